"""Budget search: the smallest budget at which a method keeps at least ``target`` of the full cache's
accuracy on the same samples, found with fewer samples than the exhaustive grid (``+exp=budget_search``).

Each budget is judged by the gate's rule (:func:`snapeval.stats.retention`: exact one-sided bounds of the
paired retention): it **passes** when the lower bound reaches the target, **fails** when the upper bound is
below it, and is otherwise open (or has too few samples). The search runs in two stages, each at half the
error (97.5% per test), so that the chance of naming a budget whose true retention is below the target is
at most 5% when retention grows with the budget:

1. the coarse ladder ``search.budgets`` is tested from the largest budget down and the descent stops at the
   first budget that does not pass (fixed-sequence testing, :func:`snapeval.stats.smallest_kept`);
2. the budgets of the resolution grid between that budget and the last one passed are tested the same way,
   from the largest down, a few per round, until one does not pass.

An error needs a budget below the true threshold to pass: in stage 1 the largest ladder budget below it, in
stage 2 the largest grid budget below it, each a single test at 2.5%. Samples grow per budget from the
number the target needs (:func:`snapeval.stats.samples_needed`, at least ``search.min_samples``) by
doubling, up to ``search.max_samples``: a fail stops a budget early, but a pass counts only on
``search.max_samples`` samples, so each budget's pass is one test, not one per look. Every round is a grid
run (one prefill per sample fills the full cache and every budget), stored as ordinary runs: a search
resumes, and workers running it share the samples through their claims. ``search.compare=true`` also
tests every budget of the resolution grid on ``search.max_samples`` samples as one fixed sequence at 95%
(:func:`exhaustive`), with the ratio of samples spent.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from snapeval.configs.cache import FULL
from snapeval.errors import SnapevalError
from snapeval.stats import CONFIDENCE, STAGE_CONFIDENCE, retention, samples_needed, smallest_kept

Scores = tuple[list[float], list[float]]  # (method, full) scores of the same samples, in sample order
Evaluate = Callable[[list[int], int], dict[int, Scores]]  # (budgets, samples) -> paired scores per budget


@dataclass(frozen=True)
class Evidence:
    """What ``n`` paired samples say of one budget."""

    budget: int
    n: int
    retention: float
    low: float
    high: float
    verdict: str  # pass | fail | open | too few
    evidence: int = 0  # samples the full cache got right (0/1 scores), else n


@dataclass(frozen=True)
class Decision:
    """The smallest budget shown to keep ``target`` (None: none of those tried), its evidence, every
    budget's, and the samples spent."""

    method: str
    target: float
    budget: int | None
    evidence: tuple[Evidence, ...]
    samples_spent: int
    exhaustive: bool

    @property
    def chosen(self) -> Evidence | None:
        return next((e for e in self.evidence if e.budget == self.budget), None)

    def stored(self) -> dict:
        """The decision as the database stores it."""
        return {**asdict(self), "evidence": [asdict(e) for e in self.evidence]}


FINE_PER_ROUND = 4  # grid budgets of stage 2 evaluated together
WAIT_S = 5.0  # between looks at samples another worker holds


def judge(budget: int, scores: Scores, target: float, confidence: float = CONFIDENCE) -> Evidence:
    """The verdict of ``scores`` (method, full) on ``target`` at ``confidence`` (see the module's doc)."""
    method, full = scores
    bounds = retention(method, full, confidence)
    verdict = bounds.verdict(target)
    return Evidence(budget, bounds.n, bounds.ratio, bounds.lower, bounds.upper, verdict, bounds.evidence)


@dataclass(frozen=True)
class Settings:
    """``search.*``: the method's coarse ladder, the grid's resolution below it and the samples allowed."""

    method: str
    target: float
    budgets: tuple[int, ...]
    resolution: int
    min_samples: int
    max_samples: int


def first_samples(settings: Settings) -> int:
    """The samples a budget is first evaluated on: what a record without a loss needs, at least
    ``search.min_samples``, at most ``search.max_samples``."""
    return min(
        max(settings.min_samples, samples_needed(settings.target, STAGE_CONFIDENCE)), settings.max_samples
    )


def search(settings: Settings, evaluate: Evaluate) -> Decision:
    """The two-stage search (see the module's docstring)."""
    settled: dict[int, Evidence] = {}

    def settle(budgets: list[int]) -> None:
        n = first_samples(settings)
        while budgets:
            for budget, scores in evaluate(budgets, n).items():
                settled[budget] = judge(budget, scores, settings.target, STAGE_CONFIDENCE)
            if n == settings.max_samples:
                return
            failed = max((b for b in budgets if settled[b].verdict == "fail"), default=0)
            budgets = [b for b in budgets if b > failed]  # none at or below a fail can be named
            n = min(2 * n, settings.max_samples)

    ladder = sorted(settings.budgets)
    settle(ladder)
    passing = smallest_kept({b: settled[b].verdict for b in ladder})
    below = [b for b in ladder if passing is not None and b < passing]
    if below:
        fine = [
            b for b in range(passing - settings.resolution, below[-1], -settings.resolution) if b > below[-1]
        ]
        for start in range(0, len(fine), FINE_PER_ROUND):
            settle(fine[start : start + FINE_PER_ROUND])
            if any(settled[b].verdict != "pass" for b in fine[start : start + FINE_PER_ROUND]):
                break
        passing = smallest_kept({b: settled[b].verdict for b in [passing, *fine] if b in settled})
    samples = sum(e.n for e in settled.values()) + max(e.n for e in settled.values())  # + the full cache's
    return _decision(settings, settled, passing, samples, exhaustive=False)


def every_budget(settings: Settings) -> list[int]:
    """The ladder and the resolution grid between its ends: every budget a search may try."""
    low, high = min(settings.budgets), max(settings.budgets)
    return sorted({*range(low, high + 1, settings.resolution), *settings.budgets})


def exhaustive(settings: Settings, evaluate: Evaluate) -> Decision:
    """Every budget of the resolution grid between the ladder's ends on ``max_samples`` samples, decided as
    one fixed sequence at 95%."""
    budgets = every_budget(settings)
    settled = {b: judge(b, s, settings.target) for b, s in evaluate(budgets, settings.max_samples).items()}
    passing = smallest_kept({b: e.verdict for b, e in settled.items()})
    samples = settings.max_samples * (len(budgets) + 1)
    return _decision(settings, settled, passing, samples, exhaustive=True)


def _decision(
    settings: Settings, settled: dict[int, Evidence], passing: int | None, samples: int, exhaustive: bool
) -> Decision:
    evidence = tuple(settled[b] for b in sorted(settled))
    return Decision(settings.method, settings.target, passing, evidence, samples, exhaustive)


def describe(decision: Decision, reference: Decision | None = None) -> str:
    """The decision in a line or two (with the exhaustive reference's, when given)."""
    share = f"{decision.target:.0%} of the full cache's accuracy"
    chosen = decision.chosen
    largest = decision.evidence[-1]
    if chosen is None and all(e.retention != e.retention for e in decision.evidence):  # all NaN
        head = f"{decision.method}: the full cache got no sample right: there is no accuracy to keep"
    elif chosen is None and largest.verdict == "too few":
        head = f"{decision.method}: undecided: {_too_few(largest, decision.target)}"
    elif chosen is None:
        verdict = f"{largest.budget}: {largest.verdict}"
        head = f"{decision.method}: no budget tried is shown to keep {share} ({verdict})"
    else:
        bounds = f"{chosen.retention:.3f}, bounds [{chosen.low:.3f}, {chosen.high:.3f}]"
        head = (
            f"{decision.method} keeps >= {share} from budget {decision.budget}: retention {bounds}, "
            f"n={chosen.n} paired samples"
        )
    kind = "exhaustive grid" if decision.exhaustive else "adaptive search"
    lines = [f"{head} ({kind}, {decision.samples_spent:,} samples spent)"]
    if reference is not None:
        agrees = "agrees" if reference.budget == decision.budget else f"decided {reference.budget}"
        ratio = decision.samples_spent / reference.samples_spent
        lines.append(
            f"exhaustive grid: {agrees}, {reference.samples_spent:,} samples; the search spent {ratio:.2f}x"
        )
    return "\n".join(lines)


def _too_few(evidence: Evidence, target: float) -> str:
    needed = samples_needed(target, STAGE_CONFIDENCE)
    return (
        f"n = {evidence.n} cannot show {target:g} retention "
        f"(needs >= {needed} the full cache gets right; has {evidence.evidence})"
    )


def evidence_rows(decision: Decision) -> Sequence[dict]:
    """One row per budget tried, for a table."""
    return [
        {
            "budget": e.budget,
            "n": e.n,
            "retention": round(e.retention, 3),
            "bounds": f"[{e.low:.3f}, {e.high:.3f}]",
            "verdict": e.verdict,
        }
        for e in decision.evidence
    ]


def run_search(config: Mapping[str, Any]) -> str:
    """``job=search`` (``+exp=budget_search``): the search of ``config["search"]`` on the config's model
    and task, each round a grid run stored like any run; the decisions stored and returned as text."""
    from tabulate import tabulate

    from snapeval.results import ResultsDB

    node = config["search"]
    settings = settings_of(config)
    evaluate = _evaluator(config, settings)
    decisions = [search(settings, evaluate)]
    if node["compare"]:
        decisions.append(exhaustive(settings, evaluate))
    identity = {key: config[key] for key in ("seed", "model", "task", "generation", "search")}
    with ResultsDB(config["run"]["db"]) as db:
        for decision in decisions:
            db.add_decision({**identity, "exhaustive": decision.exhaustive}, decision.stored())
    table = tabulate(evidence_rows(decisions[0]), headers="keys", tablefmt="github")
    return f"{table}\n\n{describe(*decisions)}"


def settings_of(config: Mapping[str, Any]) -> Settings:
    """The search's :class:`Settings` from ``config["search"]`` (one line when there is none)."""
    node = config.get("search")
    if not node:
        raise SnapevalError(
            "job=search needs a search: add +exp=budget_search (its search.* settings)", "job"
        )
    keys = ("method", "target", "budgets", "resolution", "min_samples", "max_samples")
    return Settings(*(tuple(node[k]) if k == "budgets" else node[k] for k in keys))


def check_search(config: Mapping[str, Any]) -> None:
    """Refuse, before torch, a search that could not finish: no search node, a shard, sampled draws or a
    grid of its own, or a budget or parameter that some budget it may try cannot run (every budget of the
    ladder and of the resolution grid between its ends is planned as it would be run)."""
    from snapeval.run.plan import check_inputs, plan_points

    settings = settings_of(config)
    if config["run"].get("shard"):
        message = (
            "a budget search decides on every sample; share it between workers by running it twice instead"
        )
        raise SnapevalError(message, "run.shard")
    generation = config["generation"]
    if generation.get("do_sample") or generation.get("num_samples", 1) > 1:
        message = "a budget search pairs one greedy answer per sample; sampled draws are not separate samples"
        raise SnapevalError(message, "generation.do_sample")
    if config.get("grid"):
        raise SnapevalError("a budget search makes its own grid of budgets; drop the grid", "grid")
    budgets = every_budget(settings)
    try:
        _, failed = plan_points(check_inputs(_round_config(config, settings, budgets, settings.max_samples)))
    except SnapevalError as exc:  # the round's grid takes the search's parameters: name them as the user did
        field = exc.field.replace("grid.params.", "search.params.", 1) if exc.field else None
        raise SnapevalError(
            str(exc).removeprefix(f"{exc.field}: ") if exc.field else str(exc), field
        ) from None
    if failed:
        setting, error = failed[0]
        raise SnapevalError(f"budget {setting['cache'].get('budget')} cannot run: {error}", "search.budgets")


def _round_config(config: Mapping[str, Any], settings: Settings, budgets: list[int], samples: int) -> dict:
    """The grid run of one round: the full cache and the method at ``budgets``, on the first ``samples``."""
    base = {key: value for key, value in config.items() if key != "search"}
    grid = {"cache": [FULL, settings.method], "params": {**config["search"]["params"], "budget": budgets}}
    return {**base, "job": "evaluate", "grid": grid, "run": {**base["run"], "limit": samples}}


def _evaluator(config: Mapping[str, Any], settings: Settings) -> Evaluate:
    """The search's ``evaluate``: a grid run of the full cache and the method at the budgets asked, on the
    first n samples (stored samples are not computed again), read back paired by sample."""
    from snapeval.configs.grid import grid_points
    from snapeval.models import ModelSpec
    from snapeval.results import ResultsDB, identity
    from snapeval.run.evaluation import Loaded
    from snapeval.run.runner import run
    from snapeval.tasks import load_task

    loaded = Loaded(ModelSpec.from_config(config["model"]))  # every round's: the model loads once
    task = load_task(config["task"], config["seed"], settings.max_samples)
    ids = [prompt.id for prompt in task.prompts(loaded.tokenizer)]

    def stored(cfg: dict) -> dict[str, dict[str, float]]:
        with ResultsDB(cfg["run"]["db"]) as db:
            by_point = {}
            for point in grid_points(cfg):
                key = FULL if point["cache"]["method"] == FULL else str(point["cache"]["budget"])
                by_point[key] = {row["sample_id"]: row["score"] for row in db.samples_for(identity(point)[1])}
            return by_point

    def evaluate(budgets: list[int], samples: int) -> dict[int, Scores]:
        cfg = _round_config(config, settings, budgets, samples)
        wanted = ids[:samples]
        run(cfg, loaded)
        scores = stored(cfg)
        while missing := sum(i not in by_id for by_id in scores.values() for i in wanted):
            print(f"waiting for {missing} samples that another worker holds", file=sys.stderr, flush=True)
            time.sleep(WAIT_S)
            run(cfg, loaded)  # computes whatever a dead worker's expired claims returned
            scores = stored(cfg)
        full = scores.pop(FULL)
        return {int(b): ([s[i] for i in wanted], [full[i] for i in wanted]) for b, s in scores.items()}

    return evaluate
