"""``python -m snapeval.memory key=value ...``: print a memory estimate, or one ``error:`` line."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from snapeval.cli import one_line_errors
from snapeval.errors import SnapevalError
from snapeval.memory.estimate import estimate
from snapeval.memory.report import render

KEYS = ("model", "hardware", "context", "batch", "tp", "budget", "method", "kv_dtype", "weights_dtype")
REQUIRED = ("model", "context")
INTEGER_KEYS = frozenset({"context", "batch", "tp", "budget"})
NULL = "null"
DEFAULT_HARDWARE = "sn40l"  # as in conf/memory/default.yaml
USAGE = (
    "usage: python -m snapeval.memory model=<conf/model name | config.json | hub id> context=<tokens> "
    "[hardware=sn40l] [batch=1] [tp=1] [budget=<tokens>] [method=<a method of snapeval.cache>] "
    "[kv_dtype=bf16] [weights_dtype=bf16]"
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
    missing = [key for key in REQUIRED if options.get(key) is None]
    if missing:
        raise SnapevalError(f"missing {', '.join(f'{key}=' for key in missing)}; {USAGE}")
    return options


@one_line_errors
def main(argv: Sequence[str] | None = None) -> int:
    """Print the estimate the arguments ask for; exit status 2 on bad input."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    options = parse_overrides(args)
    hardware = options.pop("hardware", None) or DEFAULT_HARDWARE
    print(render(estimate(options.pop("model"), hardware, **options)))
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
