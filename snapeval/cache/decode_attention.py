"""The decode step's attention over a layer's held slots: each KV head's keys and values read once.

transformers' SDPA path copies every KV head's keys and values to each query head of its group
(``repeat_kv``) whenever a mask is passed (under ``torch.compile`` always), and the engine always passes
one at decode: which slots a row holds. For one query token per row the copies are not needed: the query
heads of a GQA group are stacked as that KV head's query rows, ``(rows, kv_heads, group, head_dim)``, and
attend to the KV head's slots with the row's mask, which is the same computation (every query head sees
the same slots of its KV head) reading each held byte once. No dense float mask, no atomics: the same
call gives the same bits, and a row's output depends only on that row.

:func:`split_decode_attention` is the same attention split along the slots (flash-decoding). On a GPU
the fused SDPA kernels run one program per (row, KV head) and leave most SMs idle with few rows and many
slots (cuDNN's flash kernel at 1 row and 128k slots: 12x its memory floor); fixed-size chunks of slots,
attended independently and then combined with the log-sum-exp rule in a fixed order, give
(rows x KV heads x chunks) programs that still read each held byte once. It is plain torch ops with
shapes fixed by the inputs' shapes (``torch.compile(fullgraph=True)``, CUDA graphs) and as deterministic
as the grouped call. On CPU the grouped SDPA stays the default; the engine picks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SPLIT_CHUNK = 512  # vLLM's PagedAttention-v2 partition: 128k slots give 256 chunks per (row, KV head)


def grouped_decode_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scaling: float
) -> torch.Tensor:
    """(rows, 1, heads, value_dim) attention of one query token per row, as transformers' attention
    functions return it.

    ``query``: (rows, heads, 1, d); ``key``/``value``: (rows, kv_heads, slots, d / value_dim), ``heads`` a
    multiple of ``kv_heads``; ``mask``: None or bool (rows, 1 or heads, 1, slots), True where a query
    head may attend.
    """
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    grouped = query.reshape(rows, kv_heads, group, dim)
    if mask is not None and mask.shape[1] != 1:
        mask = mask.reshape(rows, kv_heads, group, mask.shape[-1])
    output = F.scaled_dot_product_attention(grouped, key, value, attn_mask=mask, scale=scaling)
    return output.reshape(rows, heads, 1, value.shape[-1]).transpose(1, 2).contiguous()


def split_decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None,
    chunk: int = SPLIT_CHUNK,
) -> torch.Tensor:
    """:func:`grouped_decode_attention` (same arguments, same output) over chunks of ``chunk`` slots.

    Scores, softmax statistics and the combine are float32 (:func:`_float_matmul`); the output has the
    query's dtype. The slots past the last whole chunk are one shorter chunk. A query head that sees no
    slot gets zeros, as SDPA returns. ``scaling`` None: SDPA's default, ``head_dim ** -0.5``.
    """
    rows, heads, _, dim = query.shape
    kv_heads, slots = key.shape[1], key.shape[2]
    group = heads // kv_heads
    grouped = query.reshape(rows, kv_heads, group, dim)
    scores = _float_matmul(grouped, key.transpose(-1, -2)) * (dim**-0.5 if scaling is None else scaling)
    if mask is not None:
        if mask.shape[1] != 1:
            mask = mask.reshape(rows, kv_heads, group, slots)
        scores = scores.masked_fill(~mask, -torch.inf)
    return chunked_attention(scores, value, chunk).reshape(rows, 1, heads, -1).to(query.dtype)


def chunked_attention(scores: torch.Tensor, value: torch.Tensor, chunk: int = SPLIT_CHUNK) -> torch.Tensor:
    """(rows, kv_heads, group, value_dim) float32: softmax(``scores``) @ ``value`` over chunks of ``chunk``
    slots, each attended apart and combined by log-sum-exp in a fixed order.

    ``scores``: (rows, kv_heads, group, slots) float32, scaled, -inf where a query may not attend;
    ``value``: (rows, kv_heads, slots, value_dim). Absorbed MLA attends its latent slots with it too.
    """
    slots = scores.shape[-1]
    whole = slots - slots % chunk
    parts = [_chunk_partials(scores[..., :whole].unflatten(-1, (whole // chunk, chunk)), value[:, :, :whole])]
    if whole < slots:
        parts.append(_chunk_partials(scores[..., whole:].unsqueeze(-2), value[:, :, whole:]))
    peak, total, output = (torch.cat(part, dim=3) for part in zip(*parts, strict=True))
    weight = torch.exp(peak - _finite(peak.amax(-1, keepdim=True)))  # 0 for a chunk that sees no slot
    total = (total * weight).sum(-1, keepdim=True)
    return (output * weight.unsqueeze(-1)).sum(-2) / total.masked_fill(total == 0, 1)


def _chunk_partials(
    scores: torch.Tensor, value: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each chunk's max score, sum of exp(score - max) and exp(score - max)-weighted values.

    ``scores``: (rows, kv_heads, group, chunks, chunk) float32; ``value``: (rows, kv_heads, chunks *
    chunk, value_dim). Returns (rows, kv_heads, group, chunks) twice and (..., chunks, value_dim).
    """
    peak = scores.amax(-1)
    weights = torch.exp(scores - _finite(peak).unsqueeze(-1))
    value = value.unflatten(2, scores.shape[3:])  # (rows, kv_heads, chunks, chunk, value_dim)
    if _mixes(value):  # as flash attention does: the weights in the values' precision
        weights = weights.to(value.dtype)
    weighted = _float_matmul(weights.transpose(2, 3), value).transpose(2, 3)
    return peak, weights.float().sum(-1), weighted


def _mixes(tensor: torch.Tensor) -> bool:
    """Whether half-precision CUDA matrices multiply as they are into float32 (``aten.bmm.dtype``)."""
    half = tensor.dtype in (torch.bfloat16, torch.float16)
    return half and tensor.is_cuda and hasattr(torch.ops.aten.bmm, "dtype")


def _float_matmul(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """``first @ second`` (batched alike) in float32. Half-precision CUDA inputs are multiplied as they
    are with float32 accumulation and results (each held byte read once, in its own precision);
    elsewhere both are cast to float32 first (a copy)."""
    if not _mixes(second):
        return first.float() @ second.float()
    batch, rows, columns = first.shape[:-2], first.shape[-2], second.shape[-1]
    flat = (first.reshape(-1, rows, first.shape[-1]), second.reshape(-1, *second.shape[-2:]))
    return _bmm_float32(*flat).reshape(*batch, rows, columns)


def _bmm_float32(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Batched half-precision ``first @ second`` accumulated and returned in float32 (CUDA)."""
    return torch.ops.aten.bmm.dtype(first, second, torch.float32)


def _finite(peak: torch.Tensor) -> torch.Tensor:
    """0 where nothing was visible (-inf), so that exp(-inf - peak) is 0 rather than NaN."""
    return peak.masked_fill(torch.isneginf(peak), 0)
