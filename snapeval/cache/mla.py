"""Multi-head latent attention (MLA: DeepSeek-V2, V3, R1): what its cache holds and how it is scored.

An MLA layer caches one "head" per token: the normalised latent ``c`` (``kv_lora_rank`` wide) as the
cache's keys and the shared rotary key ``k_rot`` (``qk_rope_head_dim``, already rotated) as its values.
Every attention call expands per-head keys ``[W_UK_h c, k_rot]`` and values ``W_UV_h c`` from them
(``kv_b_proj``). So every method keeps or evicts latent slots, one cache head per layer, and a slot
costs ``kv_lora_rank + qk_rope_head_dim`` numbers per layer.

Scoring happens in latent space: ``q_h . k_h = (W_UK_h^T q_nope_h) . c + q_rot_h . k_rot``. A query head
absorbed through its up-projection and joined to its rotary part, against the latent key ``[c, k_rot]``,
gives the very logits the model's attention computes, without expanding the prompt's keys per head (at
128k tokens and 128 heads those would take 13 GB in float32 per layer; the latent keys take 0.3 GB). All
query heads share the one latent head, as one GQA group.
"""

from __future__ import annotations

import torch

from snapeval.cache.decode_attention import chunked_attention


def is_latent(module: torch.nn.Module | None) -> bool:
    """Whether ``module`` is an MLA attention module (it caches a latent, expanded by ``kv_b_proj``)."""
    return module is not None and hasattr(module, "kv_b_proj") and hasattr(module, "kv_lora_rank")


def latent_keys(latent: torch.Tensor, rotary: torch.Tensor) -> torch.Tensor:
    """(batch, 1, L, kv_lora_rank + rope) keys in latent space, from the cache's keys and values."""
    return torch.cat([latent, rotary], dim=-1)


def latent_queries(module: torch.nn.Module, query: torch.Tensor) -> torch.Tensor:
    """(batch, heads, n, kv_lora_rank + rope) float32 queries in latent space, from the per-head post-RoPE
    ``query`` (batch, heads, n, qk_nope_head_dim + qk_rope_head_dim) the attention function received.

    The up-projection is read by applying ``kv_b_proj`` to the identity, so that it is the matrix the
    model applies, whatever its weights' storage (an FP8 checkpoint's blocks and scales included)."""
    heads, nope, rank = query.shape[1], module.qk_nope_head_dim, module.kv_lora_rank
    identity = torch.eye(rank, dtype=query.dtype, device=query.device)
    up = module.kv_b_proj(identity).float().view(rank, heads, nope + module.v_head_dim)
    absorbed = torch.einsum("bhnd,rhd->bhnr", query[..., :nope].float(), up[..., :nope])
    return torch.cat([absorbed, query[..., nope:].float()], dim=-1)


def up_projections(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(heads, qk_nope_head_dim, kv_lora_rank) key and (heads, v_head_dim, kv_lora_rank) value halves of
    ``kv_b_proj`` in the module's dtype, read (as :func:`latent_queries` does) by applying it to the
    identity, so that they are the matrices the model applies."""
    rank, nope, value = module.kv_lora_rank, module.qk_nope_head_dim, module.v_head_dim
    weight = module.kv_b_proj.weight
    with torch.no_grad():
        identity = torch.eye(rank, dtype=weight.dtype, device=weight.device)
        up = module.kv_b_proj(identity).view(rank, -1, nope + value).permute(1, 2, 0)
    return up[:, :nope].contiguous(), up[:, nope:].contiguous()


def absorbed_decode_attention(
    query: torch.Tensor,
    latent: torch.Tensor,
    rotary: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    projections: tuple[torch.Tensor, torch.Tensor],
    chunk: int | None = None,
) -> torch.Tensor:
    """(rows, 1, heads, v_head_dim) MLA attention of one query token per row over the held latent slots,
    without expanding per-head keys or values: each query head's no-RoPE part is absorbed through its key
    up-projection into latent space, every head attends to the one latent head (keys ``[c, k_rot]``,
    values ``c``), and the latent output goes out through the head's value up-projection.

    ``query``: (rows, heads, 1, qk_nope + rope) post-RoPE; ``latent`` (rows, 1, slots, kv_lora_rank) and
    ``rotary`` (rows, 1, slots, rope) as the cache holds them; ``mask``: None or bool (rows, 1 or heads, 1,
    slots); ``projections``: :func:`up_projections`. Scores and the softmax in float32, as eager
    attention computes them; with a ``chunk``, the latent slots attended in chunks of that many
    (:func:`~snapeval.cache.decode_attention.chunked_attention`, the split-KV attention's).
    """
    key_up, value_up = projections
    nope = key_up.shape[1]
    heads_first = query[:, :, 0].unsqueeze(1)  # (rows, 1, heads, d): the heads as one group's query rows
    absorbed = torch.einsum("bqhn,hnr->bqhr", heads_first[..., :nope], key_up)
    scores = absorbed @ latent.transpose(-1, -2) + heads_first[..., nope:] @ rotary.transpose(-1, -2)
    scores = scores.float() * scaling
    if mask is not None:
        scores = scores.masked_fill(~mask.transpose(1, 2), float("-inf"))
    if chunk is not None:
        attended = chunked_attention(scores, latent, chunk).to(latent.dtype)
    else:
        attended = torch.softmax(scores, dim=-1).to(latent.dtype) @ latent
    return torch.einsum("bqhr,hvr->bqhv", attended, value_up)
