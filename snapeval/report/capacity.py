"""KV bytes per sequence and rows per accelerator at an experiment's context, from the memory estimator
(:func:`snapeval.memory.estimate`) for the models its catalogue ships, on one H100, H200 and SN40L socket.

The estimator sizes a compressed cache from the engine's cache classes, which need torch; the report
does not load torch, so a compressed setting's bytes are the full cache's estimate scaled by the KV bytes
its runs measured against the full cache's on the same samples."""

from __future__ import annotations

import math
from typing import Any

from snapeval.errors import SnapevalError
from snapeval.memory import ModelGeometry, estimate, geometry_from_config
from snapeval.memory.catalogue import shipped_config
from snapeval.memory.estimate import MemoryEstimate
from snapeval.report.analysis import Decision
from snapeval.report.data import Experiment
from snapeval.report.document import Block, Cell, Heading, Mark, Paragraph, Table, binary_size

HARDWARE = ("h100", "h200", "sn40l")
HARDWARE_NAMES = {"h100": "H100", "h200": "H200", "sn40l": "SN40L"}


def catalogued_geometry(config: dict[str, Any]) -> tuple[ModelGeometry | None, str]:
    """The estimator's geometry of the config's model (its ``hub_id``, else ``pretrained``) when the
    catalogue ships it, else None and why it is left out."""
    model = config.get("model") or {}
    for source in (model.get("hub_id"), model.get("pretrained")):
        fields = shipped_config(source) if isinstance(source, str) else None
        if fields is not None:
            return geometry_from_config(fields, name=str(model.get("name")), source=source), ""
    sources = " or ".join(str(s) for s in (model.get("hub_id"), model.get("pretrained")) if s)
    return None, (
        f"left out: the memory estimator's catalogue (snapeval/memory/models) ships no config for "
        f"{sources or 'this model'}, and the report reads no config from elsewhere"
    )


def task_context(config: dict[str, Any], samples: list[dict[str, Any]]) -> tuple[int | None, str]:
    """The tokens a full-cache row holds for the task: ``task.context_length`` where the task has one,
    else the longest stored prompt and ``task.max_new_tokens``; and how it was found."""
    task = config.get("task") or {}
    if isinstance(task.get("context_length"), int):
        return task["context_length"], "task.context_length"
    prompts = [row["prompt_tokens"] for row in samples if row.get("prompt_tokens")]
    new_tokens = task.get("max_new_tokens")
    if not prompts or not isinstance(new_tokens, int):
        return None, "no prompt length stored"
    return max(
        prompts
    ) + new_tokens, f"longest stored prompt {max(prompts):,} + max_new_tokens {new_tokens:,}"


def capacity_blocks(experiment: Experiment, decisions: list[Decision]) -> list[Block]:
    """The estimator's table for ``experiment``: the full cache and each setting that meets a target, at
    the TP degree its runs recorded (:func:`sized_degree`): a rank's KV bytes per sequence and the rows one
    socket holds in what its shard of the weights leaves."""
    blocks: list[Block] = [Heading(3, "KV memory per sequence and rows per accelerator")]
    geometry, reason = catalogued_geometry(experiment.config)
    if geometry is None:
        return [*blocks, Paragraph(f"{experiment.model}: {reason}.")]
    samples = [row for _, setting in experiment.labelled() for row in setting.samples]
    context, found = task_context(experiment.config, samples)
    if context is None:
        return [*blocks, Paragraph(f"Left out: the task's context is unknown ({found}).")]
    tp, degree_text = sized_degree(experiment, geometry)
    try:
        estimates = [estimate(geometry, hardware, context=context, tp=tp) for hardware in HARDWARE]
    except SnapevalError as error:
        return [*blocks, Paragraph(f"Left out: the memory estimator refused {context:,} tokens ({error}).")]
    columns = [(e, tier) for e in estimates for tier in e.tiers if tier.name != "onchip"]
    header = (
        "Cache",
        "KV per sequence" if tp == 1 else "KV per sequence, one rank",
        *(f"rows, {HARDWARE_NAMES[e.hardware]} {tier.label}" for e, tier in columns),
    )
    rows: list[tuple[Cell, ...]] = [_row("Full cache", 1.0, columns)]
    for label, ratio in _passing(decisions):
        if math.isnan(ratio):
            rows.append((label, Mark("KV bytes not stored", "muted"), *("-" for _ in columns)))
        else:
            rows.append(_row(label, ratio, columns))
    notes = sorted({note for e in estimates for note in e.notes})
    return [
        *blocks,
        Paragraph(
            f"{geometry.name} ({geometry.attention}, {geometry.num_layers} layers) at {context:,} tokens "
            f"({found}); {estimates[0].kv_dtype} KV, {estimates[0].weights_dtype} weights, {degree_text}, "
            "KV in what the weights leave."
        ),
        Table(header, tuple(rows)),
        Paragraph(
            "A compressed row (the smallest budget meeting a target; the others are not sized here): the "
            "full cache's estimate times the KV bytes its runs held over the full cache's on the same "
            "samples (both the whole row's, over every rank, so runs at any TP degree compare). Estimator "
            "notes: " + "; ".join(notes) + ".",
            note=True,
        ),
    ]


def sized_degree(experiment: Experiment, geometry: ModelGeometry) -> tuple[int, str]:
    """The TP degree the table is sized at and how the text says it: the largest its runs recorded.

    One degree sizes the whole table, so that its rows compare. Runs of one experiment at different
    degrees show that the model ran at each; the largest is the one its weights and cache needed (a model
    split 8 ways because one socket could not hold it would show no row at a smaller degree), and the
    smaller ones are named. A database from before TP (``tensor_parallel`` NULL) is sized at tp=1, one
    socket, as it always was."""
    degrees = experiment.tensor_parallel or (1,)
    tp = max(degrees)
    if tp == 1:
        return 1, "one socket (tp=1)"
    if geometry.attention == "mla":  # one latent per token: sharded or replicated, by the hardware
        latent = "the MLA latent as the notes say"
        text = f"tp={tp}: the weights split over {tp} sockets and {latent}, as the runs were"
    else:
        text = f"tp={tp}: the weights and KV heads split over {tp} sockets, as the runs were"
    if len(degrees) > 1:
        text += f" (runs at {_degrees(degrees)}: sized at the largest)"
    return tp, text


def _degrees(degrees: tuple[int, ...]) -> str:
    return "tp=" + ", ".join(str(d) for d in degrees)


def _passing(decisions: list[Decision]) -> list[tuple[str, float]]:
    """``(label, measured KV ratio)`` of each setting that is the smallest to meet a target, once."""
    labels: dict[str, tuple[str, float, list[str]]] = {}
    for decision in decisions:
        if decision.passing is not None:
            setting = decision.passing.setting
            label = decision.series.labelled(setting)
            entry = labels.setdefault(setting.digest, (label, decision.passing.kv_ratio, []))
            entry[2].append(f"{decision.target:g}")
    return [(f"{label} (meets {', '.join(targets)})", ratio) for label, ratio, targets in labels.values()]


def _row(label: str, ratio: float, columns: list[tuple[MemoryEstimate, Any]]) -> tuple[Cell, ...]:
    """A row of ``ratio`` times the full cache's KV bytes per sequence on one rank: each hardware's own
    (an MLA latent may be sharded on one and replicated on another)."""
    per_rank = [(e.kv_bytes_per_sequence_full_per_socket * ratio, tier) for e, tier in columns]
    rows = (f"{int(tier.kv_available // kv_bytes):,}" for kv_bytes, tier in per_rank)
    return (label, binary_size(per_rank[0][0]), *rows)
