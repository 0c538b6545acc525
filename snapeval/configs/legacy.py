"""The legacy-key table: each old spelling of a config key and its key today, used twice: a command line
written with an old key is rewritten before Hydra composes it (:func:`rewrite`, with a note), and
``python -m snapeval.results migrate`` rewrites the stored configs of older databases (:func:`upgrade`)
so that their runs resume without recomputation."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import fields
from typing import Any

from snapeval.configs.methods import METHODS
from snapeval.configs.root import declared_fields

RENAMED: dict[str, str] = {
    "task.limit": "run.limit",
    "task.shard": "run.shard",
    "generation.batch_size": "run.batch_size",
    "generation.compile": "run.compile",
    "progress": "run.progress",
    "db.url": "run.db",
    "db.lease_s": "run.lease_s",
    "generation.max_new_tokens": "task.max_new_tokens",
    "task.num_samples": "task.num_prompts",
}
"""Old dotted key -> its key today. A stored old value of null meant "the default" (the task's own
``max_new_tokens``): it is dropped, not moved."""

DROPPED: tuple[str, ...] = ("task.family", "task.lm_eval_task", "task.id_field", "generation.draw_batch")
"""Old keys with no key today: dropped from stored configs (they never changed a result)."""


def rewrite(overrides: list[str]) -> list[str]:
    """``overrides`` with each old key spelled as today (``task.limit=2`` -> ``run.limit=2``), one note on
    stderr per rewritten key."""
    rewritten = []
    for override in overrides:
        match = re.fullmatch(r"([+~]{0,2})([\w.]+)(=.*)?", override, flags=re.DOTALL)
        new = RENAMED.get(match[2]) if match else None
        if new is None:
            rewritten.append(override)
            continue
        print(f"note: {match[2]} is now {new}", file=sys.stderr)
        rewritten.append(f"{match[1]}{new}{match[3] or ''}")
    return rewritten


def upgrade(config: Mapping[str, Any]) -> dict[str, Any]:
    """A stored config with its old keys moved to today's (a null old value dropped), the keys with no
    home today dropped, and a whole number given to a float field stored as the float that composing
    it gives today (``cache.ratio=1`` -> 1.0)."""
    upgraded = _copy(config)
    for old, new in RENAMED.items():
        found, value = _pop(upgraded, old)
        if found and value is not None:
            _put(upgraded, new, value)
    for old in DROPPED:
        _pop(upgraded, old)
    for path in _float_fields(upgraded):
        *parents, leaf = path.split(".")
        node: Any = upgraded
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and type(node.get(leaf)) is int:
            node[leaf] = float(node[leaf])
    return upgraded


def _float_fields(config: Mapping[str, Any]) -> Iterator[str]:
    """Dotted paths of the float fields of the config tree and of ``config``'s cache method."""
    floating = re.compile(r"float( \| None)?")
    yield from (path for path, item in declared_fields() if floating.fullmatch(str(item.type)))
    method = METHODS.get(str((config.get("cache") or {}).get("method")))
    if method is not None:
        yield from (f"cache.{item.name}" for item in fields(method) if floating.fullmatch(str(item.type)))


def _copy(config: Mapping[str, Any]) -> dict[str, Any]:
    return {key: _copy(value) if isinstance(value, Mapping) else value for key, value in config.items()}


def _pop(config: dict[str, Any], path: str) -> tuple[bool, Any]:
    *parents, leaf = path.split(".")
    node: Any = config
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or leaf not in node:
        return False, None
    value = node.pop(leaf)
    if parents and not node:  # an emptied group (db) goes with its last key
        _pop(config, ".".join(parents))
    return True, value


def _put(config: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
