"""Budget search: the smallest budget at which a method keeps at least ``target`` of the full cache's
accuracy on the same samples, found with as few samples as the decision needs (``+exp=budget_search``).

The rule is the gate's (:func:`snapeval.stats.paired_bootstrap_lower_bound`): a budget **passes** when
the one-sided 95% lower bound of ``mean(method) - target x mean(full)`` over the paired samples is >= 0,
**fails** when the upper bound is < 0, and is **open** otherwise. The search

1. evaluates the coarse ladder ``search.budgets`` on the first ``search.min_samples`` samples (one grid:
   one prefill per sample fills the full cache and every budget);
2. doubles the samples of every budget that has not failed, up to ``search.max_samples``: only a fail
   stops early, a pass is confirmed on ``search.max_samples`` (a bootstrap bound on a few samples that all
   agree has no spread to go by: 10 right answers out of 10 "pass" any target), and a budget open at the
   cap has not shown the target, so it counts as failing;
3. bisects between the largest failing and the smallest passing budget, each new budget settled the same
   way, until they are at most ``search.resolution`` apart.

The decision is the smallest passing budget, with its retention and interval
(:func:`snapeval.stats.paired_retention`) and the samples spent (method samples over every budget tried,
plus the full cache's). ``search.compare=true`` also evaluates every budget of the resolution grid
between the ladder's ends on ``search.max_samples`` samples (:func:`exhaustive`): the reference the
adaptive search is checked against, with the ratio of samples spent. Samples are stored as ordinary
runs, so a search resumes, and several workers running it share the samples through their claims.
Retention is assumed to grow with the budget (bisection needs it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from snapeval.stats import paired_bootstrap_lower_bound, paired_retention

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
    verdict: str  # pass | fail | open


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


def judge(budget: int, scores: Scores, target: float) -> Evidence:
    """The verdict of ``scores`` (method, full) on ``target`` (see the module's docstring)."""
    method, full = scores
    lower = paired_bootstrap_lower_bound(method, full, target)
    upper = -paired_bootstrap_lower_bound([target * f for f in full], method)
    verdict = "pass" if lower >= 0 else "fail" if upper < 0 else "open"
    if not any(full):  # the full cache got none right: there is nothing to retain, nothing to decide
        verdict = "open"
    return Evidence(budget, len(method), *paired_retention(method, full), verdict)


@dataclass(frozen=True)
class Settings:
    """``search.*``: the method's coarse ladder, the bisection's resolution and the samples allowed."""

    method: str
    target: float
    budgets: tuple[int, ...]
    resolution: int
    min_samples: int
    max_samples: int


def search(settings: Settings, evaluate: Evaluate) -> Decision:
    """The adaptive search (see the module's docstring)."""
    settled: dict[int, Evidence] = {}

    def settle(budgets: list[int]) -> None:
        n = settings.min_samples
        while budgets:
            for budget, scores in evaluate(budgets, n).items():
                settled[budget] = judge(budget, scores, settings.target)
            budgets = [b for b in budgets if settled[b].verdict != "fail" and n < settings.max_samples]
            n = min(2 * n, settings.max_samples)

    settle(sorted(settings.budgets))
    failing, passing = _bracket(settled)
    while passing is not None and failing is not None and passing - failing > settings.resolution:
        middle = _on_grid((failing + passing) // 2, settings.resolution, failing, passing)
        if middle is None:
            break
        settle([middle])
        failing, passing = (failing, middle) if settled[middle].verdict == "pass" else (middle, passing)
    samples = sum(e.n for e in settled.values()) + max(e.n for e in settled.values())  # + the full cache's
    return _decision(settings, settled, samples, exhaustive=False)


def exhaustive(settings: Settings, evaluate: Evaluate) -> Decision:
    """Every budget of the resolution grid between the ladder's ends, on ``max_samples`` samples."""
    low, high = min(settings.budgets), max(settings.budgets)
    budgets = sorted({*range(low, high + 1, settings.resolution), *settings.budgets})
    settled = {b: judge(b, s, settings.target) for b, s in evaluate(budgets, settings.max_samples).items()}
    samples = settings.max_samples * (len(budgets) + 1)
    return _decision(settings, settled, samples, exhaustive=True)


def _bracket(settled: dict[int, Evidence]) -> tuple[int | None, int | None]:
    """The smallest passing budget and the largest failing one below it (None: there is none)."""
    passing = min((b for b, e in settled.items() if e.verdict == "pass"), default=None)
    below = [b for b, e in settled.items() if e.verdict != "pass" and (passing is None or b < passing)]
    return max(below, default=None), passing


def _on_grid(budget: int, resolution: int, failing: int, passing: int) -> int | None:
    """``budget`` rounded to the resolution grid of ``failing``, strictly between the two (None: none)."""
    rounded = failing + round((budget - failing) / resolution) * resolution
    return rounded if failing < rounded < passing else None


def _decision(settings: Settings, settled: dict[int, Evidence], samples: int, exhaustive: bool) -> Decision:
    _, passing = _bracket(settled)
    evidence = tuple(settled[b] for b in sorted(settled))
    return Decision(settings.method, settings.target, passing, evidence, samples, exhaustive)


def describe(decision: Decision, reference: Decision | None = None) -> str:
    """The decision in a line or two (with the exhaustive reference's, when given)."""
    share = f"{decision.target:.0%} of the full cache's accuracy"
    chosen = decision.chosen
    if chosen is None and all(e.retention != e.retention for e in decision.evidence):  # all NaN
        head = f"{decision.method}: the full cache got no sample right: there is no accuracy to keep"
    elif chosen is None:
        head = f"{decision.method}: no budget tried keeps {share}"
    else:
        interval = f"{chosen.retention:.3f} [{chosen.low:.3f}, {chosen.high:.3f}]"
        head = (
            f"{decision.method} keeps >= {share} from budget {decision.budget}: retention {interval}, "
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


def evidence_rows(decision: Decision) -> Sequence[dict]:
    """One row per budget tried, for a table."""
    return [
        {
            "budget": e.budget,
            "n": e.n,
            "retention": round(e.retention, 3),
            "95% CI": f"[{e.low:.3f}, {e.high:.3f}]",
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
    settings = Settings(
        node["method"],
        node["target"],
        tuple(node["budgets"]),
        node["resolution"],
        node["min_samples"],
        node["max_samples"],
    )
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


def _evaluator(config: Mapping[str, Any], settings: Settings) -> Evaluate:
    """The search's ``evaluate``: a grid run of the full cache and the method at the budgets asked, on the
    first n samples (stored samples are not computed again), read back paired by sample."""
    from snapeval.grid import grid_points
    from snapeval.models import ModelSpec, load_tokenizer
    from snapeval.results import ResultsDB, identity
    from snapeval.runner import run
    from snapeval.tasks import load_task

    base = {key: value for key, value in config.items() if key != "search"}
    task = load_task(config["task"], config["seed"], settings.max_samples)
    ids = [prompt.id for prompt in task.prompts(load_tokenizer(ModelSpec.from_config(config["model"])))]
    fixed = dict(config["search"]["params"])

    def evaluate(budgets: list[int], samples: int) -> dict[int, Scores]:
        grid = {"cache": ["full", settings.method], "params": {**fixed, "budget": budgets}}
        cfg = {**base, "job": "evaluate", "grid": grid, "run": {**base["run"], "limit": samples}}
        run(cfg)
        wanted = ids[:samples]
        with ResultsDB(cfg["run"]["db"]) as db:
            scores, full = {}, {}
            for point in grid_points(cfg):
                stored = {row["sample_id"]: row["score"] for row in db.samples_for(identity(point)[1])}
                if point["cache"]["method"] == "full":
                    full = stored
                else:
                    scores[point["cache"]["budget"]] = stored
        return {b: ([s[i] for i in wanted], [full[i] for i in wanted]) for b, s in scores.items()}

    return evaluate
