"""``python -m snapeval.memory key=value ...``: print a memory estimate, or one ``error:`` line.

The same estimate as ``python -m snapeval job=memory memory.key=value`` (:mod:`snapeval.memory.point`),
checked by the same function with the same defaults, printed and not stored."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from snapeval.cli import one_line_errors
from snapeval.errors import SnapevalError
from snapeval.memory.point import KEYS, REQUIRED, default_hardware, estimate_memory
from snapeval.memory.report import render

INTEGER_KEYS = frozenset({"context", "batch", "tp", "budget"})
NULL = "null"
USAGE = (
    "usage: python -m snapeval.memory model=<conf/model name | config.json | hub id> context=<tokens> "
    "[hardware=sn40l] [batch=1] [tp=1] [budget=<tokens>] [method=<a method of snapeval.cache>] "
    "[kv_dtype=bf16] [weights_dtype=<the checkpoint's: fp8 | bf16>]"
)


def parse_overrides(args: Sequence[str]) -> dict[str, Any]:
    """Hydra-style ``key=value`` arguments as ``estimate`` keyword arguments (``null`` is None)."""
    options: dict[str, Any] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep:
            raise SnapevalError(f"expected key=value, got {arg!r}; {USAGE}")
        if key not in KEYS:
            raise SnapevalError(f"unknown key {key!r}; choose from {', '.join(KEYS)}")
        if key in options:
            raise SnapevalError("given twice", key)
        options[key] = _value(key, value)
    return options


@one_line_errors
def main(argv: Sequence[str] | None = None) -> int:
    """Print the estimate the arguments ask for; exit status 2 on bad input."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    options = {"hardware": default_hardware(), **parse_overrides(args)}
    missing = [key for key in REQUIRED if options.get(key) is None]
    if missing:  # the check's "required", said with the command's usage
        raise SnapevalError(f"missing {', '.join(f'{key}=' for key in missing)}; {USAGE}")
    print(render(estimate_memory(options, node="")))
    return 0


def _value(key: str, text: str) -> Any:
    if text == NULL:
        return None
    if key not in INTEGER_KEYS:
        return text
    try:
        return int(text)
    except ValueError:
        raise SnapevalError(f"expected an integer, got {text!r}", key) from None
