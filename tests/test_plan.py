"""The rules of one step (grpo_lab.plan): plan_step by hand, the empty-step decision, the sync
schedule's begin/end, and the same plan, the same schedule decisions and the one call order (begin, plan,
mark_synced, end) in every driver; the loss's knobs the plan carries."""

import numpy as np
import pytest
import torch
from schedule_calls import assert_one_call_order, record_plans_and_schedule

import grpo_lab.exact.closed_form as closed_form
import grpo_lab.loop as loop_module
from grpo_lab import GRPOConfig, plan_step
from grpo_lab.exact.bandit import BanditProblem, bandit_config, build_bandit_loop, run_bandit
from grpo_lab.schedules import make_sync_schedule

# ----------------------------------------------------------------------------- plan_step by hand

# P = 3 groups of G = 2; group 1 agrees (masked); completion lengths 3, 1 | 2, 3 | 2, 1 (T = 3).
REWARDS = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
LENGTHS = torch.tensor([3, 1, 2, 3, 2, 1])
SAMPLED = torch.arange(3)[None, :] < LENGTHS[:, None]
KEPT_ROWS = [0, 1, 4, 5]
# The weight of each counted token of rows 0, 1, 4, 5, by hand. N_seq = 6 sequences and N_tok = 12 tokens
# sampled ("batch"); 4 sequences and 3 + 1 + 2 + 1 = 7 tokens kept ("unmasked").
HAND_WEIGHTS = {
    ("grpo", "batch"): [1 / (3 * 6), 1 / (1 * 6), 1 / (2 * 6), 1 / (1 * 6)],
    ("grpo", "unmasked"): [1 / (3 * 4), 1 / (1 * 4), 1 / (2 * 4), 1 / (1 * 4)],
    ("bnpo", "batch"): [1 / 12] * 4,
    ("bnpo", "unmasked"): [1 / 7] * 4,
    ("dapo", "batch"): [1 / 12] * 4,
    ("dapo", "unmasked"): [1 / 7] * 4,
    ("dr_grpo", "batch"): [1 / (6 * 4)] * 4,       # max_completion_length = 4
    ("dr_grpo", "unmasked"): [1 / (4 * 4)] * 4,
}


@pytest.mark.parametrize("loss_type, mask_normalize", HAND_WEIGHTS.keys())
def test_plan_step_hand_computed(loss_type, mask_normalize):
    config = GRPOConfig(G=2, eps_std=0.0, loss_type=loss_type, mask_normalize=mask_normalize, max_completion_length=4)
    plan = plan_step(REWARDS, SAMPLED, config, dtype=torch.float64)
    assert torch.equal(plan.advantages, torch.tensor([1.0, -1.0, 0.0, 0.0, -1.0, 1.0]))  # ±(r − μ)/σ, σ = ½
    assert plan.informative.tolist() == [True, False, True] and torch.equal(plan.keep, plan.informative)
    assert torch.equal(plan.mask, SAMPLED & torch.tensor([1, 1, 0, 0, 1, 1], dtype=torch.bool)[:, None])
    expected = torch.zeros(6, 3, dtype=torch.float64)
    for row, weight in zip(KEPT_ROWS, HAND_WEIGHTS[loss_type, mask_normalize], strict=True):
        expected[row, : LENGTHS[row]] = weight
    torch.testing.assert_close(plan.weights, expected, rtol=1e-15, atol=0)
    assert plan.masked_frac == pytest.approx(1 / 3)
    assert not plan.empty and plan.trains and not plan.skipped


def test_the_mask_off_keeps_every_group_and_still_measures_masked_frac():
    plan = plan_step(REWARDS, SAMPLED, GRPOConfig(G=2, eps_std=0.0, mask_zero_variance=False), dtype=torch.float64)
    assert plan.keep.all() and plan.informative.tolist() == [True, False, True]
    assert torch.equal(plan.mask, SAMPLED) and plan.masked_frac == pytest.approx(1 / 3)
    assert (plan.weights[2:4] > 0).any()                                  # the agreeing group counts (A = 0)


def test_stacked_runs_are_planned_as_if_alone():
    """run_ids: each run's weights are those of the run alone; the empty-step decision is the batch's."""
    rewards = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [1.0, 1.0]])     # run 0 has no signal, run 1 has
    sampled = torch.ones(8, 2, dtype=torch.bool)
    sampled[5, 1] = False
    config = GRPOConfig(G=2, loss_type="bnpo")
    stacked = plan_step(rewards, sampled, config, torch.arange(2).repeat_interleave(4), dtype=torch.float64)
    alone = [plan_step(rewards[2 * r:2 * r + 2], sampled[4 * r:4 * r + 4], config, dtype=torch.float64)
             for r in range(2)]
    assert torch.equal(stacked.weights, torch.cat([a.weights for a in alone]))
    assert alone[0].empty and alone[0].skipped and not alone[1].empty
    assert not stacked.empty and stacked.trains


@pytest.mark.parametrize("empty_step", ["skip", "optimizer_step"])
def test_a_step_with_no_signal(empty_step):
    """Empty: every group masked, or with the mask off every group agrees and β = 0. ``empty_step`` decides
    whether the optimiser steps; the drift counts only where the step trained on counted tokens."""
    agree = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    sampled = torch.ones(4, 3, dtype=torch.bool)
    stepped = empty_step == "optimizer_step"

    masked = plan_step(agree, sampled, GRPOConfig(G=2, empty_step=empty_step))
    assert masked.empty and masked.trains == stepped and masked.masked_frac == 1.0
    assert not (masked.weights > 0).any() and masked.observed_drift(0.3) is None   # nothing counted

    unmasked = plan_step(agree, sampled, GRPOConfig(G=2, mask_zero_variance=False, empty_step=empty_step))
    assert unmasked.empty and unmasked.trains == stepped and (unmasked.weights > 0).all()
    assert unmasked.observed_drift(0.3) == (0.3 if stepped else None)

    with_kl = plan_step(agree, sampled, GRPOConfig(G=2, mask_zero_variance=False, beta=0.1, empty_step=empty_step))
    assert not with_kl.empty and with_kl.trains and with_kl.observed_drift(0.3) == 0.3   # the KL term has a gradient

    signal = plan_step(REWARDS, SAMPLED, GRPOConfig(G=2, empty_step=empty_step))
    assert not signal.empty and signal.trains and signal.observed_drift(0.3) == 0.3
    assert signal.observed_drift(None) is None


@pytest.mark.parametrize("eps_std", [0.0, 1e-4])
def test_a_step_of_agreeing_non_dyadic_rewards_is_empty_with_the_mask_off(eps_std):
    """Partial credit: every group's rewards agree at 0.1 or 0.7, values whose float mean is off by a rounding.
    With the mask off and β = 0 the step has no signal, so ``plan_step`` must see it as empty (``advantages != 0``
    found rounding there, and AdamW stepped on it)."""
    agree = torch.tensor([[0.1] * 8, [0.7] * 8])
    sampled = torch.ones(16, 3, dtype=torch.bool)
    plan = plan_step(agree, sampled, GRPOConfig(G=8, eps_std=eps_std, mask_zero_variance=False))
    assert torch.equal(plan.advantages, torch.zeros(16)) and (plan.weights > 0).all()
    assert plan.empty and not plan.trains and plan.observed_drift(0.3) is None


def test_skip_kl_only_skips_a_step_whose_only_gradient_is_the_kl():
    """β > 0 with the mask off: every step has a KL gradient, so ``skip`` never skips; ``skip_kl_only`` skips
    the steps with no reward signal, as the masked run does, and trains the others."""
    agree = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    sampled = torch.ones(4, 3, dtype=torch.bool)
    for mask in (False, True):
        config = GRPOConfig(G=2, mask_zero_variance=mask, beta=0.1, empty_step="skip_kl_only")
        no_signal, signal = plan_step(agree, sampled, config), plan_step(REWARDS, SAMPLED, config)
        assert no_signal.skipped and not signal.skipped
        masked = plan_step(agree, sampled, GRPOConfig(G=2, mask_zero_variance=mask, beta=0.1))
        assert masked.skipped == mask    # the plain rule: only the masked run skips it


def test_plan_step_names_bad_input():
    config = GRPOConfig(G=2)
    with pytest.raises(ValueError, match=r"sampled_mask must have shape \[B, T\] with B = P·G = 6, got \(5, 3\)"):
        plan_step(REWARDS, SAMPLED[:5], config)
    with pytest.raises(ValueError, match=r"run_ids must have shape \[B\] = \[6\], got \(3,\)"):
        plan_step(REWARDS, SAMPLED, config, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"rewards\[0, 1\] = 1.5"):
        plan_step(torch.tensor([[0.0, 1.5]]), torch.ones(2, 1, dtype=torch.bool), config)
    with pytest.raises(ValueError, match="empty_step must be one of .* got 'adam'"):
        GRPOConfig(empty_step="adam")


# ----------------------------------------------------------------------------- the schedule's begin / end

def test_begin_decides_without_committing_and_end_none_keeps_the_drift():
    """An interrupted sampling step asks begin(k) again and gets the same answer; end(None) is a step that
    measured no drift; the adaptive schedule keeps the last measured one."""
    schedule = make_sync_schedule("adaptive", 4, 0.1)
    assert schedule.begin(0) and schedule.begin(0) and schedule.lag(0) == 1   # nothing committed yet
    schedule.mark_synced(0)
    assert schedule.lag(0) == 0
    schedule.end(0.5)
    assert schedule.begin(1)                                                  # drift 0.5 > 0.1
    schedule.mark_synced(1)
    schedule.end(None)                                                        # step 1 measured nothing
    assert not schedule.begin(2) and schedule.last_drift == 0.0
    schedule.end(0.05)
    schedule.end(None)
    assert schedule.last_drift == 0.05 and not schedule.begin(3) and schedule.begin(5)   # longest lag v = 4
    state = schedule.state_dict()
    resumed = make_sync_schedule("adaptive", 4, 0.1)
    resumed.load_state_dict(state)
    assert [resumed.begin(k) for k in range(2, 7)] == [schedule.begin(k) for k in range(2, 7)]


# ----------------------------------------------------------------------------- one plan for every driver

# P = 1 group of G = 2 per run: many steps have every group masked (contexts 0 and 1 always agree).
SMALL = BanditProblem(torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.2, 0.9]], dtype=torch.float64))
DRIVER_CASES = {
    "adaptive, masked steps skipped": dict(sync="adaptive", v=5, sync_threshold=0.3),
    "adaptive, empty steps stepped, AdamW": dict(sync="adaptive", v=5, sync_threshold=0.3, empty_step="optimizer_step",
                                                 optimizer="adamw", lr=0.3, weight_decay=0.1),
    "no mask, unmasked, bnpo, v = 3": dict(mask_zero_variance=False, mask_normalize="unmasked", loss_type="bnpo", v=3),
    "dr_grpo, beta": dict(loss_type="dr_grpo", max_completion_length=3, beta=0.2, v=2),
}


@pytest.mark.parametrize("changes", DRIVER_CASES.values(), ids=DRIVER_CASES.keys())
def test_loop_and_closed_form_make_the_same_plans_and_sync_decisions(monkeypatch, changes):
    config = bandit_config(**{"steps": 40, "G": 2, "prompts_per_step": 1, "lr": 1.0, "seed": 2, **changes})
    loop_plans, loop_calls = record_plans_and_schedule(monkeypatch, loop_module)
    fast_plans, fast_calls = record_plans_and_schedule(monkeypatch, closed_form)
    run_bandit(SMALL, config, runs=2)
    closed_form.run_bandit_closed_form(SMALL, config, runs=2)
    assert len(loop_plans) == len(fast_plans) == config.steps
    for a, b in zip(loop_plans, fast_plans, strict=True):
        for name in ("advantages", "informative", "keep", "mask", "weights"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert (a.masked_frac, a.empty, a.trains, a.objective) == (b.masked_frac, b.empty, b.trains, b.objective)
    assert [c[0:2] for c in loop_calls] == [c[0:2] for c in fast_calls]            # the same calls at the same k
    for a, b in zip(loop_calls, fast_calls, strict=True):
        assert a[-1] == b[-1] and (a[1] is None) == (b[1] is None)                 # same answers, same Nones
        if a[0] == "end" and a[1] is not None:
            assert a[1] == pytest.approx(b[1], rel=1e-12)
    assert_one_call_order(loop_calls)                                                # begin, plan, mark, end
    assert_one_call_order(fast_calls)
    ends = [c[1] for c in loop_calls if c[0] == "end"]
    assert [e is None for e in ends] == [p.observed_drift(0.0) is None for p in loop_plans]
    if config.sync == "adaptive":           # the case exercises both: skipped steps and syncs by drift
        assert None in ends and any(e > config.sync_threshold for e in ends if e is not None)


# ----------------------------------------------------------------------------- empty_step in the loop

@pytest.mark.parametrize("mask_zero_variance", [True, False])
@pytest.mark.parametrize("empty_step", ["skip", "optimizer_step"])
def test_loop_empty_step_with_adamw_and_weight_decay(mask_zero_variance, empty_step):
    """A step whose groups all agree (β = 0): "skip" leaves θ and AdamW's state as they were;
    "optimizer_step" moves θ (momentum and weight decay on a zero gradient), i times."""
    config = bandit_config(steps=3, i=2, optimizer="adamw", lr=0.1, weight_decay=0.1, empty_step=empty_step,
                           mask_zero_variance=mask_zero_variance)
    loop = build_bandit_loop(BanditProblem.random(4, 3, seed=1), config, runs=2)
    first = loop.step()
    assert not first.skipped and first.grad_norm > 0
    before = loop.policy.logits.detach().clone()
    state = loop.optimizer.state_dict()["state"][0]
    before_state = {name: value.clone() for name, value in state.items()}

    loop.task.rewards = lambda rollout, generator: torch.ones(len(rollout.prompts), rollout.group_size)
    record = loop.step()
    after = loop.optimizer.state_dict()["state"][0]
    assert record.masked_frac == 1.0 and record.loss == 0.0 and record.grad_norm == 0.0
    if empty_step == "skip":
        assert record.skipped
        assert torch.equal(loop.policy.logits.detach(), before)
        assert all(torch.equal(after[name], value) for name, value in before_state.items())
    else:
        assert not record.skipped
        assert not torch.equal(loop.policy.logits.detach(), before)
        assert float(after["step"]) == float(before_state["step"]) + config.i
        assert not torch.equal(after["exp_avg"], before_state["exp_avg"])


@pytest.mark.parametrize("changes", [dict(), dict(beta=0.04, i=2)], ids=["beta 0, i 1", "beta 0.04, i 2"])
def test_skip_after_backward_runs_the_backward_and_ends_as_skip(changes):
    """``empty_step="skip_after_backward"`` (issue 38's arm: TRL's compute, the loop's rule) against a plain
    ``skip`` loop on a tiny LM: a step with signal, two empty ones (every group agrees), a step with signal.
    After every step θ, AdamW's state and the records' decisions are the same; only the skipping loop's empty
    steps ran no backward, the other ran it on every row, i times."""
    from tiny_lm import EvenTokenTask, tiny_model, word_tokenizer

    from grpo_lab import GRPOLoop
    from grpo_lab.lm.policy import LMPolicy
    from grpo_lab.lm.sampling import HFSampler

    def loop(empty_step):
        config = GRPOConfig(**{"G": 4, "prompts_per_step": 2, "max_completion_length": 5, "lr": 1e-2, "seed": 0,
                               "micro_batch_size": 4, "empty_step": empty_step, "sync_audit": False, **changes})
        policy = LMPolicy(tiny_model(), config.temperature)
        built = GRPOLoop(policy, HFSampler(policy, word_tokenizer(), config.max_completion_length), EvenTokenTask(),
                         config)
        built.backwards = 0
        weight = next(policy.parameters())
        weight.register_post_accumulate_grad_hook(lambda p: setattr(built, "backwards", built.backwards + 1))
        return built

    plain, computing = loop("skip"), loop("skip_after_backward")
    signal = plain.task.rewards
    for k, empty in enumerate([False, True, True, False]):
        backwards = (plain.backwards, computing.backwards)
        for each in (plain, computing):
            each.task.rewards = (lambda r, g: torch.ones(len(r.prompts), r.group_size)) if empty else signal
        first, second = plain.step(), computing.step()
        assert first.skipped == second.skipped == empty, k
        for a, b in zip(plain.policy.parameters(), computing.policy.parameters(), strict=True):
            assert torch.equal(a, b), k
        states = plain.optimizer.state_dict()["state"], computing.optimizer.state_dict()["state"]
        assert states[0].keys() == states[1].keys()
        assert all(torch.equal(x[name], y[name]) for x, y in zip(states[0].values(), states[1].values(), strict=True)
                   for name in x), k
        assert first.reward_mean == second.reward_mean and first.tv_estimate == pytest.approx(second.tv_estimate)
        ran = (plain.backwards - backwards[0], computing.backwards - backwards[1])
        passes = plain.config.i * 2   # 8 rows in micro-batches of 4: two backwards a pass
        assert ran == ((0, passes) if empty else (ran[0], ran[0])) and (empty or ran[0] > 0), k
        assert all(p.grad is None for p in computing.policy.parameters())   # dropped, not held


# ----------------------------------------------------------------------------- the closed-form engine

@pytest.mark.parametrize("changes", [dict(), dict(weight_decay=0.1), dict(optimizer="adamw", lr=0.1, weight_decay=0.1)],
                         ids=["SGD", "SGD, weight decay", "AdamW, weight decay"])
@pytest.mark.parametrize("empty_step", ["skip", "optimizer_step"])
def test_closed_form_empty_step_matches_the_loop(changes, empty_step):
    config = bandit_config(**{"steps": 30, "G": 2, "prompts_per_step": 1, "lr": 1.0, "seed": 4,
                              "empty_step": empty_step, **changes})
    loop, fast = run_bandit(SMALL, config, runs=2), closed_form.run_bandit_closed_form(SMALL, config, runs=2)
    np.testing.assert_allclose(fast.J, loop.J, rtol=0, atol=1e-12)
    assert np.array_equal(fast.optimizer_passes, loop.optimizer_passes)
    empty = fast.masked_frac == 1.0                                   # every group of both runs masked
    assert empty.any() and not empty.all()
    moved = np.abs(np.diff(fast.J, axis=0)).max(axis=1) > 0          # [steps]: θ changed at step k
    passes = np.diff(np.concatenate([[0], fast.optimizer_passes]))
    if empty_step == "skip":
        assert (passes[empty] == 0).all() and not moved[empty].any()
    else:
        assert (passes == config.i).all()
        # a zero gradient moves θ only through weight decay or AdamW's momentum
        assert moved[empty].any() == (config.weight_decay > 0 or config.optimizer == "adamw")


# ----------------------------------------------------------------------------- the loss's knobs, resolved once

@pytest.mark.parametrize("changes, eps_high", [
    (dict(), 0.2),
    (dict(eps_high=0.28, is_correction="truncated", is_cap=1.5), 0.28),
    (dict(eps_low=0.1, is_correction="none", is_cap=1.5), 0.1),
])
def test_the_plan_carries_the_objectives_knobs_resolved(changes, eps_high):
    """StepPlan.objective: ε_high None → ε_low, the correction and its cap (the ratio diagnostics read them too),
    and exactly grpo_objective's keyword knobs (so a driver passes them whole)."""
    import inspect

    from grpo_lab import grpo_objective

    config = GRPOConfig(G=2, beta=0.1, kl_kind="k2", band="multiplicative", level="sequence", **changes)
    objective = plan_step(REWARDS, SAMPLED, config).objective
    assert objective.eps_high == eps_high and objective.eps_low == config.eps_low
    assert (objective.is_correction, objective.is_cap) == (config.is_correction, config.is_cap)
    assert (objective.beta, objective.kl_kind, objective.band, objective.level) == (0.1, "k2", "multiplicative",
                                                                                      "sequence")
    knobs = {name for name, p in inspect.signature(grpo_objective).parameters.items()
             if p.kind is p.KEYWORD_ONLY and p.default is not p.empty and not name.startswith("logp")}
    assert set(objective.kwargs()) == knobs
