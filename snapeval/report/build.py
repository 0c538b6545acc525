"""The whole report of a database: what it is and how to read it, the decision over every experiment, the
gates' verdicts when asked, each deployed engine against snapeval's reference when the database holds one,
the accuracy of each turn when it holds multi-turn samples, then a section per experiment."""

from __future__ import annotations

import importlib.metadata
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy.engine import make_url

from snapeval.report.analysis import accuracy_interval
from snapeval.report.data import load_experiments
from snapeval.report.document import (
    Block,
    Cell,
    Document,
    Heading,
    Mark,
    Paragraph,
    Table,
    interval,
    number,
)
from snapeval.report.engines import engine_blocks, engine_gate_blocks
from snapeval.report.experiment import (
    Analysis,
    analyse,
    decided,
    decision_cell,
    decision_notes,
    experiment_blocks,
    target_label,
)
from snapeval.report.turns import turn_blocks
from snapeval.results import ResultsDB
from snapeval.results.identity import git_sha

if TYPE_CHECKING:  # the gates' module composes configs with Hydra: loaded only to judge gates
    from snapeval.commands.engine_gate import EngineGate, EngineVerdict
    from snapeval.commands.gate import Gate, Verdict

TITLE = "KV-cache compression: decision report"


def build_report(
    db: ResultsDB,
    targets: Sequence[float],
    *,
    figures: bool = True,
    flips: int = 5,
    gates: Sequence[Gate | EngineGate] = (),
    max_output_growth: float | None = None,
) -> Document:
    """The report of every experiment stored in ``db`` at the retention ``targets``, each also requiring
    output growth at most ``max_output_growth`` where given; its figures drawn when ``figures``, ``flips``
    flipped samples shown per setting, and the verdicts of ``gates``."""
    targets = tuple(targets)
    analyses = [analyse(experiment, targets, max_output_growth) for experiment in load_experiments(db)]
    blocks: list[Block] = [
        *_header(db, targets, figures, max_output_growth),
        *_decisions(analyses, targets, max_output_growth),
    ]
    if gates:
        from snapeval.commands.gate import judge

        blocks += _gate_blocks([judge(gate, db) for gate in gates])
    blocks += engine_blocks([analysis.experiment for analysis in analyses])
    blocks += turn_blocks([analysis.experiment for analysis in analyses])
    for index, analysis in enumerate(analyses, start=1):
        blocks += experiment_blocks(analysis, f"experiment-{index}", targets, figures, flips)
    return Document(TITLE, tuple(blocks))


def _header(
    db: ResultsDB, targets: tuple[float, ...], figures: bool, max_growth: float | None
) -> list[Block]:
    try:
        version = importlib.metadata.version("snapeval")
    except importlib.metadata.PackageNotFoundError:
        version = "(version not installed)"
    commit = git_sha()
    database = make_url(db.url).render_as_string(hide_password=True)
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    blocks: list[Block] = [
        Heading(1, TITLE),
        Paragraph(
            f"Database {database}; written {now} UTC by snapeval {version}, "
            f"commit {commit[:12] if commit else 'not available (no git checkout)'}."
        ),
        Paragraph(
            "Retention is a method's accuracy over the full cache's on the same samples, with its one-sided "
            "95% bounds (exact for 0/1 scores). A budget keeps a retention target t when the lower bound "
            "reaches t (the gate's rule); the smallest budget named keeps t with every larger one, "
            "tested from the largest down (at most 5% of such names are wrong). Too few samples to show t "
            "are said as such (n too small, explained under each table). "
            f"Targets: {', '.join(f'{t:g}' for t in targets)}."
        ),
    ]
    if max_growth is not None:
        blocks.append(
            Paragraph(
                f"Each target also requires output growth at most {max_growth:g}: the one-sided 95% upper "
                "bound of the method's mean generated tokens over the full cache's on the same samples "
                f"is at most {max_growth:g}. A budget passes only when both are shown, each at 95%, so a "
                "budget that misses either passes at most 5% of the time."
            )
        )
    if not figures:
        blocks.append(
            Paragraph("Figures are drawn in the HTML report (the command without --markdown).", note=True)
        )
    return blocks


def _decisions(analyses: list[Analysis], targets: tuple[float, ...], max_growth: float | None) -> list[Block]:
    """One row per series of each experiment: the smallest budget meeting each target."""
    rows: list[tuple[Cell, ...]] = []
    for analysis in analyses:
        experiment = analysis.experiment
        settings = ", ".join(f"{k}={v}" for k, v in experiment.distinct.items()) or "-"
        head = (experiment.model, experiment.task, settings)
        full = interval(*accuracy_interval(experiment.full)) if experiment.full else "not stored"
        if not experiment.series:
            rows.append((*head, "-", full, *(Mark("no compressed setting", "muted") for _ in targets)))
        for series in experiment.series:
            cells = [decision_cell(d) for d in analysis.decisions if d.series is series]
            rows.append((*head, series.label, full, *cells))
    header = (
        "Model",
        "Task",
        "Settings",
        "Method",
        "Full-cache accuracy",
        *(target_label(t, max_growth) for t in targets),
    )
    return [
        Heading(2, f"Decision: the {decided(max_growth)}", "decision"),
        Table(header, tuple(rows)),
        *decision_notes(rows),
    ]


def _gate_blocks(verdicts: list[Verdict | EngineVerdict]) -> list[Block]:
    """The gates' verdicts: a table of retention gates, and one of engine gates, where there are any."""
    from snapeval.commands.gate import Verdict

    retention = [v for v in verdicts if isinstance(v, Verdict)]
    engine = [v for v in verdicts if not isinstance(v, Verdict)]
    passed = sum(v.passed for v in verdicts)
    return [
        Heading(2, "Accuracy gates", "gates"),
        Paragraph(f"{passed} of {len(verdicts)} gates pass on the stored samples (nothing was run)."),
        *([_retention_gates(retention)] if retention else []),
        *(engine_gate_blocks(engine) if engine else []),
    ]


def _retention_gates(verdicts: list[Verdict]) -> Table:
    rows = tuple(
        (
            v.gate.name,
            Mark("PASS", "pass") if v.passed else Mark("FAIL", "fail"),
            f"{v.n} (min {v.gate.min_n})",
            number(v.full_accuracy),
            number(v.compressed_accuracy),
            f"{number(v.bounds.ratio if v.bounds else math.nan)} (required {v.gate.min_retained:g})",
            f"{number(v.bounds.lower)} ({v.verdict})" if v.bounds else "-",
            " ".join(v.gate.cache),
        )
        for v in verdicts
    )
    header = (
        "Gate",
        "Verdict",
        "Paired n",
        "Full acc.",
        "Compressed acc.",
        "Retained",
        "95% lower bound",
        "Cache",
    )
    return Table(header, rows)
