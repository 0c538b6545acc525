"""The statistics every verdict rests on: accuracy intervals and pass@k (:mod:`.accuracy`), the paired
retention rule of the gate, the report and the budget search (:mod:`.retention`), the decision over a
ladder of budgets (:mod:`.ladder`), answer agreement and the "compression not applied?" test
(:mod:`.agreement`), a deployed engine's setting against snapeval's on the same samples
(:mod:`.engines`), output-length growth and the verdict of two targets together (:mod:`.output_length`),
accuracy per turn of multi-turn samples (:mod:`.turns`), and the decisions' error rates by simulation
(:mod:`.simulation`)."""

from snapeval.stats.accuracy import PASS_AT, mean_ci, pass_at, pass_at_k
from snapeval.stats.agreement import Agreement, Unchanged, agreement, clopper_pearson, unchanged
from snapeval.stats.engines import Answers, EnginePairing, answers_of, pair_engine
from snapeval.stats.ladder import STAGE_CONFIDENCE, smallest_kept
from snapeval.stats.retention import CONFIDENCE, Retention, retention, samples_needed

__all__ = [
    "Agreement",
    "Answers",
    "CONFIDENCE",
    "EnginePairing",
    "PASS_AT",
    "Retention",
    "STAGE_CONFIDENCE",
    "Unchanged",
    "agreement",
    "answers_of",
    "clopper_pearson",
    "mean_ci",
    "pair_engine",
    "pass_at",
    "pass_at_k",
    "retention",
    "samples_needed",
    "smallest_kept",
    "unchanged",
]
