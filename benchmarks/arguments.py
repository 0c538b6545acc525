"""The benchmarks' arguments, checked as the package checks its own: a bad one ends a script in one line
``error: <flag>: <what>`` with exit code 2 (:func:`snapeval.cli.one_line_errors` around its ``main``),
before any model or tensor is made. Torch-free.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from snapeval.configs.setting import CacheSetting
from snapeval.errors import SnapevalError


def at_least(args: argparse.Namespace, bounds: Mapping[str, int]) -> None:
    """Refuse a flag of ``bounds`` (``--kv-heads`` is ``args.kv_heads``: a number, a list of them, or None
    when not given) with a value below its bound."""
    for flag, low in bounds.items():
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        for number in value if isinstance(value, list) else [value]:
            if number is not None and number < low:
                raise SnapevalError(f"must be >= {low}, got {number}", flag)


def cache_setting(node: Mapping[str, Any], flags: Mapping[str, str]) -> None:
    """Refuse ``node``, a cache made of flags' values (``flags``: a parameter to the flag that sets it),
    if the package would not run it: why not, on the flag of the parameter refused (else the first)."""
    try:
        CacheSetting.of(node)
    except SnapevalError as exc:
        parameter = (exc.field or "").removeprefix("cache.")
        raise SnapevalError(str(exc), flags.get(parameter, next(iter(flags.values())))) from None
