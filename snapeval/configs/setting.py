"""One cache setting, checked and resolved: what a ``cache`` node of a config stands for.

A config's ``cache`` node (or a grid point's) is a mapping as Hydra composed it. :meth:`CacheSetting.of`,
the one way to make a setting, turns it into a frozen :class:`CacheSetting`: its ``method`` and the
``params`` results store (with the method, :attr:`CacheSetting.stored`), read off the method's
declaration made from the node (the method's checks run; :func:`~snapeval.configs.methods.method_params`),
and the :attr:`CacheSetting.key` that tells settings apart. The config check (:func:`check_cache`) and
the plan's grid points (their stored form, :func:`effective_params`) make settings; a request carries
one, the batcher keys its prefills and rows by its key, and the engine is built from it as it is
(:func:`snapeval.cache.build_cache`). A setting depends on nothing but its node: whoever reuses one keeps
it. No torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from snapeval.configs.cache import FULL, SELF_DRAFT
from snapeval.configs.methods import (
    METHODS,
    check_outside,
    method_label,
    method_params,
    parameter_names,
    params_class,
    stored_params,
)
from snapeval.errors import SnapevalError


@dataclass(frozen=True)
class CacheSetting:
    """A cache setting: ``method`` and ``params``, the (name, value) pairs results store (the parameters it
    takes, defaults filled in, unset options left out, in declaration order)."""

    method: str
    params: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, node: Mapping[str, Any] | CacheSetting, strict: bool = False) -> CacheSetting:
        """The setting of a ``cache`` node (a setting is its own), its method's checks run: one line naming
        ``cache.<field>`` for a bad value, and, when ``strict``, for a key the method takes no notice of
        (else such a key is dropped, so that one sweep can give ``budget`` to every method)."""
        if isinstance(node, CacheSetting):
            return node
        method = node.get("method")
        declared = params_class(method)
        taken = parameter_names(declared)
        unknown = sorted(set(node) - {"method", *taken})
        if strict and unknown:
            raise SnapevalError(
                f"{method} takes no parameter {', '.join(unknown)}; it takes {', '.join(taken) or 'none'}",
                f"cache.{unknown[0]}",
            )
        if declared is None:
            return cls(str(method), ())
        declaration = method_params(declared, node)
        return cls(str(method), tuple(stored_params(declared, declaration).items()))

    @property
    def stored(self) -> dict[str, Any]:
        """The cache as results store it: ``{"method": ..., **params}``."""
        return {"method": self.method, **dict(self.params)}

    @property
    def key(self) -> tuple:
        """Sorted (name, value) pairs of :attr:`stored`: equal for two nodes that make the same cache."""
        return tuple(sorted(self.stored.items()))

    @property
    def is_full(self) -> bool:
        """Whether this is the full cache (the reference)."""
        return self.method == FULL

    @property
    def label(self) -> str:
        """How figures and tables name the method."""
        return method_label(self.method)

    @property
    def draft(self) -> str | None:
        """The speculative prefill draft this setting names, the target itself left out (None: none)."""
        draft = dict(self.params).get("draft")
        return None if draft in (None, SELF_DRAFT) else str(draft)

    @property
    def kv_dtype(self) -> str | None:
        """What this setting stores keys and values in (``cache.kv_dtype``; None: the model's dtype)."""
        return dict(self.params).get("kv_dtype")


def effective_params(node: Mapping[str, Any]) -> dict[str, Any]:
    """What a ``cache`` node stands for, as results store it (:attr:`CacheSetting.stored`): two nodes that
    make the same cache give the same."""
    return CacheSetting.of(node).stored


def check_cache(node: Mapping[str, Any], grid: bool = False) -> None:
    """Refuse a composed ``cache`` node with a key its method does not have (in a ``grid``: that no method
    has, the points sharing the grid's parameters) or a bad value (outside a grid, for a built-in
    method: its setting is made; one outside the package is checked when its module loads)."""
    method = node.get("method")
    if grid:
        known = sorted({f.name for params in METHODS.values() for f in fields(params)})
        owner = "the caches take"
    elif isinstance(method, str) and ":" in method:
        return check_outside(method)
    else:
        known = [f.name for f in fields(params_class(method))]
        owner = f"{method} takes"
    for key in node:
        if key not in known:
            raise SnapevalError(f"unknown key; {owner} {', '.join(sorted(known))}", f"cache.{key}")
    if not grid:
        CacheSetting.of(node)
