"""Compose the configs of ``conf/`` from Python, as ``python -m snapeval <overrides>`` would."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from snapeval.errors import SnapevalError
from snapeval.paths import CONF_DIR


def compose_config(*overrides: str) -> dict[str, Any]:
    """The resolved config of ``conf/config.yaml`` with Hydra ``overrides``, as a plain dict."""
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            config = compose("config", overrides=list(overrides))
            return named_after_weights(OmegaConf.to_container(config, resolve=True))
    except (HydraException, OmegaConfBaseException) as exc:
        if unknown := re.search(r"Could not override '([\w.]+)'", str(exc)):
            key = unknown[1]
            message = f"no such key (check its spelling; +{key}=... adds a new one)"
            raise SnapevalError(message, key) from None
        reason = str(exc).splitlines()[0]  # Hydra goes on with search paths and grammar links
        raise SnapevalError(f"cannot compose {' '.join(overrides) or 'the defaults'}: {reason}") from None


def named_after_weights(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its model named after the weights it loads: ``model.pretrained=<folder or Hub id>``
    over a ``conf/model`` entry (say the default ``smollm2-135m``) runs other weights, so results must
    not be stored or shown under the entry's name, nor its ``hub_id`` (the memory estimator's geometry)
    kept. A name given on the command line (``model.name=...``) is kept as given."""
    model = config.get("model")
    entry_file = CONF_DIR / "model" / f"{model['name']}.yaml" if model else None
    if entry_file is None or not entry_file.is_file():
        return config
    entry = yaml.safe_load(entry_file.read_text(encoding="utf-8")) or {}
    if entry.get("name") != model["name"] or entry.get("pretrained") == model.get("pretrained"):
        return config
    pretrained = str(model["pretrained"])
    name = Path(pretrained).name if Path(pretrained).is_dir() else pretrained
    return {**config, "model": {**model, "name": name, "hub_id": None}}
