"""Where the methods' engines are: every :class:`SnapevalCache` subclass in a module of this package.

A method is one module here whose class sets ``method`` (its name in configs and results), ``label``
(its name in figures; a class without one, such as the grid, is no method) and ``params_class``, its
parameters: the dataclass of :mod:`snapeval.configs.cache` that declares their defaults and checks, and
that Hydra composes without torch. The runner, sweeps, lm-eval model, memory estimator and figures ask
this registry for a method's engine. A method kept outside the package is named by its import path,
``package.module:ClassName``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from pathlib import Path

from snapeval.cache.base import SnapevalCache
from snapeval.configs.methods import built_in, outside_class
from snapeval.errors import SnapevalError


@functools.cache
def method_classes() -> dict[str, type[SnapevalCache]]:
    """The built-in methods, name -> class, ``full`` first and the rest by name."""
    found: dict[str, type[SnapevalCache]] = {}
    for module_info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        module = importlib.import_module(f"snapeval.cache.{module_info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(cls, SnapevalCache)
                and cls.__module__ == module.__name__
                and vars(cls).get("label")
            ):
                found[cls.method] = cls
    return dict(sorted(found.items(), key=lambda item: (item[0] != "full", item[0])))


def method_class(name: object) -> type[SnapevalCache]:
    """The class of method ``name``: a built-in name, or ``package.module:ClassName`` for one outside."""
    if isinstance(name, str) and ":" in name:
        return _external(name)
    return method_classes()[built_in(name)]


def method_label(name: str) -> str:
    """How figures name method ``name``: its class's ``label``, or the name itself if it cannot load."""
    try:
        cls = method_class(name)
        return cls.label or name
    except SnapevalError:
        return name


def _external(path: str) -> type[SnapevalCache]:
    cls = outside_class(path)
    if not (inspect.isclass(cls) and issubclass(cls, SnapevalCache)):
        raise SnapevalError(f"{path!r} is not a snapeval.cache.SnapevalCache subclass", "cache.method")
    return cls
