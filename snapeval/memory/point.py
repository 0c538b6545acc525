"""``python -m snapeval job=memory [memory.key=value ...]``: one memory estimate, stored and printed.

A Hydra multirun over ``memory.*`` (``+exp=memory_sweep``) stores one row per point in the
``memory_estimates`` table of the results database, for figures of accuracy against memory saved.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from snapeval.errors import SnapevalError
from snapeval.memory.estimate import MemoryEstimate, estimate
from snapeval.memory.report import render
from snapeval.paths import CONF_DIR

KEYS = ("model", "hardware", "context", "batch", "tp", "budget", "method", "kv_dtype", "weights_dtype")
"""The estimator's settings: the keys of ``conf/memory/default.yaml`` and of ``python -m snapeval.memory``."""
NAME_KEYS = ("model", "hardware")
REQUIRED = ("model", "hardware", "context")


def default_hardware() -> str:
    """The hardware an estimate is for unless told: ``conf/memory/default.yaml``'s."""
    return yaml.safe_load((CONF_DIR / "memory" / "default.yaml").read_text(encoding="utf-8"))["hardware"]


def run_memory_point(config: dict) -> str:
    """Estimate the memory of ``config["memory"]``, store it at ``config["run"]["db"]``, return its tables."""
    from snapeval.results import ResultsDB

    memory = config["memory"]
    result = estimate_memory(memory)
    with ResultsDB(config["run"]["db"]) as db:
        db.add_memory_estimate(memory, result.as_row())
    return render(result)


def estimate_memory(memory: Mapping[str, Any], node: str = "memory.") -> MemoryEstimate:
    """The estimate of the settings ``memory`` (checked by :func:`check_memory`); a bad value is reported
    as ``<node><key>`` (``memory.context`` in a config; ``context`` on the estimator's command line)."""
    check_memory(memory, node)
    try:
        return estimate(**memory)
    except SnapevalError as exc:
        if exc.field not in KEYS:
            raise
        raise SnapevalError(str(exc).removeprefix(f"{exc.field}: "), f"{node}{exc.field}") from exc


def check_memory(memory: Mapping[str, Any], node: str = "memory.") -> None:
    """Raise on an unknown key, a missing required value, or a model or hardware that is not a name."""
    for key in memory:
        if key not in KEYS:
            raise SnapevalError(f"unknown key; choose from {', '.join(KEYS)}", f"{node}{key}")
    for key in REQUIRED:
        if memory.get(key) is None:
            raise SnapevalError("required", f"{node}{key}")
    for key in NAME_KEYS:
        if not isinstance(memory[key], str):
            raise SnapevalError(f"expected a name, got {memory[key]!r}", f"{node}{key}")
