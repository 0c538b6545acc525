"""What a row holds, in one place: the slots of each layer (:func:`layer_slots`, summed over a model's
layers by :func:`row_slots`), the bytes of one slot (:func:`slot_bytes`) and of one element by dtype name
(:data:`ELEMENT_BYTES`), and what ``cache.kv_dtype`` stores keys and values in (:data:`KV_STORAGE`,
:func:`kv_element_bytes`).

A row is one sequence's cache: a single-sequence cache's layer, a slot row of continuous batching, or the
memory estimator's sequence. It holds ``slots`` tokens in every full layer, the number its method says
(:meth:`~snapeval.cache.method.CacheMethod.decode_slots`: the context for ``full``, the budget a fixed cache
preallocates, ``budget + buffer`` for a row R-KV or SnapStream re-selects while decoding); a layer with a
sliding window (Gemma 2/3 local layers, Mistral, GPT-OSS) holds at most its window. One slot of one layer
is, in each of ``heads`` KV heads, a key of ``key_dim`` elements and a value of ``value_dim``: most models
cache ``num_key_value_heads`` heads of ``head_dim`` both (on one of ``tp`` ranks, that rank's heads); MLA
caches one head whose key is the ``kv_lora_rank`` latent and whose value the ``qk_rope_head_dim`` rotary
key. The head count is an argument, never read here from a config, so a rank's share counts the same way.

Torch-free and on the first floor, so that every user imports it: the engine's layers and batch rows
(:mod:`snapeval.cache.layer`, :mod:`snapeval.cache.slots`: the slots they allocate and the ``kv_bytes`` a
result stores), the batcher's check that its rows fit before it allocates them
(:mod:`snapeval.decode.batch_rows`), and the memory estimator (:mod:`snapeval.memory.kv`), whose bytes
per sequence the reports read.
"""

from __future__ import annotations

from collections.abc import Iterable

ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp8_e4m3": 1, "int8": 1}
"""Bytes of one element of each dtype by name: the memory estimator's ``kv_dtype`` and ``weights_dtype``,
and every ``cache.kv_dtype``."""
KV_STORAGE = {"fp8_e4m3": "float8_e4m3fn"}
"""Each ``cache.kv_dtype`` and the torch dtype (its name in torch) the engine stores keys and values in
(null, not listed: the model's own dtype)."""


def layer_slots(window: int | None, slots: int | None) -> int | None:
    """Slots one layer holds of a row of ``slots`` (None: a layer that grows): all of them on a full layer
    (``window`` None), ``min(window, slots)`` on a layer with a sliding ``window`` (its window if it would
    grow)."""
    if window is None:
        return slots
    return window if slots is None else min(window, slots)


def row_slots(slots: int, windows: Iterable[int | None]) -> int:
    """Slots a row of ``slots`` holds summed over layers of sliding ``windows`` (None: a full layer), each
    layer's by :func:`layer_slots`."""
    return sum(layer_slots(window, slots) for window in windows)


def slot_bytes(heads: int, key_dim: int, value_dim: int, element_bytes: int) -> int:
    """Bytes of one slot of one layer: ``heads`` KV heads of a ``key_dim`` key and a ``value_dim`` value,
    ``element_bytes`` each."""
    return heads * (key_dim + value_dim) * element_bytes


def kv_element_bytes(kv_dtype: str | None, model_bytes: int) -> int:
    """Bytes of one stored key or value element under ``cache.kv_dtype`` (None: the model's own,
    ``model_bytes``)."""
    return model_bytes if kv_dtype is None else ELEMENT_BYTES[kv_dtype]
