"""One checked run plan: every check a run needs, made once, before any model loads.

:func:`check_inputs` is the torch-free stage (about a second): the config's fields
(:func:`snapeval.configs.check.check`), the sandbox (LiveCodeBench), the task and its data rows (read,
each checked to fit), the requests, the shard, the extras a method needs, the draft names, a local
model folder's ``config.json`` and the model's trained positions (:func:`check_positions`).
:func:`make_plan` adds the rest: the device, the answer pass, each cache setting's parameters (a grid
point whose settings are impossible is set aside, to be recorded as failed), the drafts' configs and
the model's config with its overrides. The front door, the gate and :func:`snapeval.run.runner.run` build a
:class:`RunPlan` this way, and the runner executes it without checking anything again.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from snapeval.backends.reach import check_reachable
from snapeval.configs.check import check
from snapeval.configs.engine import check_engine, serve_template
from snapeval.configs.fields import count_error, is_name, model_configs, model_entry
from snapeval.configs.grid import grid_points, skipped_options
from snapeval.configs.methods import draft_names, missing_extra
from snapeval.configs.protocols import announce
from snapeval.configs.root import MAX_REQUESTS
from snapeval.configs.setting import CacheSetting
from snapeval.errors import SnapevalError

if TYPE_CHECKING:
    from snapeval.tasks import Task

DRAFT_FIELD = "cache.draft"
MODEL_FIELD = "model.pretrained"
TEMPLATE_TOKENS = 256
"""Tokens a chat template adds to a prompt's messages at most (role markers, a default system prompt)."""


@dataclass(frozen=True)
class Inputs:
    """A config whose fields, task, data, requests, shard, extras and draft names passed (no torch)."""

    config: dict[str, Any]
    task: Task
    settings: tuple[dict[str, Any], ...]  # the configs of its cache settings (a grid's points)
    samples: int  # prompts x draws: the samples each setting stores


@dataclass(frozen=True)
class PlannedPoint:
    """A setting that runs: its config as results store it, and its cache setting (made once, here)."""

    config: dict[str, Any]
    setting: CacheSetting


@dataclass(frozen=True)
class RunPlan:
    """A run checked once: its config, its task, the settings that run (each as results store it) and
    those whose parameters are impossible, each with why."""

    config: dict[str, Any]
    task: Task
    points: tuple[PlannedPoint, ...]
    failed: tuple[tuple[dict[str, Any], SnapevalError], ...] = ()


def check_inputs(config: dict[str, Any]) -> Inputs:
    """Every check that needs no torch and no model weights, in order (see the module's docstring)."""
    check(config)
    announce(config)  # a preset's deviations from the official run, stored with it (its config)
    if config["task"]["name"] == "livecodebench":  # graded in the sandbox: a machine that cannot run it
        from snapeval.sandbox import isolation

        isolation()
    from snapeval.tasks import load_task

    limit = config["run"]["limit"]
    task = load_task(config["task"], config["seed"], limit)
    if config["model"].get("completion") and not task.reads_as_text:
        raise SnapevalError(
            f"{config['model']['name']} is a base model (plain-text prompts): task {config['task']['name']} "
            "needs a chat model; run a RULER task (task=ruler_passkey, ruler_niah_single, ...)",
            "model.completion",
        )
    rows = None
    if not task.needs_tokenizer:  # rows are read from a file (or the Hub): read them now
        rows = task.rows(None)[:limit]
        task.check_fits(rows, config["model"]["max_context"])  # a row too long, before any tokenizer
        count = len(rows)
    else:  # generated: as many as asked for
        count = limit or config["task"].get("num_prompts") or 1
    check_requests(count, config["generation"]["num_samples"])
    check_shard(count * config["generation"]["num_samples"], config["run"]["shard"])
    settings = tuple(grid_points(config))
    check_extras(config, settings)
    check_draft_names([setting["cache"] for setting in settings])
    check_engine(config, [setting["cache"] for setting in settings])  # engine.serve's command and fields
    if config["model"].get("backend") and serve_template(config) is None:  # a deployed engine: its address
        check_reachable(config["model"].get("backend_args"))
    folder = check_model_folder(config["model"])
    check_positions(config, task, rows, trained_positions(config["model"], folder))
    return Inputs(config, task, settings, count * config["generation"]["num_samples"])


def make_plan(config_or_inputs: dict[str, Any] | Inputs) -> RunPlan:
    """The :class:`RunPlan` of a config (or of its checked :class:`Inputs`); one line naming the field
    for the first thing wrong, or when no setting of a grid can run."""
    inputs = config_or_inputs if isinstance(config_or_inputs, Inputs) else check_inputs(config_or_inputs)
    config = inputs.config
    from snapeval.models import check_device
    from snapeval.tasks import AnswerPass

    check_device(config["model"].get("device", "auto"))
    AnswerPass.from_config(config["task"].get("answer_pass"))
    points, failed = plan_points(inputs)
    if not points:
        raise failed[0][1]
    check_drafts([point.config["cache"] for point in points])
    check_model(config["model"], config["run"]["rendezvous_s"])
    return RunPlan(config, inputs.task, tuple(points), tuple(failed))


def plan_points(inputs: Inputs) -> tuple[list[PlannedPoint], list[tuple[dict[str, Any], SnapevalError]]]:
    """The settings' points, each with its cache setting (each method's declaration checks its parameters
    together) and its config as stored, and the settings that cannot run, each with its error; torch-free."""
    from snapeval.results import stored_config

    points, failed = [], []
    for config in inputs.settings:
        try:
            setting = CacheSetting.of(config["cache"])
            points.append(PlannedPoint(stored_config(config, setting.stored), setting))
        except SnapevalError as exc:
            failed.append((config, exc))
    return points, failed


def check_requests(prompts: int, draws: int) -> None:
    """Refuse more than :data:`~snapeval.configs.root.MAX_REQUESTS` requests (``prompts`` x ``draws``)."""
    if prompts * draws > MAX_REQUESTS:
        raise SnapevalError(
            f"{prompts:,} prompts x {draws:,} draws make {prompts * draws:,} requests; a run makes at most "
            f"{MAX_REQUESTS:,}: draw fewer, or fewer prompts (run.limit)",
            "generation.num_samples",
        )


def check_model_folder(model: Mapping[str, Any]) -> dict[str, Any] | None:
    """A local model folder's ``config.json``, read before torch: a JSON object whose counts (layers,
    heads, widths) are at least 1; None when the model is not such a folder."""
    path = Path(str(model.get("pretrained"))) / "config.json"
    if not path.is_file():
        return None
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SnapevalError(f"{path}: not a readable JSON config ({exc})", MODEL_FIELD) from None
    if not isinstance(values, dict):
        raise SnapevalError(f"{path}: not a JSON object", MODEL_FIELD)
    for key, value in values.items():
        if (error := count_error(key, value)) is not None:
            raise SnapevalError(f"{path}: {key} {error}", MODEL_FIELD)
    return values


def trained_positions(model: Mapping[str, Any], folder: Mapping[str, Any] | None) -> int | None:
    """The model's trained positions: ``max_position_embeddings`` (of its text model, if multimodal) in
    its local folder's ``config.json`` (``folder``), else in the config snapeval ships for its Hub id
    (``model.hub_id``, else ``model.pretrained``: :mod:`snapeval.memory.catalogue`); None where neither
    says, before torch."""
    from snapeval.memory.catalogue import shipped_config

    values = folder if folder is not None else shipped_config(str(model.get("hub_id") or model["pretrained"]))
    text = (values or {}).get("text_config")
    for fields in (values or {}, text if isinstance(text, Mapping) else {}):
        positions = fields.get("max_position_embeddings")
        if isinstance(positions, int) and not isinstance(positions, bool) and positions > 0:
            return positions
    return None


def check_positions(
    config: Mapping[str, Any], task: Task, rows: list[dict[str, Any]] | None, trained: int | None
) -> None:
    """Refuse a run whose sequences may pass the model's ``trained`` positions, as far as its window
    lets them run: a generated task's ``context_length`` and answer, a data task's longest row (no token
    is shorter than a byte) and answer; ``model.allow_past_trained_positions`` lets them, with a note."""
    if trained is None:
        return
    model, new = config["model"], config["task"]["max_new_tokens"]
    window, length = model["max_context"], config["task"].get("context_length")
    if rows is None and length is not None:  # generated at context_length tokens, then answered
        longest, most = min(length + new, window), trained - new
        field, what = "task.context_length", f"{length:,} tokens and {new:,} new ones run"
    else:
        prompt = max((_utf8_bytes(task, row) for row in rows or ()), default=0) + TEMPLATE_TOKENS
        longest, most = min(prompt + new, window), trained
        field, what = (
            "model.max_context",
            f"a window of {window:,} tokens lets prompts and {new:,} new ones run",
        )
    if longest <= trained:
        return
    past = f"{what} past {model['name']}'s {trained:,} trained positions (max_position_embeddings)"
    if model.get("allow_past_trained_positions"):
        print(f"note: {field}: {past}, as model.allow_past_trained_positions allows", file=sys.stderr)
        return
    raise SnapevalError(
        f"{past}: give at most {most}, or set model.allow_past_trained_positions=true for a model made "
        "to run longer (RoPE scaling: docs/models.md)",
        field,
    )


def _utf8_bytes(task: Task, row: Mapping[str, Any]) -> int:
    """The bytes of ``row``'s messages as UTF-8: at least as many as their tokens."""
    return sum(len(message["content"].encode()) for message in task.messages(row))


def check_model(model: Mapping[str, Any], rendezvous_s: float) -> None:
    """The model's config read (not its weights) with its ``config_overrides`` set and checked
    (:func:`snapeval.models.model_config`), when it has overrides or is a local folder (a GGUF model's
    config takes seconds to convert: its own is not checked here, but under torchrun, where the ranks
    must be able to split the model: :func:`snapeval.models.parallel.check_tensor_parallel`)."""
    from snapeval.cli.world import launcher_world
    from snapeval.models import ModelSpec, model_config, resolve_pretrained
    from snapeval.models.parallel import check_tensor_parallel, init_process_group

    spec = ModelSpec.from_config(model)
    world = launcher_world()
    if world.parallel:  # under torchrun: a model the ranks cannot split is refused here, on every rank
        init_process_group(
            world, rendezvous_s
        )  # so that each rank's one line is printed before any rank ends
        check_tensor_parallel(model_config(spec), world.size)
    elif spec.config_overrides or (Path(resolve_pretrained(spec.pretrained)) / "config.json").is_file():
        model_config(spec)


def check_extras(config: Mapping[str, Any], settings: tuple[dict[str, Any], ...]) -> None:
    """Refuse a method whose optional extra is missing, before torch loads; a grid leaves its points out
    with a note, and runs the rest (``settings``: its points, :func:`grid_points`)."""
    if config.get("grid") is None:
        if why := missing_extra(config["cache"].get("method")):
            raise SnapevalError(why, "cache.method")
        return
    for option, why in skipped_options(config).items():
        print(f"note: grid.cache: {option} left out: {why}", file=sys.stderr)
    if not settings:
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
