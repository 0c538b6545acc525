"""SnapStream: SnapKV selection at prefill into a fixed-capacity cache whose decode region is a ring, or,
with ``reselect_every``, a region whose generated tokens are re-scored by SnapKV's priority when it fills."""

from __future__ import annotations

import torch

from snapeval.cache.base import SnapevalCache
from snapeval.cache.eviction import Eviction
from snapeval.cache.method import LayerPrompt, Selection, resolve_budget
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
    with a decode-time re-selection (:mod:`snapeval.cache.eviction`): whenever a row holds all its
    ``budget`` slots, each full-attention layer keeps ``budget - N`` of them (in storage order), so the next
    N tokens fit before the next re-selection. It keeps, per KV head: the prompt slots before the ring;
    the last w <= ``window`` tokens fed, whose queries score the rest; any other prompt slots (a query
    appended after prefill); then the generated tokens of highest SnapKV priority from those w queries
    (their attention over the held slots in storage order, causal among the w, summed over them, pooled
    with ``kernel``/``pooling``, reduced over each GQA group by ``gqa_reduce``). The prompt before the
    ring is always kept; when the recent tokens or an appended query do not all fit, their newest stay.
    Sliding-window layers keep their ring.

    Parameters and their defaults: :class:`~snapeval.configs.cache.SnapStream`.
    """

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
        capacity = self.capacity(prompt.whole_length)
        prompt_slots = capacity - self.ring
        if prompt.length <= prompt_slots:
            return Selection(capacity=capacity)
        priority = snapkv_priority(prompt, self.window, self.kernel, self.pooling, self.gqa_reduce)
        sinks = first_valid_columns(prompt.valid, self.sinks)
        priority = priority.masked_fill(sinks[:, None], float("inf"))
        return Selection(pinned=top_columns(priority, prompt_slots), capacity=capacity)

    def reselect(self, held: LayerPrompt, keep: int) -> torch.Tensor:
        """(1, cache_heads, keep) ascending slots of ``held`` to keep (see the class docstring)."""
        pinned = keep + self.reselect_every - self.ring  # the slots before the ring
        ranks = reselect_ranks(held, pinned, self.kernel, self.pooling, self.gqa_reduce)
        return ranks[..., :keep].sort(dim=-1).values


def reselect_ranks(
    held: LayerPrompt, pinned: int, kernel: int, pooling: str, gqa_reduce: str
) -> torch.Tensor:
    """(1, cache_heads, S) a layer's ``held`` slots, most wanted first: the prompt slots among the first
    ``pinned``; the last w slots (the tokens of the w >= 1 recent queries), newest first; the other prompt
    slots (a query appended after prefill), newest first; the generated slots by SnapKV's priority from the
    w recent queries (ties: the earlier slot first)."""
    w = held.query.shape[2]
    scores = snapkv_priority(held, w, kernel, pooling, gqa_reduce)
    slots = torch.arange(held.length, device=scores.device).expand_as(scores)
    prompt = held.positions < held.prompt_length
    tier = prompt.long()
    tier[..., -w:] = 2
    tier[prompt & (slots < pinned)] = 3
    by_score = torch.where(tier == 0, scores, slots.to(scores.dtype))
    order = by_score.argsort(dim=-1, descending=True, stable=True)
    return order.gather(-1, tier.gather(-1, order).argsort(dim=-1, descending=True, stable=True))
