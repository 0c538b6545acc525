"""The paired retention rule of the gate, the report and the budget search: does a method keep ``target``
of the full cache's accuracy, ``mean(method) / mean(full)`` over the same samples?

**0/1 scores** (every shipped task) get bounds that hold exactly at every n:

- *Lower bound.* Of the ``m`` samples the full cache got right the method kept ``k``. Given which samples
  those are, ``k ~ Binomial(m, kappa)`` with ``kappa = P(method right | full right)``, and retention is
  ``kappa + P(method right, full wrong) / P(full right) >= kappa``. The one-sided Clopper-Pearson bound of
  ``kappa`` (Clopper and Pearson, Biometrika 26, 1934) is therefore a lower bound of retention with at least
  the stated confidence for any n and any pairing. It is conservative by the answers the method gets right
  that the full cache missed, which it is given no credit for; it is the most powerful bound when there are
  none, the common case for a compressed cache, and it needs no large-sample approximation: the
  percentile bootstrap it replaces passed 41-79% of below-target methods at n = 10.
- *Upper bound.* The Clopper-Pearson upper bound of ``mean(method)`` over the lower bound of ``mean(full)``,
  each at half the error (Bonferroni): valid, and used only to call a budget failed early.

**Other scores in [0, 1]** get the same bounds from a test by betting (Waudby-Smith and Ramdas, "Estimating
means of bounded random variables by betting", JRSS-B 86, 2024): ``d = method - t * full`` lies in
``[-t, 1]``; the wealth of an even mixture of fixed bets on ``d > 0`` is a nonnegative supermartingale when
retention is at most ``t``, so by Ville's inequality it exceeds ``1 / alpha`` with probability at most alpha
at any n. The bounds invert the test over ``t`` (the wealth is monotone in ``t``).

A target is **passed** when the lower bound reaches it, **failed** when the upper bound is below it, and
otherwise **open**; when even a record without a loss could not pass (:func:`samples_needed`), the
samples are **too few** to decide, and the verdict says how many would be.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
from scipy.special import betaincinv, logsumexp

CONFIDENCE = 0.95
VERDICTS = ("pass", "fail", "open", "too few")
_BETS = np.arange(1, 20) / 20  # the mixture's bets, as fractions of the largest that keeps wealth positive
_GRID, _ROUNDS = 33, 5  # targets tried per round, rounds: the bounds to 1e-7 of their range


@dataclass(frozen=True)
class Retention:
    """A method's retention over ``n`` paired samples: the ratio and its one-sided bounds at ``confidence``
    (each bound alone holds with that confidence). ``evidence`` is what a decision needs enough of: for
    0/1 scores the samples the full cache got right, else ``n``."""

    ratio: float
    lower: float
    upper: float
    n: int
    evidence: int
    binary: bool
    confidence: float = CONFIDENCE

    def needed(self, target: float) -> int:
        """Samples of evidence a record without a loss needs to show ``target``."""
        return samples_needed(target, self.confidence, self.binary)

    def verdict(self, target: float) -> str:
        """``pass``, ``fail``, ``open`` or ``too few`` (see the module's docstring)."""
        if self.upper < target:
            return "fail"
        if self.lower >= target:
            return "pass"
        return "too few" if self.evidence < self.needed(target) else "open"

    def shortfall(self, target: float) -> str | None:
        """Why these samples cannot decide ``target`` (None: they can)."""
        if self.verdict(target) != "too few":
            return None
        unit = "samples the full cache gets right" if self.binary else "samples"
        have = f"has {self.evidence}" if self.binary else f"has {self.n}"
        return (
            f"n = {self.n} cannot show {target:g} retention "
            f"(needs >= {self.needed(target):g} {unit}, with no loss; {have})"
        )


def retention(
    scores: Iterable[float], reference: Iterable[float], confidence: float = CONFIDENCE
) -> Retention:
    """The retention of ``scores`` over ``reference`` (one pair per sample) with its one-sided bounds."""
    method = np.asarray(list(scores), dtype=float)
    full = np.asarray(list(reference), dtype=float)
    if method.size == 0 or method.shape != full.shape:
        raise ValueError("need one reference score per score, and at least one pair")
    if not (np.all((method >= 0) & (method <= 1)) and np.all((full >= 0) & (full <= 1))):
        raise ValueError("scores must lie in [0, 1]")
    ratio = float(method.mean() / full.mean()) if full.any() else math.nan
    alpha = 1 - confidence
    if np.isin(method, (0, 1)).all() and np.isin(full, (0, 1)).all():
        right = full == 1
        lower = _exact_lower(int(method[right].sum()), int(right.sum()), alpha)
        upper = _exact_upper(int(method.sum()), int(right.sum()), method.size, alpha)
        return Retention(ratio, lower, upper, method.size, int(right.sum()), True, confidence)
    lower, upper = (float(bound) for bound in _betting_bounds(method, full, alpha))
    return Retention(ratio, lower, upper, method.size, method.size, False, confidence)


def samples_needed(target: float, confidence: float = CONFIDENCE, binary: bool = True) -> float:
    """The fewest samples of evidence with which a record without a loss shows ``target``: for 0/1 scores
    the smallest ``m`` with ``target ** m <= 1 - confidence`` (59 for 0.95 at 95%, 299 for 0.99); infinite
    from a target of 1 on (no finite sample shows that nothing is ever lost)."""
    if target <= 0:
        return 0
    if target >= 1:
        return math.inf
    alpha = 1 - confidence
    if binary:
        return math.ceil(round(math.log(alpha) / math.log(target), 9))
    growth = np.log1p(_BETS * (1 - target) / target)  # each bet's log wealth per sample kept
    n = 1
    while logsumexp(n * growth) - math.log(_BETS.size) < -math.log(alpha):
        n *= 2
    low, high = n // 2, n
    while high - low > 1:
        middle = (low + high) // 2
        passes = logsumexp(middle * growth) - math.log(_BETS.size) >= -math.log(alpha)
        low, high = (low, middle) if passes else (middle, high)
    return high


def _exact_lower(kept: int, right: int, alpha: float) -> float:
    """One-sided Clopper-Pearson lower bound of the share of the ``right`` samples that were ``kept``."""
    if kept == 0:
        return 0.0
    return round(float(betaincinv(kept, right - kept + 1, alpha)), 12)


def _exact_upper(method_right: int, full_right: int, n: int, alpha: float) -> float:
    """Clopper-Pearson upper bound of the method's accuracy over the lower bound of the full cache's, each
    at ``alpha / 2``."""
    if full_right == 0:
        return math.inf
    high = 1.0 if method_right == n else float(betaincinv(method_right + 1, n - method_right, 1 - alpha / 2))
    low = float(betaincinv(full_right, n - full_right + 1, alpha / 2))
    return round(high / low, 12)


def _betting_bounds(method: np.ndarray, full: np.ndarray, alpha: float) -> tuple[float, float]:
    """The lower and upper bounds of retention from the betting test, each at ``alpha``."""
    if not full.any():
        return 0.0, math.inf
    ratio = float(method.mean() / full.mean())

    def lower_rejected(targets: np.ndarray) -> np.ndarray:  # retention <= t rejected, for each t
        return _rejects(method[None, :] - targets[:, None] * full[None, :], targets, alpha)

    def upper_rejected(targets: np.ndarray) -> np.ndarray:  # retention >= t rejected
        return _rejects(targets[:, None] * full[None, :] - method[None, :], np.ones_like(targets), alpha)

    lower = _edge(lower_rejected, 0.0, ratio, rejected_below=True)
    high = max(ratio, 1.0) * 2
    while not upper_rejected(np.array([high]))[0]:
        if high > 1e6:
            return lower, math.inf
        high *= 2
    return lower, _edge(upper_rejected, ratio, high, rejected_below=False)


def _rejects(values: np.ndarray, floors: np.ndarray, alpha: float) -> np.ndarray:
    """Per row of ``values`` (each value >= -floor of its row): whether the mixture of bets rejects a mean
    of at most 0."""
    bets = _BETS[None, :, None] / np.maximum(floors, 1e-12)[:, None, None]
    log_wealth = np.log1p(bets * values[:, None, :]).sum(axis=2)
    return logsumexp(log_wealth, axis=1) - math.log(_BETS.size) >= -math.log(alpha)


def _edge(rejected, low: float, high: float, rejected_below: bool) -> float:
    """The edge in ``[low, high]`` between the targets ``rejected`` and not (rejection is monotone in the
    target), to within ``(high - low) / _GRID ** _ROUNDS``: a grid of targets per round, refined around it."""
    for _ in range(_ROUNDS):
        targets = np.linspace(low, high, _GRID)
        inside = rejected(np.maximum(targets, 1e-12)) == rejected_below
        last = int(np.flatnonzero(inside)[-1]) if inside.any() else -1
        if last == -1:
            return round(float(low), 9)
        if last == _GRID - 1:
            return round(float(high), 9)
        low, high = targets[last], targets[last + 1]
    return round(float(low if rejected_below else high), 9)
