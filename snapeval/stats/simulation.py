"""How often the decisions are wrong, by simulation: paired scores drawn from a known truth, judged by the
project's own rule (:func:`snapeval.stats.retention`), ladder (:func:`snapeval.stats.smallest_kept`) and
budget search (:func:`snapeval.commands.search.search`); how often an engine is flagged "compression
not applied?" (:func:`flag_rate`, the test of :class:`snapeval.stats.agreement.Unchanged`); and how often
the bounds of output-length growth miss it and a setting that grows more than a bound passes
(:func:`growth_misses`, :func:`growth_pass_rate`, the rule of :mod:`snapeval.stats.output_length`).

The truth: the full cache is right with probability ``full_accuracy``; on a sample it got right the method
keeps the answer with probability ``keep``; on one it missed the method is right with probability ``gain``.
True retention is ``keep + gain * (1 - full_accuracy) / full_accuracy``. Across budgets one uniform draw per
sample decides every budget (kept where the draw is below the budget's ``keep``), so a larger budget keeps
what a smaller one kept, as the same prompts do under a growing cache.

Output lengths (:func:`token_draws`): a problem's length is lognormal around ``scale`` (``spread``, the
log-sd across problems); each setting's trace adds its own lognormal noise (``noise``) of mean one, and the
method's is ``factor`` times as long, so the true growth of the means is ``factor`` exactly; ``cap`` stops
traces as ``max_new_tokens`` does (the true growth is then the capped means' ratio).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from snapeval.stats.agreement import Unchanged
from snapeval.stats.ladder import smallest_kept
from snapeval.stats.output_length import growth, jointly
from snapeval.stats.retention import CONFIDENCE, retention


def true_retention(full_accuracy: float, keep: float, gain: float = 0.0) -> float:
    """The retention that ``keep`` and ``gain`` give at ``full_accuracy``."""
    return keep + gain * (1 - full_accuracy) / full_accuracy


def draws(
    rng: np.random.Generator, trials: int, n: int, full_accuracy: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per trial and sample: whether the full cache is right, and the uniform draw that decides the method."""
    return rng.random((trials, n)) < full_accuracy, rng.random((trials, n))


def method_scores(full: np.ndarray, draw: np.ndarray, keep: float, gain: float = 0.0) -> np.ndarray:
    """The method's 0/1 scores at a budget that keeps ``keep`` and gains ``gain``."""
    return np.where(full, draw < keep, draw < gain).astype(float)


def pass_rate(
    n: int,
    full_accuracy: float,
    keep: float,
    target: float,
    trials: int,
    seed: int,
    gain: float = 0.0,
    confidence: float = CONFIDENCE,
) -> float:
    """The share of ``trials`` in which ``n`` paired samples pass ``target``."""
    full, draw = draws(np.random.default_rng(seed), trials, n, full_accuracy)
    method = method_scores(full, draw, keep, gain)
    passed = [
        retention(m, f.astype(float), confidence).verdict(target) == "pass"
        for m, f in zip(method, full, strict=True)
    ]
    return float(np.mean(passed))


def ladder_error_rate(
    n: int, full_accuracy: float, keeps: Sequence[float], target: float, trials: int, seed: int
) -> float:
    """The share of ``trials`` in which the report's decision over a ladder of budgets (one ``keep`` per
    budget, ascending) names a budget whose true retention is at most ``target``."""
    full, draw = draws(np.random.default_rng(seed), trials, n, full_accuracy)
    wrong = 0
    for f, d in zip(full, draw, strict=True):
        verdicts = {
            index: retention(method_scores(f, d, keep), f.astype(float)).verdict(target)
            for index, keep in enumerate(keeps)
        }
        named = smallest_kept(verdicts)
        wrong += named is not None and keeps[named] <= target
    return wrong / trials


def search_error_rate(
    search: Callable[[Any, Callable], Any],
    settings: Any,
    keep_at: Callable[[int], float],
    full_accuracy: float,
    trials: int,
    seed: int,
) -> tuple[float, float]:
    """The share of ``trials`` in which ``search(settings, evaluate)``
    (:func:`snapeval.commands.search.search`) names a budget whose true retention (``keep_at(budget)``)
    is at most the target, and the mean samples it spent."""
    rng = np.random.default_rng(seed)
    wrong, spent = 0, 0
    for _ in range(trials):
        [full], [draw] = draws(rng, 1, settings.max_samples, full_accuracy)

        def evaluate(budgets: list[int], samples: int, full=full, draw=draw) -> dict[int, tuple[list, list]]:
            reference = full[:samples].astype(float).tolist()
            return {
                b: (method_scores(full[:samples], draw[:samples], keep_at(b)).tolist(), reference)
                for b in budgets
            }

        decision = search(settings, evaluate)
        wrong += decision.budget is not None and keep_at(decision.budget) <= settings.target
        spent += decision.samples_spent
    return wrong / trials, spent / trials


def exact_pass_probability(n: int, full_accuracy: float, keep: float, target: float) -> float:
    """The chance that ``n`` paired 0/1 samples pass ``target`` when the method gains nothing, summed over
    every outcome (``m`` right under the full cache, ``k`` of them kept) rather than simulated."""
    from scipy.stats import binom

    total = 0.0
    for right in range(n + 1):
        kept = _fewest_kept_to_pass(right, n, target)
        if kept is not None:
            total += binom.pmf(right, n, full_accuracy) * binom.sf(kept - 1, right, keep)
    return float(total)


def _fewest_kept_to_pass(right: int, n: int, target: float) -> int | None:
    """The fewest of ``right`` full-cache answers kept with which ``n`` samples pass ``target`` (None:
    none)."""
    full = [1.0] * right + [0.0] * (n - right)

    def passes(kept: int) -> bool:
        method = [1.0] * kept + [0.0] * (n - kept)
        return retention(method, full).verdict(target) == "pass"

    if right == 0 or not passes(right):
        return None
    low, high = 0, right  # passes(high); the lower bound grows with the answers kept
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if passes(middle) else (middle, high)
    return high


def flag_rate(
    n: int,
    reference_only: float,
    engine_only: float,
    both: float,
    trials: int,
    seed: int,
    confidence: float = CONFIDENCE,
) -> float:
    """The share of ``trials`` of ``n`` samples flagged "compression not applied?" when, per sample, only
    snapeval's reference changes its answer (against its full cache) with probability ``reference_only``,
    only the engine with ``engine_only``, and both with ``both``."""
    draw = np.random.default_rng(seed).random((trials, n))
    reference = draw < both + reference_only
    engine = (draw < both) | ((draw >= both + reference_only) & (draw < both + reference_only + engine_only))
    flagged = [
        Unchanged(int(changed), int(reference_changed), n, confidence).flagged
        for changed, reference_changed in zip(engine.sum(axis=1), reference.sum(axis=1), strict=True)
    ]
    return float(np.mean(flagged))


def token_draws(
    rng: np.random.Generator,
    trials: int,
    n: int,
    factor: float,
    spread: float,
    noise: float,
    cap: float = np.inf,
    scale: float = 3000.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Per trial and sample: the method's generated tokens and the full cache's (the module's model)."""
    problem = scale * np.exp(rng.normal(0.0, spread, (trials, n)))

    def trace(times: float) -> np.ndarray:
        return np.minimum(times * problem * np.exp(rng.normal(-(noise**2) / 2, noise, (trials, n))), cap)

    full = trace(1.0)
    return trace(factor), full


def growth_misses(
    n: int,
    factor: float,
    truth: float,
    trials: int,
    seed: int,
    spread: float,
    noise: float,
    cap: float = np.inf,
) -> tuple[float, float]:
    """The shares of ``trials`` in which the upper bound of growth lies below ``truth`` and the lower bound
    above it, when the method's traces are ``factor`` times as long (``truth``: the growth of the means,
    ``factor`` itself without a cap)."""
    method, full = token_draws(np.random.default_rng(seed), trials, n, factor, spread, noise, cap)
    bounds = [growth(m, f) for m, f in zip(method, full, strict=True)]
    return (
        float(np.mean([b.upper < truth for b in bounds])),
        float(np.mean([b.lower > truth for b in bounds])),
    )


def growth_pass_rate(
    n: int,
    true_growth: float,
    bound: float,
    trials: int,
    seed: int,
    target: float = 0.95,
    spread: float = 0.8,
    noise: float = 0.3,
) -> float:
    """The share of ``trials`` in which a setting passes both ``target`` retention and growth at most
    ``bound`` (:func:`snapeval.stats.output_length.jointly`) when it keeps every answer of a full cache
    right on 90% of the samples and its traces grow by ``true_growth``."""
    rng = np.random.default_rng(seed)
    full_right, _ = draws(rng, trials, n, 0.9)
    method, full = token_draws(rng, trials, n, true_growth, spread, noise)
    passed = [
        jointly(
            retention(right.astype(float), right.astype(float)).verdict(target),
            growth(m, f).verdict(bound),
        )
        == "pass"
        for right, m, f in zip(full_right, method, full, strict=True)
    ]
    return float(np.mean(passed))
