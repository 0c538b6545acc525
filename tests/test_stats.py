import math

import pytest
from scipy import stats

from snapeval.stats import mean_ci

Z95 = 1.959963984540054


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
