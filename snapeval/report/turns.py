"""The report's "Accuracy per turn" table: for each setting whose samples asked several questions of one
context (a multi-turn task), the accuracy of each turn with its 95% interval
(:func:`snapeval.stats.turns.per_turn`) and the mean of the samples' turns, beside the compression mode
(query-aware or query-agnostic). Nothing where the database holds no multi-turn sample."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from snapeval.report.data import Experiment, Setting
from snapeval.report.document import Block, Cell, Heading, Paragraph, Table, interval
from snapeval.stats import mean_ci
from snapeval.stats.turns import per_turn

DEFAULT_COMPRESSION = "query_aware"
NOTE = (
    "Samples that ask several questions of one context: each turn's accuracy over the samples that asked "
    "it (n where fewer than the setting's), with its 95% interval (Wilson for 0/1 scores, else Student t), "
    "and the mean of each sample's turns. query_aware compresses the context with the first question, "
    "query_agnostic before it (the question appended after compression); every later question is appended "
    "to the compressed cache after the answers before it."
)


@dataclass(frozen=True)
class _Row:
    """One setting's line: where it is from, its multi-turn samples, each turn's cell and the mean's."""

    head: tuple[str, str, str]
    n: int
    turns: tuple[str, ...]
    mean: str

    def cells(self, width: int) -> tuple[Cell, ...]:
        """The row with ``width`` turn columns (``-`` for a turn none of its samples asked)."""
        return (*self.head, str(self.n), *self.turns, *("-",) * (width - len(self.turns)), self.mean)


def turn_blocks(experiments: Sequence[Experiment]) -> list[Block]:
    """The section over every experiment's settings that stored multi-turn samples."""
    rows = [
        row
        for experiment in experiments
        for label, setting in experiment.labelled()
        if (row := _row((experiment.title, label, _compression(experiment)), setting)) is not None
    ]
    if not rows:
        return []
    width = max(len(row.turns) for row in rows)
    header = (
        "Experiment",
        "Setting",
        "Compression",
        "n",
        *(f"Turn {turn} [95% CI]" for turn in range(1, width + 1)),
        "Mean of turns [95% CI]",
    )
    table = Table(header, tuple(row.cells(width) for row in rows))
    return [Heading(2, "Accuracy per turn", "turns"), table, Paragraph(NOTE, note=True)]


def _compression(experiment: Experiment) -> str:
    return str((experiment.config.get("task") or {}).get("compression") or DEFAULT_COMPRESSION)


def _row(head: tuple[str, str, str], setting: Setting) -> _Row | None:
    """The line of ``setting``; None where none of its samples asked several questions."""
    samples = [row for row in setting.samples if "turn_1" in (row.get("metrics") or {})]
    if not samples:
        return None
    n = len(samples)
    turns = tuple(
        interval(turn.mean, turn.low, turn.high) + ("" if turn.n == n else f" (n {turn.n})")
        for turn in per_turn(row["metrics"] for row in samples)
    )
    return _Row(head, n, turns, interval(*mean_ci(row["score"] for row in samples)))
