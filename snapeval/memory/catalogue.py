"""One model catalogue: the names of ``conf/model``, each with the Hub id whose config it runs.

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


def model_names() -> list[str]:
    """The names of ``conf/model``, the models ``model=<name>`` selects everywhere."""
    return sorted(path.stem for path in MODEL_CONF_DIR.glob("*.yaml"))


def model_source(name: str) -> str | None:
    """The Hub id (or local path) whose config the ``conf/model`` entry ``name`` runs; None when
    ``name`` is not an entry."""
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
    """The JSON object in ``path``; a file that is not one is named in the error."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise SnapevalError(f"{path} is not valid JSON ({exc.msg}, line {exc.lineno})", "model") from exc
    if not isinstance(data, dict):
        raise SnapevalError(f"{path} does not hold a JSON object", "model")
    return data
