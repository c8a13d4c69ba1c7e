"""Group-sequential boundaries: the published Lan–DeMets O'Brien–Fleming values, each look's crossing chance
against a simulated Brownian motion, and the t boundaries' error rate on small normal samples."""

from __future__ import annotations

import numpy as np
import pytest

from grpo_lab.stats.sequential import Look, SequentialPlan, boundaries, obf_spending


def test_one_look_is_the_fixed_sample_test():
    assert boundaries((1.0,), 0.05, True)[0] == pytest.approx(1.959964, abs=1e-5)
    assert boundaries((1.0,), 0.025, False)[0] == pytest.approx(1.959964, abs=1e-5)


def test_three_equal_looks_match_the_published_boundaries():
    # Lan–DeMets O'Brien–Fleming, one-sided 0.025, three equal looks (gsDesign's sfLDOF)
    assert boundaries((1 / 3, 2 / 3, 1.0), 0.025, False) == pytest.approx((3.7103, 2.5114, 1.9930), abs=2e-3)


@pytest.mark.parametrize("two_sided, alpha", [(False, 0.025), (True, 0.05)])
def test_each_look_spends_what_the_spending_function_says(two_sided, alpha):
    fractions = (0.4, 0.7, 1.0)
    c = np.array(boundaries(fractions, alpha, two_sided))
    rng = np.random.default_rng(1)
    t = np.array(fractions)
    w = np.cumsum(rng.standard_normal((400_000, 3)) * np.sqrt(np.diff(np.r_[0.0, t])), axis=1)
    z = w / np.sqrt(t)
    crossed = (np.abs(z) if two_sided else z) >= c
    first = np.where(crossed.any(axis=1), np.argmax(crossed, axis=1), -1)
    spent = np.diff([0.0] + [obf_spending(f, alpha) for f in fractions])
    for k in range(3):   # 4 standard errors of a 400k-draw share
        share = np.mean(first == k)
        assert share == pytest.approx(spent[k], abs=4 * np.sqrt(spent[k] / 400_000) + 1e-5)


def test_t_boundaries_keep_the_level_on_small_normal_samples():
    plan = SequentialPlan(looks=(8, 14, 20))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((40_000, 20)) * 0.1
    rejected = np.zeros(x.shape[0], dtype=bool)
    for k, n in enumerate(plan.looks):
        mean, se = x[:, :n].mean(1), x[:, :n].std(1, ddof=1) / np.sqrt(n)
        rejected |= np.abs(mean) / se >= plan.difference_bound(k, 0.05)
    assert rejected.mean() == pytest.approx(0.05, abs=0.005)


def test_the_repeated_interval_and_the_tests_agree():
    plan = SequentialPlan(looks=(8, 14, 20))
    look = Look.of([0.01, 0.02, 0.0, 0.03, 0.015, 0.01, 0.02, 0.025])
    low, high = plan.rci(0, look, 0.05)
    assert (low > 0) == plan.rejects_difference(0, look, 0.05)
    assert plan.rejects_inequivalence(0, look, 0.05, margin=0.2)
    assert not plan.rejects_inequivalence(0, look, 0.05, margin=0.02)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="looks"):
        SequentialPlan(looks=(14, 8))
    with pytest.raises(ValueError, match="fraction"):
        obf_spending(1.5, 0.05)
    with pytest.raises(ValueError, match="2 paired"):
        Look.of([0.1])
