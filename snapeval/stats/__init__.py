"""The statistics every verdict rests on: accuracy intervals and pass@k (:mod:`.accuracy`), the paired
retention rule of the gate, the report and the budget search (:mod:`.retention`) and the decision over a
ladder of budgets (:mod:`.ladder`)."""

from snapeval.stats.accuracy import PASS_AT, mean_ci, pass_at, pass_at_k
from snapeval.stats.ladder import STAGE_CONFIDENCE, smallest_kept
from snapeval.stats.retention import CONFIDENCE, Retention, retention, samples_needed

__all__ = [
    "CONFIDENCE",
    "PASS_AT",
    "Retention",
    "STAGE_CONFIDENCE",
    "mean_ci",
    "pass_at",
    "pass_at_k",
    "retention",
    "samples_needed",
    "smallest_kept",
]
