"""Where the methods' engines are: method ``name``'s engine is the class of module ``snapeval.cache.<name>``
whose ``params_class`` is the method's declaration (:data:`snapeval.configs.methods.METHODS`).

A method is its declaration (torch-free, :mod:`snapeval.configs.cache`: name, label, parameters) and one
engine module here, named after it, whose class points at the declaration with ``params_class`` (and so
takes its name and label). The runner, sweeps, lm-eval model and memory estimator ask this registry for a
method's engine. A method kept outside the package is named by its import path,
``package.module:ClassName``.
"""

from __future__ import annotations

import importlib
import inspect

from snapeval.cache.base import SnapevalCache
from snapeval.configs.methods import METHODS, built_in, outside_class
from snapeval.errors import SnapevalError


def method_classes() -> dict[str, type[SnapevalCache]]:
    """The built-in methods, name -> engine class, in the order of :data:`METHODS`."""
    return {name: method_class(name) for name in METHODS}


def method_class(name: object) -> type[SnapevalCache]:
    """The class of method ``name``: a built-in name, or ``package.module:ClassName`` for one outside."""
    if isinstance(name, str) and ":" in name:
        return _external(name)
    name = built_in(name)
    module = importlib.import_module(f"snapeval.cache.{name}")
    engines = [
        cls
        for cls in vars(module).values()
        if inspect.isclass(cls) and vars(cls).get("params_class") is METHODS[name]
    ]
    if len(engines) != 1:
        raise SnapevalError(
            f"{module.__name__} has {len(engines)} engines of {name}'s declaration", "cache.method"
        )
    return engines[0]


def _external(path: str) -> type[SnapevalCache]:
    cls = outside_class(path)
    if not (inspect.isclass(cls) and issubclass(cls, SnapevalCache)):
        raise SnapevalError(f"{path!r} is not a snapeval.cache.SnapevalCache subclass", "cache.method")
    return cls
