"""KV-cache and weights arithmetic: small pure functions of a model geometry."""

from __future__ import annotations

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
    return geometry.num_layers * width * dtype_bytes(kv_dtype, "kv_dtype")


def layer_tokens(geometry: ModelGeometry, tokens: int) -> int:
    """Tokens cached summed over layers; sliding-window layers keep at most their window."""
    full_layers = geometry.num_layers - geometry.num_sliding_layers
    window = geometry.sliding_window or tokens
    return full_layers * tokens + geometry.num_sliding_layers * min(tokens, window)


def kv_bytes_per_sequence(
    geometry: ModelGeometry, tokens: int, kv_dtype: str, *, tp: int = 1, mla_latent_sharded: bool = False
) -> int:
    """KV bytes of one sequence caching ``tokens`` tokens, on one of ``tp`` ranks."""
    width = kv_width(geometry, tp, mla_latent_sharded)
    return layer_tokens(geometry, tokens) * width * dtype_bytes(kv_dtype, "kv_dtype")


def cached_tokens(method: str, context: int, budget: int | None) -> int:
    """Tokens a method holds per layer for a ``context``-token sequence: the slots its cache class says a
    row needs (:meth:`~snapeval.cache.base.SnapevalCache.decode_slots`), so the estimate is the engine's.

    ``full`` keeps them all; SnapStream, StreamingLLM and SAGE-KV preallocate ``budget`` slots; SnapKV
    keeps at most ``budget``.
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
