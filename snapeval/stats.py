"""Confidence intervals for per-sample scores in [0, 1]."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from scipy.special import ndtri, stdtrit  # normal and Student t quantiles; lighter than scipy.stats


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
