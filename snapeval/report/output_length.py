"""The report's "Output length" table: per compressed setting, the mean generated tokens of the full cache
and the method on the same samples, their ratio (growth) with its one-sided 95% bounds
(:func:`snapeval.stats.output_length.growth`), whether growth is shown to stay within the bound the report
requires, decode seconds per sample and generated tokens per correct answer."""

from __future__ import annotations

from snapeval.report.analysis import Comparison, OutputCost
from snapeval.report.data import Experiment
from snapeval.report.document import Block, Cell, Heading, Mark, Paragraph, Table, interval, number

NOTE = (
    "On the paired samples that stored their generated tokens: mean generated tokens per sample of the full "
    "cache and the method, and the method's over the full cache's (growth) with its one-sided 95% bounds "
    "(Fieller's, from the paired t statistic; each bound alone holds at 95%). Decode seconds are the mean "
    "per sample; tokens per correct answer are all generated tokens over the correct answers (the sum of "
    "the scores), - where none is correct."
)
VERDICTS = {"pass": ("yes", "pass"), "fail": ("no", "fail"), "open": ("open", "muted")}


def output_length_blocks(
    experiment: Experiment, comparisons: dict[str, Comparison], max_growth: float | None
) -> list[Block]:
    """The section, with a ``Growth ≤ max_growth`` column where the report requires it; nothing where no
    compressed setting stored generated tokens beside the full cache's."""
    rows = [
        _row(series.labelled(setting), cost, max_growth)
        for series in experiment.series
        for setting in series.settings
        if (cost := comparisons[setting.digest].output) is not None
    ]
    if not rows:
        return []
    header = (
        "Setting",
        "Paired n",
        "Tokens, full",
        "Tokens, method",
        "Growth [95% bounds]",
        *(() if max_growth is None else (f"Growth ≤ {max_growth:g}",)),
        "Decode s, full",
        "Decode s, method",
        "Tokens per correct, full",
        "Tokens per correct, method",
    )
    return [Heading(3, "Output length"), Table(header, tuple(rows)), Paragraph(NOTE, note=True)]


def _row(label: str, cost: OutputCost, max_growth: float | None) -> tuple[Cell, ...]:
    grown = cost.growth
    verdict: tuple[Cell, ...] = ()
    if max_growth is not None:
        outcome = grown.verdict(max_growth)
        verdict = (Mark(*VERDICTS.get(outcome, ("too few (needs 2 pairs)", "muted"))),)
    return (
        label,
        str(grown.n),
        number(grown.full_mean, 1),
        number(grown.mean, 1),
        interval(grown.ratio, grown.lower, grown.upper),
        *verdict,
        number(cost.full_decode_s, 3),
        number(cost.decode_s, 3),
        number(cost.full_per_correct, 1),
        number(cost.per_correct, 1),
    )
