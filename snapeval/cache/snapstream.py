"""SnapStream: SnapKV selection at prefill into a fixed-capacity cache whose decode region is a ring, or,
with ``reselect_every``, a region whose generated tokens are re-scored by SnapKV's priority when it fills."""

from __future__ import annotations

import torch

from snapeval.cache.base import LayerPrompt, Selection, SnapevalCache, resolve_budget
from snapeval.cache.eviction import Eviction
from snapeval.cache.scoring import first_valid_columns, snapkv_priority, top_columns
from snapeval.configs.cache import SnapStream


class SnapStreamCache(SnapevalCache):
    """SnapStream: a fixed-capacity cache of ``budget`` slots per layer and KV head.

    At the end of prefill, if the prompt fits in ``budget - ring`` slots it is pinned whole and every other
    slot serves the ring. Otherwise ``budget - ring`` prompt tokens are pinned: the first ``sinks`` tokens,
    the last ``window`` tokens, and the best of the rest by SnapKV scores (window attention summed over the
    window, pooled with ``kernel``/``pooling``, reduced over each GQA group by ``gqa_reduce``). The other
    ``ring`` slots form a StreamingLLM ring for generated tokens: once full, each new token overwrites the
    oldest generated one. Buffers are allocated once; decode never resizes them.

    ``reselect_every`` = N (off by default: the above is the paper's method) replaces the ring's overwrite
    with a decode-time re-selection (:mod:`snapeval.cache.eviction`): whenever a row holds all its slots,
    each full-attention layer keeps ``budget - N`` of them, so the next N tokens fit before the next one.
    The prompt slots (pinned, and any query appended after prefill) are always kept; the generated ones
    are ranked by SnapKV's priority from the last w <= ``window`` generated tokens' queries: their attention
    over the held slots in storage order (causal among the w), summed over the w, pooled, reduced over each
    GQA group; the w tokens themselves are always kept. The slots kept stay in storage order (ascending).

    Parameters and their defaults: :class:`~snapeval.configs.cache.SnapStream`.
    """

    method = "snapstream"
    label = "SnapStream"
    params_class = SnapStream

    def capacity(self, prompt_length: int) -> int:
        """Slots per layer and KV head after a prompt of ``prompt_length`` tokens."""
        minimum = self.window + self.sinks + self.ring + 1
        return resolve_budget(self.budget, self.ratio, prompt_length, minimum)

    def decode_slots(self, prompt_length: int, new_tokens: int) -> int:
        return self.capacity(prompt_length)

    def decode_eviction(self, prompt_length: int) -> Eviction | None:
        if self.reselect_every is None:
            return None
        slots = self.capacity(prompt_length)
        return Eviction(keep=slots - self.reselect_every, slots=slots, queries=self.window)

    def select(self, prompt: LayerPrompt) -> Selection:
        capacity = self.capacity(prompt.length)
        prompt_slots = capacity - self.ring
        if prompt.length <= prompt_slots:
            return Selection(capacity=capacity)
        priority = snapkv_priority(prompt, self.window, self.kernel, self.pooling, self.gqa_reduce)
        sinks = first_valid_columns(prompt.valid, self.sinks)
        priority = priority.masked_fill(sinks[:, None], float("inf"))
        return Selection(pinned=top_columns(priority, prompt_slots), capacity=capacity)

    def reselect(self, held: LayerPrompt, keep: int) -> torch.Tensor:
        """(1, cache_heads, keep) ascending slots of ``held`` to keep: every prompt slot, the slots of the
        w recent queries, and the generated slots of highest SnapKV priority from those queries."""
        priority = reselect_priority(held, self.kernel, self.pooling, self.gqa_reduce)
        return top_columns(priority, keep)


def reselect_priority(held: LayerPrompt, kernel: int, pooling: str, gqa_reduce: str) -> torch.Tensor:
    """(1, cache_heads, S) priority of a layer's ``held`` slots at a re-selection: SnapKV's priority with
    the w >= 1 recent queries as its window (the last w held slots, +inf), prompt slots +inf."""
    priority = snapkv_priority(held, held.query.shape[2], kernel, pooling, gqa_reduce)
    return priority.masked_fill(held.positions < held.prompt_length, float("inf"))
