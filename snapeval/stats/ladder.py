"""The decision over a ladder of budgets: the smallest budget shown to keep a target.

Budgets are tested from the largest down, each at the full confidence, and the descent stops at the first
budget that does not pass; the decision is the last one that passed. This is fixed-sequence testing
(Maurer, Hothorn and Lehmacher 1995; for dose finding, Hsu and Berger, JASA 94, 1999): the chance that any
budget it names keeps less than the target is at most the error of one test, with no correction for the
number of budgets, because a budget below the target can only be named if the first such budget in the
sequence passes. A budget that passes below one that does not is never named.
"""

from __future__ import annotations

from collections.abc import Mapping

from snapeval.stats.retention import CONFIDENCE

STAGE_CONFIDENCE = 1 - (1 - CONFIDENCE) / 2
"""Each test's confidence in a decision of two stages (the budget search's), each at half the error."""


def smallest_kept(verdicts: Mapping[int, str]) -> int | None:
    """The last budget that passes, going down from the largest and stopping at the first that does not
    (None: the largest does not pass)."""
    kept = None
    for budget in sorted(verdicts, reverse=True):
        if verdicts[budget] != "pass":
            break
        kept = budget
    return kept
