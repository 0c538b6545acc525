import math

import pytest
from scipy import stats

from snapeval.stats import mean_ci, retention, samples_needed, smallest_kept

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


def test_a_record_without_a_loss_needs_the_samples_the_target_names():
    # target ** m <= 0.05: m >= log(0.05) / log(target) = 58.4 for 0.95, 298.1 for 0.99, 13.4 for 0.8
    assert [samples_needed(t) for t in (0.8, 0.95, 0.99)] == [14, 59, 299]
    assert samples_needed(0.95, confidence=0.975) == 72  # log(0.025) / log(0.95) = 71.9
    assert retention([1] * 58, [1] * 58).verdict(0.95) == "too few"
    assert retention([1] * 59, [1] * 59).verdict(0.95) == "pass"  # lower bound 0.05 ** (1 / 59) = 0.95050


@pytest.mark.parametrize("n", [1, 10])
def test_agreeing_pairs_on_few_samples_are_too_few_not_a_pass(n):
    bounds = retention([1] * n, [1] * n)
    assert bounds.ratio == 1.0
    assert bounds.lower == pytest.approx(0.05 ** (1 / n))
    for target in (0.95, 0.99):
        assert bounds.verdict(target) == "too few"
    assert bounds.shortfall(0.95) == (
        f"n = {n} cannot show 0.95 retention "
        f"(needs >= 59 samples the full cache gets right, with no loss; has {n})"
    )


def test_the_lower_bound_is_clopper_pearson_on_the_answers_kept():
    # 40 samples: the full cache right on 30, the method keeps 27 of them and gets 2 of the other 10 right
    full = [1.0] * 30 + [0.0] * 10
    method = [1.0] * 27 + [0.0] * 3 + [1.0] * 2 + [0.0] * 8
    bounds = retention(method, full)
    assert bounds.ratio == pytest.approx(29 / 30)
    assert bounds.lower == pytest.approx(stats.beta.ppf(0.05, 27, 4))  # the one-sided exact bound of 27/30
    method_high = stats.beta.ppf(0.975, 30, 11)  # 29 of 40 right, upper at 2.5%
    full_low = stats.beta.ppf(0.025, 30, 11)  # 30 of 40 right, lower at 2.5%
    assert bounds.upper == pytest.approx(method_high / full_low)
    assert bounds.evidence == 30 and bounds.n == 40 and bounds.binary


def test_a_method_far_below_the_target_fails_and_one_in_between_is_open():
    full = [1.0] * 100
    assert retention([1.0] * 50 + [0.0] * 50, full).verdict(0.95) == "fail"  # upper bound ~0.61
    assert retention([1.0] * 93 + [0.0] * 7, full).verdict(0.95) == "open"  # 0.93: lower 0.872, upper 0.98


def test_no_right_answer_under_the_full_cache_decides_nothing():
    bounds = retention([1.0, 0.0], [0.0, 0.0])
    assert math.isnan(bounds.ratio) and bounds.lower == 0.0 and bounds.upper == math.inf
    assert bounds.verdict(0.95) == "too few"


def test_other_scores_get_betting_bounds_that_hold_the_ratio():
    method, full = [0.5] * 60 + [1.0] * 40, [1.0] * 100
    bounds = retention(method, full)
    assert not bounds.binary
    assert bounds.ratio == pytest.approx(0.7)
    assert 0.6 < bounds.lower < 0.7 < bounds.upper < 0.8
    assert bounds.verdict(0.5) == "pass" and bounds.verdict(0.9) == "fail"
    assert retention([0.5] * 5, [0.5] * 5).verdict(0.95) == "too few"


@pytest.mark.parametrize(
    ("verdicts", "kept"),
    [
        ({128: "fail", 256: "pass", 512: "pass"}, 256),
        ({128: "pass", 256: "open", 512: "pass"}, 512),  # 128 passes below a budget that does not: not named
        ({128: "pass", 256: "pass", 512: "too few"}, None),
        ({}, None),
    ],
)
def test_the_ladder_stops_at_the_first_budget_that_does_not_pass(verdicts, kept):
    assert smallest_kept(verdicts) == kept
