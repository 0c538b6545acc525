"""The decode step's attention over a layer's held slots: each KV head's keys and values read once.

transformers' SDPA path copies every KV head's keys and values to each query head of its group
(``repeat_kv``) whenever a mask is passed (under ``torch.compile`` always), and the engine always passes
one at decode: which slots a row holds. For one query token per row the copies are not needed: the query
heads of a GQA group are stacked as that KV head's query rows, ``(rows, kv_heads, group, head_dim)``, and
attend to the KV head's slots with the row's mask, which is the same computation (every query head sees
the same slots of its KV head) reading each held byte once. No dense float mask, no atomics: the same
call gives the same bits, and a row's output depends only on that row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
