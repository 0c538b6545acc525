"""The blocks of one experiment: its figure, accuracy and retention per setting, the smallest budget per
retention target, memory, output length, traces, the samples that flipped, and provenance."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from snapeval.report.analysis import Comparison, Decision, accuracy_interval, compare, decide
from snapeval.report.capacity import capacity_blocks
from snapeval.report.charts import budget_figure
from snapeval.report.data import Experiment, Setting
from snapeval.report.document import (
    Block,
    Cell,
    Figure,
    Heading,
    Histogram,
    Mark,
    Paragraph,
    Table,
    interval,
    number,
    shortened,
)
from snapeval.report.output_length import output_length_blocks
from snapeval.report.provenance import provenance_blocks
from snapeval.results.summary import summary_of

NONE_PASSES = "none of the measured budgets"
TOO_SMALL = "n too small"
TOO_SMALL_NOTE = (
    f'"{TOO_SMALL}: k of m" means undecided: even with no loss, showing the target with 95% confidence '
    "takes m samples of evidence (for 0/1 scores, samples the full cache gets right; otherwise paired "
    "samples), and the largest budget measured has k. More samples decide it."
)


@dataclass(frozen=True)
class Analysis:
    """An experiment with its comparisons (by setting hash) and decisions (per series and target), each
    decision requiring output growth at most ``max_growth`` where that is set."""

    experiment: Experiment
    comparisons: dict[str, Comparison]
    decisions: list[Decision]
    max_growth: float | None = None


def analyse(experiment: Experiment, targets: tuple[float, ...], max_growth: float | None = None) -> Analysis:
    """Every compressed setting against the full cache, and the decision per series and target (and
    output growth at most ``max_growth``, where given)."""
    comparisons = {
        setting.digest: compare(setting, experiment.full, max_growth)
        for series in experiment.series
        for setting in series.settings
    }
    decisions = [decide(series, comparisons, target) for series in experiment.series for target in targets]
    return Analysis(experiment, comparisons, decisions, max_growth)


def decided(max_growth: float | None) -> str:
    """What a decision table names: the smallest budget shown to keep each target (and bounded growth)."""
    subject = "smallest budget shown to keep each retention target"
    return subject if max_growth is None else f"{subject} with output growth at most {max_growth:g}"


def target_label(target: float, max_growth: float | None) -> str:
    """A decision column's name: ``Retention 0.95``, with ``, growth ≤ 1.1`` where growth is bounded."""
    return f"Retention {target:g}" + ("" if max_growth is None else f", growth ≤ {max_growth:g}")


def decision_cell(decision: Decision) -> Cell:
    """The smallest budget shown to keep the target with its retention, or why none is (too few samples:
    ``n too small: k of m``, which :func:`decision_notes` explains once per table)."""
    if not any(comparison.paired for comparison in decision.measured):
        return Mark("no full-cache run of the same samples stored", "muted")
    if decision.passing is None:
        largest = decision.measured[-1]
        bounds = largest.bounds
        if bounds is not None and bounds.verdict(decision.target) == "too few":
            return Mark(f"{TOO_SMALL}: {bounds.evidence} of {bounds.needed(decision.target):g}", "muted")
        grown = ""
        if largest.max_growth is not None:
            grown = f", growth {number(largest.output.growth.ratio) if largest.output else 'not stored'}"
        return Mark(
            f"{NONE_PASSES} (largest {largest.setting.size_label}: {number(largest.retention[0])}{grown})",
            "fail",
        )
    passing = decision.passing
    return Mark(f"{passing.setting.size_label} (retention {number(passing.retention[0])})", "pass")


def decision_notes(rows: Iterable[Sequence[Cell]]) -> list[Block]:
    """The footnote under a decision table of ``rows``: what ``n too small`` means, said once (no
    footnote where no cell says it)."""
    cells = (cell for row in rows for cell in row)
    if any(isinstance(cell, Mark) and cell.text.startswith(f"{TOO_SMALL}:") for cell in cells):
        return [Paragraph(TOO_SMALL_NOTE, note=True)]
    return []


def experiment_blocks(
    analysis: Analysis, anchor: str, targets: tuple[float, ...], figure: bool, flips: int
) -> list[Block]:
    """Every block of the experiment's section; its figure drawn only when ``figure``."""
    experiment = analysis.experiment
    blocks: list[Block] = [Heading(2, experiment.title, anchor), _full_line(experiment)]
    if not experiment.series:
        return [
            *blocks,
            Paragraph("No compressed setting is stored for this experiment."),
            *capacity_blocks(experiment, []),
            *_trace_blocks(experiment),
            *provenance_blocks(experiment),
        ]
    if figure:
        full_accuracy = accuracy_interval(experiment.full) if experiment.full else (float("nan"),) * 3
        svg = budget_figure(experiment, analysis.comparisons, full_accuracy, targets)
        if svg is not None:
            caption = (
                "Accuracy (left; the full cache dashed, with its 95% band) and retention over the full cache "
                "on the same samples (right; the targets dotted), with its one-sided 95% bounds."
            )
            blocks.append(
                Figure(svg, f"Accuracy and paired retention against KV budget, {experiment.title}", caption)
            )
    return [
        *blocks,
        Heading(3, "Accuracy and retention"),
        _accuracy_table(experiment, analysis.comparisons, targets),
        Paragraph(
            "Keeps t: yes when the one-sided 95% lower bound of the retention reaches t, no when its upper "
            "bound is below t, open otherwise; too few when even no loss on these samples could not show t. "
            "KV MiB and decode tokens/s as the runs measured them; KV MiB is the whole row's, over every "
            "rank of a tensor-parallel run, so settings run at different TP degrees compare.",
            note=True,
        ),
        Heading(3, decided(analysis.max_growth).capitalize()),
        *_decision_table(analysis, targets),
        *capacity_blocks(experiment, analysis.decisions),
        *output_length_blocks(analysis.experiment, analysis.comparisons, analysis.max_growth),
        *_trace_blocks(experiment),
        *_flip_blocks(analysis, flips),
        *provenance_blocks(experiment),
    ]


def _full_line(experiment: Experiment) -> Paragraph:
    if experiment.full is None or not experiment.full.scores():
        return Paragraph("Full cache: no scored sample stored, so retention is not computed here.")
    mean, low, high = accuracy_interval(experiment.full)
    n = len(experiment.full.scores())
    return Paragraph(f"Full cache: accuracy {interval(mean, low, high)} (95% CI) on {n} samples.")


def _accuracy_table(
    experiment: Experiment, comparisons: dict[str, Comparison], targets: tuple[float, ...]
) -> Table:
    header = (
        "Setting",
        "n",
        "Accuracy [95% CI]",
        "Paired n",
        "Full acc. (paired)",
        "Retention [95% bounds]",
        *(f"Keeps {t:g}" for t in targets),
        "KV MiB",
        "Decode tok/s",
    )
    rows = tuple(
        _setting_cells(setting, label, comparisons.get(setting.digest), targets)
        for label, setting in experiment.labelled()
    )
    return Table(header, rows)


def _setting_cells(
    setting: Setting, label: str, comparison: Comparison | None, targets: tuple[float, ...]
) -> tuple[Cell, ...]:
    summary = summary_of(setting.samples)
    accuracy = interval(summary["accuracy"], summary["ci_low"], summary["ci_high"])
    speed = (number(summary["kv_mib"], 1), number(summary["decode_tok_s"], 1))
    if comparison is None:
        return (label, str(summary["n"]), accuracy, "-", "-", "reference", *("-" for _ in targets), *speed)
    meets = tuple(_meets(comparison, target) for target in targets)
    return (
        label,
        str(summary["n"]),
        accuracy,
        str(comparison.paired),
        number(comparison.full_accuracy),
        interval(*comparison.retention),
        *meets,
        *speed,
    )


def _meets(comparison: Comparison, target: float) -> Cell:
    if comparison.bounds is None:
        return Mark("no paired sample", "muted")
    verdict = comparison.bounds.verdict(target)
    marks = {"pass": ("yes", "pass"), "fail": ("no", "fail"), "open": ("open", "muted")}
    return Mark(*marks.get(verdict, (f"too few (needs {comparison.bounds.needed(target):g})", "muted")))


def _decision_table(analysis: Analysis, targets: tuple[float, ...]) -> list[Block]:
    """The experiment's decision per series and target, and its footnote."""
    by_series: dict[str, list[Decision]] = {}
    for decision in analysis.decisions:
        by_series.setdefault(decision.series.label, []).append(decision)
    rows = tuple(
        (label, ", ".join(s.size_label for s in decisions[0].series.settings), *map(decision_cell, decisions))
        for label, decisions in by_series.items()
    )
    header = ("Method", "Budgets measured", *(target_label(t, analysis.max_growth) for t in targets))
    return [Table(header, rows), *decision_notes(rows)]


def _trace_blocks(experiment: Experiment) -> list[Block]:
    """Trace statistics per setting whose samples store traces (``extra.trace``)."""
    rows = []
    for label, setting in experiment.labelled():
        traces = [row["extra"]["trace"] for row in setting.samples if _has_trace(row)]
        if not traces:
            continue
        stats = summary_of(setting.samples)
        closed = sum(bool(trace.get("reasoning_closed")) for trace in traces) / len(traces)
        rows.append(
            (
                label,
                str(len(traces)),
                number(stats["trace_tokens"], 1),
                number(stats["truncated"]),
                number(closed),
                number(stats["evictions"], 2),
                number(stats["kept_generated"]),
            )
        )
    if not rows:
        return []
    header = (
        "Setting",
        "Traces",
        "Generated tokens (mean)",
        "Truncated",
        "Reasoning closed",
        "Re-selections",
        "Generated kept",
    )
    return [Heading(3, "Traces"), Table(header, tuple(rows))]


def _has_trace(row: dict) -> bool:
    extra = row.get("extra")
    return isinstance(extra, dict) and isinstance(extra.get("trace"), dict)


def _flip_blocks(analysis: Analysis, shown: int) -> list[Block]:
    """Per compressed setting, the paired samples scored differently from the full cache (``shown`` each)."""
    blocks: list[Block] = [Heading(3, "Samples that flipped")]
    for series in analysis.experiment.series:
        for setting in series.settings:
            comparison = analysis.comparisons[setting.digest]
            if not comparison.flips:
                continue
            lost = sum(flip.score < flip.full_score for flip in comparison.flips)
            blocks.append(
                Heading(
                    4,
                    f"{series.labelled(setting)}: {len(comparison.flips)} of {comparison.paired} paired "
                    f"samples flipped ({lost} lost, {len(comparison.flips) - lost} gained)",
                )
            )
            rows = tuple(
                (
                    flip.sample_id,
                    f"{flip.full_score:g} → {flip.score:g}",
                    "-" if flip.target is None else shortened(flip.target, 40),
                    shortened(flip.full_output),
                    shortened(flip.output),
                    _histogram(flip.kept_histogram),
                )
                for flip in comparison.flips[:shown]
            )
            header = (
                "Sample",
                "Full → method",
                "Target",
                "Full-cache answer",
                "Method answer",
                "Kept prompt",
            )
            if rows:
                blocks.append(Table(header, rows))
            if len(comparison.flips) > shown:
                blocks.append(
                    Paragraph(f"{len(comparison.flips) - shown} more not shown (--flips).", note=True)
                )
    if len(blocks) == 1:
        blocks.append(Paragraph("No paired sample was scored differently by the full cache and a method."))
    return blocks


def _histogram(stored: object) -> Cell:
    """The stored kept histogram (``{"bins": [...], "counts": [...]}``) as a cell; ``-`` where absent."""
    if not isinstance(stored, dict) or not stored.get("counts") or not stored.get("bins"):
        return "-"
    return Histogram(tuple(map(float, stored["bins"])), tuple(map(float, stored["counts"])))
