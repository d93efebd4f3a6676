import json
import math

import pytest
import torch

from feedbackrl.algos.confidence import (
    mean_cost_upper_bound,
    release_test,
    student_t_quantile,
    student_t_sf,
    wilson_interval,
)

# The quantile is a bisection on a float64 series; its error is the tail's rounding (~1e-16) over
# the density, largest far in the tail (1e-6 below: ~1e-11 relative). 1e-9 is well above that and
# far below any difference that would change a release decision.
REL = 1e-9


@pytest.mark.parametrize("p", [0.6, 0.9, 0.95, 0.99, 0.999])
def test_quantile_matches_the_closed_forms_for_one_and_two_degrees_of_freedom(p):
    # nu = 1 (Cauchy): t = tan(pi (p - 1/2)); nu = 2: t = (2p - 1) / sqrt(2 p (1 - p)).
    assert student_t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=REL)
    assert student_t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=REL)


@pytest.mark.parametrize("df, p, expected", [
    # scipy.stats.t.ppf(p, df), SciPy 1.17.1
    (3, 0.9, 1.637744353696209),
    (3, 0.99, 4.540702858568132),
    (4, 0.9, 1.533206274058944),
    (9, 0.95, 1.833112932656237),
    (10, 0.95, 1.8124611228116756),
    (12, 0.75, 0.6954828655117926),
    (17, 0.95, 1.7396067260750725),
    (29, 0.9, 1.311433647301551),
    (30, 0.975, 2.0422724563012378),
    (64, 0.9, 1.2949198195951734),
    (100, 0.95, 1.6602343260853392),
    (501, 0.95, 1.6479007483164314),
    (1000, 0.9, 1.2823987214609247),
    (99999, 0.9, 1.2815600315340214),
    (5, 0.999999, 24.771029720372493),
])
def test_quantile_matches_scipy(df, p, expected):
    assert student_t_quantile(p, df) == pytest.approx(expected, rel=REL)


def test_quantile_is_antisymmetric_and_zero_at_the_median():
    assert student_t_quantile(0.5, 7) == 0.0
    assert student_t_quantile(0.1, 4) == -student_t_quantile(0.9, 4)


def test_survival_function_hand_computed():
    # nu = 2, t = 2: P(|T| < t) = sin(atan(2 / sqrt 2)) = 2 / sqrt(6); P(T > 2) = (1 - 0.816497) / 2 = 0.091752
    assert student_t_sf(2.0, 2) == pytest.approx((1 - 2 / math.sqrt(6)) / 2, rel=1e-14)
    # nu = 3, t = sqrt 3: theta = pi / 4, cos = sin = 1/sqrt 2; P(|T| < t) = 2/pi (pi/4 + 1/2) = 0.818310
    assert student_t_sf(math.sqrt(3), 3) == pytest.approx((1 - 2 / math.pi * (math.pi / 4 + 0.5)) / 2, rel=1e-14)
    assert student_t_sf(0.0, 5) == 0.5


@pytest.mark.parametrize("p, df, match", [
    pytest.param(0.0, 3, r"in \(0, 1\)", id="p-zero"),
    pytest.param(1.0, 3, r"in \(0, 1\)", id="p-one"),
    pytest.param(0.9, 0, "integer >= 1", id="df-zero"),
    pytest.param(0.9, 2.5, "integer >= 1", id="df-fractional"),
])
def test_quantile_rejects_bad_input(p, df, match):
    with pytest.raises(ValueError, match=match):
        student_t_quantile(p, df)


def test_upper_bound_hand_computed():
    # costs (0, 1, 0, 2, 0): mean 0.6; deviations (-0.6, 0.4, -0.6, 1.4, -0.6), squares sum
    # 0.36 + 0.16 + 0.36 + 1.96 + 0.36 = 3.2, unbiased variance 3.2 / 4 = 0.8, std 0.894427;
    # std / sqrt 5 = 0.4; t_{0.9, 4} = 1.533206 -> U = 0.6 + 1.533206 * 0.4 = 1.213283
    b = mean_cost_upper_bound(torch.tensor([0.0, 1.0, 0.0, 2.0, 0.0]), delta=0.1)
    assert (b.n, b.mean, b.delta) == (5, 0.6, 0.1)
    assert b.std == pytest.approx(math.sqrt(0.8), rel=1e-15)
    assert b.bound == pytest.approx(0.6 + 1.533206274058944 * 0.4, rel=REL)


def test_release_refuses_above_and_releases_below_the_bound():
    costs = [0.0, 1.0, 0.0, 2.0, 0.0]  # U = 1.213283 at delta 0.1 (above)
    refused = release_test(costs, threshold=1.0, delta=0.1)
    assert not refused.released and refused.n == 5 and refused.mean == 0.6
    assert "refused" in refused.reason and "1.21328" in refused.reason and "n 5" in refused.reason
    # the mean (0.6) is under 1.0, so a test on the mean alone would have released it
    assert release_test(costs, threshold=1.25, delta=0.1).released
    # a smaller delta widens the bound: t_{0.99, 4} = 3.746947 -> U = 0.6 + 1.498779 = 2.098779
    assert not release_test(costs, threshold=1.25, delta=0.01).released


def test_release_with_one_cost_refuses_with_an_infinite_bound():
    d = release_test([0.0], threshold=1.0, delta=0.1)
    assert not d.released and d.bound == math.inf and d.n == 1 and "n must be >= 2" in d.reason
    assert json.loads(json.dumps(d.to_dict()))["bound"] is None


def test_release_with_zero_variance_uses_the_mean():
    # every cost 0.2 (not exact in binary): the bound is exactly 0.2, so the decision turns on 0.2 vs the threshold
    assert release_test([0.2] * 7, threshold=0.3, delta=0.1).bound == 0.2
    assert release_test([0.2] * 7, threshold=0.3, delta=0.1).released


def test_release_refuses_when_every_cost_equals_the_threshold():
    d = release_test([0.2] * 7, threshold=0.2, delta=0.1)
    assert not d.released and d.bound == 0.2 and "not under the threshold" in d.reason


@pytest.mark.parametrize("costs, threshold, delta, match", [
    pytest.param([], 0.1, 0.1, "no costs", id="empty"),
    pytest.param([0.0, float("nan")], 0.1, 0.1, "finite", id="nan-cost"),
    pytest.param([0.0, 1.0], 0.1, 0.0, r"delta must be in \(0, 0.5\]", id="delta-zero"),
    pytest.param([0.0, 1.0], 0.1, 0.9, r"delta must be in \(0, 0.5\]", id="delta-above-half"),
    pytest.param([0.0, 1.0], float("inf"), 0.1, "threshold must be a finite", id="infinite-threshold"),
])
def test_release_rejects_bad_input(costs, threshold, delta, match):
    with pytest.raises(ValueError, match=match):
        release_test(costs, threshold=threshold, delta=delta)


def test_wilson_interval_hand_computed():
    # 3 of 10 at 95%: z = 1.959964, z^2 = 3.841459, 1 + z^2/n = 1.384146;
    # centre (0.3 + 0.192073) / 1.384146 = 0.355507;
    # half 1.959964 * sqrt(0.021 + 0.009604) / 1.384146 = 1.959964 * 0.174939 / 1.384146 = 0.247715
    # -> (0.355507 - 0.247715, 0.355507 + 0.247715) = (0.107791, 0.603222)
    assert wilson_interval(3, 10) == pytest.approx((0.107791, 0.603222), abs=1e-6)
    # 0 of 10: the low end is 0 and the high end z^2/n / (1 + z^2/n) = 0.384146 / 1.384146 = 0.277533
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.277533), abs=1e-6)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    # 90%: z = 1.644854, z^2 = 2.705543; 1 of 2: centre 0.5,
    # half 1.644854 * sqrt(0.125 + 2.705543 / 16) / (1 + 2.705543 / 2) = 1.644854 * 0.542307 / 2.352772 = 0.379134
    assert wilson_interval(1, 2, level=0.9) == pytest.approx((0.120866, 0.879134), abs=1e-6)


@pytest.mark.parametrize("events, n, level", [(3, 2, 0.95), (-1, 2, 0.95), (0, 0, 0.95), (1, 2, 1.0), (True, 2, 0.95)])
def test_wilson_interval_rejects_bad_input(events, n, level):
    with pytest.raises(ValueError):
        wilson_interval(events, n, level)


def test_the_bound_covers_the_true_mean_with_probability_one_minus_delta():
    # 4000 sets of n = 5 normal costs (true mean 0.3): U >= 0.3 should hold in 90% of them at delta 0.1,
    # with a binomial std of sqrt(0.9 * 0.1 / 4000) = 0.0047. The normal quantile z_0.9 = 1.2816 in place
    # of t_{0.9, 4} = 1.5332 would cover only P(T_4 < 1.2816) = 0.865, outside the 0.015 allowed.
    # Measured with this seed: 0.8935 (the normal quantile: 0.857).
    g = torch.Generator().manual_seed(0)
    sets = 0.3 + 0.2 * torch.randn(4000, 5, generator=g, dtype=torch.float64)
    covered = sum(mean_cost_upper_bound(row, delta=0.1).bound >= 0.3 for row in sets)
    assert abs(covered / 4000 - 0.9) < 0.015, covered / 4000
