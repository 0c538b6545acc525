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


def kv_heads(config: Mapping[str, Any], heads: int) -> int:
    """``num_key_value_heads`` (``heads`` when the config has none): at least 1, at most ``heads``, and
    dividing them, each KV head serving an equal group of query heads."""
    key = "num_key_value_heads"
    if config.get(key) is None:
        return heads
    value = _positive(config[key], key)
    if value > heads:
        why = (
            f"{value} is more than num_attention_heads ({heads}): each KV head serves at least one query head"
        )
        raise SnapevalError(why, key)
    if heads % value:
        why = f"{value} does not divide num_attention_heads ({heads}): KV heads serve equal groups of them"
        raise SnapevalError(why, key)
    return value


def head_dim(config: Mapping[str, Any]) -> int:
    """``head_dim`` if the config sets it, else ``hidden_size // num_attention_heads`` (at least 1)."""
    if explicit := optional_int(config, "head_dim"):
        return explicit
    hidden, heads = require_int(config, "hidden_size"), require_int(config, "num_attention_heads")
    if hidden < heads:
        message = f"{hidden} is less than num_attention_heads ({heads}): a head of 0 dimensions; set head_dim"
        raise SnapevalError(message, "hidden_size")
    return hidden // heads


def layer_kinds(config: Mapping[str, Any], num_layers: int) -> list[str]:
    """``layer_types``: one attention kind (a string) per layer."""
    kinds = config["layer_types"]
    if not isinstance(kinds, list) or not all(isinstance(kind, str) for kind in kinds):
        message = f"must be a list of attention kinds, one per layer, got {kinds!r:.80}"
        raise SnapevalError(message, "layer_types")
    if len(kinds) != num_layers:
        raise SnapevalError(f"has {len(kinds)} entries for {num_layers} layers", "layer_types")
    return kinds


def _positive(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise SnapevalError(f"must be a positive integer, got {value!r}", key)
    return value
