"""What a run checks before it loads a model, so that a bad input fails in seconds, not after loading:
the cache's parameters (or the grid's), the task and its data file, the samples a shard gets, and the
draft models a cache names.

:func:`check_inputs` is called by the front door (``python -m snapeval``) once the schema
(:mod:`snapeval.configs.check`) has passed; the runner calls the same checks before it loads the model.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from snapeval.configs.fields import count_error, is_name, model_configs, model_entry
from snapeval.configs.methods import draft_names, missing_extra
from snapeval.configs.root import MAX_REQUESTS
from snapeval.errors import SnapevalError
from snapeval.grid import check_grid, grid_points, skipped_options

DRAFT_FIELD = "cache.draft"
MODEL_FIELD = "model.pretrained"


def check_inputs(config: Mapping[str, Any]) -> None:
    """Every check that needs no model weights: task, data rows, requests, shard, drafts' names and cache
    extras, a local model folder's ``config.json`` (before torch), then cache parameters, drafts' configs
    and the model's config with its overrides."""
    from snapeval.tasks import load_task

    limit = config["run"]["limit"]
    task = load_task(config["task"], config["seed"], limit)
    if not task.needs_tokenizer:  # rows are read from a file (or the Hub): read them now
        rows = task.rows(None)[:limit]
        task.check_fits(rows, config["model"]["max_context"])  # a row too long, before any tokenizer
        count = len(rows)
    else:  # generated: as many as asked for
        count = limit or config["task"].get("num_prompts") or 1
    check_requests(count, config["generation"]["num_samples"])
    check_shard(count * config["generation"]["num_samples"], config["run"]["shard"])
    check_extras(config)
    caches = [point["cache"] for point in grid_points(config)]
    check_draft_names(caches)  # before torch
    check_model_folder(config["model"])

    from snapeval.cache import build_cache  # torch and transformers load here

    if config.get("grid") is None:  # the schema checked a shipped method's keys; an outside one's here
        cache = config["cache"]
        outside = ":" in str(cache.get("method"))
        build_cache({k: v for k, v in cache.items() if v is not None} if outside else cache, strict=outside)
    else:
        check_grid(config)
    check_drafts(caches)
    check_model(config["model"])


def check_requests(prompts: int, draws: int) -> None:
    """Refuse more than :data:`~snapeval.configs.root.MAX_REQUESTS` requests (``prompts`` x ``draws``)."""
    if prompts * draws > MAX_REQUESTS:
        raise SnapevalError(
            f"{prompts:,} prompts x {draws:,} draws make {prompts * draws:,} requests; a run makes at most "
            f"{MAX_REQUESTS:,}: draw fewer, or fewer prompts (run.limit)",
            "generation.num_samples",
        )


def check_model_folder(model: Mapping[str, Any]) -> None:
    """A local model folder's ``config.json``, read before torch: a JSON object whose counts (layers,
    heads, widths) are at least 1."""
    path = Path(str(model.get("pretrained"))) / "config.json"
    if not path.is_file():
        return
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SnapevalError(f"{path}: not a readable JSON config ({exc})", MODEL_FIELD) from None
    if not isinstance(values, dict):
        raise SnapevalError(f"{path}: not a JSON object", MODEL_FIELD)
    for key, value in values.items():
        if (error := count_error(key, value)) is not None:
            raise SnapevalError(f"{path}: {key} {error}", MODEL_FIELD)


def check_model(model: Mapping[str, Any]) -> None:
    """The model's config read (not its weights) with its ``config_overrides`` set and checked
    (:func:`snapeval.models.model_config`), when it has overrides or is a local folder (a GGUF model's
    config takes seconds to convert: its own is not checked here)."""
    from snapeval.models import ModelSpec, model_config, resolve_pretrained

    spec = ModelSpec.from_config(model)
    if spec.config_overrides or (Path(resolve_pretrained(spec.pretrained)) / "config.json").is_file():
        model_config(spec)


def check_extras(config: Mapping[str, Any]) -> None:
    """Refuse a method whose optional extra is missing, before torch loads; a grid leaves its points out
    with a note, and runs the rest."""
    if config.get("grid") is None:
        if why := missing_extra(config["cache"].get("method")):
            raise SnapevalError(why, "cache.method")
        return
    for option, why in skipped_options(config).items():
        print(f"note: grid.cache: {option} left out: {why}", file=sys.stderr)
    if not grid_points(config):
        raise SnapevalError("no point of this grid can run here", "grid.cache")


def check_shard(samples: int, spec: str | None) -> None:
    """Refuse a shard (``i/n``) that gets none of the run's ``samples``."""
    if spec is None:
        return
    index, count = map(int, spec.split("/"))
    if samples * (index + 1) // count == samples * index // count:
        raise SnapevalError(
            f"shard {spec} of {samples} sample(s) is empty: use at most {samples} shards, or more samples",
            "run.shard",
        )


def check_draft_names(caches: list[Mapping[str, Any]]) -> None:
    """Every draft model the caches name (``cache.draft``) is a model config of ``conf/model``, a local
    directory, or a Hub id (``owner/name``): never another path."""
    for name in draft_names(caches):
        if model_entry(name) is None and not Path(name).is_dir() and not (is_name(name) and "/" in name):
            raise SnapevalError(
                f"no model {name!r}: give self, a model config ({', '.join(model_configs())}), a local "
                "directory or a Hub id (owner/name)",
                DRAFT_FIELD,
            )


def check_drafts(caches: list[Mapping[str, Any]]) -> None:
    """:func:`check_draft_names`, then each draft's config is read (not its weights)."""
    check_draft_names(caches)
    for name in draft_names(caches):
        _check_draft(name)


def _check_draft(name: str) -> None:
    from snapeval.models import model_spec, resolve_pretrained

    spec = model_spec(name)
    try:
        source = resolve_pretrained(spec.pretrained)
    except SnapevalError as exc:
        raise SnapevalError(str(exc).removeprefix(f"{exc.field}: "), DRAFT_FIELD) from None
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(source, gguf_file=spec.gguf_file)
    except (OSError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SnapevalError(f"cannot load draft {name!r}: {reason}", DRAFT_FIELD) from None
