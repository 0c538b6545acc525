"""The built-in methods by name, and what configs, results and figures make of their declarations.

:data:`METHODS` maps each name to its declaration (a dataclass of :mod:`snapeval.configs.cache` with a
``label``), found there, not listed; :func:`register_caches` makes every method an option of Hydra's
``cache`` group, :func:`method_label` names it in figures and :func:`method_table` is the
table of ``docs/methods.md``. No torch.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import typing
from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Any

from snapeval.configs import cache as declarations
from snapeval.configs.cache import DEPLOYMENT, FULL, SELF_DRAFT
from snapeval.errors import SnapevalError


def declared_methods(module: Any = declarations) -> dict[str, type]:
    """The methods ``module`` declares (its dataclasses with a ``label``), name -> declaration, ``full``
    first and the rest by name."""
    found = {
        cls.__dataclass_fields__["method"].default: cls
        for cls in vars(module).values()
        if dataclasses.is_dataclass(cls) and isinstance(vars(cls).get("label"), str)
    }
    return dict(sorted(found.items(), key=lambda item: (item[0] != FULL, item[0])))


METHODS: dict[str, type] = declared_methods()
"""The built-in methods, name -> declaration: ``full`` first, the rest by name."""


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


def stored_params(params: type | None, values: Any) -> dict[str, Any]:
    """The parameters of ``params`` as results store them, read off ``values`` (the dataclass, or an
    engine built from it): an option left unset (a ``when_set`` field at null or false) is left out, so
    that adding an option keeps every earlier result's identity."""
    if params is None:
        return {}
    unset = {f.name for f in fields(params) if f.metadata.get("when_set")}
    stored = {name: getattr(values, name) for name in parameter_names(params)}
    return {name: value for name, value in stored.items() if name not in unset or value not in (None, False)}


def check_outside(path: str) -> None:
    """Refuse a method outside the package, ``package.module:ClassName``, that is spelled otherwise or whose
    package is not installed: told without importing anything (its module loads with torch, later)."""
    module, _, name = path.partition(":")
    if not name.isidentifier() or not all(part.isidentifier() for part in module.split(".")):
        raise SnapevalError(f"cannot load {path!r}: give package.module:ClassName", "cache.method")
    if importlib.util.find_spec(package := module.partition(".")[0]) is None:
        raise SnapevalError(f"cannot load {path!r}: No module named {package!r}", "cache.method")


def draft_names(caches: Iterable[Mapping[str, Any]]) -> list[str]:
    """The draft models that cache configs name (``cache.draft``), the target itself left out, sorted."""
    return sorted({str(cache["draft"]) for cache in caches if cache.get("draft") not in (None, SELF_DRAFT)})


def missing_extra(method: object) -> str | None:
    """Why built-in ``method`` cannot run here: the optional extra it needs is not installed (None: it
    can). Torch-free, so a run is refused before any model loads."""
    package = getattr(METHODS.get(method) if isinstance(method, str) else None, "extra", None)
    if package is None or importlib.util.find_spec(package) is not None:
        return None
    return f"{package} is not installed; pip install 'snapeval[{package}]'"


def method_label(method: str) -> str:
    """How figures and tables name ``method``: its declaration's ``label`` (a method outside the package:
    its engine class's ``label``, or its name if it has none or cannot load)."""
    if method in METHODS:
        return METHODS[method].label
    if ":" not in method:
        return method
    try:
        return getattr(outside_class(method), "label", None) or method
    except SnapevalError:
        return method


def method_table() -> str:
    """The markdown table of the built-in methods (``docs/methods.md``), from their declarations: option,
    label, what it keeps (the declaration's first sentence), its cache's shape, its parameters' defaults
    and its source."""
    lines = [
        "| `cache=` | method | what it keeps | shape | defaults | source |",
        "|---|---|---|---|---|---|",
    ]
    for name, params in METHODS.items():
        summary = " ".join(inspect.getdoc(params).replace("``", "`").split()).split(". ")[0].rstrip(".") + "."
        defaults = ", ".join(
            f"`{f.name}` {_written(f.default)}"
            for f in fields(params)
            if f.name in parameter_names(params) and f.name not in ("ratio", *DEPLOYMENT)
        )
        extra = f" Needs `pip install 'snapeval[{params.extra}]'`." if getattr(params, "extra", None) else ""
        shape, source = getattr(params, "shape", "-"), getattr(params, "source", "-")
        cells = (f"`{name}`", params.label, summary + extra, shape, defaults or "-", source)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _written(value: Any) -> str:
    """A default as a command line writes it."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
