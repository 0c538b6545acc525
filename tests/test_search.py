"""The budget search: two fixed sequences at 97.5% (the ladder from the largest budget down, then the
resolution grid below the last budget kept) reach the exhaustive grid's decision with fewer samples, name no
budget below one that does not pass, and run end to end as stored runs."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from snapeval.__main__ import check_before_hydra
from snapeval.commands.search import (
    Decision,
    Settings,
    describe,
    exhaustive,
    first_samples,
    judge,
    run_search,
    search,
)
from snapeval.configs.compose import compose_config
from snapeval.results import ResultsDB
from snapeval.stats import STAGE_CONFIDENCE

SETTINGS = Settings("snapstream", 0.95, (128, 256, 512, 1024), 32, 10, 100)
LADDER = (128, 256, 512, 1024)
# 0.95 at 97.5% a stage needs m kept of m with 0.95**m <= 0.025: m = 72 (0.95**71 = 0.026); samples go
# 72, then min(144, 100) = 100. All 100 kept: lower bound 0.025**(1/100) = 0.964 at 97.5% (a pass), and
# 0.05**(1/100) = 0.970 at 95% (the exhaustive grid's). Every other sample kept: upper bound <= 0.68 (fail).


def table(threshold: int, broken: frozenset[int] = frozenset(), noisy: frozenset[int] = frozenset()):
    """An ``evaluate`` over made-up scores: the full cache gets every sample right; the method too from
    ``threshold`` slots on, every other sample below it and at a ``broken`` budget, and 9 in 10 at a
    ``noisy`` one. Records the (budgets, samples) asked for."""
    asked = []

    def evaluate(budgets, samples):
        asked.append((tuple(budgets), samples))
        scores = {}
        for budget in budgets:
            if budget in noisy:
                method = [float(i % 10 != 9) for i in range(samples)]
            elif budget >= threshold and budget not in broken:
                method = [1.0] * samples
            else:
                method = [float(i % 2 == 0) for i in range(samples)]
            scores[budget] = (method, [1.0] * samples)
        return scores

    return evaluate, asked


def test_a_first_look_is_on_the_samples_a_record_without_a_loss_needs():
    assert first_samples(SETTINGS) == 72
    assert first_samples(Settings("snapstream", 0.8, LADDER, 32, 10, 100)) == 17  # 0.8**17 = 0.0225
    assert first_samples(Settings("snapstream", 0.5, LADDER, 32, 10, 100)) == 10  # 6 needed, min 10


def test_the_search_reaches_the_exhaustive_decision_with_fewer_samples():
    """Threshold 300: the ladder keeps 1024 and 512 and fails 256; the grid below 512 is walked down 4 a
    round, 480..384 then 352, 320, 288, and 288 fails: 320 is named, as the exhaustive grid names it."""
    evaluate, asked = table(threshold=300)
    decision = search(SETTINGS, evaluate)
    reference = exhaustive(SETTINGS, table(threshold=300)[0])
    assert decision.budget == reference.budget == 320
    assert asked == [
        (LADDER, 72),
        ((512, 1024), 100),  # the fails stop at 72; a pass counts only on 100
        ((480, 448, 416, 384), 72),
        ((480, 448, 416, 384), 100),
        ((352, 320, 288), 72),
        ((352, 320), 100),
    ]
    assert [(e.budget, e.n, e.verdict) for e in decision.evidence if e.verdict != "pass"] == [
        (128, 72, "fail"),
        (256, 72, "fail"),
        (288, 72, "fail"),
    ]
    assert {e.n for e in decision.evidence if e.verdict == "pass"} == {100}
    assert decision.samples_spent == 3 * 72 + 8 * 100 + 100  # fails at 72, passes at 100, + the full cache's
    assert reference.samples_spent == (len(range(128, 1025, 32)) + 1) * 100 == 3000
    # upper bound: 1 over the full cache's lower bound at 98.75%, 0.0125**(1/100) = 0.957
    assert describe(decision, reference) == (
        "snapstream keeps >= 95% of the full cache's accuracy from budget 320: retention 1.000, bounds "
        "[0.964, 1.045], n=100 paired samples (adaptive search, 1,116 samples spent)\n"
        "exhaustive grid: agrees, 3,000 samples; the search spent 0.37x"
    )


def test_the_grid_stops_at_its_first_budget_that_does_not_pass():
    """Threshold 450: of the first round below 512 only 480 passes, so no second round is asked for."""
    evaluate, asked = table(threshold=450)
    decision = search(SETTINGS, evaluate)
    assert asked[2:] == [((480, 448, 416, 384), 72), ((480,), 100)]
    assert decision.budget == 480


def test_a_budget_passing_below_one_that_does_not_is_never_named():
    """Broken 512 on the ladder: 256 and 128 pass on 100 samples, but the descent stopped at 512, so the
    grid is walked from 1024 down to 544 (15 budgets, 4 rounds). Broken 448 in the grid: 416 and 384 pass
    below it, and 480 is named."""
    evaluate, asked = table(threshold=0, broken=frozenset({512}))
    decision = search(SETTINGS, evaluate)
    passed = {e.budget for e in decision.evidence if e.verdict == "pass"}
    assert {128, 256} <= passed and decision.budget == 544
    assert [budgets for budgets, n in asked if n == 72][1:] == [
        (992, 960, 928, 896),
        (864, 832, 800, 768),
        (736, 704, 672, 640),
        (608, 576, 544),
    ]
    assert exhaustive(SETTINGS, table(threshold=0, broken=frozenset({512}))[0]).budget == 544

    decision = search(SETTINGS, table(threshold=300, broken=frozenset({448}))[0])
    verdicts = {e.budget: e.verdict for e in decision.evidence}
    assert [verdicts[b] for b in (480, 448, 416, 384)] == ["pass", "fail", "pass", "pass"]
    assert decision.budget == 480


def test_a_pass_on_the_first_look_counts_only_on_the_most_samples():
    """Below 512 the method keeps the first 72 samples and loses 1 in 5 after (5 of samples 72..99): 72
    samples pass at 97.5% (lower bound 0.025**(1/72) = 0.950), but 95 of 100 are only open (lower bound
    0.887), so the descent stops at 256 and 512 is named, as the exhaustive grid names it."""

    def evaluate(budgets, samples):
        return {
            b: ([1.0 if b >= 512 or i < 72 or i % 5 else 0.0 for i in range(samples)], [1.0] * samples)
            for b in budgets
        }

    assert judge(256, evaluate([256], 72)[256], 0.95, 0.975).verdict == "pass"
    decision, reference = search(SETTINGS, evaluate), exhaustive(SETTINGS, evaluate)
    assert [(e.n, e.verdict) for e in decision.evidence if e.budget == 256] == [(100, "open")]
    assert decision.budget == reference.budget == 512


def test_samples_are_added_only_where_the_decision_is_open():
    """Budget 256 keeps 9 in 10 against a 95% target: open on 72 samples (65 kept) and on 100 (the cap:
    not shown to keep the target, so the descent stops there); the failing 128 stops at 72."""
    evaluate, asked = table(threshold=500, noisy=frozenset({256}))
    decision = search(SETTINGS, evaluate)
    assert asked[:2] == [(LADDER, 72), ((256, 512, 1024), 100)]
    assert [(e.n, e.verdict) for e in decision.evidence if e.budget in (128, 256)] == [
        (72, "fail"),
        (100, "open"),
    ]
    assert decision.budget == 512


def test_a_full_cache_with_nothing_right_decides_nothing():
    evidence = judge(128, ([0.0] * 10, [0.0] * 10), 0.95)
    assert evidence.verdict == "too few" and evidence.retention != evidence.retention  # NaN


def test_a_search_that_cannot_show_its_target_is_refused_before_torch(tmp_path, torch_refused):
    """0.99 at 97.5% needs 368 samples without a loss (0.99**368 = 0.0248): 80 cannot show it."""
    args = ["+exp=budget_search", "search.max_samples=80", "search.target=0.99", f"run.db={tmp_path / 'db'}"]
    result = subprocess.run(
        [sys.executable, "-m", "snapeval", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=torch_refused,
        cwd=tmp_path,
    )
    assert (result.returncode, result.stderr) == (
        2,
        "error: search.max_samples: 80 samples cannot show 0.99 retention: a search needs >= 368 the full "
        "cache gets right, with no loss (97.5% a stage)\n",
    )


def tiny_search(model: tuple[str, ...], database, samples: int) -> list[str]:
    """A search of two budgets on the tiny random model, up to ``samples`` samples, target 0.3 (4 samples
    without a loss show it at 97.5%: 0.3**4 = 0.008 <= 0.025 < 0.3**3)."""
    return [
        *model,
        "+exp=budget_search",
        "search.budgets=[128,160]",
        "search.target=0.3",
        "search.min_samples=2",
        f"search.max_samples={samples}",
        "task.context_length=256",
        "task.max_new_tokens=2",
        f"task.num_prompts={samples}",
        f"run.db={database}",
    ]


def test_a_search_runs_as_stored_grid_runs_and_stores_its_decision(tmp_path, tiny_llama_overrides):
    """Random weights: the full cache gets nothing right, so nothing is decided (the plumbing is tested).
    Target 0.3 keeps it to 4 samples: 0.3**4 = 0.008 <= 0.025 < 0.3**3."""
    database = tmp_path / "db.sqlite"
    overrides = [*tiny_search(tiny_llama_overrides, database, samples=4), "search.compare=true"]
    assert check_before_hydra(overrides).plan is None  # accepted by the front door; the search plans rounds
    printed = run_search(compose_config(*overrides))
    assert "the full cache got no sample right" in printed
    with ResultsDB(database) as db:
        decisions = db.decisions()
        runs = db.run_states()
    assert [d["decision"]["exhaustive"] for d in decisions] == [False, True]
    assert [d["decision"]["samples_spent"] for d in decisions] == [3 * 4, 3 * 4]  # 2 budgets + full, 4 each
    assert {run["method"] for run in runs} == {"full", "snapstream"}
    assert all(run["status"] == "finished" for run in runs)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["job=search"], "job: job=search needs a search: add +exp=budget_search"),
        (["+exp=budget_search", "run.shard=0/2"], "run.shard: a budget search decides on every sample"),
        (
            ["+exp=budget_search", "generation.do_sample=true", "generation.num_samples=2"],
            "generation.do_sample: a budget search pairs one greedy answer per sample",
        ),
        (
            ["+exp=budget_search", "search.budgets=[1,2]"],
            "search.budgets: budget 1 cannot run: cache.budget:",
        ),
        (
            ["+exp=budget_search", "+search.params.window=9999"],
            "search.budgets: budget 128 cannot run: cache.budget: must be an integer larger than",
        ),
        (["+exp=budget_search", "+search.params.bogus=1"], "search.params.bogus: no method of this grid"),
    ],
)
def test_a_search_that_could_not_finish_is_refused_before_torch(tmp_path, torch_refused, overrides, expected):
    """Each of these ran a round (or all of it) before failing with a traceback."""
    result = subprocess.run(
        [sys.executable, "-m", "snapeval", *overrides, f"run.db={tmp_path / 'db'}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=torch_refused,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: {expected}") and result.stderr.count("\n") == 1


@pytest.mark.slow
def test_two_identical_searches_on_one_database_share_it(tmp_path, tiny_llama_overrides):
    """Started at once, each claims part of every round's samples and waits for the other's (this was a
    KeyError): both decide the same, the decision is stored once, and no sample is computed twice."""
    database = tmp_path / "db.sqlite"
    overrides = [*tiny_search(tiny_llama_overrides, database, samples=8), "run.batch_size=1"]
    command = [sys.executable, "-m", "snapeval", *overrides]
    workers = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in "ab"
    ]
    outputs = [worker.communicate(timeout=600) for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], [err[-2000:] for _, err in outputs]
    assert all("the full cache got no sample right" in out for out, _ in outputs)
    assert outputs[0][0] == outputs[1][0]
    with ResultsDB(database) as db:
        assert len(db.decisions()) == 1
    with sqlite3.connect(database) as connection:
        samples = connection.execute(
            "SELECT config_hash, COUNT(*) FROM samples GROUP BY config_hash"
        ).fetchall()
    assert sorted(count for _, count in samples) == [8, 8, 8]  # full, 128, 160: each sample stored once


def test_an_undecided_search_says_how_many_right_answers_it_had():
    """72 samples, the full cache right on 70, the method keeping all 70: a 0.95 target needs 72 at 97.5%."""
    full = [1.0] * 70 + [0.0] * 2
    evidence = judge(1024, (full, full), 0.95, STAGE_CONFIDENCE)
    assert (evidence.verdict, evidence.evidence) == ("too few", 70)
    decision = Decision("snapstream", 0.95, None, (evidence,), 144, exhaustive=False)
    assert "n = 72 cannot show 0.95 retention (needs >= 72 the full cache gets right; has 70)" in describe(
        decision
    )
