"""Reading fields from a transformers config dict, naming the field when one is missing or bad."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from snapeval.errors import SnapevalError


def require_int(config: Mapping[str, Any], key: str) -> int:
    """The positive integer ``config[key]``."""
    if config.get(key) is None:
        raise SnapevalError("missing from the model config", key)
    return _positive(config[key], key)


def optional_int(config: Mapping[str, Any], key: str) -> int | None:
    """The positive integer ``config[key]``, or None when it is absent, null or zero."""
    value = config.get(key)
    return None if value is None or value == 0 else _positive(value, key)


def head_dim(config: Mapping[str, Any]) -> int:
    """``head_dim`` if the config sets it, else ``hidden_size // num_attention_heads``."""
    return optional_int(config, "head_dim") or require_int(config, "hidden_size") // require_int(
        config, "num_attention_heads"
    )


def _positive(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SnapevalError(f"must be a positive integer, got {value!r}", key)
    return value
