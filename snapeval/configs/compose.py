"""Compose the configs of ``conf/`` from Python, as ``python -m snapeval <overrides>`` would, and turn
what Hydra and OmegaConf refuse into one line naming the field (:func:`field_error`)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import (
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from snapeval.configs.backend import quote_arguments
from snapeval.configs.fields import model_entry, takes
from snapeval.configs.protocols import check_task_choice
from snapeval.configs.root import Config
from snapeval.configs.store import register
from snapeval.errors import SnapevalError
from snapeval.paths import CONF_DIR

OMEGACONF_TYPES = {
    "Integer": "an integer",
    "Float": "a number",
    "Boolean": "true or false",
    "String": "a string",
}


def compose_config(*overrides: str) -> dict[str, Any]:
    """The resolved config of ``conf/config.yaml`` with Hydra ``overrides`` (spelled as today: a command
    line's old spellings are rewritten once, where it is read, by :func:`snapeval.configs.legacy.rewrite`),
    as a plain dict (:func:`plain`)."""
    return compose_job(*overrides)[0]


def default_option(group: str) -> str:
    """The option of config group ``group`` that ``conf/config.yaml``'s defaults list picks (``model``:
    the embedded default model), read without composing."""
    defaults = yaml.safe_load((CONF_DIR / "config.yaml").read_text(encoding="utf-8"))["defaults"]
    return next(entry[group] for entry in defaults if isinstance(entry, dict) and group in entry)


def compose_job(*overrides: str) -> tuple[dict[str, Any], bool]:
    """:func:`compose_config`, and whether the composed config is a sweep (an experiment that sets Hydra's
    ``mode: MULTIRUN``), from one composition."""
    overrides = tuple(quote_arguments(overrides))
    check_task_choice(overrides)
    register()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
            sweep = OmegaConf.select(cfg, "hydra.mode", default=None) == RunMode.MULTIRUN
            with open_dict(cfg):
                del cfg["hydra"]
            return plain(cfg), sweep
    except (HydraException, OmegaConfBaseException) as exc:
        raise field_error(exc, overrides) from None


def plain(cfg: DictConfig) -> dict[str, Any]:
    """A composed config as the runner reads it: resolved plain dicts, without the optional nodes left
    unset (``protocol``, ``hardware``), its model named after the weights it loads."""
    config = OmegaConf.to_container(cfg, resolve=True)
    unset = [
        f.name
        for f in dataclasses.fields(Config)
        if f.metadata.get("when_set") and config.get(f.name) is None
    ]
    return named_after_weights({key: value for key, value in config.items() if key not in unset})


def field_error(
    exc: Exception, overrides: tuple[str, ...] = (), names: Mapping[str, str] | None = None
) -> SnapevalError:
    """The one line of what Hydra or OmegaConf refused: ``<dotted field>: <what it takes>, got <value>``
    (``names``: the chosen option of each group, to name the node an unknown key is not in)."""
    cause = exc if isinstance(exc, OmegaConfBaseException) else exc.__cause__
    if isinstance(cause, OmegaConfBaseException) and cause.full_key:
        key = str(cause.full_key)
        owner = getattr(cause, "object_type", None)
        if isinstance(cause, ConfigKeyError) or "not in" in str(cause.msg):
            return unknown_key(key, owner, (names or {}).get(key.partition(".")[0]))
        if isinstance(cause, MissingMandatoryValue):
            return SnapevalError("missing: give it a value", key)
        if isinstance(cause, ValidationError):
            return SnapevalError(f"must be {_takes(cause, owner)}, got {cause.value!r}", key)
    reason = str(exc).splitlines()[0]  # Hydra goes on with search paths and grammar links
    return SnapevalError(f"cannot compose {' '.join(overrides) or 'the defaults'}: {reason}")


def unknown_key(key: str, owner: type | None, group_name: str | None = None) -> SnapevalError:
    """A key that the node ``owner`` (a config dataclass) does not have, with the keys it has."""
    parent = key.rpartition(".")[0]
    if not dataclasses.is_dataclass(owner):  # a node of free keys (memory, grid): no list to show
        return SnapevalError("no such key (check its spelling; +KEY=... adds a new one)", key)
    known = sorted(f.name for f in dataclasses.fields(owner))
    if parent == "cache":
        who = f"{getattr(owner, 'method', 'the cache')} takes"
    elif parent in ("task", "model") and group_name:
        who = f"{parent} {group_name} has"
    else:
        who = f"{parent or 'the config'} has"
    return SnapevalError(f"unknown key; {who} {', '.join(known)}", key)


def _takes(cause: ValidationError, owner: type | None) -> str:
    """What the field of a failed conversion takes: its check's words, else its type's."""
    declared = {f.name: f for f in dataclasses.fields(owner)} if dataclasses.is_dataclass(owner) else {}
    item = declared.get(str(cause.key))
    if item is not None and item.metadata.get("check"):
        return takes(item.metadata["check"])
    if item is not None and not re.match(r"(int|float|str|bool)\b", str(item.type)):
        return "a list" if str(item.type).startswith("list") else "a mapping"
    typed = re.search(r"converted to (\w+)", str(cause.msg))
    return OMEGACONF_TYPES.get(typed[1], typed[1]) if typed else "a value of its type"


def named_after_weights(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its model named after the weights it loads: ``model.pretrained=<folder or Hub id>``
    over a ``conf/model`` entry (say the default ``smollm2-135m``) runs other weights, so results must
    not be stored or shown under the entry's name, nor its ``hub_id`` (the memory estimator's geometry)
    kept. A name given on the command line (``model.name=...``) is kept as given."""
    model = config.get("model")
    entry_file = model_entry(model.get("name")) if isinstance(model, dict) else None
    if entry_file is None:  # no entry of that name (a path is never one: the schema refuses it)
        return config
    entry = yaml.safe_load(entry_file.read_text(encoding="utf-8")) or {}
    if not isinstance(entry, dict) or entry.get("name") != model["name"]:
        return config
    if entry.get("pretrained") == model.get("pretrained"):
        return config
    pretrained = str(model["pretrained"])
    name = Path(pretrained).name if Path(pretrained).is_dir() else pretrained
    return {**config, "model": {**model, "name": name, "hub_id": None}}
