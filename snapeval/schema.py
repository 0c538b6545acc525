"""The config schema, checked in about a second, before torch, transformers or lm-eval load.

Every field a config may hold has a type and range here (:data:`FIELDS`), and every key must be one that
the chosen config files define: a misspelt override (``+cache.budgt=5``) is refused, never dropped. A
bad value gets one line naming the field and what it takes (:class:`~snapeval.errors.SnapevalError`).
A cache key the chosen method does not take is refused too, except in a grid, whose points share the
parameters of all its methods. The checks that need the engine or the data (a cache's parameters
together, a grid, data files, shards, drafts) come next, still before any model loads
(:mod:`snapeval.preflight`, :func:`snapeval.runner.check_config`).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from snapeval.errors import SnapevalError
from snapeval.paths import CONF_DIR

GROUPS = ("task", "cache", "model", "memory", "hardware", "protocol", "exp")
"""Config groups a command line can choose from (``task=NAME``, ``+exp=NAME``)."""

MAX_LEASE_S = 10**9  # about 31 years: an expiry date must stay within the calendar
Check = Callable[[Any], str | None]  # None when the value is fine, else what the field takes


INT64_MAX = 2**63 - 1  # what a database column and a torch tensor hold


def integer(low: int = 1, optional: bool = False, high: int = INT64_MAX) -> Check:
    def check(value: Any) -> str | None:
        if value is None and optional:
            return None
        if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
            return None
        if isinstance(value, int) and value > high:
            return f"an integer <= {high}"
        return f"an integer >= {low}" + (" or null" if optional else "")

    return check


def number(low: float, high: float, low_open: bool = False) -> Check:
    def check(value: Any) -> str | None:
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if numeric and (low < value if low_open else low <= value) and value <= high:
            return None
        return f"a number in {'(' if low_open else '['}{low:g}, {high:g}]"

    return check


def choice(*choices: Any) -> Check:
    return lambda value: None if value in choices else "one of " + ", ".join(map(str, choices))


def iso_date(value: Any) -> str | None:
    if value is None:
        return None
    try:
        datetime.fromisoformat(str(value))
    except ValueError:
        return "an ISO date (2024-08-01) or null"
    return None


def device(value: Any) -> str | None:
    ok = isinstance(value, str) and re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value)
    return None if ok else "auto, cpu, mps, cuda or cuda:N"


def shard(value: Any) -> str | None:
    """``i/n`` with 0 <= i < n, or null."""
    match = re.fullmatch(r"(\d+)/(\d+)", str(value)) if value is not None else None
    if value is None or (match and int(match[1]) < int(match[2])):
        return None
    return "i/n with 0 <= i < n (say 0/4), or null"


def json_object(value: Any) -> str | None:
    """A JSON object written as a string (``'{"window_size": 64}'``)."""
    try:
        return None if isinstance(json.loads(value), dict) else 'a JSON object such as {"name": 1}'
    except (TypeError, ValueError):
        return 'a JSON object such as {"name": 1}'


boolean = choice(True, False)
text: Check = lambda value: None if isinstance(value, str) else "a string"  # noqa: E731

FIELDS: dict[str, Check] = {
    "seed": integer(low=0),
    "job": choice("evaluate", "memory"),
    "generation.do_sample": boolean,
    "generation.temperature": number(0, 100, low_open=True),
    "generation.top_p": number(0, 1, low_open=True),
    "generation.num_samples": integer(),
    "task.name": text,
    "task.max_new_tokens": integer(),
    "task.max_prompt_tokens": integer(optional=True),
    "task.context_length": integer(low=16),
    "task.num_prompts": integer(),
    "task.truncation": choice("error", "middle"),
    "task.compression": choice("query_aware", "query_agnostic"),
    "task.cot": boolean,
    "task.scorer": choice("qwen_math", "math_verify", "lm_eval"),
    "task.prompt_style": choice("openai_chat", "llama3", "codeqwen", "qwq", "deepseek_r1"),
    "task.metadata.start_date": iso_date,
    "task.metadata.end_date": iso_date,
    "model.max_context": integer(low=16),
    "model.prompt_style": choice("openai_chat", "llama3", "codeqwen", "qwq", "deepseek_r1"),
    "model.dtype": choice("auto", "float32", "bfloat16", "float16"),
    "model.device": device,
    "cache.press_args": json_object,
    "run.limit": integer(optional=True),
    "run.shard": shard,
    "run.batch_size": integer(),
    "run.compile": choice("auto", "on", "off"),
    "run.progress": boolean,
    "run.db": text,
    "run.lease_s": integer(low=4, high=MAX_LEASE_S),
}


def check(config: Mapping[str, Any]) -> None:
    """Refuse unknown keys and ill-typed or out-of-range values of a composed config, one field at a time."""
    _check_protocol(config)
    _check_keys(config)
    for path, field_check in FIELDS.items():
        found, value = _lookup(config, path)
        if found and (takes := field_check(value)) is not None:
            raise SnapevalError(f"must be {takes}, got {value!r}", path)
    task, model = config.get("task", {}), config.get("model", {})
    if str(model.get("device", "")).startswith("cuda") and no_gpu_here():
        raise SnapevalError("CUDA is not available on this machine; use auto or cpu", "model.device")
    if isinstance(task.get("context_length"), int) and task["context_length"] > model.get("max_context", 0):
        raise SnapevalError(
            f"{task['context_length']} tokens do not fit the model's window of {model['max_context']} "
            "(model.max_context)",
            "task.context_length",
        )
    _check_new_tokens(config)


def _check_protocol(config: Mapping[str, Any]) -> None:
    """A protocol preset (``+protocol=NAME``) belongs to one task: refuse it with another task."""
    protocol, task = config.get("protocol"), config.get("task")
    if not isinstance(protocol, Mapping) or not isinstance(task, Mapping):
        return
    tasks = protocol.get("task") if isinstance(protocol.get("task"), list) else [protocol.get("task")]
    if task.get("name") not in tasks:
        raise SnapevalError(
            f"{protocol.get('name')} is a protocol of task {' or '.join(map(str, tasks))}, not of task "
            f"{task.get('name')}",
            "protocol",
        )


def _check_new_tokens(config: Mapping[str, Any]) -> None:
    """The answer's length must leave room for a prompt in the model's window."""
    window = config.get("model", {}).get("max_context")
    for path in ("task.max_new_tokens",):
        found, value = _lookup(config, path)
        if found and isinstance(value, int) and isinstance(window, int) and value >= window:
            raise SnapevalError(
                f"{value} new tokens leave no room for a prompt in the model's window of {window} "
                "(model.max_context)",
                path,
            )


def no_gpu_here() -> bool:
    """True when this machine certainly has no GPU that torch could use (no NVIDIA, ROCm or WSL GPU
    device node), told without importing torch; False means torch has to be asked."""
    nodes = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dxg")
    return not any(next(Path("/").glob(node.lstrip("/")), None) for node in nodes)


def check_choices(overrides: list[str]) -> None:
    """Refuse a command-line choice of a config group option that does not exist (``task=nope``), and
    a number too long for Hydra's parser (more digits than Python converts)."""
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        number = value.lstrip("+-").replace("_", "")
        if number.isdigit() and 0 < sys.get_int_max_str_digits() < len(number):
            raise SnapevalError(f"a number of {len(number)} digits is out of range", key)
        match = re.fullmatch(r"\+{0,2}(\w+)=(.*)", override)
        if not match or match[1] not in GROUPS:
            continue
        group, options = match[1], available(match[1])
        for option in match[2].split(","):
            if option not in options:
                raise SnapevalError(f"unknown option {option!r}; choose one of {', '.join(options)}", group)


def available(group: str) -> list[str]:
    """The options of a config group: the names of ``conf/<group>/*.yaml``."""
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))


def _check_keys(config: Mapping[str, Any]) -> None:
    known_top = set(_defined(CONF_DIR / "config.yaml")) | {"protocol", "hydra", "exp"}
    for key in config:
        if key not in known_top:
            raise SnapevalError(f"unknown key; the config has {', '.join(sorted(known_top))}", key)
    sections = {"task": ("task", "name"), "cache": ("cache", "method"), "model": ("model", "name")}
    for section, (group, name_key) in sections.items():
        value = config.get(section)
        source = CONF_DIR / group / f"{value.get(name_key)}.yaml" if isinstance(value, Mapping) else None
        if source is None or not source.is_file():
            continue  # a model given by Hub id, say: its keys are the ModelSpec's, checked on load
        defined = _defined(source)
        owner = f"{group} {value[name_key]} has"
        if section == "cache" and config.get("grid") is not None:
            # a grid point holds the grid's parameters, which some method of the grid takes
            defined = {key: None for path in (CONF_DIR / "cache").glob("*.yaml") for key in _defined(path)}
            owner = "the caches take"
        elif section == "cache":
            owner = f"{value[name_key]} takes"
        for key in value:
            if key not in defined:
                raise SnapevalError(f"unknown key; {owner} {', '.join(sorted(defined))}", f"{section}.{key}")


def _defined(path: Path) -> dict[str, Any]:
    """The keys a config file defines, with those of the files its ``defaults`` list extends."""
    content = yaml.safe_load(path.read_text()) or {}
    merged: dict[str, Any] = {}
    for entry in content.pop("defaults", []):
        if isinstance(entry, str) and entry != "_self_":
            merged |= _defined(path.parent / f"{entry}.yaml")
        elif isinstance(entry, Mapping):  # a group chosen by default: a section of the config
            merged |= {group: None for group in entry}
    return merged | content


def _lookup(config: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    value: Any = config
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value
