"""KV-cache and weights arithmetic: small pure functions of a model geometry."""

from __future__ import annotations

from snapeval.configs.cache import FULL
from snapeval.configs.footprint import row_slots, slot_bytes
from snapeval.errors import SnapevalError
from snapeval.memory.geometry import ModelGeometry
from snapeval.memory.units import dtype_bytes

SNAPSTREAM = "snapstream"


def ceil_div(numerator: int, denominator: int) -> int:
    """``ceil(numerator / denominator)`` in integers."""
    return -(-numerator // denominator)


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """KV heads on one of ``tp`` ranks: an even split, or ``ceil(kv_heads / tp)`` with replicated heads."""
    return ceil_div(num_kv_heads, tp)


def slot_shape(
    geometry: ModelGeometry, tp: int = 1, mla_latent_sharded: bool = False
) -> tuple[int, int, int]:
    """(KV heads, key width, value width) of one slot on one of ``tp`` ranks, as the engine caches them
    (:func:`snapeval.configs.footprint.slot_bytes`): the rank's KV heads (:func:`kv_heads_per_rank`) of
    ``head_dim`` keys and values; MLA one head of the ``kv_lora_rank`` latent and its ``qk_rope_head_dim``
    rotary key (split together over the ranks when the latent is sharded)."""
    if geometry.is_mla:
        if mla_latent_sharded:
            return 1, ceil_div(geometry.kv_lora_rank + geometry.qk_rope_head_dim, tp), 0
        return 1, geometry.kv_lora_rank, geometry.qk_rope_head_dim
    return kv_heads_per_rank(geometry.num_kv_heads, tp), geometry.head_dim, geometry.head_dim


def layer_windows(geometry: ModelGeometry) -> list[int | None]:
    """Each layer's sliding window, None on a full layer (full layers first: only the count matters)."""
    sliding = geometry.num_sliding_layers
    return [None] * (geometry.num_layers - sliding) + [geometry.sliding_window] * sliding


def kv_bytes_per_sequence(
    geometry: ModelGeometry, tokens: int, kv_dtype: str, *, tp: int = 1, mla_latent_sharded: bool = False
) -> int:
    """KV bytes of one sequence caching ``tokens`` tokens, on one of ``tp`` ranks: the slots it holds
    over layers, windows included, times the bytes of a slot (:mod:`snapeval.configs.footprint`)."""
    per_slot = slot_bytes(*slot_shape(geometry, tp, mla_latent_sharded), dtype_bytes(kv_dtype, "kv_dtype"))
    return row_slots(tokens, layer_windows(geometry)) * per_slot


def kv_bytes_per_token(
    geometry: ModelGeometry, kv_dtype: str, *, tp: int = 1, mla_latent_sharded: bool = False
) -> int:
    """KV bytes one token adds over all layers, on one of ``tp`` ranks (the whole model for tp=1)."""
    return kv_bytes_per_sequence(geometry, 1, kv_dtype, tp=tp, mla_latent_sharded=mla_latent_sharded)


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


def weights_bytes(geometry: ModelGeometry, weights_dtype: str, tp: int = 1) -> int:
    """Weight bytes on one of ``tp`` ranks: the parts the family's TP plan leaves whole
    (:attr:`~snapeval.memory.geometry.ModelGeometry.replicated`) on every rank, the rest split evenly."""
    size = dtype_bytes(weights_dtype, "weights_dtype")
    whole = min(geometry.replicated_parameters, geometry.num_parameters) if tp > 1 else 0
    return whole * size + ceil_div((geometry.num_parameters - whole) * size, tp)
