"""The section "Engine against reference": each deployed engine's setting (``model.backend=lm_eval:...``)
beside snapeval's own run of the same setting, on the same samples (:func:`snapeval.stats.pair_engine`).

An engine's run and snapeval's of the same setting store configs that differ only in ``model.backend``
(and what is not hashed: ``model.backend_args``, how the server was started), so snapeval's is found by
the hash of the engine's config without them. Shown only when the database holds an engine's run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from snapeval.backends import TRUNCATED
from snapeval.configs.backend import lm_eval_model
from snapeval.report.data import Experiment, Setting, full_cache_config
from snapeval.report.document import Block, Cell, Heading, Mark, Paragraph, Table, interval, number
from snapeval.results import config_hash
from snapeval.stats import Answers, EnginePairing, Retention, answers_of, pair_engine
from snapeval.stats.agreement import CHANGED, FLAGGED, NOT_APPLIED, changes_to_flag

if TYPE_CHECKING:  # the gates compose configs with Hydra: loaded only to judge gates
    from snapeval.commands.engine_gate import EngineVerdict

ENGINE_KEYS = ("backend", "backend_args")
"""The ``model`` keys that tell an engine's run from snapeval's own of the same setting."""
NOTE = (
    "All numbers on the n samples that the engine's setting, its full cache, snapeval's setting and "
    "snapeval's full cache all scored (those stored). Agreement: the share of those samples whose outputs "
    "are the same text, with its exact 95% interval (Clopper-Pearson). Retention: each engine's accuracy "
    "over its own full cache's, with the one-sided 95% bounds of the decision report. "
    f'"{NOT_APPLIED}": the engine\'s setting answered every sample as its own full cache did, while '
    f"snapeval's changed at least {changes_to_flag()} of the same answers; a port whose compression "
    f"changes answers as often as snapeval's is flagged at most {2 ** -changes_to_flag():.1%} of the time "
    "(an exact bound, at every n). Prompts cut (beside n): the engine's stored samples whose prompt its "
    "server counted fewer tokens of than were sent: it cut them without saying so. A remote run stores no "
    "KV bytes: its KV MiB shows -."
)


def engine_blocks(experiments: list[Experiment]) -> list[Block]:
    """The section: a row per setting of each engine's experiment; nothing without an engine's run."""
    engines = [experiment for experiment in experiments if _backend(experiment.config)]
    if not engines:
        return []
    references = {
        _reference_key(setting.config): setting
        for experiment in experiments
        if not _backend(experiment.config)
        for _, setting in experiment.labelled()
    }
    rows = tuple(
        _row(experiment, label, setting, references)
        for experiment in engines
        for label, setting in experiment.labelled()
    )
    header = (
        "Engine",
        "Experiment",
        "Setting",
        "n",
        "Engine acc.",
        "snapeval acc.",
        "Agreement [95% CI]",
        "Engine retention [95% bounds]",
        "snapeval retention [95% bounds]",
        "Flag",
    )
    return [
        Heading(2, "Engine against reference", "engines"),
        Table(header, rows),
        Paragraph(NOTE, note=True),
    ]


def _row(
    experiment: Experiment, label: str, setting: Setting, references: Mapping[str, Setting]
) -> tuple[Cell, ...]:
    reference = references.get(_reference_key(setting.config))
    compressed = setting is not experiment.full
    reference_full = references.get(_reference_key(full_cache_config(setting.config)))
    pairing = pair_engine(
        _answers(setting),
        _answers(reference),
        _answers(experiment.full) if compressed else None,
        _answers(reference_full) if compressed else None,
    )
    others = ", ".join(f"{k}={v}" for k, v in experiment.distinct.items() if k != "model.backend")
    where = f"{experiment.model} · {experiment.task}" + (f" ({others})" if others else "")
    return (
        str(_backend(setting.config)),
        where,
        label,
        _n(pairing.n, setting),
        number(pairing.engine_accuracy),
        number(pairing.reference_accuracy) if reference else Mark("not stored", "muted"),
        _agreement(pairing),
        _retention(pairing.engine_retention, compressed),
        _retention(pairing.reference_retention, compressed),
        _flag(pairing, compressed),
    )


def _n(n: int, setting: Setting) -> Cell:
    """The paired n, and how many of the engine's stored samples its server cut the prompt of."""
    cut = sum(TRUNCATED in (row.get("extra") or {}) for row in setting.samples)
    return Mark(f"{n} ({cut} of {len(setting.samples)} prompts cut)", "fail") if cut else str(n)


def _agreement(pairing: EnginePairing) -> str:
    agreement = pairing.agreement
    return interval(agreement.share, agreement.low, agreement.high) if agreement else "-"


def _retention(bounds: Retention | None, compressed: bool) -> Cell:
    if not compressed:
        return "reference"
    return _bounds(bounds) if bounds else Mark("no full cache", "muted")


def _bounds(bounds: Retention | None) -> str:
    return interval(bounds.ratio, bounds.lower, bounds.upper) if bounds else "-"


def _flag(pairing: EnginePairing, compressed: bool) -> Cell:
    test = pairing.unchanged
    if not compressed:
        return "-"
    if test is None:
        return Mark("not tested: a run is not stored", "muted")
    changes = f"snapeval changed {test.reference_changed} of {test.n}"
    if test.verdict == FLAGGED:
        return Mark(f"{NOT_APPLIED} (0 of {test.n} answers changed; {changes})", "fail")
    if test.verdict == CHANGED:
        return f"applied ({test.changed} of {test.n} answers changed; {changes})"
    return Mark(f"unchanged, too few to flag ({changes}; needs {test.needed})", "muted")


def _answers(setting: Setting | None) -> Answers | None:
    return None if setting is None else answers_of(setting.samples)


def _backend(config: Mapping[str, Any]) -> str | None:
    """The engine a config's run was answered by (``lm_eval:<model>``); None for snapeval's own."""
    backend = (config.get("model") or {}).get("backend")
    return backend if lm_eval_model(backend) else None


def _reference_key(config: Mapping[str, Any]) -> str:
    """The hash a config shares with snapeval's run of the same setting: without :data:`ENGINE_KEYS`."""
    model = {k: v for k, v in (config.get("model") or {}).items() if k not in ENGINE_KEYS}
    return config_hash({**config, "model": model})


def engine_gate_blocks(verdicts: Sequence[EngineVerdict]) -> list[Block]:
    """The engine gates' verdicts (``kind: engine``): a row each, and why it fails."""
    rows = tuple(
        (
            v.gate.name,
            Mark("PASS", "pass") if v.passed else Mark("FAIL", "fail"),
            f"{v.pairing.n} (min {v.gate.min_n})",
            f"{_agreement(v.pairing)} (lower end required {v.gate.min_agreement:g})",
            f"{_bounds(v.pairing.engine_retention)} (lower required {v.gate.min_retained:g})",
            "; ".join(v.failures()) or "-",
            " ".join((*v.gate.backend, *v.gate.cache)),
        )
        for v in verdicts
    )
    header = ("Engine gate", "Verdict", "Paired n", "Agreement", "Engine retention", "Fails on", "Setting")
    return [Heading(3, "Engine gates"), Table(header, rows)]
