"""Data types, byte sizes and their human-readable forms."""

from __future__ import annotations

import re

from snapeval.configs.footprint import ELEMENT_BYTES as DTYPE_BYTES  # one table, the engine's too
from snapeval.errors import SnapevalError

_SIZE_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)\s*$")
_BINARY_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def dtype_bytes(dtype: str, field: str) -> int:
    """Bytes per element of ``dtype``; ``field`` names the setting in the error."""
    if dtype not in DTYPE_BYTES:
        raise SnapevalError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}", field)
    return DTYPE_BYTES[dtype]


def parse_size(text: object, field: str) -> int:
    """Bytes in a size written like ``520 MB`` (decimal units) or ``64 GiB`` (binary units)."""
    match = _SIZE.match(str(text))
    if match is None:
        raise SnapevalError(f"expected a size such as '64 GB' or '520 MiB', got {text!r}", field)
    size = round(float(match[1]) * _SIZE_UNITS[match[2]])
    if size <= 0:
        raise SnapevalError(f"must be a positive size, got {text!r}", field)
    return size


def format_bytes(size: int) -> str:
    """``size`` in binary units: ``576 B``, ``68.62 KiB``, ``16.00 GiB``."""
    exponent = min((max(size, 1).bit_length() - 1) // 10, len(_BINARY_UNITS))
    if exponent == 0:
        return f"{size} B"
    return f"{size / 1024**exponent:.2f} {_BINARY_UNITS[exponent - 1]}"


def format_count(count: int) -> str:
    """A parameter count: ``134.5M``, ``8.03B``."""
    if count >= 10**9:
        return f"{count / 10**9:.2f}B"
    return f"{count / 10**6:.1f}M" if count >= 10**6 else f"{count:,}"
