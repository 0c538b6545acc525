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
    """Failing budgets stop at 10 samples; passing ones are confirmed on 80 (the cap)."""
    evaluate, asked = table(threshold=300)
    decision = search(SETTINGS, evaluate)
    reference = exhaustive(SETTINGS, table(threshold=300)[0])
    assert decision.budget == reference.budget == 320
    tried = [budget for budgets, _ in asked for budget in budgets if _ == 10]
    assert tried == [128, 256, 512, 1024, 384, 320, 288]  # the ladder, then bisection to 32 slots
    assert [(e.budget, e.n, e.verdict) for e in decision.evidence if e.verdict == "pass"] == [
        (320, 80, "pass"),
        (384, 80, "pass"),
        (512, 80, "pass"),
        (1024, 80, "pass"),
    ]
    assert decision.samples_spent == 3 * 10 + 4 * 80 + 80  # fails at 10, passes at 80, + the full cache's
    assert reference.samples_spent == (len(range(128, 1025, 32)) + 1) * 80
    assert decision.chosen.retention == 1.0


def test_a_pass_on_a_few_agreeing_samples_is_confirmed_on_more():
    """Budget 256 is right on the first 10 samples and wrong on 1 in 5 after: 10 samples would pass it,
    the confirmation fails it on 40, as the exhaustive grid does on 80."""

    def evaluate(budgets, samples):
        return {
            b: ([1.0 if b >= 512 or i < 10 or i % 5 else 0.0 for i in range(samples)], [1.0] * samples)
            for b in budgets
        }

    assert judge(256, evaluate([256], 10)[256], 0.95).verdict == "pass"  # no spread in 10 agreeing samples
    decision, reference = search(SETTINGS, evaluate), exhaustive(SETTINGS, evaluate)
    assert [(e.n, e.verdict) for e in decision.evidence if e.budget == 256] == [(40, "fail")]
    assert decision.budget == reference.budget == 512


def test_samples_are_added_only_where_the_decision_is_open():
    """Budget 256 keeps 90% against a 95% target: open on 10, 20, 40 and still on 80 samples (the cap:
    not shown to keep the target, so not chosen); the failing budget stops at 10."""
    evaluate, asked = table(threshold=500, noisy=frozenset({256}))
    decision = search(SETTINGS, evaluate)
    ladder, confirming = (128, 256, 512, 1024), (256, 512, 1024)
    assert asked[:4] == [(ladder, 10), (confirming, 20), (confirming, 40), (confirming, 80)]
    assert [(e.n, e.verdict) for e in decision.evidence if e.budget in (128, 256)] == [
        (10, "fail"),
        (80, "open"),
    ]
    assert decision.budget == 512


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
