"""Output length: how much longer a method's answers are than the full cache's on the same samples, and the
verdict of a setting that must keep both an accuracy target and a bound on that growth.

**Growth** is ``mean(method tokens) / mean(full tokens)`` over paired samples. Its one-sided bounds are
Fieller's (Fieller, "Some problems in interval estimation", JRSS-B 16, 1954), from the paired t statistic of
``d = method - g * full``: growth is at most ``g`` exactly when ``mean(d) <= 0``, and the bounds are the
``g`` at which that statistic reaches the t quantile of the confidence, the two roots of a quadratic in
``g``. They are exact for normal pairs; for output lengths (skewed, capped at ``max_new_tokens``) they
hold approximately (the central limit theorem), so their coverage was checked by simulation
(``tests/test_output_length.py``, :func:`snapeval.stats.simulation.growth_misses`, ``docs/decisions.md``):
over lognormal problem lengths (log-sd 0.3 to 1.0 across problems, 0.1 to 1.0 per run) and n from 10 to
100 each bound misses at most 5% plus Monte-Carlo error. Where about 40% of the traces stop at the cap,
the upper bound misses about 8.5% of the time at n = 10 and 6.5-7% at n = 30 and 100. Fieller's bounds
are closed-form and deterministic; an exact bound for values capped at ``max_new_tokens`` (a test by
betting, as :mod:`.retention` uses for other scores) would hold at every n, but its bets are limited by the
cap, so it needs more samples where traces stay far below it.

**Both targets** (:func:`jointly`): a setting passes when each of its tests passes, each at the report's
confidence. That is an intersection-union test (Berger, Technometrics 24, 1982): a setting that misses
either target passes with at most the error of one test, with no correction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy.special import stdtrit

from snapeval.stats.retention import CONFIDENCE


@dataclass(frozen=True)
class Growth:
    """A method's mean generated tokens over the full cache's on ``n`` paired samples, with the one-sided
    bounds of their ratio at ``confidence`` (each bound alone holds with that confidence)."""

    mean: float
    full_mean: float
    lower: float
    upper: float
    n: int
    confidence: float = CONFIDENCE

    @property
    def ratio(self) -> float:
        return self.mean / self.full_mean if self.full_mean > 0 else math.nan

    def verdict(self, bound: float) -> str:
        """``pass`` when the upper bound is at most ``bound``, ``fail`` when the lower bound is above it,
        ``too few`` with fewer than two pairs (no spread to bound with), else ``open``."""
        if self.n < 2:
            return "too few"
        if self.upper <= bound:
            return "pass"
        return "fail" if self.lower > bound else "open"


def growth(tokens: Iterable[float], reference: Iterable[float], confidence: float = CONFIDENCE) -> Growth:
    """The growth of ``tokens`` (the method's, per sample) over ``reference`` (the full cache's on the same
    samples) with its one-sided Fieller bounds; ``[0, inf]`` where the full cache's mean is not shown to
    be above zero."""
    method = np.asarray(list(tokens), dtype=float)
    full = np.asarray(list(reference), dtype=float)
    if method.size == 0 or method.shape != full.shape:
        raise ValueError("need one reference length per length, and at least one pair")
    if np.any(method < 0) or np.any(full < 0):
        raise ValueError("output lengths must be >= 0")
    mean, full_mean, n = float(method.mean()), float(full.mean()), method.size
    if n < 2:
        return Growth(mean, full_mean, 0.0, math.inf, n, confidence)
    scale = float(stdtrit(n - 1, confidence)) ** 2 / (n * (n - 1))  # t**2 / n, over n - 1 for the variances
    x, y = method - mean, full - full_mean
    a = full_mean**2 - scale * float(y @ y)
    b = mean * full_mean - scale * float(x @ y)
    c = mean**2 - scale * float(x @ x)
    if a <= 0:
        return Growth(mean, full_mean, 0.0, math.inf, n, confidence)
    half = math.sqrt(max(b * b - a * c, 0.0))  # below zero only by rounding, where the roots meet
    return Growth(mean, full_mean, max((b - half) / a, 0.0), (b + half) / a, n, confidence)


def tokens_per_correct(tokens: Iterable[float], scores: Iterable[float]) -> float:
    """All generated ``tokens`` over the correct answers (the sum of ``scores``: their count for 0/1
    scores); NaN where none is correct."""
    correct = sum(scores)
    return sum(tokens) / correct if correct > 0 else math.nan


def jointly(*verdicts: str) -> str:
    """The verdict of a setting that must pass every one of its tests (``pass``, ``fail``, ``open`` or
    ``too few`` each): ``fail`` where any fails, ``pass`` where all pass, ``too few`` where any is too
    few, else ``open``."""
    for outcome in ("fail", "too few", "open"):
        if outcome in verdicts:
            return outcome
    return "pass"
