"""SAGE-KV (Wang et al., 2025, arXiv:2503.08879): one top-k selection after prefill, guided by the last
prompt token's attention, into a fixed-size cache whose recent window rolls during decode."""

from __future__ import annotations

import torch

from snapeval.cache.base import EMPTY, SnapevalCache
from snapeval.cache.method import LayerPrompt, Selection, resolve_budget
from snapeval.cache.scoring import first_valid_columns, prompt_window_attention, reduce_gqa, top_columns
from snapeval.configs.cache import SageKV


class SageKVCache(SnapevalCache):
    """SAGE-KV: self-attention guided eviction, a fixed cache of ``budget`` slots per layer and KV head.

    After prefill the prompt is split into sink tokens (the first ``sinks``), recent tokens (the last
    ``recent``, the last token among them) and the tokens in between, the eviction candidates. The query
    of the last prompt token (``window`` = 1; more sums the attention of the last ``window`` queries)
    attends to every prompt key; the candidates with the highest attention, per KV head (the paper's
    head-level selection), fill the ``budget - sinks - recent`` slots left after the sinks and recent
    tokens. Decode attends to this reduced cache; each generated token enters the recent window and
    evicts its oldest entry, so the cache never grows. A prompt of at most ``budget - recent`` tokens is
    kept whole and the other slots serve the recent window.

    Choices the paper leaves open: a GQA group's query heads are reduced to one score per KV head by
    ``gqa_reduce`` (mean); scores are softmax probabilities in float32, not pooled; ties go to the earlier
    token. ``recent`` defaults to the size of SnapStream's ring, for a matched comparison. ``ratio``
    instead of ``budget`` sizes the cache as ``ceil(ratio * prompt length)``. Parameters and their
    defaults: :class:`~snapeval.configs.cache.SageKV`.
    """

    params_class = SageKV

    def decode_slots(self, prompt_length: int, new_tokens: int) -> int:
        return resolve_budget(self.budget, self.ratio, prompt_length, self.sinks + self.recent + 1)

    def select(self, prompt: LayerPrompt) -> Selection:
        capacity = resolve_budget(self.budget, self.ratio, prompt.whole_length, self.sinks + self.recent + 1)
        if prompt.length <= capacity - self.recent:
            return Selection(capacity=capacity)
        batch, kv_heads, length, _ = prompt.keys.shape
        attention = prompt_window_attention(prompt, self.window)
        scores = reduce_gqa(attention, kv_heads, self.gqa_reduce)
        columns = torch.arange(length, device=scores.device)
        recent = columns >= length - self.recent
        sinks = first_valid_columns(prompt.valid, self.sinks)
        priority = scores.masked_fill(sinks[:, None], float("inf"))
        priority = priority.masked_fill(recent | ~prompt.valid[:, None], float("-inf"))
        ring = columns[recent].expand(batch, kv_heads, -1)
        ring = ring.masked_fill(~prompt.valid[:, None, recent], EMPTY)
        return Selection(pinned=top_columns(priority, capacity - self.recent), ring=ring, capacity=capacity)
