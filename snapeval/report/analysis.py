"""The numbers of the report: each compressed setting against the full cache on the same samples (paired
retention and its interval, the gate's lower bound per retention target), the samples that flipped, and
per series the smallest budget that meets each target."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from snapeval.report.data import Series, Setting
from snapeval.stats import mean_ci, paired_bootstrap_lower_bound, paired_retention

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
class Comparison:
    """A compressed setting against the full cache on the samples both stored (``paired`` of them):
    retention ``(ratio, low, high)`` and, per target, the one-sided 95% lower bound of
    ``mean(method) - target * mean(full)`` (the target is met when it is >= 0)."""

    setting: Setting
    paired: int
    full_accuracy: float
    retention: tuple[float, float, float]
    bounds: dict[float, float]
    kv_ratio: float
    flips: tuple[Flip, ...]

    def meets(self, target: float) -> bool:
        return self.paired > 0 and self.bounds[target] >= 0


@dataclass(frozen=True)
class Decision:
    """The smallest setting of a series that meets ``target`` (None: none of the measured budgets)."""

    series: Series
    target: float
    passing: Comparison | None
    measured: tuple[Comparison, ...]


def accuracy_interval(setting: Setting) -> tuple[float, float, float]:
    """Accuracy of every scored sample of ``setting`` with its 95% interval (Wilson for 0/1 scores)."""
    return mean_ci(setting.scores().values())


def compare(setting: Setting, full: Setting | None, targets: tuple[float, ...]) -> Comparison:
    """``setting`` against ``full`` on the sample ids both scored."""
    scores, reference = setting.scores(), full.scores() if full else {}
    paired = [sample_id for sample_id in scores if sample_id in reference]
    if not paired:
        nan = dict.fromkeys(targets, math.nan)
        return Comparison(setting, 0, math.nan, NAN3, nan, math.nan, ())
    method = [scores[i] for i in paired]
    base = [reference[i] for i in paired]
    bounds = {target: paired_bootstrap_lower_bound(method, base, ratio=target) for target in targets}
    rows = list(zip(_rows(setting, paired), _rows(full, paired), strict=True))
    return Comparison(
        setting=setting,
        paired=len(paired),
        full_accuracy=sum(base) / len(base),
        retention=paired_retention(method, base),
        bounds=bounds,
        kv_ratio=_kv_ratio(rows),
        flips=_flips(rows),
    )


def decide(series: Series, comparisons: dict[str, Comparison], target: float) -> Decision:
    """The first (smallest) setting of ``series`` whose comparison meets ``target``."""
    measured = tuple(comparisons[s.digest] for s in series.settings)
    passing = next((c for c in measured if c.meets(target)), None)
    return Decision(series, target, passing, measured)


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
