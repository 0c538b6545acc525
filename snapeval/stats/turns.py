"""Accuracy per turn of samples that ask several questions of one context: a multi-turn sample stores the
score of each turn's answer as the metrics ``turn_1``, ``turn_2``, ... (and their mean as ``score``,
:meth:`snapeval.tasks.base.Task.score_turns`). Each turn's accuracy is the mean over the samples that asked
it, with its interval (:func:`snapeval.stats.accuracy.mean_ci`: Wilson for 0/1 scores)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from snapeval.stats.accuracy import mean_ci

TURN_METRIC = re.compile(r"turn_([1-9]\d*)")
"""The name of a turn's metric: ``turn_1`` is the first question's."""


@dataclass(frozen=True)
class TurnAccuracy:
    """The accuracy of turn ``turn`` (1: the first question) over ``n`` samples, with its interval."""

    turn: int
    mean: float
    low: float
    high: float
    n: int


def turn_scores(metrics: Iterable[Mapping[str, Any] | None]) -> dict[int, list[float]]:
    """Per turn, in order, the scores of the samples whose ``metrics`` hold it (none for one-turn samples)."""
    scores: dict[int, list[float]] = {}
    for stored in metrics:
        for name, value in (stored or {}).items():
            if (match := TURN_METRIC.fullmatch(name)) and isinstance(value, int | float):
                scores.setdefault(int(match[1]), []).append(float(value))
    return dict(sorted(scores.items()))


def per_turn(metrics: Iterable[Mapping[str, Any] | None], confidence: float = 0.95) -> list[TurnAccuracy]:
    """The accuracy of each turn that the samples' ``metrics`` score, first turn first."""
    return [
        TurnAccuracy(turn, *mean_ci(scores, confidence), len(scores))
        for turn, scores in turn_scores(metrics).items()
    ]
