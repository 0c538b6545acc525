"""StreamingLLM (Xiao et al., 2023, arXiv:2309.17453): attention sinks plus a window of recent tokens."""

from __future__ import annotations

import torch

from snapeval.cache.attention import ROPE_ROTATION
from snapeval.cache.base import SnapevalCache
from snapeval.cache.method import LayerPrompt, Selection, resolve_budget
from snapeval.cache.ring import rerotated_sinks
from snapeval.cache.rope import KeyRotation
from snapeval.cache.scoring import first_valid_columns, top_columns
from snapeval.configs.cache import StreamingLLM
from snapeval.errors import SnapevalError


class StreamingLLMCache(SnapevalCache):
    """StreamingLLM: keep the first ``sinks`` tokens and the most recent ``budget - sinks`` tokens.

    A fixed-capacity cache of ``budget`` slots per layer and KV head: the sinks are pinned, every other
    slot belongs to a ring that the prompt's most recent tokens fill first and that each generated token
    then advances, overwriting the oldest non-sink token. Keys keep the RoPE rotation of their original
    position, unless ``rerotate``: then, as in the original, attention sees every token at its position
    inside the cache. The recent tokens are contiguous up to the query, so only the sinks' distances
    change: each decode step rotates the sink keys forward by the number of evicted tokens (the cache
    itself keeps them as they were).

    ``ratio`` instead of ``budget`` sizes the cache as ``ceil(ratio * prompt length)``. Parameters and
    their defaults: :class:`~snapeval.configs.cache.StreamingLLM`.
    """

    params_class = StreamingLLM

    def decode_slots(self, prompt_length: int, new_tokens: int) -> int:
        return resolve_budget(self.budget, self.ratio, prompt_length, self.sinks + 1)

    def select(self, prompt: LayerPrompt) -> Selection:
        batch, kv_heads, length, _ = prompt.keys.shape
        valid = prompt.valid
        capacity = resolve_budget(self.budget, self.ratio, prompt.whole_length, self.sinks + 1)
        sinks = first_valid_columns(valid, self.sinks)
        columns = torch.arange(length, device=valid.device, dtype=torch.float32).expand(batch, length)
        sink_priority = torch.where(sinks, 0.0, float("-inf"))
        recent_priority = torch.where(valid & ~sinks, columns, float("-inf"))
        eligible = int((valid & ~sinks).sum(dim=-1).max())
        ring = top_columns(recent_priority[:, None], min(capacity - self.sinks, eligible))
        pinned = top_columns(sink_priority[:, None], self.sinks)
        return Selection(
            pinned=pinned.expand(batch, kv_heads, -1),
            ring=ring.expand(batch, kv_heads, -1),
            capacity=capacity,
        )

    def finish_prefill(self, layer_idx: int, *args, **kwargs) -> None:
        if self.rerotate:  # refused before any decode step, whatever the path
            rotation_of(kwargs.get("module", args[3] if len(args) > 3 else None))
        super().finish_prefill(layer_idx, *args, **kwargs)

    def fill_layer(self, layer_idx: int, prompt: LayerPrompt, values: torch.Tensor) -> None:
        if self.rerotate:  # a grid's shared prefill refuses as this cache's own would
            rotation_of(prompt.module)
        super().fill_layer(layer_idx, prompt, values)

    def attention_keys(self, layer_idx: int, key: torch.Tensor, module: torch.nn.Module) -> torch.Tensor:
        layer = self.layers[layer_idx]
        if not self.rerotate or layer.ring_start == 0:
            return key
        pinned = torch.arange(key.shape[2], device=key.device) < layer.ring_start
        return rerotated_sinks(rotation_of(module), key, layer.positions, pinned[None, None])


def rotation_of(module: torch.nn.Module | None) -> KeyRotation:
    """The key rotation :func:`~snapeval.cache.install` read for ``module``'s model; refused in one line
    (naming the family) where there is none."""
    rotation = getattr(module, ROPE_ROTATION, None)
    if isinstance(rotation, KeyRotation):
        return rotation
    why = rotation or "re-rotating keys needs a model prepared with snapeval.cache.install"
    raise SnapevalError(why, "cache.rerotate")
