"""StreamingLLM (Xiao et al., 2023, arXiv:2309.17453): attention sinks plus a window of recent tokens."""

from __future__ import annotations

import torch

from snapeval.cache.base import Selection, SnapevalCache, resolve_budget
from snapeval.cache.scoring import first_valid_columns, top_columns
from snapeval.cache.validation import check_budget, check_count


class StreamingLLMCache(SnapevalCache):
    """StreamingLLM: keep the first ``sinks`` tokens and the most recent ``budget - sinks`` tokens.

    A fixed-capacity cache of ``budget`` slots per layer and KV head: the sinks are pinned, every other
    slot belongs to a ring that the prompt's most recent tokens fill first and that each generated token
    then advances, overwriting the oldest non-sink token. Keys keep the RoPE rotation of their original
    position (the variant that re-rotates keys to their position inside the cache is not implemented).

    Defaults: sinks 4. ``ratio`` instead of ``budget`` sizes the cache as ``ceil(ratio * prompt length)``.
    """

    method = "streaming_llm"

    def __init__(self, budget: int | None = None, ratio: float | None = None, sinks: int = 4) -> None:
        check_count(sinks, "cache.sinks", 0)
        check_budget(budget, ratio, sinks, "cache.sinks")
        super().__init__()
        self.budget, self.ratio, self.sinks = budget, ratio, sinks

    def params(self) -> dict:
        return {"method": self.method, "budget": self.budget, "ratio": self.ratio, "sinks": self.sinks}

    def select(
        self, keys: torch.Tensor, query: torch.Tensor, valid: torch.Tensor, scaling: float
    ) -> Selection:
        batch, kv_heads, length, _ = keys.shape
        capacity = resolve_budget(self.budget, self.ratio, length, self.sinks + 1)
        sinks = first_valid_columns(valid, self.sinks)
        columns = torch.arange(length, device=keys.device, dtype=torch.float32).expand(batch, length)
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
