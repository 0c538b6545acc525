"""``python -m snapeval job=memory [memory.key=value ...]``: one memory estimate, stored and printed.

A Hydra multirun over ``memory.*`` (``+exp=memory_sweep``) stores one row per point in the
``memory_estimates`` table of the results database, for figures of accuracy against memory saved.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from snapeval.errors import SnapevalError
from snapeval.memory.cli import KEYS
from snapeval.memory.estimate import MemoryEstimate, estimate
from snapeval.memory.report import render
from snapeval.results import ResultsDB

NAME_KEYS = ("model", "hardware")
REQUIRED = ("model", "hardware", "context")


def run_memory_point(config: dict) -> str:
    """Estimate the memory of ``config["memory"]``, store it at ``config["run"]["db"]``, return its tables."""
    memory = config["memory"]
    result = estimate_memory(memory)
    with ResultsDB(config["run"]["db"]) as db:
        db.add_memory_estimate(memory, result.as_row())
    return render(result)


def estimate_memory(memory: Mapping[str, Any]) -> MemoryEstimate:
    """The estimate of a ``memory`` config; a bad value is reported as ``memory.<key>``."""
    check_memory_config(memory)
    try:
        return estimate(**memory)
    except SnapevalError as exc:
        if exc.field not in KEYS:
            raise
        raise SnapevalError(str(exc).removeprefix(f"{exc.field}: "), f"memory.{exc.field}") from exc


def check_memory_config(memory: Mapping[str, Any]) -> None:
    """Raise on an unknown key, a missing required value, or a model or hardware that is not a name."""
    for key in memory:
        if key not in KEYS:
            raise SnapevalError(f"unknown key; choose from {', '.join(KEYS)}", f"memory.{key}")
    for key in REQUIRED:
        if memory.get(key) is None:
            raise SnapevalError("required", f"memory.{key}")
    for key in NAME_KEYS:
        if not isinstance(memory[key], str):
            raise SnapevalError(f"expected a name, got {memory[key]!r}", f"memory.{key}")
