"""Where an experiment's results come from, as the database stores it: per setting its config hash, runs
(status, when, host, git commit, package versions), and the weights, data and protocol its config names.
What a run does not store is said to be not stored."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from snapeval.report.analysis import extra_field
from snapeval.report.data import Experiment, Setting
from snapeval.report.document import Block, Bullets, Heading, Table
from snapeval.results import flatten

NOT_STORED = "not stored"
#: Package versions a run stores (``runs.versions``), in the order shown.
PACKAGES = ("snapeval", "torch", "transformers", "python")
#: Config keys (their last part) under ``task`` that name or pin a dataset.
DATASET_KEYS = ("data_path", "release", "revision", "start_date", "end_date", "split")


def provenance_blocks(experiment: Experiment) -> list[Block]:
    """A table of every setting's runs, and what the config says of weights, data and protocol."""
    labelled = experiment.labelled()
    rows = tuple(_setting_row(label, setting) for label, setting in labelled)
    header = ("Setting", "Config hash", "Runs", "Created (UTC)", "Host", "Git commit", *PACKAGES)
    return [
        Heading(3, "Provenance"),
        Table(header, rows),
        Bullets(
            (
                _weights(experiment.config),
                _dataset(experiment.config),
                *_protocol([setting for _, setting in labelled]),
                "Accelerator: not stored (runs store their host name; the device is not recorded).",
            )
        ),
    ]


def _setting_row(label: str, setting: Setting) -> tuple[str, ...]:
    runs = setting.runs
    statuses = ", ".join(f"#{run['id']} {run['status']}" for run in runs)
    created = sorted(str(run["created_at"])[:19] for run in runs if run.get("created_at"))
    when = created[0] if len(created) < 2 or created[0] == created[-1] else f"{created[0]} to {created[-1]}"
    versions = [run.get("versions") if isinstance(run.get("versions"), dict) else {} for run in runs]
    return (
        label,
        setting.digest[:12],
        statuses,
        when or NOT_STORED,
        _distinct(run.get("hostname") for run in runs),
        _distinct((run.get("git_sha") or "")[:12] or None for run in runs),
        *(_distinct(v.get(package) for v in versions) for package in PACKAGES),
    )


def _distinct(values: Iterable[Any]) -> str:
    """The distinct stored values, in order; ``not stored`` where none is."""
    seen = list(dict.fromkeys(str(value) for value in values if value))
    return ", ".join(seen) if seen else NOT_STORED


def _weights(config: dict[str, Any]) -> str:
    model = config.get("model") or {}
    named = [
        f"{key} {model[key]}" for key in ("pretrained", "gguf_file", "hub_id", "dtype") if model.get(key)
    ]
    if not named:
        return f"Weights: {NOT_STORED}."
    return f"Weights: {', '.join(named)}; revision (commit of the weights): {NOT_STORED}."


def _dataset(config: dict[str, Any]) -> str:
    task = flatten(config.get("task") or {})
    named = [f"task.{key} {value}" for key, value in task.items() if key.rsplit(".", 1)[-1] in DATASET_KEYS]
    named = [item for item in named if not item.endswith(" None")]
    if named:
        return f"Dataset: {', '.join(named)}; revision of the data: {NOT_STORED} beyond these."
    generated = " (the RULER family is generated offline from the seed)" if "kind" in task else ""
    return f"Dataset revision: {NOT_STORED}{generated}."


def _protocol(settings: list[Setting]) -> list[str]:
    """The protocol preset and its deviations (the config's), and the scoring deviations the samples store."""
    lines = []
    presets = {
        (p.get("name"), tuple(p.get("deviations") or ()), tuple(p.get("changed") or ()))
        for p in (s.config.get("protocol") for s in settings)
        if isinstance(p, dict)
    }
    for name, deviations, changed in sorted(presets, key=str):
        listed = ", ".join([*deviations, *changed]) or "none"
        lines.append(f"Protocol preset {name}: deviations from the official run: {listed}.")
    if not presets:
        lines.append("Protocol preset: none (the config names no protocol).")
    stored = sorted(
        {str(item) for s in settings for row in s.samples for item in (extra_field(row, "deviations") or ())}
    )
    lines.append(f"Scoring deviations stored with the samples: {', '.join(stored) or 'none'}.")
    return lines
