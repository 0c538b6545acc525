"""One model catalogue: the names of ``conf/model``, each with the Hub id whose config it runs, and their
short names (``llama-3.1-8b`` for ``llama-3.1-8b-instruct``: :func:`model_aliases`).

A ``conf/model/<name>.yaml`` names its Hub id in ``hub_id`` (for a model loaded from elsewhere, such as
a GGUF file inside a package) or else in ``pretrained``. The estimator reads the geometry of a Hub id
offline when ``snapeval/memory/models/`` ships it: each JSON file there holds the relevant fields of an
official ``config.json`` and lists, in ``_hub_ids``, the Hub ids whose config has those fields.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import yaml

from snapeval.errors import SnapevalError
from snapeval.paths import CONF_DIR

MODEL_CONF_DIR = CONF_DIR / "model"
SHIPPED_DIR = Path(__file__).with_name("models")
PACKAGE_SCHEME = "pkg://"  # a model inside a Python package (snapeval.models): no config to read here
ALIAS_SUFFIXES = ("-instruct", "-chat", "-it")  # what a short name leaves out of a conf/model name


def model_names() -> list[str]:
    """The names of ``conf/model``, the models ``model=<name>`` selects everywhere."""
    return sorted(path.stem for path in MODEL_CONF_DIR.glob("*.yaml"))


def model_aliases() -> dict[str, str]:
    """Short names, each with its ``conf/model`` name: a name without its ``-instruct``, ``-chat`` or
    ``-it`` suffix (the names the estimator took before its catalogue joined ``conf/model``), unless that
    is a name itself or shortens two names."""
    names = model_names()
    short: dict[str, list[str]] = {}
    for name in names:
        for suffix in ALIAS_SUFFIXES:
            if name.endswith(suffix):
                short.setdefault(name.removesuffix(suffix), []).append(name)
    return {alias: full[0] for alias, full in sorted(short.items()) if len(full) == 1 and alias not in names}


def known_names() -> str:
    """Every name ``model=`` takes, for an error message: the ``conf/model`` names, then the short ones."""
    aliases = ", ".join(f"{alias} ({name})" for alias, name in model_aliases().items())
    return f"{', '.join(model_names())} (conf/model)" + (f"; short names {aliases}" if aliases else "")


def model_source(name: str) -> str | None:
    """The Hub id (or local path) whose config the ``conf/model`` entry ``name`` runs; None when
    ``name`` is not an entry (short names: :func:`model_aliases`)."""
    path = MODEL_CONF_DIR / f"{name}.yaml"
    if "/" in name or not path.is_file():
        return None
    entry = yaml.safe_load(path.read_text()) or {}
    source = entry.get("hub_id") or entry.get("pretrained")
    if not isinstance(source, str) or not source:
        raise SnapevalError(f"conf/model/{name}.yaml names no hub_id or pretrained", "model")
    if source.startswith(PACKAGE_SCHEME):
        message = f"conf/model/{name}.yaml loads {source}: name the Hub id of its config in hub_id"
        raise SnapevalError(message, "model")
    return source


@functools.cache
def shipped_configs() -> dict[str, Path]:
    """Every Hub id whose geometry ships with snapeval, each with its JSON file."""
    shipped: dict[str, Path] = {}
    for path in sorted(SHIPPED_DIR.glob("*.json")):
        for hub_id in read_json(path).get("_hub_ids", ()):
            if hub_id in shipped:
                twice = f"{shipped[hub_id].name} and {path.name}"
                raise SnapevalError(f"{hub_id} is shipped twice, in {twice}", "model")
            shipped[hub_id] = path
    return shipped


def shipped_config(hub_id: str) -> dict[str, Any] | None:
    """The shipped config fields of ``hub_id``, or None when snapeval does not ship them."""
    path = shipped_configs().get(hub_id)
    return None if path is None else read_json(path)


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; a file that is not one (binary, not JSON, nested too deeply, a number
    too long) is named in the error."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        byte = f"byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
        raise SnapevalError(f"{path} is not UTF-8 text ({byte}): give a config.json", "model") from None
    except json.JSONDecodeError as exc:
        raise SnapevalError(f"{path} is not valid JSON ({exc.msg}, line {exc.lineno})", "model") from exc
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
        raise SnapevalError(f"{path} is not valid JSON ({reason})", "model") from None
    if not isinstance(data, dict):
        raise SnapevalError(f"{path} does not hold a JSON object", "model")
    return data
