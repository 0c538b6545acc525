"""R-KV (Cai et al. 2025, arXiv:2505.24133): redundancy-aware KV compression while decoding."""

from __future__ import annotations

import torch

from snapeval.cache.base import SnapevalCache
from snapeval.cache.eviction import Eviction
from snapeval.cache.method import LayerPrompt, Selection
from snapeval.cache.redundancy import importance, kept_slots, mixed, redundancy, rkv_scores
from snapeval.cache.scoring import top_columns
from snapeval.configs.cache import RKV


class RKVCache(SnapevalCache):
    """R-KV: rows of ``budget + buffer`` slots per layer and KV head, cut back to ``budget`` whenever full.

    Algorithm, per layer and KV head, at a re-selection of the S held tokens, whose last ``window`` are
    the last tokens generated (their post-RoPE queries recorded): importance is the attention logits of
    those queries (max over each GQA group's query heads), softmax over the S - window other tokens,
    mean over the queries, max-pooled (``kernel``, stride 1, padding kernel // 2); redundancy is each
    token's mean cosine similarity to the held keys (not counting itself, nor the tokens whose most
    recent look-alike above ``threshold`` it is), softmaxed over the held tokens. The ``budget - window``
    best by ``mix_lambda * importance - (1 - mix_lambda) * redundancy`` are kept, best first, then the
    window; new tokens fill the ``buffer`` slots after them. Fewer recorded queries (a chunk appended
    after the prompt fills the row first) make a shorter window. A prompt longer than ``budget`` is cut
    to ``budget`` the same way at prefill (its last ``window`` queries as the window); a shorter one is
    kept whole. Scores are computed in float32 (the authors' softmax is float32, their similarities in
    the model's dtype). An MLA layer is scored in latent space (:mod:`snapeval.cache.mla`), one cache head.
    The authors' code also waits, once its cache holds ``budget + buffer`` tokens, for the decoded count
    to reach a multiple of ``buffer``: after a prompt shorter than ``budget`` their cache grows past
    ``budget + buffer`` until then, where a row here, of fixed size, is re-selected as soon as it is full.

    Parameters and their defaults: :class:`~snapeval.configs.cache.RKV` (the authors' code:
    https://github.com/Zefan-Cai/R-KV, ``R1KV`` and ``cal_similarity``).
    """

    params_class = RKV

    def decode_slots(self, prompt_length: int, new_tokens: int) -> int:
        return self.budget + self.buffer

    def decode_eviction(self, prompt_length: int) -> Eviction:
        return Eviction(keep=self.budget, slots=self.budget + self.buffer, queries=self.window)

    def select(self, prompt: LayerPrompt) -> Selection:
        capacity = self.budget + self.buffer
        if prompt.length <= self.budget:
            return Selection(capacity=capacity)
        return Selection(pinned=top_columns(self.priority(prompt), self.budget), capacity=capacity)

    def reselect(self, held: LayerPrompt, keep: int) -> torch.Tensor:
        window = held.query.shape[2]
        queries, keys = held.window_queries(window), held.scoring_keys()
        scores = rkv_scores(queries, keys, self.kernel, self.mix_lambda, self.threshold, held.scaling)
        return kept_slots(scores, keep, window)

    def priority(self, prompt: LayerPrompt) -> torch.Tensor:
        """(batch, cache_heads, L) R-KV scores of a prompt's columns before its last ``window``, +inf for
        the window, -inf for padding. Importance and redundancy are kept in ``prompt.scores``, so that
        the settings a grid selects from one prefill compute each once. A chunk of a chunked prefill
        shorter than ``window`` scores with all its queries."""
        window, keys = self.window, prompt.scoring_keys()
        weight = prompt.scores.get(("rkv importance", window, self.kernel))
        if weight is None:
            queries = prompt.window_queries(window)
            weight = importance(
                queries,
                keys,
                self.kernel,
                prompt.scaling,
                prompt.valid,
                prompt.sliding_window,
                prompt.positions,
            )
            prompt.scores[("rkv importance", window, self.kernel)] = weight
        similar = prompt.scores.get(("rkv redundancy", self.threshold))
        if similar is None:
            similar = redundancy(keys, self.threshold, prompt.valid)
            prompt.scores[("rkv redundancy", self.threshold)] = similar
        scores = mixed(weight, similar, self.mix_lambda)[..., : prompt.length - window]
        forced = scores.new_full((*scores.shape[:2], window), float("inf"))
        return torch.cat([scores, forced], dim=-1).masked_fill(~prompt.valid[:, None], float("-inf"))
