"""The cache methods' parameters: one dataclass per built-in method, the ``cache`` node of the config.

Each dataclass is a method's single declaration of its parameters, their types, defaults and checks
(``__post_init__``, one :class:`~snapeval.errors.SnapevalError` naming ``cache.<field>``). Hydra
composes them from its ConfigStore (``cache=snapstream cache.budget=256``, :func:`register_caches`),
the engine's classes take their parameters from them (``params_class``), and results store what
:func:`effective_params` makes of them. Every method has ``budget`` and ``ratio``, so that one sweep can
give a budget to all; a method that takes neither ignores them (``setting(stored=False)``). Nothing
here imports torch: a bad parameter is refused before any model loads.
"""

from __future__ import annotations

import importlib
import json
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from snapeval.configs.fields import setting
from snapeval.errors import SnapevalError

DEFAULT_BUDGET = 1024
"""Slots per layer and KV head of every budgeted method unless a command line says otherwise."""
SELF_DRAFT = "self"
"""The speculative prefill draft that is the target model itself."""
POOLINGS = ("max", "avg")
GQA_REDUCTIONS = ("mean", "max")


def ignored() -> Any:
    """A field the method takes no notice of (a sweep may give it to every method): never stored."""
    return setting(None, stored=False, help="ignored by this method")


@dataclass
class Full:
    """Full KV cache: keeps every prompt token and appends every generated one; the reference every
    compressed method is measured against. No parameters (``budget`` and ``ratio`` are ignored)."""

    method: str = "full"
    budget: int | None = ignored()
    ratio: float | None = ignored()


@dataclass
class StreamingLLM:
    """StreamingLLM (arXiv:2309.17453): the first ``sinks`` tokens and a ring of the most recent
    ``budget - sinks`` tokens, which each generated token advances. ``rerotate`` gives keys their position
    inside the cache, as the original does.

    Defaults: budget 1024, sinks 4, rerotate false. ``ratio`` instead of ``budget`` sizes the cache as
    ``ceil(ratio * prompt length)``.
    """

    method: str = "streaming_llm"
    budget: int | None = DEFAULT_BUDGET
    ratio: float | None = None
    sinks: int = 4
    rerotate: bool = False

    def __post_init__(self) -> None:
        check_count(self.sinks, "cache.sinks", 0)
        check_budget(self.budget, self.ratio, self.sinks, "cache.sinks")
        if not isinstance(self.rerotate, bool):
            raise SnapevalError(f"must be true or false, got {self.rerotate!r}", "cache.rerotate")


@dataclass
class SnapKV:
    """SnapKV (arXiv:2404.14469): at the end of prefill, keep the last ``window`` prompt tokens and the
    ``budget - window`` tokens those queries attend to most (attention pooled with ``kernel``/``pooling``,
    reduced over each GQA group by ``gqa_reduce``); generated tokens are appended.

    Defaults: budget 1024, window 32, kernel 7, pooling max, gqa_reduce mean. ``ratio`` instead of
    ``budget`` keeps ``ceil(ratio * prompt length)`` tokens.
    """

    method: str = "snapkv"
    budget: int | None = DEFAULT_BUDGET
    ratio: float | None = None
    window: int = 32
    kernel: int = 7
    pooling: str = "max"
    gqa_reduce: str = "mean"

    def __post_init__(self) -> None:
        check_snapkv_scoring(self.window, self.kernel, self.pooling, self.gqa_reduce)
        check_budget(self.budget, self.ratio, self.window, "cache.window")


@dataclass
class SnapStream:
    """SnapStream: a fixed cache of ``budget`` slots; ``budget - ring`` hold the prompt (the first
    ``sinks``, the last ``window`` and the best of the rest by SnapKV's scores), the other ``ring`` slots
    a ring of generated tokens that overwrites its oldest.

    Defaults: budget 1024, window 32, kernel 7, pooling max, sinks 4, ring 64, gqa_reduce mean.
    ``ratio`` instead of ``budget`` sizes the cache as ``ceil(ratio * prompt length)``.
    """

    method: str = "snapstream"
    budget: int | None = DEFAULT_BUDGET
    ratio: float | None = None
    window: int = 32
    kernel: int = 7
    pooling: str = "max"
    sinks: int = 4
    ring: int = 64
    gqa_reduce: str = "mean"

    def __post_init__(self) -> None:
        check_snapkv_scoring(self.window, self.kernel, self.pooling, self.gqa_reduce)
        check_count(self.sinks, "cache.sinks", 0)
        check_count(self.ring, "cache.ring", 1)
        reserved = self.window + self.sinks + self.ring
        check_budget(self.budget, self.ratio, reserved, "cache.window + cache.sinks + cache.ring")


@dataclass
class SageKV:
    """SAGE-KV (arXiv:2503.08879): a fixed cache of ``budget`` slots: the first ``sinks`` tokens, a
    rolling window of the ``recent`` last ones, and the candidates in between that the last ``window``
    prompt queries attend to most, per KV head (query heads reduced by ``gqa_reduce``).

    Defaults: budget 1024, sinks 4, recent 64, window 1, gqa_reduce mean. ``ratio`` instead of
    ``budget`` sizes the cache as ``ceil(ratio * prompt length)``.
    """

    method: str = "sage_kv"
    budget: int | None = DEFAULT_BUDGET
    ratio: float | None = None
    sinks: int = 4
    recent: int = 64
    window: int = 1
    gqa_reduce: str = "mean"

    def __post_init__(self) -> None:
        check_count(self.sinks, "cache.sinks", 0)
        check_count(self.recent, "cache.recent", 1)
        check_count(self.window, "cache.window", 1)
        check_choice(self.gqa_reduce, GQA_REDUCTIONS, "reduction", "cache.gqa_reduce")
        check_budget(self.budget, self.ratio, self.sinks + self.recent, "cache.sinks + cache.recent")


@dataclass
class SpeculativePrefill:
    """Speculative prefill (arXiv:2502.02789): a ``draft`` model (``self``: the target) reads the prompt;
    the target prefills only its last ``window`` tokens and the chunks of ``chunk`` tokens the draft's
    last ``window`` queries attend to most (importance average-pooled with ``kernel``), ``budget`` in all.

    Defaults: budget 1024, draft self, window 8, kernel 13, chunk 32. ``ratio`` instead of ``budget``
    keeps ``ceil(ratio * prompt length)`` tokens.
    """

    method: str = "speculative_prefill"
    budget: int | None = DEFAULT_BUDGET
    ratio: float | None = None
    draft: str = SELF_DRAFT
    window: int = 8
    kernel: int = 13
    chunk: int = 32

    def __post_init__(self) -> None:
        check_count(self.window, "cache.window", 1)
        check_count(self.chunk, "cache.chunk", 1)
        check_odd(self.kernel, "cache.kernel")
        if not isinstance(self.draft, str) or not self.draft:
            message = f"must be a model name, a Hub id or {SELF_DRAFT!r}, got {self.draft!r}"
            raise SnapevalError(message, "cache.draft")
        check_budget(self.budget, self.ratio, self.window, "cache.window")


@dataclass
class Kvpress:
    """kvpress (https://github.com/NVIDIA/kvpress): the scorer press ``press`` (a class of ``kvpress``
    with a ``score`` method, made with the JSON object ``press_args``) scores each layer's prompt tokens
    per KV head; the ``budget`` best are kept, or without a budget ``int(L * (1 - compression_ratio))``.

    Defaults: budget null, compression_ratio 0.5, press SnapKVPress, press_args {} (the press's own
    defaults). A ``budget`` replaces the ratio; ``ratio`` is ignored.
    """

    method: str = "kvpress"
    budget: int | None = None
    ratio: float | None = ignored()
    compression_ratio: float | None = 0.5
    press: str = "SnapKVPress"
    press_args: str = "{}"

    def __post_init__(self) -> None:
        budget, compression_ratio = self.budget, self.compression_ratio
        if budget is not None and (not isinstance(budget, int) or budget <= 0):
            raise SnapevalError(f"must be a positive integer or null, got {budget!r}", "cache.budget")
        ratio_ok = isinstance(compression_ratio, int | float) and 0 <= compression_ratio < 1
        if budget is None and not ratio_ok:
            raise SnapevalError(f"must be in [0, 1), got {compression_ratio!r}", "cache.compression_ratio")
        if budget is not None:
            self.compression_ratio = None  # a budget replaces it
        press_arguments(self.press_args)


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


METHODS: dict[str, type] = {
    cls.method: cls for cls in (Full, Kvpress, SageKV, SnapKV, SnapStream, SpeculativePrefill, StreamingLLM)
}
"""The built-in methods, name -> parameters: ``full`` first, the rest by name."""


def register_caches(config_store: Any) -> None:
    """Make every built-in method an option of Hydra's ``cache`` group (``cache=snapstream``)."""
    for name, params_class in METHODS.items():
        config_store.store(group="cache", name=name, node=params_class)


def params_class(method: object) -> type | None:
    """The parameters of ``method``: a built-in name (without torch), or ``package.module:ClassName``
    (its engine class's ``params_class``; None if it declares none: it takes no parameters)."""
    if isinstance(method, str) and ":" in method:
        return getattr(outside_class(method), "params_class", None)
    return METHODS[built_in(method)]


def built_in(method: object) -> str:
    """``method`` if it names a built-in method, else the one-line error naming ``cache.method``."""
    if method not in METHODS:
        raise SnapevalError(
            f"unknown method {method!r}; choose one of {', '.join(METHODS)} or give package.module:ClassName",
            "cache.method",
        )
    return str(method)


def outside_class(path: str) -> Any:
    """The class that ``package.module:ClassName`` names (a method kept outside snapeval)."""
    module_name, _, class_name = path.partition(":")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise SnapevalError(f"cannot load {path!r}: {error}", "cache.method") from None


def parameter_names(params: type | None) -> list[str]:
    """The parameters a method takes: its fields but ``method`` and those it ignores."""
    if params is None:
        return []
    return [f.name for f in fields(params) if f.name != "method" and f.metadata.get("stored", True)]


def method_params(params: type, given: Mapping[str, Any]) -> Any:
    """``params`` made from ``given`` (its fields; the checks run): a ratio given without a budget
    stands instead of the default budget, and an integer given to a number field is that number, as
    Hydra composes it (a grid's ``ratio: 1`` is stored as the ``cache.ratio=1`` of a run alone)."""
    hints = typing.get_type_hints(params)
    names = {f.name for f in fields(params)}
    given = {name: _as_typed(value, hints[name]) for name, value in given.items() if name in names}
    if given.get("ratio") is not None and "budget" not in given and "budget" in names:
        given["budget"] = None
    return params(**given)


def _as_typed(value: Any, hint: Any) -> Any:
    numbers = hint is float or float in typing.get_args(hint)
    return float(value) if numbers and isinstance(value, int) and not isinstance(value, bool) else value


def effective_params(cache: Mapping[str, Any]) -> dict[str, Any]:
    """What a cache config stands for, as results store it: its method and the parameters that method
    takes, defaults filled in, the rest dropped (two configs that make the same cache give the same)."""
    method = cache.get("method")
    params = params_class(method)
    if params is None:
        return {"method": method}
    made = method_params(params, cache)
    return {"method": method, **{name: getattr(made, name) for name in parameter_names(params)}}


def check_cache(cache: Mapping[str, Any], grid: bool = False) -> None:
    """Refuse a composed ``cache`` node with a key its method does not have (in a ``grid``: that no method
    has, the points sharing the grid's parameters) or a bad value (outside a grid, for a built-in
    method; one outside the package is checked when its module loads)."""
    method = cache.get("method")
    if grid:
        known = sorted({f.name for params in METHODS.values() for f in fields(params)})
        owner = "the caches take"
    elif isinstance(method, str) and ":" in method:
        return
    else:
        known = [f.name for f in fields(params_class(method))]
        owner = f"{method} takes"
    for key in cache:
        if key not in known:
            raise SnapevalError(f"unknown key; {owner} {', '.join(sorted(known))}", f"cache.{key}")
    if not grid:
        method_params(params_class(method), cache)


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
    check_odd(kernel, "cache.kernel")
    check_choice(pooling, POOLINGS, "pooling", "cache.pooling")
    check_choice(gqa_reduce, GQA_REDUCTIONS, "reduction", "cache.gqa_reduce")


def check_count(value: int, field: str, minimum: int) -> None:
    if not isinstance(value, int) or value < minimum:
        raise SnapevalError(f"must be an integer >= {minimum}, got {value}", field)


def check_odd(value: int, field: str) -> None:
    if not isinstance(value, int) or value <= 0 or value % 2 == 0:
        raise SnapevalError(f"must be a positive odd integer, got {value}", field)


def check_choice(value: str, choices: tuple[str, ...], what: str, field: str) -> None:
    if value not in choices:
        raise SnapevalError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}", field)


def draft_names(caches: Iterable[Mapping[str, Any]]) -> list[str]:
    """The draft models that cache configs name (``cache.draft``), the target itself left out, sorted."""
    return sorted({str(cache["draft"]) for cache in caches if cache.get("draft") not in (None, SELF_DRAFT)})
