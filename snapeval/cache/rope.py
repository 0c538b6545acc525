"""Rotating RoPE keys to another position, for caches that move tokens inside the cache.

RoPE turns pairs of a head's dimensions by an angle proportional to the position, so a key cached at
position p is moved to p + o by turning the same pairs by o times their frequencies. Families pair the
dimensions differently: i with i + r/2 (transformers' ``rotate_half``, most families), or 2i with 2i + 1
(interleaved: Cohere); with partial rotary (Phi-4-mini) only the first r = 2 x len(inv_freq) dimensions
turn. :func:`key_rotation` reads which layout a layer uses by running the model's own
``apply_rotary_pos_emb`` once (with the layer type's own frequencies where layer types have their own
RoPE base, as in Gemma 3), and refuses (with the reason, naming the family) a model whose keys it cannot
turn: frequencies that change with the sequence length, or any other layout.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from snapeval.cache.mla import is_latent


def rotate_keys(
    keys: torch.Tensor, offset: torch.Tensor, inv_freq: torch.Tensor, interleaved: bool = False
) -> torch.Tensor:
    """RoPE keys (batch, kv_heads, n, d) moved ``offset`` (batch, kv_heads) positions forward.

    The first ``2 * len(inv_freq)`` dimensions turn, paired half-split (i with i + r/2) or ``interleaved``
    (2i with 2i + 1), pair i by frequency i; the rest pass. The keys already carry the model's
    ``attention_scaling``; a rotation leaves it as it is.
    """
    angles = offset[..., None, None].float() * inv_freq.to(keys.device)
    cos, sin = angles.cos().to(keys.dtype), angles.sin().to(keys.dtype)
    rotary = 2 * inv_freq.numel()
    part, rest = keys[..., :rotary], keys[..., rotary:]
    if interleaved:
        first, second = part[..., 0::2], part[..., 1::2]
        turned = torch.stack([first * cos - second * sin, second * cos + first * sin], dim=-1).flatten(-2)
    else:
        first, second = part.chunk(2, dim=-1)
        turned = torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)
    return torch.cat([turned, rest], dim=-1)


@dataclass(frozen=True)
class KeyRotation:
    """How to turn a model's cached keys: its RoPE frequencies and how its dimensions pair up."""

    inv_freq: torch.Tensor
    interleaved: bool

    def rotate(self, keys: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        return rotate_keys(keys, offset, self.inv_freq, self.interleaved)


@torch.no_grad()
def key_rotation(model: torch.nn.Module, module: torch.nn.Module, inv_freq: torch.Tensor | None):
    """The :class:`KeyRotation` of ``model`` (``module``: one of its attention modules; ``inv_freq``: the
    fixed frequencies read off its rotary embedding, or None), or one line saying why keys of this family
    cannot be re-rotated."""
    family = model.config.model_type
    if is_latent(module):
        return (
            f"{family}: multi-head latent attention caches its rotary key apart from the keys (as the "
            "cache's values), so StreamingLLM cannot re-rotate sink keys; use rerotate=false"
        )
    rotary = getattr(model.get_decoder(), "rotary_emb", None)
    apply = getattr(sys.modules[type(module).__module__], "apply_rotary_pos_emb", None)
    layer_type = getattr(module, "layer_type", None)
    per_type = {} if layer_type is None else {"layer_type": layer_type}
    if per_type and isinstance(getattr(rotary, f"{layer_type}_inv_freq", None), torch.Tensor):
        fixed = getattr(rotary, "rope_type", {}).get(layer_type) not in ("dynamic", "longrope")
        inv_freq = getattr(rotary, f"{layer_type}_inv_freq").detach().float().clone() if fixed else None
        scaling = getattr(rotary, f"{layer_type}_attention_scaling", 1.0)
    else:
        per_type, scaling = {}, getattr(rotary, "attention_scaling", 1.0)
    if inv_freq is None or rotary is None or apply is None:
        return (
            f"{family}: re-rotating keys needs a rotary embedding with fixed frequencies, and this family "
            "has none (frequencies that change with the sequence length)"
        )
    head_dim = getattr(module, "head_dim", None) or 2 * inv_freq.numel()
    generator = torch.Generator().manual_seed(0)
    key = torch.randn(1, 1, 1, head_dim, generator=generator).to(inv_freq.device)
    position = torch.tensor([[7]], device=inv_freq.device)
    cos, sin = rotary(key, position, **per_type)
    expected = apply(key, key, cos, sin)[1] / scaling
    for interleaved in (False, True):
        turned = rotate_keys(key, position.float(), inv_freq, interleaved)
        if torch.allclose(turned, expected.float(), rtol=1e-3, atol=1e-3):
            return KeyRotation(inv_freq, interleaved)
    return f"{family}: re-rotating keys needs RoPE that pairs dimensions half-split or interleaved"


def rope_inv_freq(model: torch.nn.Module) -> torch.Tensor | None:
    """The model's RoPE inverse frequencies (float32), or None where the engine cannot read them.

    Unreadable: no ``rotary_emb.inv_freq`` on the decoder (e.g. per-layer-type RoPE), or frequencies that
    change with the sequence length (dynamic NTK, LongRoPE). Partial rotary shows up at use, as too few
    frequencies for the head dimension.
    """
    rotary = getattr(model.get_decoder(), "rotary_emb", None)
    inv_freq, rope_type = getattr(rotary, "inv_freq", None), getattr(rotary, "rope_type", None)
    if not isinstance(inv_freq, torch.Tensor) or rope_type in ("dynamic", "longrope"):
        return None
    return inv_freq.detach().float().clone()
