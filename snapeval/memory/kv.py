"""KV-cache and weights arithmetic: small pure functions of a model geometry."""

from __future__ import annotations

from collections.abc import Iterable

from snapeval.errors import SnapevalError
from snapeval.memory.geometry import ModelGeometry
from snapeval.memory.units import dtype_bytes

FULL = "full"
SNAPSTREAM = "snapstream"


def ceil_div(numerator: int, denominator: int) -> int:
    """``ceil(numerator / denominator)`` in integers."""
    return -(-numerator // denominator)


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """KV heads on one of ``tp`` ranks: an even split, or ``ceil(kv_heads / tp)`` with replicated heads."""
    return ceil_div(num_kv_heads, tp)


def kv_width(geometry: ModelGeometry, tp: int = 1, mla_latent_sharded: bool = False) -> int:
    """Elements cached per token and layer on one rank: K and V, or the MLA latent and its RoPE key."""
    if geometry.is_mla:
        latent = geometry.kv_lora_rank + geometry.qk_rope_head_dim
        return ceil_div(latent, tp) if mla_latent_sharded else latent
    return 2 * kv_heads_per_rank(geometry.num_kv_heads, tp) * geometry.head_dim


def kv_bytes_per_token(
    geometry: ModelGeometry, kv_dtype: str, *, tp: int = 1, mla_latent_sharded: bool = False
) -> int:
    """KV bytes one token adds over all layers, on one of ``tp`` ranks (the whole model for tp=1)."""
    width = kv_width(geometry, tp, mla_latent_sharded)
    return held_bytes(1, [None] * geometry.num_layers, width, dtype_bytes(kv_dtype, "kv_dtype"))


def layer_windows(geometry: ModelGeometry) -> list[int | None]:
    """Each layer's sliding window, None on a full layer (full layers first: only the count matters)."""
    sliding = geometry.num_sliding_layers
    return [None] * (geometry.num_layers - sliding) + [geometry.sliding_window] * sliding


def layer_tokens(windows: Iterable[int | None], tokens: int) -> int:
    """Tokens held summed over layers of sliding ``windows`` (None: a full layer) by a sequence of
    ``tokens``: a full layer holds them all, a windowed layer ``min(window, tokens)``."""
    return sum(tokens if window is None else min(window, tokens) for window in windows)


def held_bytes(tokens: int, windows: Iterable[int | None], width: int, element_bytes: int) -> int:
    """Bytes a sequence of ``tokens`` tokens (a decode row of ``tokens`` slots) holds in layers of sliding
    ``windows`` (:func:`layer_tokens`), ``width`` elements of ``element_bytes`` bytes per token and layer.

    The one home of a row's bytes: the estimator's KV bytes per sequence (:func:`kv_bytes_per_sequence`),
    and the batcher's memory check of its rows' keys and values, positions and valid flags
    (:func:`snapeval.decode.batch_rows.row_bytes`), which the slot cache allocates
    (:class:`snapeval.cache.slots.SlotCache`: ``min(window, capacity)`` slots on a windowed layer).
    """
    return layer_tokens(windows, tokens) * width * element_bytes


def kv_bytes_per_sequence(
    geometry: ModelGeometry, tokens: int, kv_dtype: str, *, tp: int = 1, mla_latent_sharded: bool = False
) -> int:
    """KV bytes of one sequence caching ``tokens`` tokens, on one of ``tp`` ranks (:func:`held_bytes`)."""
    width = kv_width(geometry, tp, mla_latent_sharded)
    return held_bytes(tokens, layer_windows(geometry), width, dtype_bytes(kv_dtype, "kv_dtype"))


def cached_tokens(method: str, context: int, budget: int | None) -> int:
    """Tokens a method holds per layer for a ``context``-token sequence: the slots its cache class says a
    row needs (:meth:`~snapeval.cache.base.SnapevalCache.decode_slots`), so the estimate is the engine's.

    ``full`` keeps them all; each other method of ``docs/methods.md`` what its cache class gives a row
    (``budget`` slots for most, R-KV's ``budget + buffer``).
    """
    if method == FULL:
        return context
    if budget is None:
        raise SnapevalError(f"required by method={method}", "budget")
    from snapeval.cache import build_cache  # torch loads once the arguments are known to be sound

    try:
        cache = build_cache({"method": method, "budget": budget}, strict=False)
    except SnapevalError as error:
        raise SnapevalError(str(error).removeprefix(f"{error.field}: "), "budget") from None
    return cache.decode_slots(context, 0)


def method_names() -> list[str]:
    """The methods the estimator knows: the built-in ones (their parameters' registry, without torch)."""
    from snapeval.configs.methods import METHODS

    return list(METHODS)


def weights_bytes(num_parameters: int, weights_dtype: str, tp: int = 1) -> int:
    """Weight bytes on one of ``tp`` ranks, the weights sharded evenly."""
    return ceil_div(num_parameters * dtype_bytes(weights_dtype, "weights_dtype"), tp)
