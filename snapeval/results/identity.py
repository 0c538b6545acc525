"""What identifies a result: the stored config (the composed config as recorded with results), its hash
(less what does not change a result), both derived from the config fields' declarations
(:func:`snapeval.configs.fields.setting`), the config's dotted columns and the short names of the keys that
tell experiments apart, and the provenance recorded with each run (git commit, package versions)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from snapeval.configs import legacy
from snapeval.configs.cache import DEPLOYMENT
from snapeval.configs.protocols import changed_settings, lookup
from snapeval.configs.root import declared_fields
from snapeval.configs.setting import effective_params
from snapeval.errors import SnapevalError

#: The random number generator of sampled answers (:mod:`snapeval.decode.sampling`), stored with sampled runs.
SAMPLER = "counter-hash-v1"

#: Hydra's own node: a reserved key, never a config field, never stored nor hashed.
HYDRA = "hydra"

#: Dotted config keys never stored with a result (``setting(stored=False)``): which job ran, how a run
#: executes (``run``, but for the shard a worker ran), the grid (each point is stored as its own config)
#: and the memory estimator's settings.
NOT_STORED: tuple[str, ...] = (
    HYDRA,
    *(path for path, item in declared_fields() if not item.metadata["stored"]),
)

#: Dotted config keys stored but left out of :func:`config_hash` (``setting(hashed=False)``): they name
#: or slice a run without changing what a sample's result is (the ``run`` group, the model's
#: ``hub_id`` and ``prompt_style``, which acts as the ``task.prompt_style`` it sets, ``num_prompts``).
UNHASHED: tuple[str, ...] = (
    HYDRA,
    *(path for path, item in declared_fields() if item.metadata["stored"] and not item.metadata["hashed"]),
)

#: Optional nodes stored only when set, not null or false (``setting(when_set=True)``): ``protocol``,
#: ``model.config_overrides``, ``model.completion``.
WHEN_SET: tuple[str, ...] = tuple(path for path, item in declared_fields() if item.metadata["when_set"])

#: Short column names in :func:`load`, for the config keys that identify an experiment.
ALIASES: dict[str, str] = {
    "model": "model.name",
    "task": "task.name",
    "method": "cache.method",
    "budget": "cache.budget",
    "window": "cache.window",
    "kernel": "cache.kernel",
    "pooling": "cache.pooling",
}

#: Config columns every loaded frame has (:func:`load`), null where a run left them unset: how a setting was
#: deployed (``cache.prefill_chunk`` null: one whole prefill; ``cache.kv_dtype`` null: the model's dtype).
DEPLOYMENT_COLUMNS: tuple[str, ...] = tuple(f"cache.{name}" for name in DEPLOYMENT)

#: Distribution of each package whose version a run records.
VERSIONED_PACKAGES: dict[str, str] = {
    "torch": "torch",
    "transformers": "transformers",
    "lm_eval": "lm-eval",
    "snapeval": "snapeval",
}


def identity(cfg: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """What a run of ``cfg`` is stored and found under: its :func:`stored_config`, its cache given by
    :func:`~snapeval.configs.setting.effective_params`, and that config's :func:`config_hash`."""
    stored = stored_config(cfg, effective_params(cfg["cache"]))
    return stored, config_hash(stored)


def stored_config(cfg: Mapping[str, Any], cache_params: Mapping[str, Any]) -> dict[str, Any]:
    """The config as recorded with results (:func:`keep_stored`), its cache given as the cache's
    effective parameters (``cache_params``: :func:`snapeval.cache.effective_params` of ``cfg["cache"]``,
    which drops what the method ignores), a sampled run's generator named (never mixed with another's),
    and under a protocol preset the preset's settings it changes (``protocol.changed``).
    """
    stored = keep_stored(cfg)
    stored["cache"] = dict(cache_params)
    if cfg.get("protocol"):  # the preset's settings changed after it, by name, beside its deviations
        stored["protocol"] = {**cfg["protocol"], "changed": changed_settings(cfg)}
    if cfg["generation"]["do_sample"]:
        stored["generation"] = {**cfg["generation"], "rng": SAMPLER}
    return stored


def keep_stored(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` less :data:`NOT_STORED` and the :data:`WHEN_SET` nodes left unset (null or false)."""
    for path in NOT_STORED:
        config = _without(config, path)
    for path in WHEN_SET:
        found, value = lookup(config, path)
        if found and (value is None or value is False):
            config = _without(config, path)
    return dict(config)


def run_config(run: Mapping[str, Any], field: str) -> dict[str, Any]:
    """The config ``run`` stores; one that is not a mapping (JSON null, say) is an error naming the run."""
    config = run["config"]
    if not isinstance(config, Mapping):
        raise SnapevalError(
            f"run {run['id']} stores {json.dumps(config)[:40]} as its config, not a mapping of settings, so "
            "its samples cannot be placed: a damaged row; restore the database from a copy, or delete the "
            "run and its samples",
            field,
        )
    return dict(config)


def config_hash(config: Mapping[str, Any], ignore: Iterable[str] = UNHASHED) -> str:
    """SHA-256 of the canonical JSON of ``config`` without the ``ignore`` dotted keys."""
    for path in ignore:
        config = _without(config, path)
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def upgraded(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config stored by an older snapeval as it is stored today: old keys renamed or dropped
    (:mod:`snapeval.configs.legacy`), then :func:`keep_stored`."""
    return keep_stored(legacy.upgrade(config))


def _without(config: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    head, _, rest = path.partition(".")
    if head not in config:
        return config
    if not rest:
        return {key: value for key, value in config.items() if key != head}
    child = config[head]
    return {**config, head: _without(child, rest)} if isinstance(child, Mapping) else config


def git_sha() -> str | None:
    """The commit of the snapeval checkout a run uses, or None outside a git checkout."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip()


def package_versions() -> dict[str, str | None]:
    """Python's and each :data:`VERSIONED_PACKAGES` version (None where not installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for key, distribution in VERSIONED_PACKAGES.items():
        try:
            versions[key] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            versions[key] = None
    return versions
