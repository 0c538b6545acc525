"""Accuracy with its confidence interval, and pass@k, for per-sample scores in [0, 1]."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from scipy.special import ndtri, stdtrit  # normal and Student t quantiles; lighter than scipy.stats

PASS_AT = (5, 10)  # pass@k reported beside the mean (pass@1) when every problem has at least k draws


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator ``1 - C(n - c, k) / C(n, k)`` for ``c`` correct of ``n`` samples."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_at(
    sample_ids: Iterable[str], scores: Iterable[float], ks: Iterable[int] = PASS_AT
) -> dict[str, float]:
    """``pass@k`` over problems for each k that every problem's draws allow (ids ``<problem>#<draw>``,
    a score of 1 is a pass); empty when the samples are single answers or scores are not 0/1."""
    problems: dict[str, list[float]] = {}
    for sample_id, score in zip(sample_ids, scores, strict=True):
        problem, draw, _ = sample_id.rpartition("#")
        problems.setdefault(problem if draw else sample_id, []).append(score)
    fewest = min((len(draws) for draws in problems.values()), default=0)
    if fewest < 2 or any(score not in (0, 1) for draws in problems.values() for score in draws):
        return {}
    return {
        f"pass@{k}": sum(pass_at_k(len(d), int(sum(d)), k) for d in problems.values()) / len(problems)
        for k in ks
        if k <= fewest
    }


def mean_ci(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)`` of scores in [0, 1]; all NaN when there are none.

    Binary (0/1) scores get the Wilson score interval, which stays inside [0, 1] and keeps its
    coverage at small n and near 0 or 1. Other scores get a Student t-interval, clipped to [0, 1]
    (its bounds are NaN for a single score).
    """
    scores = np.asarray(list(values), dtype=float)
    if not np.all((scores >= 0) & (scores <= 1)):
        raise ValueError("scores must lie in [0, 1]")
    if scores.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(scores.mean())
    if np.isin(scores, (0, 1)).all():
        low, high = _wilson(mean, scores.size, confidence)
    else:
        low, high = _t_interval(scores, confidence)
    return mean, low, high


def _wilson(p: float, n: int, confidence: float) -> tuple[float, float]:
    z = ndtri((1 + confidence) / 2)
    denominator = 1 + z**2 / n
    center = (p + z**2 / (2 * n)) / denominator
    half = z / denominator * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    return float(max(center - half, 0.0)), float(min(center + half, 1.0))  # clamp rounding error


def _t_interval(scores: np.ndarray, confidence: float) -> tuple[float, float]:
    if scores.size < 2:
        return math.nan, math.nan
    mean = scores.mean()
    half = stdtrit(scores.size - 1, (1 + confidence) / 2) * scores.std(ddof=1) / math.sqrt(scores.size)
    return float(max(mean - half, 0.0)), float(min(mean + half, 1.0))
