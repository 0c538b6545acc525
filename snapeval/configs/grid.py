"""A grid of cache settings, evaluated from one prefill per sample: the ``grid`` key of the config.

::

    grid:
      cache: [full, streaming_llm, snapkv, snapstream]   # options of the cache group (methods)
      params: {budget: [192, 384, 768], window: 16}      # a list is swept, a value is fixed
      share_prefill: true                                # false: every point alone (to time one point)

Each point is the cache group option's config (its method's dataclass, :mod:`snapeval.configs.cache`)
with the grid's parameters applied, exactly the cache that ``python -m snapeval cache=<option>
cache.<param>=<value> ...`` composes, so it is stored under the very config hash a run of that point
alone would have. A parameter a method does not take leaves it out (the full cache ignores budgets), so
points that end up equal are evaluated once. Nothing here loads torch.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping
from typing import Any

from snapeval.configs.methods import METHODS, missing_extra, parameter_names
from snapeval.configs.setting import effective_params
from snapeval.errors import SnapevalError

GRID_KEYS = ("cache", "params", "share_prefill")
MAX_GRID_POINTS = 1_000
"""The most points one grid runs: every point is a stored run and a request per prompt, made before the
first sample (their caches are filled :data:`snapeval.run.workers.SETTINGS_PER_PREFILL` settings at a time);
a larger sweep is several grids (or a ``-m`` sweep over one of its parameters)."""
SCALARS = (str, int, float, bool, type(None))


def _shipped(name: Any) -> dict[str, Any] | None:
    """The cache config of group option ``name`` (a built-in method's declared defaults, as Hydra composes
    them), or None if none."""
    params = METHODS.get(name) if isinstance(name, str) else None
    return {f.name: f.default for f in dataclasses.fields(params)} if params is not None else None


def _option(name: Any) -> dict[str, Any]:
    """The cache config of group option ``name``; an error naming ``grid.cache`` if there is none."""
    option = _shipped(name)
    if option is None:
        raise SnapevalError(
            f"no cache config {name!r}; choose from {', '.join(sorted(METHODS))}", "grid.cache"
        )
    return option


def check_grid(cfg: Mapping[str, Any]) -> None:
    """Reject a malformed ``grid`` (its type, unknown keys, options, parameters, values that are not a
    value or a list of values, more than :data:`MAX_GRID_POINTS` points) before any model work."""
    grid = cfg.get("grid")
    if grid is None:
        return
    if not isinstance(grid, Mapping):
        raise SnapevalError(f"must be a mapping with keys {', '.join(GRID_KEYS)}, got {grid!r}", "grid")
    for key in grid:
        if key not in GRID_KEYS:
            raise SnapevalError(f"unknown key; the grid takes {', '.join(GRID_KEYS)}", f"grid.{key}")
    options = grid.get("cache")
    if not isinstance(options, list) or not options:
        raise SnapevalError(f"must be a non-empty list of cache configs, got {options!r}", "grid.cache")
    if not isinstance(grid.get("share_prefill", True), bool):
        raise SnapevalError("must be true or false", "grid.share_prefill")
    methods = {_option(name)["method"] for name in options}
    accepted = {name for method in methods for name in parameter_names(METHODS[method])}
    for name, values in _params(grid).items():
        if name not in accepted:
            known = ", ".join(sorted(methods))
            raise SnapevalError(f"no method of this grid ({known}) takes it", f"grid.params.{name}")
        if isinstance(values, list) and not values:
            raise SnapevalError("an empty list leaves no point to run", f"grid.params.{name}")
        listed = values if isinstance(values, list) else [values]
        if not all(isinstance(value, SCALARS) for value in listed):
            raise SnapevalError(f"must be a value or a list of values, got {values!r}", f"grid.params.{name}")
    if (count := point_count(grid)) > MAX_GRID_POINTS:
        raise too_many_points(f"{count:,} points")
    cache = dict(cfg.get("cache") or {})
    shipped = _shipped(cache.get("method"))
    if shipped is not None and cache != shipped:
        raise SnapevalError("a grid takes its cache settings from grid.params, not from cache.*", "cache")


def _params(grid: Mapping[str, Any]) -> Mapping[str, Any]:
    """``grid.params``: a mapping of parameter names to a value or a list of values (null: none)."""
    params = grid.get("params")
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        message = f"must be a mapping of parameters to a value or a list of values, got {params!r}"
        raise SnapevalError(message, "grid.params")
    return params


def point_count(grid: Mapping[str, Any]) -> int:
    """How many points ``grid`` has at most (its distinct options, each swept over the parameters its
    method takes), counted without making them."""
    swept = {name: len(values) for name, values in _params(grid).items() if isinstance(values, list)}
    takes = [parameter_names(METHODS[_option(option)["method"]]) for option in dict.fromkeys(grid["cache"])]
    return sum(math.prod(n for name, n in swept.items() if name in names) for names in takes)


def too_many_points(size: str) -> SnapevalError:
    """The error of a grid of ``size`` (say ``10,000 points``), larger than :data:`MAX_GRID_POINTS`."""
    return SnapevalError(
        f"{size}; a grid runs at most {MAX_GRID_POINTS:,}: split it into smaller grids", "grid"
    )


def longest_list(text: str) -> int:
    """The most items in one bracketed list (``[a, b, ...]``) of an override's text, quoted text
    skipped: a grid's size told before Hydra's parser, which takes seconds on a list of thousands, reads
    it. Linear in the text."""
    open_lists: list[int] = []  # for each open bracket, its items so far (-1: a mapping's braces)
    longest, quote = 0, ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            open_lists.append(1 if char == "[" else -1)
        elif char == "," and open_lists and open_lists[-1] > 0:
            open_lists[-1] += 1
        elif char in "]}" and open_lists:
            longest = max(longest, open_lists.pop())
    return longest


def grid_points(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The configs of the grid's points (each without ``grid``), in order, equal points once; without a
    grid, the config itself. A point whose settings are impossible is kept: running it reports why."""
    grid = cfg.get("grid")
    base = {key: value for key, value in cfg.items() if key != "grid"}
    if grid is None:
        return [base]
    params = _params(grid)
    swept = {name: value if isinstance(value, list) else [value] for name, value in params.items()}
    points, seen = [], set()
    for option in grid["cache"]:
        shipped = _option(option)
        if missing_extra(shipped["method"]):
            continue  # preflight says so once (skipped_options)
        # a parameter the method does not take is left out: the point is that method's own config
        taken = {name: values for name, values in swept.items() if name in shipped}
        for values in itertools.product(*taken.values()):  # linear in the points: no product of the rest
            cache = {**shipped, **dict(zip(taken, values, strict=True))}
            try:
                effective = tuple(sorted(effective_params(cache).items()))
            except SnapevalError:
                effective = tuple(sorted(cache.items()))
            if effective not in seen:
                seen.add(effective)
                points.append({**base, "cache": cache})
    return points


def skipped_options(cfg: Mapping[str, Any]) -> dict[str, str]:
    """The grid's cache options left out here, each with why: the optional extra it needs is missing."""
    options = (cfg.get("grid") or {}).get("cache") or []
    return {option: why for option in options if (why := missing_extra(_option(option)["method"]))}


def shares_prefill(cfg: Mapping[str, Any]) -> bool:
    """Whether the grid's points share one prefill per sample (and decode together)."""
    return bool((cfg.get("grid") or {}).get("share_prefill", True))
