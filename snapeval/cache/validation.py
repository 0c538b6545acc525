"""Parameter checks shared by the cache methods: each failure is one SnapevalError naming the field."""

from __future__ import annotations

from snapeval.cache.scoring import GQA_REDUCTIONS, POOLINGS
from snapeval.errors import SnapevalError


def check_budget(budget: int | None, ratio: float | None, reserved: int, reserved_what: str) -> None:
    """Exactly one of ``budget`` (slots) or ``ratio`` (kept share of the prompt); budget > reserved."""
    if (budget is None) == (ratio is None):
        raise SnapevalError(
            "give exactly one of cache.budget (slots) or cache.ratio (share kept)", "cache.budget"
        )
    if ratio is not None and not 0 < ratio <= 1:
        raise SnapevalError(f"must be in (0, 1], got {ratio}", "cache.ratio")
    if budget is not None and (not isinstance(budget, int) or budget <= reserved):
        raise SnapevalError(
            f"must be an integer larger than {reserved_what} = {reserved}, got {budget}", "cache.budget"
        )


def check_snapkv_scoring(window: int, kernel: int, pooling: str, gqa_reduce: str) -> None:
    if not isinstance(window, int) or window <= 0:
        raise SnapevalError(f"must be a positive integer, got {window}", "cache.window")
    if not isinstance(kernel, int) or kernel <= 0 or kernel % 2 == 0:
        raise SnapevalError(f"must be a positive odd integer, got {kernel}", "cache.kernel")
    if pooling not in POOLINGS:
        raise SnapevalError(
            f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}", "cache.pooling"
        )
    if gqa_reduce not in GQA_REDUCTIONS:
        raise SnapevalError(
            f"unknown reduction {gqa_reduce!r}; choose one of {', '.join(GQA_REDUCTIONS)}", "cache.gqa_reduce"
        )


def check_count(value: int, field: str, minimum: int) -> None:
    if not isinstance(value, int) or value < minimum:
        raise SnapevalError(f"must be an integer >= {minimum}, got {value}", field)
