"""The numbers of the report: each compressed setting against the full cache on the same samples (paired
retention and its bounds, the gate's verdict per retention target, output length and what it costs), the
samples that flipped, and per series the smallest budget shown to keep each target (fixed-sequence testing
from the largest budget down, :func:`snapeval.stats.smallest_kept`), and at most a stated growth in output
length where one is required (:func:`snapeval.stats.output_length.jointly`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from snapeval.report.data import Series, Setting
from snapeval.stats import Retention, mean_ci, retention, smallest_kept
from snapeval.stats.output_length import Growth, growth, jointly, tokens_per_correct

NAN3 = (math.nan, math.nan, math.nan)


@dataclass(frozen=True)
class Flip:
    """A sample scored differently by the full cache and the method."""

    sample_id: str
    full_score: float
    score: float
    target: Any
    full_output: str
    output: str
    kept_histogram: dict[str, list[float]] | None


@dataclass(frozen=True)
class OutputCost:
    """A method's output against the full cache's on the paired samples that stored both generated token
    counts: the growth of the mean with its bounds, mean decode seconds per sample and generated tokens
    per correct answer (NaN where none is correct, or nothing was stored)."""

    growth: Growth
    decode_s: float
    full_decode_s: float
    per_correct: float
    full_per_correct: float


@dataclass(frozen=True)
class Comparison:
    """A compressed setting against the full cache on the samples both stored (``paired`` of them): the
    retention's one-sided 95% bounds (:func:`snapeval.stats.retention`; None without a paired sample), its
    output cost (None where no paired sample stored generated tokens), and the largest growth of output
    length that a verdict allows (None: any)."""

    setting: Setting
    paired: int
    full_accuracy: float
    bounds: Retention | None
    kv_ratio: float
    flips: tuple[Flip, ...]
    output: OutputCost | None = None
    max_growth: float | None = None

    @property
    def retention(self) -> tuple[float, float, float]:
        """``(ratio, lower, upper)``."""
        return (self.bounds.ratio, self.bounds.lower, self.bounds.upper) if self.bounds else NAN3

    def verdict(self, target: float) -> str:
        """``pass``, ``fail``, ``open`` or ``too few`` (nothing paired is too few): of the retention
        ``target``, and of output growth at most :attr:`max_growth` where that is set (too few where no
        generated tokens were stored)."""
        if self.bounds is None:
            return "too few"
        if self.max_growth is None:
            return self.bounds.verdict(target)
        grown = self.output.growth.verdict(self.max_growth) if self.output else "too few"
        return jointly(self.bounds.verdict(target), grown)

    def meets(self, target: float) -> bool:
        return self.verdict(target) == "pass"


@dataclass(frozen=True)
class Decision:
    """The smallest setting of a series shown to keep ``target`` (None: none of the measured budgets)."""

    series: Series
    target: float
    passing: Comparison | None
    measured: tuple[Comparison, ...]


def accuracy_interval(setting: Setting) -> tuple[float, float, float]:
    """Accuracy of every scored sample of ``setting`` with its 95% interval (Wilson for 0/1 scores)."""
    return mean_ci(setting.scores().values())


def compare(setting: Setting, full: Setting | None, max_growth: float | None = None) -> Comparison:
    """``setting`` against ``full`` on the sample ids both scored; its verdicts require output growth at
    most ``max_growth`` where that is given."""
    scores, reference = setting.scores(), full.scores() if full else {}
    paired = [sample_id for sample_id in scores if sample_id in reference]
    if not paired:
        return Comparison(setting, 0, math.nan, None, math.nan, (), max_growth=max_growth)
    method = [scores[i] for i in paired]
    base = [reference[i] for i in paired]
    rows = list(zip(_rows(setting, paired), _rows(full, paired), strict=True))
    return Comparison(
        setting=setting,
        paired=len(paired),
        full_accuracy=sum(base) / len(base),
        bounds=retention(method, base),
        kv_ratio=_kv_ratio(rows),
        flips=_flips(rows),
        output=_output_cost(rows),
        max_growth=max_growth,
    )


def decide(series: Series, comparisons: dict[str, Comparison], target: float) -> Decision:
    """The smallest setting of ``series`` (in budget order) that keeps ``target`` with every larger one."""
    measured = tuple(comparisons[s.digest] for s in series.settings)
    kept = smallest_kept({index: comparison.verdict(target) for index, comparison in enumerate(measured)})
    return Decision(series, target, None if kept is None else measured[kept], measured)


def extra_field(row: dict[str, Any], key: str) -> Any:
    """``row["extra"][key]``, None where the sample's ``extra`` lacks it (or is not a mapping)."""
    extra = row.get("extra")
    return extra.get(key) if isinstance(extra, dict) else None


def _rows(setting: Setting, ids: list[str]) -> list[dict[str, Any]]:
    by_id = {row["sample_id"]: row for row in setting.samples}
    return [by_id[sample_id] for sample_id in ids]


Pairs = list[tuple[dict[str, Any], dict[str, Any]]]  # (the method's row, the full cache's) per sample


def _kv_ratio(rows: Pairs) -> float:
    """Mean KV bytes the method's samples held over the full cache's, on the paired samples that stored
    both (NaN where none did)."""
    pairs = [
        (mine["kv_bytes"], theirs["kv_bytes"])
        for mine, theirs in rows
        if mine["kv_bytes"] and theirs["kv_bytes"]
    ]
    if not pairs:
        return math.nan
    return sum(mine for mine, _ in pairs) / sum(theirs for _, theirs in pairs)


def _output_cost(rows: Pairs) -> OutputCost | None:
    """The output cost on the paired samples whose rows both stored ``generated_tokens``."""
    measured = [
        (mine, theirs)
        for mine, theirs in rows
        if mine["generated_tokens"] is not None and theirs["generated_tokens"] is not None
    ]
    if not measured:
        return None
    mine, theirs = [row for row, _ in measured], [row for _, row in measured]
    tokens = [row["generated_tokens"] for row in mine]
    full_tokens = [row["generated_tokens"] for row in theirs]
    return OutputCost(
        growth=growth(tokens, full_tokens),
        decode_s=_mean_decode(mine),
        full_decode_s=_mean_decode(theirs),
        per_correct=tokens_per_correct(tokens, [row["score"] for row in mine]),
        full_per_correct=tokens_per_correct(full_tokens, [row["score"] for row in theirs]),
    )


def _mean_decode(rows: list[dict[str, Any]]) -> float:
    """Mean decode seconds of the rows that stored them (NaN where none did)."""
    seconds = [row["decode_s"] for row in rows if row["decode_s"] is not None]
    seconds = [value for value in seconds if not math.isnan(value)]
    return sum(seconds) / len(seconds) if seconds else math.nan


def _flips(rows: Pairs) -> tuple[Flip, ...]:
    """The paired samples whose scores differ, those the method lost first, then those it gained."""
    flips = [
        Flip(
            sample_id=mine["sample_id"],
            full_score=theirs["score"],
            score=mine["score"],
            target=mine["target"],
            full_output=theirs["output"] or "",
            output=mine["output"] or "",
            kept_histogram=extra_field(mine, "kept_histogram"),
        )
        for mine, theirs in rows
        if mine["score"] != theirs["score"]
    ]
    return tuple(sorted(flips, key=lambda flip: flip.score > flip.full_score))
