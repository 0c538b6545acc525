"""A protocol preset's deviations from the official run, named at the start of a run.

A preset (``conf/protocol/<name>.yaml``) sets its task's settings to the official harness's and lists,
in ``protocol.deviations``, what it still does otherwise (names of README "Protocols" rows, each with a
test; ``[]`` ideally). That list is part of the composed config, so it is stored with every run and
its rows. A setting of the preset changed after it on the command line is one more deviation,
named by :func:`changed_settings` and stored beside them (``protocol.changed``). A grader's own
deviations (Qwen2.5-Math's parsers, LiveCodeBench's JSON comparison) hold under any preset or none: its
task names them (``Task.deviations``) and every row it scores stores them (``extra.deviations``).

A preset's settings are named by dotted key; :func:`flatten` and :func:`lookup` are the dotted keys of any
config (the stored config's columns, :mod:`snapeval.results`, use them too).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from snapeval.errors import SnapevalError
from snapeval.paths import CONF_DIR


def preset_settings(name: str) -> dict[str, Any]:
    """The settings preset ``name`` fixes, by dotted key (``task.max_new_tokens``): its file's values
    outside ``protocol`` and ``defaults`` (interpolations left out: they follow other settings)."""
    content = yaml.safe_load((CONF_DIR / "protocol" / f"{name}.yaml").read_text()) or {}
    sections = {key: value for key, value in content.items() if key not in ("defaults", "protocol")}
    return {
        path: value
        for path, value in flatten(sections).items()
        if not (isinstance(value, str) and value.startswith("${"))
    }


def check_task(config: Mapping[str, Any]) -> None:
    """A preset belongs to its task(s) (``protocol.task``): refuse it with another task."""
    protocol, task = config.get("protocol"), config.get("task")
    if isinstance(protocol, Mapping) and isinstance(task, Mapping):
        _belongs(str(protocol.get("name")), protocol.get("task"), task.get("name"))


def check_task_choice(overrides: Sequence[str]) -> None:
    """:func:`check_task` on a command line, before Hydra composes a preset's settings into another
    task's (``+protocol=livecodebench_official task=ruler_passkey``)."""
    chosen = dict(
        match.groups() for o in overrides if (match := re.fullmatch(r"\+{0,2}(protocol|task)=([\w.-]+)", o))
    )
    preset = CONF_DIR / "protocol" / f"{chosen.get('protocol')}.yaml"
    if "task" in chosen and preset.is_file():
        protocol = (yaml.safe_load(preset.read_text()) or {}).get("protocol") or {}
        _belongs(chosen["protocol"], protocol.get("task"), chosen["task"])


def _belongs(name: str, tasks: Any, task: Any) -> None:
    tasks = tasks if isinstance(tasks, list) else [tasks]
    if task not in tasks:
        raise SnapevalError(
            f"{name} is a protocol of task {' or '.join(map(str, tasks))}, not of task {task}", "protocol"
        )


def changed_settings(config: Mapping[str, Any]) -> list[str]:
    """``key=value (preset: value)`` for each setting of the config's preset that the config changes."""
    protocol = config.get("protocol")
    if not protocol:
        return []
    changed = []
    for path, official in preset_settings(protocol["name"]).items():
        _, value = lookup(config, path)
        if value != official:
            changed.append(f"{path}={value!r} (preset: {official!r})")
    return changed


def deviations(config: Mapping[str, Any]) -> list[str]:
    """Every deviation of a run under a preset from the official run: the preset's, then the changes."""
    protocol = config.get("protocol")
    return [*protocol.get("deviations", []), *changed_settings(config)] if protocol else []


def announce(config: Mapping[str, Any]) -> None:
    """Print a preset's deviations from the official run (nothing for a run without a preset)."""
    protocol = config.get("protocol")
    if protocol:
        found = deviations(config)
        listed = "; ".join(found) if found else "none"
        print(f"protocol {protocol['name']}: deviations from the official run: {listed}", file=sys.stderr)


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys: ``{"cache": {"budget": 8}}`` -> ``{"cache.budget": 8}``."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def lookup(config: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    """``(True, value)`` of the dotted ``path`` in ``config``, or ``(False, None)`` where it has none."""
    value: Any = config
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value
