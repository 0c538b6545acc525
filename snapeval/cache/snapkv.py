"""SnapKV (Li et al., 2024, arXiv:2404.14469): prompt compression by observation-window attention."""

from __future__ import annotations

from snapeval.cache.base import SnapevalCache
from snapeval.cache.method import LayerPrompt, Selection, resolve_budget
from snapeval.cache.scoring import snapkv_priority, top_columns
from snapeval.configs.cache import SnapKV


class SnapKVCache(SnapevalCache):
    """SnapKV: compress the prompt once at the end of prefill, then grow as usual.

    Algorithm, per layer and KV head: the last ``window`` prompt queries attend to the prompt (softmax,
    causal); their attention is summed over the window, pooled along the sequence (``pooling`` max|avg,
    odd ``kernel``, stride 1, padding kernel // 2), reduced over the query heads of each GQA group
    (``gqa_reduce`` mean|max), and the top ``budget - window`` prefix tokens are kept together with the
    window itself. A prompt of at most ``budget`` tokens is kept whole. Generated tokens are appended.

    ``ratio`` instead of ``budget`` keeps ``ceil(ratio * prompt length)`` tokens. Parameters and their
    defaults: :class:`~snapeval.configs.cache.SnapKV`.
    """

    params_class = SnapKV

    def decode_slots(self, prompt_length: int, new_tokens: int) -> int:
        budget = resolve_budget(self.budget, self.ratio, prompt_length, self.window + 1)
        return min(prompt_length, budget) + new_tokens

    def select(self, prompt: LayerPrompt) -> Selection:
        budget = resolve_budget(self.budget, self.ratio, prompt.whole_length, self.window + 1)
        if prompt.length <= budget:
            return Selection()
        priority = snapkv_priority(prompt, self.window, self.kernel, self.pooling, self.gqa_reduce)
        return Selection(pinned=top_columns(priority, budget))
