"""The closed-form engine (the live panel's) against the loop: the same curves for every knob."""

import itertools
import math

import numpy as np
import pytest
import torch

from grpo_lab import kl_estimate
from grpo_lab.exact.bandit import BanditProblem, bandit_config, run_bandit
from grpo_lab.exact.bandit_lab import lab_cost_model, mean_grad_norm, wall_clock
from grpo_lab.exact.closed_form import kl_gradient, run_bandit_closed_form
from grpo_lab.objective import IS_CORRECTIONS, KL_KINDS

PROBLEM = BanditProblem.random(contexts=10, arms=6, seed=1, hardness=3.0)

KNOBS = {
    "on-policy": {},
    "no mask": dict(mask_zero_variance=False),
    "mask, unmasked normalisation": dict(mask_normalize="unmasked"),
    "mask, unmasked normalisation, beta k3, bnpo, v = 3": dict(mask_normalize="unmasked", beta=0.3, loss_type="bnpo",
                                                               v=3),
    "mask, batch normalisation, beta k2, v = 2, i = 2": dict(mask_normalize="batch", beta=0.3, kl_kind="k2", v=2, i=2),
    "v = 10": dict(v=10),
    "sample reuse i = 4": dict(i=4),
    "the panel's slider extremes: i = 10, G = 32, v = 20": dict(i=10, G=32, v=20),
    "multiplicative band, v = 7, i = 3": dict(band="multiplicative", v=7, i=3),
    "eps = 0, v = 3": dict(eps_low=0.0, v=3),
    "asymmetric eps, v = 4, i = 2": dict(eps_low=0.1, eps_high=0.28, v=4, i=2),
    "beta k3, fixed ref": dict(beta=0.3),
    "beta k1, ref reset every 7": dict(beta=0.3, ref_period=7, kl_kind="k1"),
    "beta k2, importance weighted, v = 5": dict(beta=0.5, kl_kind="k2", kl_importance_weighted=True, v=5),
    "lr 16, beta 0.2 (unstable)": dict(lr=16.0, beta=0.2),
    "adaptive sync": dict(sync="adaptive", v=8, sync_threshold=0.02),
    "dr_grpo, G = 2": dict(loss_type="dr_grpo", max_completion_length=3, G=2),
    "bnpo": dict(loss_type="bnpo", v=2),
    "TRL whitening": dict(eps_placement="added_to_std", unbiased_std=True, eps_std=0.0),
    "SGD with clipping and weight decay": dict(max_grad_norm=0.3, weight_decay=0.1, v=2),
    "AdamW, clipped": dict(optimizer="adamw", lr=0.05, max_grad_norm=0.5, v=4),
    "truncated correction, C = 1.2, v = 8, i = 2": dict(is_correction="truncated", is_cap=1.2, v=8, i=2),
    "truncated correction, multiplicative band, beta k2 weighted, v = 5, i = 3": dict(
        is_correction="truncated", band="multiplicative", beta=0.3, kl_kind="k2", kl_importance_weighted=True,
        v=5, i=3),
    "no correction, v = 8, i = 2": dict(is_correction="none", v=8, i=2),
    "no correction, beta k3 weighted, v = 4": dict(is_correction="none", beta=0.3, kl_importance_weighted=True, v=4),
    "beta k3, differentiable KL weight (TRL's), v = 4, i = 2": dict(beta=0.3, kl_weight_differentiable=True, v=4, i=2),
    "truncated, beta k2, differentiable KL weight, v = 3": dict(is_correction="truncated", beta=0.3, kl_kind="k2",
                                                                 kl_weight_differentiable=True, v=3),
    "mask correction, C = 1.2, v = 8, i = 2": dict(is_correction="mask", is_cap=1.2, v=8, i=2),
    "icepop correction, a = 0.9, C = 1.3, beta k3 weighted, v = 8": dict(
        is_correction="icepop", is_floor=0.9, is_cap=1.3, beta=0.3, kl_importance_weighted=True, v=8),
    "icepop correction, no floor, C = 1.2, v = 8, i = 2": dict(is_correction="icepop", is_floor=None, is_cap=1.2,
                                                             v=8, i=2),
}


@pytest.mark.parametrize("changes", KNOBS.values(), ids=KNOBS.keys())
def test_closed_form_engine_gives_the_loops_curves(changes):
    config = bandit_config(**{"steps": 80, "lr": 1.0, "seed": 3, **changes})
    loop, fast = run_bandit(PROBLEM, config, runs=3), run_bandit_closed_form(PROBLEM, config, runs=3)
    assert fast.J.shape == loop.J.shape == (81, 3)
    np.testing.assert_allclose(fast.J, loop.J, rtol=0, atol=1e-10)
    assert np.array_equal(fast.masked_frac, loop.masked_frac)
    assert np.array_equal(fast.lag, loop.lag)
    assert np.array_equal(fast.optimizer_passes, loop.optimizer_passes)
    np.testing.assert_allclose(fast.grad_norm, loop.grad_norm, rtol=1e-8, atol=1e-12)
    assert np.abs(fast.J[-1] - fast.J[0]).max() > 1e-3          # the runs moved: the comparison means something


def test_a_step_where_every_group_is_masked_trains_nothing_in_both():
    problem = BanditProblem(torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 1.0]], dtype=torch.float64))
    config = bandit_config(steps=40, G=2, prompts_per_step=1, lr=1.0, beta=0.1, ref_period=5)
    loop, fast = run_bandit(problem, config, runs=2), run_bandit_closed_form(problem, config, runs=2)
    skipped = np.diff(np.concatenate([[0], fast.optimizer_passes])) == 0
    assert skipped.any() and not skipped.all()
    np.testing.assert_allclose(fast.J, loop.J, rtol=0, atol=1e-12)
    assert np.array_equal(fast.optimizer_passes, loop.optimizer_passes)


def test_studies_read_the_same_numbers_from_either_engine():
    """wall_clock and mean_grad_norm need no StepRecords: on a closed-form run they give the loop's values."""
    config = bandit_config(steps=60, lr=1.0, v=4, i=2, seed=5)
    loop, fast = run_bandit(PROBLEM, config, runs=3), run_bandit_closed_form(PROBLEM, config, runs=3)
    assert not fast.records and loop.records
    model = lab_cost_model()
    np.testing.assert_allclose(wall_clock(fast, model), wall_clock(loop, model), rtol=1e-12)
    assert wall_clock(fast, model)[-1] > 0
    assert math.isfinite(mean_grad_norm(fast)) and mean_grad_norm(fast) > 0
    assert mean_grad_norm(fast) == pytest.approx(mean_grad_norm(loop), rel=1e-8)


def test_same_seed_same_curves():
    config = bandit_config(steps=30, seed=7, v=3)
    a, b = run_bandit_closed_form(PROBLEM, config, runs=2), run_bandit_closed_form(PROBLEM, config, runs=2)
    assert np.array_equal(a.J, b.J)
    assert not np.array_equal(a.J, run_bandit_closed_form(PROBLEM, config.replace(seed=8), runs=2).J)


@pytest.mark.parametrize("kind", KL_KINDS)
def test_kl_gradient_is_the_estimators_derivative(kind):
    logp = torch.linspace(-4.0, -0.1, 9, dtype=torch.float64, requires_grad=True)
    logp_ref = torch.linspace(-0.2, -3.0, 9, dtype=torch.float64)
    kl_estimate(logp, logp_ref, kind).sum().backward()
    torch.testing.assert_close(kl_gradient(logp_ref - logp.detach(), kind), logp.grad, rtol=1e-12, atol=1e-14)


def test_runs_below_one_is_rejected():
    with pytest.raises(ValueError, match="runs"):
        run_bandit_closed_form(PROBLEM, bandit_config(steps=1), runs=0)


def test_the_corrections_agree_on_policy_and_part_under_lag():
    """At v = 1, α = π_k: r′ = 1, so every correction takes the same steps (a band holds 1, so the masks drop
    nothing). At v = 8 they differ (icepop's floor 0.9 against mask's 1/C), and in both engines alike (the
    parametrised test above)."""
    curves = {}
    for v in (1, 8):
        for correction in IS_CORRECTIONS:
            config = bandit_config(steps=60, lr=1.0, v=v, i=2, seed=4, is_correction=correction, is_cap=1.2,
                                   is_floor=0.9)
            curves[v, correction] = run_bandit_closed_form(PROBLEM, config, runs=3).J
    for correction in IS_CORRECTIONS:
        np.testing.assert_allclose(curves[1, correction], curves[1, "ratio"], rtol=0, atol=1e-12)
    for a, b in itertools.combinations(IS_CORRECTIONS, 2):
        assert np.abs(curves[8, a] - curves[8, b]).max() > 1e-3, (a, b)
