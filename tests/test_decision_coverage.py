"""The decisions' error rates by simulation (issue 43): over sample sizes from 5 to 300 and full-cache
accuracies from 0.3 to 1, a method whose true retention is at or below the target passes the gate's rule,
the report's ladder and the budget search at most 5% of the time, plus Monte-Carlo error. The percentile
bootstrap this rule replaced passed 41% of methods at 0.90 retention against a 0.95 target at n = 10."""

from __future__ import annotations

import math

import pytest

from snapeval.commands.search import Settings, search
from snapeval.stats import samples_needed
from snapeval.stats.simulation import (
    exact_pass_probability,
    ladder_error_rate,
    pass_rate,
    search_error_rate,
    true_retention,
)

TRIALS = 400
ALLOWED = 0.05 + 3 * math.sqrt(0.05 * 0.95 / TRIALS)  # 5% plus three Monte-Carlo standard errors: 0.083
SIZES = (5, 10, 30, 60, 100, 300)
ACCURACIES = (0.3, 0.6, 0.9, 1.0)


@pytest.mark.parametrize("target", [0.95, 0.99])
@pytest.mark.parametrize("below", [0.0, 0.05])
@pytest.mark.parametrize("full_accuracy", ACCURACIES)
def test_the_rule_passes_a_method_below_the_target_at_most_5_percent(target, below, full_accuracy):
    rates = {n: pass_rate(n, full_accuracy, target - below, target, TRIALS, seed=n) for n in SIZES}
    assert max(rates.values()) <= ALLOWED, rates


@pytest.mark.parametrize("full_accuracy", [0.3, 0.6, 0.9])
def test_gains_do_not_buy_a_pass_below_the_target(full_accuracy):
    """The method loses 10% of the full cache's right answers and gets right just enough of its wrong
    ones to make up for half: true retention 0.95, at the 0.95 target."""
    gain = 0.05 * full_accuracy / (1 - full_accuracy)
    assert true_retention(full_accuracy, 0.9, gain) == pytest.approx(0.95)
    rates = {n: pass_rate(n, full_accuracy, 0.9, 0.95, TRIALS, seed=n, gain=gain) for n in SIZES}
    assert max(rates.values()) <= ALLOWED, rates


def test_other_scores_keep_the_error_rate():
    """Half-right scores (0.5) make the scores non-binary: the betting bound holds them too."""
    import numpy as np

    from snapeval.stats import retention

    rng = np.random.default_rng(7)
    for n in (10, 60):
        full = rng.choice([0.5, 1.0], size=(TRIALS, n))
        method = full * (rng.random((TRIALS, n)) < 0.95)
        rate = np.mean([retention(m, f).verdict(0.95) == "pass" for m, f in zip(method, full, strict=True)])
        assert rate <= ALLOWED, (n, rate)


@pytest.mark.parametrize(
    "keeps",
    [
        (0.95, 0.95, 0.95, 0.95, 1.0),  # every budget but the largest at the target: many chances to err
        (0.85, 0.9, 0.93, 0.95, 1.0),
    ],
)
@pytest.mark.parametrize("n", [30, 100, 300])
def test_the_reports_ladder_names_a_budget_below_the_target_at_most_5_percent(keeps, n):
    for full_accuracy in (0.6, 0.9, 1.0):
        rate = ladder_error_rate(n, full_accuracy, keeps, 0.95, TRIALS, seed=n)
        assert rate <= ALLOWED, (full_accuracy, rate)


@pytest.mark.parametrize("threshold", [700, 1024])
@pytest.mark.parametrize("full_accuracy", [0.9, 1.0])
def test_the_search_names_a_budget_below_the_target_at_most_5_percent(threshold, full_accuracy):
    """Every budget below ``threshold`` keeps exactly the target (0.95), every one from it on keeps all:
    stage 1 and stage 2 each see budgets at the target."""
    settings = Settings("snapstream", 0.95, (128, 256, 512, 1024), 32, 10, 100)
    trials = 200
    rate, _ = search_error_rate(
        search, settings, lambda budget: 1.0 if budget >= threshold else 0.95, full_accuracy, trials, seed=1
    )
    assert rate <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)


@pytest.mark.parametrize(("full_accuracy", "n"), [(1.0, 59), (0.9, 68), (0.6, 105), (0.3, 214)])
def test_a_method_that_loses_nothing_passes_0_95_four_times_in_five_from_n(full_accuracy, n):
    """The power docs/decisions.md states: exact, summed over every outcome."""
    assert exact_pass_probability(n, full_accuracy, 1.0, 0.95) >= 0.8
    assert exact_pass_probability(n - 1, full_accuracy, 1.0, 0.95) < 0.8
    assert samples_needed(0.95) == 59
