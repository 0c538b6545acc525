"""The config check, in about a second, before torch, transformers or lm-eval load.

A composed config is read into its dataclasses (:mod:`snapeval.configs.root`, the task's kind, the cache
method's parameters) with ``OmegaConf.to_object``, so every field's type and range is checked where it
is declared, and a key no dataclass declares (``+cache.budgt=5``) is refused, never dropped. Then the
checks across fields: the task's lengths against the model's window, a protocol preset against its
task, a CUDA device on a machine without one. A bad value gets one line naming the field and what it
takes (:class:`~snapeval.errors.SnapevalError`). The checks that need the engine or the data (a cache's
parameters together, a grid, data files, shards, drafts) come next, still before any model loads
(:mod:`snapeval.run.plan`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from snapeval.configs.compose import field_error
from snapeval.configs.fields import count_error
from snapeval.configs.grid import MAX_GRID_POINTS, check_grid, longest_list, too_many_points
from snapeval.configs.methods import METHODS
from snapeval.configs.model import ModelConfig
from snapeval.configs.protocols import check_task
from snapeval.configs.root import Config
from snapeval.configs.setting import check_cache
from snapeval.configs.task import task_schema
from snapeval.errors import SnapevalError
from snapeval.paths import CONF_DIR

GROUPS = ("task", "cache", "model", "memory", "hardware", "protocol", "exp")
"""Config groups a command line can choose from (``task=NAME``, ``+exp=NAME``)."""


def check(config: Mapping[str, Any]) -> None:
    """Refuse unknown keys and ill-typed or out-of-range values of a composed config, then values that do
    not fit together."""
    check_task(config)
    check_grid(config)  # before the cache node: a grid's points take the parameters of all its methods
    typed(config)
    task, model = config["task"], config["model"]
    for key, value in (model.get("config_overrides") or {}).items():
        if (error := count_error(key, value)) is not None:
            raise SnapevalError(error, f"model.config_overrides.{key}")
    if str(model.get("device", "")).startswith("cuda") and no_gpu_here():
        raise SnapevalError("CUDA is not available on this machine; use auto or cpu", "model.device")
    if config["run"]["compile"] == "graphs" and (str(model.get("device")) == "cpu" or no_gpu_here()):
        raise SnapevalError("CUDA graphs need a GPU, and this run has none; use on or off", "run.compile")
    window = model["max_context"]
    if task.get("context_length", 0) > window:
        raise SnapevalError(
            f"{task['context_length']} tokens do not fit the model's window of {window} (model.max_context)",
            "task.context_length",
        )
    if task["max_new_tokens"] >= window:
        raise SnapevalError(
            f"{task['max_new_tokens']} new tokens leave no room for a prompt in the model's window of "
            f"{window} (model.max_context)",
            "task.max_new_tokens",
        )


def typed(config: Mapping[str, Any]) -> Config:
    """``config`` as its dataclasses: the root, the schema of its task's kind and the model; its cache
    as its method's parameters (:func:`~snapeval.configs.setting.check_cache`: in a grid, whose points
    take the parameters of all its methods, keys of any of them)."""
    names = {"task": _name(config, "task", "name"), "model": _name(config, "model", "name")}
    try:
        schema = OmegaConf.structured(Config)
        schema.task = OmegaConf.structured(task_schema(names["task"]))
        schema.model = OmegaConf.structured(ModelConfig)
        tree = OmegaConf.to_object(OmegaConf.merge(schema, config))
    except OmegaConfBaseException as exc:
        raise field_error(exc, names=names) from None
    if isinstance(config.get("cache"), Mapping):
        check_cache(config["cache"], grid=config.get("grid") is not None)
    return tree


def _name(config: Mapping[str, Any], group: str, key: str) -> str:
    node = config.get(group)
    return str(node.get(key)) if isinstance(node, Mapping) else ""


def no_gpu_here() -> bool:
    """True when this machine certainly has no GPU that torch could use (no NVIDIA, ROCm or WSL GPU
    device node), told without importing torch; False means torch has to be asked."""
    nodes = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dxg")
    return not any(next(Path("/").glob(node.lstrip("/")), None) for node in nodes)


def check_choices(overrides: list[str]) -> None:
    """Refuse, before Hydra parses them, a command-line choice of a config group option that does not exist
    (``task=nope``), a number too long for Hydra's parser (more digits than Python converts), a list too
    long for a grid (Hydra's parser takes seconds on thousands of items) and an unquoted non-ASCII value."""
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        number = value.lstrip("+-").replace("_", "")
        if number.isdigit() and 0 < sys.get_int_max_str_digits() < len(number):
            raise SnapevalError(f"a number of {len(number)} digits is out of range", key)
        if key.startswith("grid") and (items := longest_list(value)) > MAX_GRID_POINTS:
            raise too_many_points(f"a list of {items:,} values makes as many points")
        if not override.isascii() and "=" in override and not override.startswith("-"):
            check_parses(override)
        match = re.fullmatch(r"\+{0,2}(\w+)=(.*)", override)
        if not match or match[1] not in GROUPS:
            continue
        group, options = match[1], available(match[1])
        for option in match[2].split(","):
            if option not in options:
                raise SnapevalError(f"unknown option {option!r}; choose one of {', '.join(options)}", group)


def check_parses(override: str) -> None:
    """Refuse an override Hydra's parser cannot read, in one line; a non-ASCII value outside quotes (which
    the parser reads only inside them) with the override quoted as it would be read."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        OverridesParser.create().parse_overrides([override])
    except OverrideParseException as exc:
        prefix, key, value = re.fullmatch(r"([+~]*)([^=]*)=?(.*)", override, re.DOTALL).groups()
        if not key.isascii():
            raise SnapevalError(f"cannot parse {override!r}: a key is ASCII", key) from None
        if value.isascii():
            raise SnapevalError(f"cannot parse {value!r}: {str(exc).splitlines()[0]}", key) from None
        quoted = re.sub(r"[^\s\[\]{},:='\"]*[^\x00-\x7f][^\s\[\]{},:='\"]*", lambda m: f'"{m[0]}"', value)
        message = f"cannot parse {value!r}; quote non-ASCII values: '{prefix}{key}={quoted}'"
        raise SnapevalError(message, key) from None


def available(group: str) -> list[str]:
    """The options of a config group: the names of ``conf/<group>/*.yaml`` (``cache``: the built-in
    methods)."""
    if group == "cache":
        return sorted(METHODS)
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))
