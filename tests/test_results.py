"""The studies' statistics (grpo_lab/study/results.py): Student's t in closed form, t intervals over seeds,
the verdict rule on paired differences (TOST / worse / better / not resolved), Wilson and bounded
intervals, and the power to reach a verdict."""

import math

import numpy as np
import pytest

from grpo_lab.study.results import (
    bounded_mean_ci,
    mean_ci,
    paired_test,
    power,
    seeds_for_power,
    study_tests,
    t_975,
    t_cdf,
    t_quantile,
    wilson_interval,
)


def test_mean_ci_is_students_t():
    mean, half = mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.303 / math.sqrt(3), rel=1e-4)     # s = 1, t_{0.975, 2} = 4.303
    mean, half = mean_ci(np.array([[0.0, 2.0], [1.0, 1.0]]), axis=1)
    assert mean.tolist() == [1.0, 1.0] and half[1] == 0.0 and half[0] == pytest.approx(12.706 * 1.0, rel=1e-4)
    assert math.isnan(float(mean_ci([0.5])[1]))
    # NaN = a seed without that point: the statistics of the others
    mean, half = mean_ci(np.array([[1.0, 2.0, 3.0], [1.0, math.nan, 3.0], [math.nan, 4.0, math.nan]]), axis=1)
    assert mean.tolist() == [2.0, 2.0, 4.0] and math.isnan(half[2])
    assert half[0] == pytest.approx(4.303 / math.sqrt(3), rel=1e-4)
    assert half[1] == pytest.approx(12.706 * math.sqrt(2) / math.sqrt(2), rel=1e-4)
    with pytest.raises(ValueError, match="not NaN"):
        mean_ci([math.nan, math.nan])
    assert t_975(100) == pytest.approx(1.984, abs=1e-3)
    with pytest.raises(ValueError, match="df must be >= 1"):
        t_975(0)


def test_t_distribution_in_closed_form():
    assert t_cdf(0.0, 3) == 0.5 and t_cdf(1.0, 1) == pytest.approx(0.75)            # Cauchy: 1/2 + atan(1)/π
    assert t_cdf(-2.0, 4) == pytest.approx(1 - t_cdf(2.0, 4))
    assert t_quantile(0.975, 2) == pytest.approx(4.3027, abs=1e-4)                   # printed tables
    assert t_quantile(0.95, 4) == pytest.approx(2.1318, abs=1e-4)
    assert t_quantile(0.975, 29) == pytest.approx(2.0452, abs=1e-4)
    with pytest.raises(ValueError, match="p must lie strictly between 0 and 1"):
        t_quantile(1.0, 3)


@pytest.mark.parametrize("diffs, finding, equivalence, difference", [
    ((0.01, -0.01, 0.005, -0.005, 0.0), "equivalent", "equivalent", "not resolved"),
    ((-0.10, -0.12, -0.08, -0.11, -0.09), "worse", "not resolved", "worse"),
    ((0.10, 0.12, 0.08, 0.11, 0.09), "better", "not resolved", "better"),
    ((0.10, -0.10, 0.05, -0.08, 0.02), "not resolved", "not resolved", "not resolved"),
    ((-0.010, -0.011, -0.009, -0.010, -0.010), "equivalent", "equivalent", "worse"),   # real, inside the margin
    ((-0.05,), "not resolved", "not resolved", "not resolved"),                      # one seed: no interval
])
def test_verdict_rule_on_constructed_differences(diffs, finding, equivalence, difference):
    reference = {s: 0.5 for s in range(len(diffs))}
    arm = {s: 0.5 + d for s, d in enumerate(diffs)} | {99: 0.9}                      # seed 99 has no partner
    test = paired_test(arm, reference, "v8_none", "v1")
    assert test.n == len(diffs) and test.verdict == finding and test.comparison == "v8_none - v1"
    eq, diff = test.entries()
    assert (eq["kind"], eq["verdict"], eq["margin"], diff["kind"], diff["verdict"]) == \
           ("equivalence", equivalence, 0.03, "difference", difference)
    assert eq["finding"] == diff["finding"] == finding and eq["estimate"] == pytest.approx(np.mean(diffs))
    if len(diffs) >= 2:                      # the 90 % / 95 % t intervals by hand: t_{0.95, 4}, t_{0.975, 4}
        mean, se = float(np.mean(diffs)), float(np.std(diffs, ddof=1)) / len(diffs) ** 0.5
        assert eq["ci"] == pytest.approx([mean - 2.1318 * se, mean + 2.1318 * se], abs=1e-5)
        assert diff["ci"] == pytest.approx([mean - 2.7764 * se, mean + 2.7764 * se], abs=1e-5)
    else:
        assert eq["ci"] is None and diff["ci"] is None


def test_study_tests_pair_by_seed():
    runs = [{"name": "v1", "seed": s, "pass_at_1_after": 0.4 + 0.01 * s} for s in range(3)]
    runs += [{"name": "v8_ratio", "seed": s, "pass_at_1_after": 0.2 + 0.01 * s} for s in (0, 1)]
    tests = study_tests(runs, [("v8_ratio", "v1"), ("v32_ratio", "v1")])
    assert [t["kind"] for t in tests] == ["equivalence", "difference"]                # v32_ratio has no run: no row
    assert tests[0]["seeds"] == [0, 1] and tests[0]["diffs"] == pytest.approx([-0.2, -0.2])
    with pytest.raises(ValueError, match="margin must be > 0"):
        paired_test({0: 0.1}, {0: 0.1}, "a", "b", margin=0.0)


def test_wilson_and_bounded_intervals_stay_in_the_unit_interval():
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)     # the textbook value
    low, high = wilson_interval(0, 10)
    assert low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(1.96 ** 2 / (10 + 1.96 ** 2), abs=1e-4)
    for k in range(0, 21):
        low, high = wilson_interval(k, 20)
        assert 0.0 <= low <= k / 20 <= high <= 1.0
    mean, low, high = bounded_mean_ci([0.9, 1.0, 0.97])                              # t interval alone passes 1
    assert mean_ci([0.9, 1.0, 0.97])[1] + mean > 1.0 and high == 1.0 and 0.0 <= low < mean
    with pytest.raises(ValueError, match="successes must be an integer in"):
        wilson_interval(11, 10)
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        wilson_interval(0, 0)


def test_power_of_the_rule():
    # issue 24: a paired SD of 0.096 with 3 seeds gives 80 % power only for an effect of about 0.31
    assert power(0.096, 3, 0.31) == pytest.approx(0.8, abs=0.03)
    assert power(0.096, 5, 0.0) == pytest.approx(0.05, abs=0.01)                    # the 95 % CI's false alarms
    assert power(0.02, 5, 0.03, "equivalence") <= 0.05 + 0.01                        # TOST's, at the margin
    assert power(0.02, 10, 0.0, "equivalence") > power(0.02, 5, 0.0, "equivalence") > 0.5
    n = seeds_for_power(0.096, 0.05)
    assert 29 <= n <= 34                                                             # normal approximation: 28.9 + t
    assert power(0.096, n, 0.05) >= 0.8 > power(0.096, n - 1, 0.05)
    assert seeds_for_power(0.5, 0.01, n_max=5) is None
    with pytest.raises(ValueError, match="n must be an integer >= 2"):
        power(0.1, 1)
    with pytest.raises(ValueError, match="kind must be one of"):
        power(0.1, 3, kind="superiority")


def test_wilson_bounds_are_exact_at_none_and_all():
    """0 of n: the lower bound is 0 itself (a float difference of equal terms can leave 2e-19 > 0)."""
    assert wilson_interval(0, 1000)[0] == 0.0 and wilson_interval(1000, 1000)[1] == 1.0
    low, high = wilson_interval(3, 1000)
    assert 0.0 < low < 0.003 < high < 1.0


def test_a_comparison_reports_its_power():
    test = paired_test({0: 0.20, 1: 0.10, 2: 0.15}, {0: 0.18, 1: 0.12, 2: 0.10}, "a", "b")
    report = test.power()
    assert report["paired_sd"] == pytest.approx(np.std([0.02, -0.02, 0.05], ddof=1))
    assert report["power_difference"] == power(report["paired_sd"], 3, 0.05)
    assert report["power_equivalence"] == power(report["paired_sd"], 3, 0.0, "equivalence")
    needed = report["seeds_for_80pct_difference"]
    assert power(report["paired_sd"], needed, 0.05) >= 0.8 > power(report["paired_sd"], needed - 1, 0.05)
    assert "paired SD 0.035 over n = 3" in test.describe_power()
    assert all(e["power"] == report for e in test.entries())
    assert paired_test({0: 0.2}, {0: 0.1}, "a", "b").power() is None                 # one seed: no SD
    assert paired_test({0: 0.5, 1: 0.75}, {0: 0.25, 1: 0.5}, "a", "b").power() is None  # equal differences
