"""SnapStream: SnapKV selection at prefill into a fixed-capacity cache whose decode region is a ring."""

from __future__ import annotations

from snapeval.cache.base import LayerPrompt, Selection, SnapevalCache, resolve_budget
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

    Parameters and their defaults: :class:`~snapeval.configs.cache.SnapStream`.
    """

    method = "snapstream"
    label = "SnapStream"
    params_class = SnapStream

    def decode_slots(self, prompt_length: int, new_tokens: int) -> int:
        return resolve_budget(
            self.budget, self.ratio, prompt_length, self.window + self.sinks + self.ring + 1
        )

    def select(self, prompt: LayerPrompt) -> Selection:
        minimum = self.window + self.sinks + self.ring + 1
        capacity = resolve_budget(self.budget, self.ratio, prompt.length, minimum)
        prompt_slots = capacity - self.ring
        if prompt.length <= prompt_slots:
            return Selection(capacity=capacity)
        priority = snapkv_priority(prompt, self.window, self.kernel, self.pooling, self.gqa_reduce)
        sinks = first_valid_columns(prompt.valid, self.sinks)
        priority = priority.masked_fill(sinks[:, None], float("inf"))
        return Selection(pinned=top_columns(priority, prompt_slots), capacity=capacity)
