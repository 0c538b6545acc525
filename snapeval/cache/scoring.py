"""SnapKV scoring, written as small pure functions so each step can be checked on its own.

1. :func:`window_attention`: softmax attention of the last ``window`` prompt queries over every prompt key
   (causal, padding excluded), summed over the window -> (batch, heads, L).
2. :func:`pool_scores`: 1-D max or average pooling along the sequence (stride 1, padding kernel // 2), so
   that the neighbours of an important token survive with it.
3. :func:`reduce_gqa`: the query heads of each KV group reduced to one score per KV head (mean or max).
4. :func:`top_columns`: the highest-priority columns per KV head; ties go to the earlier column.

:func:`snapkv_priority` composes 1-3 for one layer's prompt and remembers the results in the prompt, so
that every setting selected from one prefill (a :class:`~snapeval.cache.grid.CacheGrid`) reuses them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from snapeval.cache.base import EMPTY
from snapeval.cache.method import LayerPrompt


def window_attention(
    query: torch.Tensor,
    keys: torch.Tensor,
    valid: torch.Tensor,
    window: int,
    scaling: float,
    sliding_window: int | None = None,
    columns: torch.Tensor | None = None,
) -> torch.Tensor:
    """(batch, heads, L) attention the last ``window`` queries pay to each key, summed over the window.

    query: (batch, heads, n, d), the queries of the last n keys (all n of them when n < window: a short
    chunk of a chunked prefill), and keys: (batch, kv_heads, L, d), both post-RoPE (or both in MLA's latent
    space); valid: (batch, L). Computed in float32. Padding queries of the window contribute nothing. On a
    layer with a ``sliding_window`` each query attends only inside it, as the layer does (query i, key j:
    i - sliding_window < j), by the keys' input ``columns`` where given (:func:`outside_window`).
    """
    batch, heads, _, dim = query.shape
    length = keys.shape[2]
    window = min(window, length, query.shape[2])
    # group the window queries by KV head, so the keys are never copied per query head
    grouped = (query[:, :, -window:].float() * scaling).reshape(batch, keys.shape[1], -1, dim)
    logits = (grouped @ keys.float().transpose(-1, -2)).view(batch, heads, window, length)
    future = torch.ones(window, window, dtype=torch.bool, device=keys.device).triu(1)
    logits[..., -window:].masked_fill_(future, float("-inf"))  # only window columns can follow a query
    logits.masked_fill_(~valid[:, None, None, :], float("-inf"))
    if sliding_window is not None:
        outside = outside_window(sliding_window, window, length, columns, keys.device)
        logits.view(batch, keys.shape[1], -1, window, length).masked_fill_(outside, float("-inf"))
    probabilities = logits.softmax(dim=-1)
    return probabilities.masked_fill_(~valid[:, None, -window:, None], 0.0).sum(dim=2)


def outside_window(
    sliding_window: int, window: int, length: int, columns: torch.Tensor | None, device: torch.device
) -> torch.Tensor:
    """(batch or 1, kv_heads or 1, 1, window, L) bool: the keys outside the sliding window of each of the
    queries of the last ``window`` of L keys (query i, key j: j <= i - sliding_window), by the keys' input
    ``columns`` (batch, kv_heads, L) where given (the held slots and a chunk of a chunked prefill), else
    by their index (a whole prompt)."""
    if columns is None:
        columns = torch.arange(length, device=device)[None, None]
    return (columns[..., None, :] <= columns[..., -window:, None] - sliding_window)[:, :, None]


def pool_scores(scores: torch.Tensor, kernel: int, pooling: str) -> torch.Tensor:
    """Smooth (batch, heads, N) scores along N with an odd ``kernel``, stride 1, same length out."""
    if pooling == "max":
        return F.max_pool1d(scores, kernel, stride=1, padding=kernel // 2)
    return F.avg_pool1d(scores, kernel, stride=1, padding=kernel // 2)


def reduce_gqa(scores: torch.Tensor, kv_heads: int, how: str) -> torch.Tensor:
    """(batch, heads, N) -> (batch, kv_heads, N): reduce the query heads sharing each KV head."""
    batch, heads, length = scores.shape
    grouped = scores.view(batch, kv_heads, heads // kv_heads, length)
    return grouped.mean(dim=2) if how == "mean" else grouped.amax(dim=2)


def first_valid_columns(valid: torch.Tensor, count: int) -> torch.Tensor:
    """(batch, L) bool marking the first ``count`` real columns of each row (attention sinks)."""
    return valid & (valid.cumsum(dim=-1) <= count)


def top_columns(priority: torch.Tensor, k: int) -> torch.Tensor:
    """(batch, kv_heads, k) columns of the ``k`` highest priorities, ascending; -inf picks become EMPTY."""
    order = torch.sort(priority, dim=-1, descending=True, stable=True).indices[..., :k]
    chosen = order.masked_fill(priority.gather(-1, order) == float("-inf"), EMPTY)
    return _ascending(chosen, priority.shape[-1])


def _ascending(columns: torch.Tensor, sentinel: int) -> torch.Tensor:
    ordered = torch.sort(columns.masked_fill(columns == EMPTY, sentinel), dim=-1).values
    return ordered.masked_fill(ordered == sentinel, EMPTY)


def prompt_window_attention(prompt: LayerPrompt, window: int) -> torch.Tensor:
    """:func:`window_attention` of a layer's ``prompt``, computed once per window and kept in the prompt."""
    attention = prompt.scores.get(("window", window))
    if attention is None:
        queries, keys = prompt.window_queries(window), prompt.scoring_keys()
        attention = window_attention(
            queries, keys, prompt.valid, window, prompt.scaling, prompt.sliding_window, prompt.positions
        )
        prompt.scores[("window", window)] = attention
    return attention


def snapkv_priority(
    prompt: LayerPrompt, window: int, kernel: int, pooling: str, gqa_reduce: str
) -> torch.Tensor:
    """(batch, kv_heads, L) SnapKV priority of every column of a layer's ``prompt``.

    The prefix (all but the last ``window`` columns) is scored by window attention, pooled, then reduced
    over each GQA group; window columns get +inf (always kept) and padding -inf (never kept). The window
    attention and the priority are kept in ``prompt.scores``: selections from one prefill that share a
    window (or every setting) compute it once, with the very operations a selection alone would run.
    """
    setting = ("priority", window, kernel, pooling, gqa_reduce)
    if setting in prompt.scores:
        return prompt.scores[setting]
    attention = prompt_window_attention(prompt, window)
    prefix = prompt.length - min(window, prompt.length)
    pooled = pool_scores(attention[..., :prefix], kernel, pooling)
    scores = reduce_gqa(pooled, prompt.cache_heads, gqa_reduce)
    forced = scores.new_full((*scores.shape[:2], prompt.length - prefix), float("inf"))
    priority = torch.cat([scores, forced], dim=-1).masked_fill(~prompt.valid[:, None, :], float("-inf"))
    prompt.scores[setting] = priority
    return priority
