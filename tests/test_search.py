"""The budget search: the adaptive search reaches the exhaustive grid's decision with fewer samples, adds
samples only where the decision is open, and runs end to end as stored runs."""

from __future__ import annotations

from snapeval.configs.compose import compose_config
from snapeval.results import ResultsDB
from snapeval.search import Settings, exhaustive, judge, run_search, search

SETTINGS = Settings("snapstream", 0.95, (128, 256, 512, 1024), 32, 10, 80)


def table(threshold: int, noisy: frozenset[int] = frozenset()):
    """An ``evaluate`` over made-up scores: the full cache gets every sample right; the method too from
    ``threshold`` slots on, every other sample below it, and 9 in 10 at a ``noisy`` budget. Records the
    (budgets, samples) asked for."""
    asked = []

    def evaluate(budgets, samples):
        asked.append((tuple(budgets), samples))
        scores = {}
        for budget in budgets:
            if budget in noisy:
                method = [float(i % 10 != 9) for i in range(samples)]
            else:
                method = [1.0 if budget >= threshold else float(i % 2 == 0) for i in range(samples)]
            scores[budget] = (method, [1.0] * samples)
        return scores

    return evaluate, asked


def test_the_search_reaches_the_exhaustive_decision_with_fewer_samples():
    evaluate, asked = table(threshold=300)
    decision = search(SETTINGS, evaluate)
    reference = exhaustive(SETTINGS, table(threshold=300)[0])
    assert decision.budget == reference.budget == 320
    tried = [budget for budgets, _ in asked for budget in budgets]
    assert tried == [128, 256, 512, 1024, 384, 320, 288]  # the ladder, then bisection to 32 slots
    assert all(samples == 10 for _, samples in asked)  # every verdict was clear on 10 samples
    assert decision.samples_spent == 7 * 10 + 10  # + the full cache's
    assert reference.samples_spent == (len(range(128, 1025, 32)) + 1) * 80
    assert decision.chosen.retention == 1.0 and decision.chosen.verdict == "pass"


def test_samples_are_added_only_where_the_decision_is_open():
    """Budget 256 keeps 90% against a 95% target: open on 10, 20, 40 and still on 80 samples (the cap:
    not shown to keep the target, so not chosen); every other verdict is clear on 10."""
    evaluate, asked = table(threshold=500, noisy=frozenset({256}))
    decision = search(SETTINGS, evaluate)
    assert asked[:4] == [((128, 256, 512, 1024), 10), ((256,), 20), ((256,), 40), ((256,), 80)]
    assert all(samples == 10 for _, samples in asked[4:])
    assert [(e.n, e.verdict) for e in decision.evidence if e.budget == 256] == [(80, "open")]
    assert decision.budget == 512
    assert decision.samples_spent == 80 + 10 * (len(decision.evidence) - 1) + 80


def test_a_full_cache_with_nothing_right_decides_nothing():
    evidence = judge(128, ([0.0] * 10, [0.0] * 10), 0.95)
    assert evidence.verdict == "open" and evidence.retention != evidence.retention  # NaN


def test_a_search_runs_as_stored_grid_runs_and_stores_its_decision(tmp_path, tiny_llama_overrides):
    """Random weights: the full cache gets nothing right, so nothing is decided (the plumbing is tested)."""
    database = tmp_path / "db.sqlite"
    overrides = [
        *tiny_llama_overrides,
        "+exp=budget_search",
        "search.budgets=[128,160]",
        "search.min_samples=2",
    ]
    overrides += [
        "search.max_samples=4",
        "task.context_length=256",
        "task.max_new_tokens=2",
        "task.num_prompts=4",
    ]
    overrides += [f"run.db={database}", "search.compare=true"]
    printed = run_search(compose_config(*overrides))
    assert "the full cache got no sample right" in printed
    with ResultsDB(database) as db:
        decisions = db.decisions()
        runs = db.run_states()
    assert [d["decision"]["exhaustive"] for d in decisions] == [False, True]
    assert {run["method"] for run in runs} == {"full", "snapstream"}
    assert all(run["status"] == "finished" for run in runs)
