"""What every kind of gate checks its spec entry with: numbers, the overrides that set the cache and those
that must not, the config an entry's overrides compose, one evaluation of one setting, an error located in
the spec, and the samples a config stored."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from snapeval.configs import legacy
from snapeval.configs.cache import FULL
from snapeval.configs.compose import compose_config
from snapeval.errors import SnapevalError
from snapeval.results import ResultsDB, identity

CACHE_OVERRIDE = re.compile(r"(\+{1,2}|~)?cache(\.[\w.]+)?(=.*)?", flags=re.DOTALL)
"""An override of the cache (``cache=NAME``, ``cache.KEY=VALUE``, with Hydra's ``+``, ``++`` or ``~``)."""


def finite(value: object) -> bool:
    """A real number, neither NaN nor infinite (YAML's ``.nan``, ``.inf``), nor a boolean."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_entry(spec: object, fields: tuple[str, ...], where: str) -> list[Any]:
    """The values of ``fields`` of one spec entry, which must have exactly those keys and a non-empty
    ``name``."""
    if not isinstance(spec, Mapping) or set(spec) != set(fields):
        raise SnapevalError(f"must be a mapping with exactly the keys {', '.join(fields)}", where)
    if not isinstance(spec["name"], str) or not spec["name"]:
        raise SnapevalError(f"must be a non-empty string, got {spec['name']!r}", f"{where}.name")
    return [spec[field] for field in fields]


def check_overrides(overrides: object, where: str) -> None:
    if not isinstance(overrides, list) or not all(isinstance(item, str) for item in overrides):
        raise SnapevalError(f"must be a list of Hydra overrides, got {overrides!r}", where)


def check_counts(min_retained: object, min_n: object, where: str) -> None:
    """``min_retained``: a finite number >= 0; ``min_n``: a positive integer."""
    if not finite(min_retained) or min_retained < 0:  # NaN or inf: a gate that cannot fail, or pass
        message = f"must be a number >= 0 and finite, got {min_retained!r}"
        raise SnapevalError(message, f"{where}.min_retained")
    if isinstance(min_n, bool) or not isinstance(min_n, int) or min_n < 1:
        raise SnapevalError(f"must be a positive integer, got {min_n!r}", f"{where}.min_n")


def check_sides(task: list[str], cache: list[str], where: str) -> None:
    """The compressed side sets the cache and nothing else; the task, which the full cache runs too,
    never sets it."""
    if not cache:
        message = "must set the compressed cache (cache=NAME, cache.KEY=VALUE), got []"
        raise SnapevalError(message, f"{where}.cache")
    for override in cache:
        if not CACHE_OVERRIDE.fullmatch(override):
            message = (
                f"{override!r} is not a cache setting: give cache=NAME and cache.KEY=VALUE overrides only"
            )
            raise SnapevalError(message, f"{where}.cache")
    for override in task:
        if CACHE_OVERRIDE.fullmatch(override):
            message = (
                f"{override!r} sets the cache, which the full-cache run would take too: give it in cache"
            )
            raise SnapevalError(message, f"{where}.task")


def gate_config(overrides: tuple[str, ...], db_url: str) -> dict[str, Any]:
    """The run config of ``overrides``, storing its samples at ``db_url``."""
    config = compose_config(*legacy.rewrite(list(overrides)))
    config["run"]["db"] = db_url
    return config


def one_setting(config: Mapping[str, Any], side: str) -> None:
    """Refuse a gate's config that is not one evaluation of one cache setting, and a compressed side
    (``side`` ``cache``) that is the full cache."""
    if config["job"] != "evaluate":
        raise SnapevalError(f"a gate runs two evaluations, not job={config['job']}", "job")
    if config.get("grid") is not None:
        raise SnapevalError("a gate runs one cache setting, not a grid: give each point its own gate", "grid")
    if side == "cache" and config["cache"].get("method") == FULL:
        raise SnapevalError(
            "must be a compressed cache, got full: a gate compares one with it", "cache.method"
        )


@contextmanager
def located(where: str) -> Iterator[None]:
    """Re-raise a :class:`SnapevalError` with ``where`` (a gate's entry in its spec) in front of it."""
    try:
        yield
    except SnapevalError as exc:
        raise SnapevalError(str(exc), where) from None


def stored_samples(db: ResultsDB, config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The samples stored for ``config`` (under the hash the runner stores it with)."""
    return db.samples_for(identity(config)[1])
