"""Checks of single cache parameter values, each refusing a bad one in one line naming its field."""

from __future__ import annotations

import json
from typing import Any

from snapeval.errors import SnapevalError

MAX_SLOTS = 2**24
"""The most slots a cache parameter (a budget, a window, a ring, ...) may count: 16,777,216 positions, more
than any model's window; a larger one is refused before a model loads, not when its rows are allocated."""
POOLINGS = ("max", "avg")
GQA_REDUCTIONS = ("mean", "max")


def press_arguments(press_args: str) -> dict[str, Any]:
    """A kvpress press's ``press_args`` read as a JSON object."""
    takes = f'must be a JSON object such as {{"name": 1}}, got {press_args!r}'
    try:
        arguments = json.loads(press_args)
    except (TypeError, ValueError) as error:
        raise SnapevalError(f"{takes} ({error})", "cache.press_args") from None
    if not isinstance(arguments, dict):
        raise SnapevalError(takes, "cache.press_args")
    return arguments


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
    check_slots(budget, "cache.budget")


def check_slots(value: int | None, field: str) -> None:
    """At most :data:`MAX_SLOTS` (null: none)."""
    if isinstance(value, int) and value > MAX_SLOTS:
        raise SnapevalError(
            f"must be at most {MAX_SLOTS:,} slots (more positions than any model has), got {value}", field
        )


def check_snapkv_scoring(window: int, kernel: int, pooling: str, gqa_reduce: str) -> None:
    if not isinstance(window, int) or window <= 0:
        raise SnapevalError(f"must be a positive integer, got {window}", "cache.window")
    check_slots(window, "cache.window")
    check_odd(kernel, "cache.kernel")
    check_choice(pooling, POOLINGS, "pooling", "cache.pooling")
    check_choice(gqa_reduce, GQA_REDUCTIONS, "reduction", "cache.gqa_reduce")


def check_count(value: int, field: str, minimum: int) -> None:
    if not isinstance(value, int) or value < minimum:
        raise SnapevalError(f"must be an integer >= {minimum}, got {value}", field)
    check_slots(value, field)


def check_fraction(value: float, field: str, lowest: float) -> None:
    """A number in [``lowest``, 1]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not lowest <= value <= 1:
        raise SnapevalError(f"must be a number in [{lowest:g}, 1], got {value!r}", field)


def check_odd(value: int, field: str) -> None:
    if not isinstance(value, int) or value <= 0 or value % 2 == 0:
        raise SnapevalError(f"must be a positive odd integer, got {value}", field)
    check_slots(value, field)


def check_choice(value: str, choices: tuple[str, ...], what: str, field: str) -> None:
    if value not in choices:
        raise SnapevalError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}", field)
