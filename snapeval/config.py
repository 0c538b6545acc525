"""Compose the configs of ``conf/`` from Python, as ``python -m snapeval <overrides>`` would."""

from __future__ import annotations

import re
from typing import Any

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
            return OmegaConf.to_container(config, resolve=True)
    except (HydraException, OmegaConfBaseException) as exc:
        if unknown := re.search(r"Could not override '([\w.]+)'", str(exc)):
            key = unknown[1]
            message = f"no such key (check its spelling; +{key}=... adds a new one)"
            raise SnapevalError(message, key) from None
        reason = str(exc).splitlines()[0]  # Hydra goes on with search paths and grammar links
        raise SnapevalError(f"cannot compose {' '.join(overrides) or 'the defaults'}: {reason}") from None
