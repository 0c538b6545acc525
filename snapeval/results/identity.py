"""What identifies a result: the stored config (the composed config as recorded with results), its hash
(less what does not change a result), the config's dotted columns and the short names of the keys that
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

from snapeval.protocols import changed_settings

#: Top-level config keys never stored with a result: where results go, Hydra's and the memory
#: estimator's settings, which job ran, and the grid (each of its points is stored as its own config).
NOT_STORED: tuple[str, ...] = ("hydra", "memory", "job", "grid")

#: Run settings never stored: where results go and how long a worker's claims last.
RUN_NOT_STORED: tuple[str, ...] = ("db", "lease_s")

#: The random number generator of sampled answers (:mod:`snapeval.sampling`), stored with sampled runs.
SAMPLER = "counter-hash-v1"

#: Config keys (dotted paths) that do not change what a sample's result is, left out of
#: :func:`config_hash`: where results go, Hydra's own settings, progress display, the memory
#: estimator's settings, ``task.limit`` so that a run with a larger limit reuses the samples
#: of a smaller one, ``task.shard`` so that the shards of a point fill one point, and how answers
#: are decoded (``generation.batch_size``, ``compile``; the retired ``draw_batch``): every path
#: gives the same answers. ``model.prompt_style`` is hashed where it acts, as the ``task.prompt_style``
#: it sets (LiveCodeBench). ``model.hub_id`` names the config a model was converted from, read only by
#: the memory estimator.
DEFAULT_IGNORED: tuple[str, ...] = (
    "run",
    "hydra",
    "memory",
    "task.num_prompts",
    "generation.draw_batch",
    "model.prompt_style",
    "model.hub_id",
)

#: Config keys that no longer exist: ``python -m snapeval.results migrate`` drops them from stored
#: configs and re-keys those runs' samples, so that the runs resume under the configs of today.
RETIRED_KEYS: tuple[str, ...] = ("task.family", "task.lm_eval_task", "task.id_field")

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

#: Distribution of each package whose version a run records.
VERSIONED_PACKAGES: dict[str, str] = {
    "torch": "torch",
    "transformers": "transformers",
    "lm_eval": "lm-eval",
    "snapeval": "snapeval",
}


def stored_config(cfg: Mapping[str, Any], cache_params: Mapping[str, Any]) -> dict[str, Any]:
    """The config as recorded with results: without :data:`NOT_STORED`, its cache given as the cache's
    effective parameters (``cache_params``: :func:`snapeval.cache.effective_params` of ``cfg["cache"]``,
    which drops what the method ignores), a sampled run's generator named (never mixed with another's),
    and under a protocol preset the preset's settings it changes (``protocol.changed``).
    """
    stored = {key: value for key, value in cfg.items() if key not in NOT_STORED}
    if "run" in stored:
        stored["run"] = {key: value for key, value in stored["run"].items() if key not in RUN_NOT_STORED}
    stored["cache"] = dict(cache_params)
    if cfg.get("protocol"):  # the preset's settings changed after it, by name, beside its deviations
        stored["protocol"] = {**cfg["protocol"], "changed": changed_settings(cfg)}
    if cfg["generation"]["do_sample"]:
        stored["generation"] = {**cfg["generation"], "rng": SAMPLER}
    return stored


def config_hash(config: Mapping[str, Any], ignore: Iterable[str] = DEFAULT_IGNORED) -> str:
    """SHA-256 of the canonical JSON of ``config`` without the ``ignore`` dotted keys."""
    for path in ignore:
        config = _without(config, path)
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def without_retired_keys(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """``config`` less :data:`RETIRED_KEYS`."""
    for path in RETIRED_KEYS:
        config = _without(config, path)
    return config


def _without(config: Mapping[str, Any], path: str) -> Mapping[str, Any]:
    head, _, rest = path.partition(".")
    if head not in config:
        return config
    if not rest:
        return {key: value for key, value in config.items() if key != head}
    child = config[head]
    return {**config, head: _without(child, rest)} if isinstance(child, Mapping) else config


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys: ``{"cache": {"budget": 8}}`` -> ``{"cache.budget": 8}``."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


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
