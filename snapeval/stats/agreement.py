"""Whether two runs give the same answers: the share of paired samples whose outputs are identical, with
its exact interval, and the test behind "compression not applied?".

**Agreement** is ``k`` identical outputs of ``n`` paired samples, with the two-sided Clopper-Pearson
interval (Clopper and Pearson, Biometrika 26, 1934): each end holds with ``1 - (1 - confidence) / 2``
at every n.

**"Compression not applied?"** A deployed engine's compressed setting answers every paired sample exactly
as the engine's own full cache does, while snapeval's reference at the same setting changes ``x`` of the
same samples' answers. The hypothesis a flag rejects: the engine's compression changes answers at least
as often as the reference's (its change rate ``p >= r``). Per sample, let ``b`` count the samples only
the reference changed and ``c`` those only the engine changed. Given the ``d = b + c`` samples where the
two differ, ``c ~ Binomial(d, q)`` with ``q >= 1/2`` when ``p >= r``, whatever the pairing (McNemar's
conditional argument, exact at every n), so no change by the engine and ``x >= k`` changes by the
reference happen together with probability at most ``2 ** -k``. The flag is raised at the fewest ``k``
with ``2 ** -k <= 1 - confidence`` (5 changed answers at 95%: a false flag at most 3.1% of the time). A
silent port (``p = 0``) is flagged as often as the reference changes ``k`` answers of ``n``: about 92%
of the time at ``r = 0.2, n = 40``. :func:`snapeval.stats.simulation.flag_rate` measures both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from scipy.special import betaincinv

from snapeval.stats.retention import CONFIDENCE

FLAGGED, CHANGED, UNDECIDED = "flagged", "changed", "undecided"
NOT_APPLIED = "compression not applied?"
"""What a flagged setting is called."""


def clopper_pearson(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The two-sided exact interval of a proportion, ``k`` of ``n`` (``n >= 1``)."""
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    tail = (1 - confidence) / 2
    low = 0.0 if k == 0 else float(betaincinv(k, n - k + 1, tail))
    high = 1.0 if k == n else float(betaincinv(k + 1, n - k, 1 - tail))
    return round(low, 12), round(high, 12)


@dataclass(frozen=True)
class Agreement:
    """``same`` of ``n`` paired samples answered identically, with the exact interval of the share."""

    same: int
    n: int
    low: float
    high: float
    confidence: float = CONFIDENCE

    @property
    def share(self) -> float:
        return self.same / self.n


def agreement(outputs: Iterable[str], others: Iterable[str], confidence: float = CONFIDENCE) -> Agreement:
    """How many of the paired ``outputs`` and ``others`` (one pair per sample) are the same text."""
    pairs = list(zip(outputs, others, strict=True))
    if not pairs:
        raise ValueError("need at least one pair of outputs")
    same = sum(mine == theirs for mine, theirs in pairs)
    return Agreement(same, len(pairs), *clopper_pearson(same, len(pairs), confidence), confidence)


def changes_to_flag(confidence: float = CONFIDENCE) -> int:
    """The fewest answers the reference must change, the engine none, to flag: ``2 ** -k <= 1 - confidence``
    (5 at 95%)."""
    return math.ceil(round(math.log(1 - confidence) / math.log(0.5), 9))


@dataclass(frozen=True)
class Unchanged:
    """The flag's test on ``n`` paired samples: ``changed`` answers the engine's compressed setting
    changed against the engine's full cache, ``reference_changed`` those snapeval's changed against its
    own full cache."""

    changed: int
    reference_changed: int
    n: int
    confidence: float = CONFIDENCE

    @property
    def needed(self) -> int:
        return changes_to_flag(self.confidence)

    @property
    def verdict(self) -> str:
        """``flagged`` ("compression not applied?"), ``changed`` (the engine changed answers), or
        ``undecided`` (it changed none, and the reference too few to tell)."""
        if self.changed:
            return CHANGED
        return FLAGGED if self.reference_changed >= self.needed else UNDECIDED

    @property
    def flagged(self) -> bool:
        return self.verdict == FLAGGED


def unchanged(
    engine: Iterable[str],
    engine_full: Iterable[str],
    reference: Iterable[str],
    reference_full: Iterable[str],
    confidence: float = CONFIDENCE,
) -> Unchanged:
    """The flag's test on paired outputs (one of each per sample): the engine's compressed setting and full
    cache, snapeval's at the same setting and its full cache."""
    rows = list(zip(engine, engine_full, reference, reference_full, strict=True))
    changed = sum(mine != full for mine, full, _, _ in rows)
    reference_changed = sum(theirs != full for _, _, theirs, full in rows)
    return Unchanged(changed, reference_changed, len(rows), confidence)
