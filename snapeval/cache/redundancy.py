"""R-KV scoring (Cai et al. 2025, arXiv:2505.24133), written as small pure functions.

Scores are computed for S held keys, of which the last ``window`` are the tokens whose queries were
recorded (always kept). Every function takes (batch, kv_heads, S, d) keys and returns one score per
KV head and key, in float32 (float64 for float64 inputs); ``valid`` (batch, S) marks real columns
(a batched prompt's padding, on the left, is neither scored nor counted).

1. :func:`importance`: the attention logits of the ``window`` queries (max over each GQA group's query
   heads), softmax over the keys before the window, mean over the window, max-pooled with ``kernel``.
2. :func:`redundancy`: each key's mean cosine similarity to the other keys, not counting the keys whose
   most recent look-alike above ``threshold`` it is, softmaxed over the keys.
3. :func:`rkv_scores`: ``mix_lambda * importance - (1 - mix_lambda) * redundancy`` of the keys before
   the window; :func:`kept_slots`: the best ``keep - window`` of them (best first), then the window.
"""

from __future__ import annotations

import torch

from snapeval.cache.scoring import outside_window, pool_scores

CHUNK_ENTRIES = 2**26  # similarity entries computed at once (about 9 bytes each at the peak), not S x S


def compute_dtype(keys: torch.Tensor) -> torch.dtype:
    """float32, or float64 for float64 keys."""
    return torch.promote_types(keys.dtype, torch.float32)


def importance(
    query: torch.Tensor,
    keys: torch.Tensor,
    kernel: int,
    scaling: float,
    valid: torch.Tensor | None = None,
    sliding_window: int | None = None,
    columns: torch.Tensor | None = None,
) -> torch.Tensor:
    """(batch, kv_heads, S - w) importance of the keys before the window of the w = query.shape[2] queries.

    query: (batch, heads, w, d) the queries of the last w keys, oldest first, post-RoPE as ``keys``. The
    logits of each query head (times ``scaling``) are reduced by max over the query heads sharing a KV
    head; on a layer with a ``sliding_window`` a query sees only inside it (query i, key j:
    i - sliding_window < j; by the keys' input ``columns`` where given, :func:`outside_window`), and a
    query that sees no key before the window contributes zeros.
    """
    batch, heads, window, dim = query.shape
    kv_heads, length = keys.shape[1], keys.shape[2]
    dtype = compute_dtype(keys)
    grouped = query.to(dtype).reshape(batch, kv_heads, heads // kv_heads * window, dim)
    logits = (grouped * scaling) @ keys.to(dtype)[:, :, : length - window].transpose(-1, -2)
    logits = logits.view(batch, kv_heads, heads // kv_heads, window, -1).amax(dim=2)
    if valid is not None:
        logits = logits.masked_fill(~valid[:, None, None, : length - window], float("-inf"))
    if sliding_window is not None:
        outside = outside_window(sliding_window, window, length, columns, keys.device)
        logits = logits.masked_fill(outside[:, :, 0, :, : length - window], float("-inf"))
    probabilities = logits.softmax(dim=-1).nan_to_num(0.0)  # a query seeing no key: all -inf
    return pool_scores(probabilities.mean(dim=-2), kernel, "max")


def redundancy(keys: torch.Tensor, threshold: float, valid: torch.Tensor | None = None) -> torch.Tensor:
    """(batch, kv_heads, S) redundancy of every key: softmax over keys of the mean over keys i of the
    cosine similarity sim(i, j) (norms + 1e-8), where sim(i, i) = 0 and, for each i, the entry of the
    last j with sim(i, j) > ``threshold`` (the first key if none) is zeroed, so that of keys alike the
    most recent counts least redundant (the authors' ``retain_direction="last"``). Rows are computed in
    chunks, never S x S at once."""
    batch, heads, length, _ = keys.shape
    if valid is None:
        valid = torch.ones(batch, length, dtype=torch.bool, device=keys.device)
    keys = keys.to(compute_dtype(keys))
    normed = keys / (keys.norm(dim=-1, keepdim=True) + 1e-8)
    columns = torch.arange(length, dtype=torch.int32, device=keys.device)
    first = valid.int().argmax(dim=-1)[:, None, None, None]  # the fallback, past every padding column
    total = keys.new_zeros(keys.shape[:3])
    chunk = max(1, CHUNK_ENTRIES // (batch * heads * length))
    for start in range(0, length, chunk):
        rows = columns[start : start + chunk]
        similarity = normed[:, :, start : start + chunk] @ normed.transpose(-1, -2)  # (.., chunk, S)
        similarity.masked_fill_(rows[:, None] == columns, 0.0)
        last = torch.where(similarity > threshold, columns, first).amax(dim=-1, keepdim=True)
        similarity.scatter_(-1, last.long(), 0.0)
        total += similarity.masked_fill_(~valid[:, None, start : start + chunk, None], 0.0).sum(dim=-2)
    mean = total / valid.sum(dim=-1).clamp(min=1)[:, None, None]
    return mean.masked_fill(~valid[:, None], float("-inf")).softmax(dim=-1)


def rkv_scores(
    query: torch.Tensor,
    keys: torch.Tensor,
    kernel: int,
    mix_lambda: float,
    threshold: float,
    scaling: float,
    valid: torch.Tensor | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """(batch, kv_heads, S - w) R-KV scores of the keys before the window of the w = query.shape[2]
    queries: ``mix_lambda * importance - (1 - mix_lambda) * redundancy`` (arguments as
    :func:`importance`'s and :func:`redundancy`'s)."""
    weight = importance(query, keys, kernel, scaling, valid, sliding_window)
    return mixed(weight, redundancy(keys, threshold, valid), mix_lambda)


def mixed(weight: torch.Tensor, similar: torch.Tensor, mix_lambda: float) -> torch.Tensor:
    """``mix_lambda * importance - (1 - mix_lambda) * redundancy`` of the keys ``weight`` (the importance
    of the keys before the window) covers; ``similar``: every key's redundancy."""
    return mix_lambda * weight - (1 - mix_lambda) * similar[..., : weight.shape[-1]]


def kept_slots(scores: torch.Tensor, keep: int, window: int) -> torch.Tensor:
    """(batch, kv_heads, keep) slots kept of S = scores.shape[-1] + ``window``: the ``keep - window`` best
    scored (best first, as ``topk`` orders them), then the ``window`` last slots in order."""
    batch, heads, prefix = scores.shape
    best = scores.topk(keep - window, dim=-1).indices
    recent = torch.arange(prefix, prefix + window, device=scores.device).expand(batch, heads, window)
    return torch.cat([best, recent], dim=-1)
