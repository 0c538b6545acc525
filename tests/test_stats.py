import math

import numpy as np
import pytest
from scipy import stats

from snapeval.stats import mean_ci, paired_bootstrap_lower_bound, paired_retention

Z95 = 1.959963984540054
Z95_ONE_SIDED = 1.6448536269514722


def test_binary_scores_get_the_wilson_interval():
    # 3 of 4: p = 0.75, z^2 = 3.8415, centre = (0.75 + z^2/8) / (1 + z^2/4) = 0.62753,
    # half width = z / (1 + z^2/4) * sqrt(0.75 * 0.25 / 4 + z^2 / 64) = 0.32689.
    mean, low, high = mean_ci([1, 1, 1, 0])
    assert mean == 0.75
    assert low == pytest.approx(0.30064, abs=1e-5)
    assert high == pytest.approx(0.95441, abs=1e-5)


def test_wilson_interval_of_all_correct_ends_at_one():
    mean, low, high = mean_ci([1.0] * 10)
    assert mean == 1.0
    assert high == pytest.approx(1.0)
    assert low == pytest.approx(10 / (10 + Z95**2))


def test_other_scores_get_a_t_interval_clipped_to_unit_range():
    scores = [0.2, 0.4, 0.6]
    _, t_high = stats.t.interval(0.95, len(scores) - 1, loc=0.4, scale=stats.sem(scores))
    assert mean_ci(scores) == pytest.approx((0.4, 0.0, t_high))


def test_lower_confidence_gives_a_narrower_interval():
    _, low95, high95 = mean_ci([1, 0, 1, 1, 0, 1])
    _, low80, high80 = mean_ci([1, 0, 1, 1, 0, 1], confidence=0.8)
    assert low95 < low80 < high80 < high95


@pytest.mark.parametrize(("scores", "expected_mean"), [([], math.nan), ([0.5], 0.5)])
def test_undefined_bounds_are_nan(scores, expected_mean):
    mean, low, high = mean_ci(scores)
    assert mean == pytest.approx(expected_mean, nan_ok=True)
    assert math.isnan(low) and math.isnan(high)


@pytest.mark.parametrize("bad", [1.5, -0.1, math.nan])
def test_scores_outside_unit_range_are_rejected(bad):
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        mean_ci([0.5, bad])


def test_paired_bootstrap_bound_of_a_constant_difference_is_that_difference():
    assert paired_bootstrap_lower_bound([1.0] * 8, [1.0] * 8, ratio=0.8) == pytest.approx(0.2)


def test_paired_bootstrap_bound_is_exact_at_a_tie():
    # 18 of 20 kept at ratio 0.8: the 5% quantile of the mean is 0.2 - 4/20 = 0, not float noise below it
    assert paired_bootstrap_lower_bound([1.0] * 18 + [0.0] * 2, [1.0] * 20, ratio=0.8) == 0.0


def test_paired_bootstrap_bound_on_a_known_pairing():
    # differences 0, 0, 0, 0, -1: a resample's mean is -k/5 with k ~ Binomial(5, 0.2) failures, and
    # P(k <= 2) = 0.942 < 0.95 <= P(k <= 3) = 0.993, so the 5% quantile of the mean is -3/5.
    assert paired_bootstrap_lower_bound([1, 1, 1, 1, 0], [1, 1, 1, 1, 1]) == pytest.approx(-0.6)


def test_paired_bootstrap_bound_matches_the_normal_bound_at_large_n():
    # 1000 pairs: 100 only right under the reference, 25 only under the scores, the rest agree.
    scores = [0.0] * 100 + [1.0] * 25 + [1.0] * 875
    reference = [1.0] * 100 + [0.0] * 25 + [1.0] * 875
    differences = np.subtract(scores, reference)
    normal = differences.mean() - Z95_ONE_SIDED * differences.std() / math.sqrt(differences.size)
    bound = paired_bootstrap_lower_bound(scores, reference)
    assert bound == pytest.approx(normal, abs=0.003)
    assert bound == paired_bootstrap_lower_bound(scores, reference)  # seeded
    assert paired_bootstrap_lower_bound(scores, reference, confidence=0.8) > bound


@pytest.mark.parametrize(("scores", "reference"), [([], []), ([1.0, 0.0], [1.0])])
def test_paired_bootstrap_needs_one_pair_per_sample(scores, reference):
    with pytest.raises(ValueError, match="one reference score per score"):
        paired_bootstrap_lower_bound(scores, reference)


def test_paired_retention_is_the_ratio_of_means_with_a_paired_bootstrap_interval():
    method = [1, 1, 0, 1, 0, 1, 1, 1, 0, 1]
    full = [1, 1, 1, 1, 0, 1, 1, 1, 1, 1]
    retention, low, high = paired_retention(method, full, resamples=2000, seed=3)
    assert retention == pytest.approx(7 / 9, abs=1e-15)
    rng = np.random.default_rng(3)  # the same draws, one resample at a time
    ratios = []
    for _ in range(2000):
        drawn = rng.integers(10, size=10)
        taken = sum(full[i] for i in drawn)
        if taken:
            ratios.append(sum(method[i] for i in drawn) / taken)
    assert (low, high) == tuple(round(float(q), 12) for q in np.quantile(ratios, [0.025, 0.975]))
    assert low < 7 / 9 < high <= 1.0
    assert paired_retention(full, full) == (1.0, 1.0, 1.0)  # the same answers: retained exactly
    assert all(math.isnan(x) for x in paired_retention([1, 0], [0, 0]))  # nothing to retain
