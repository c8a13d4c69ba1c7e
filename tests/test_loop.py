"""Algorithm 1: sync schedule, lag, passes, skipped steps, exactness of batching, resume."""

import copy

import pytest
import torch

from grpo_lab import AdaptiveSyncSchedule, RefResetSchedule, SyncSchedule
from grpo_lab.exact.bandit import BanditProblem, bandit_config, build_bandit_loop


def counting_loop(**changes):
    loop = build_bandit_loop(BanditProblem.random(contexts=4, arms=3, seed=0), bandit_config(**changes), runs=2)
    loop.sync_calls = []
    real_sync = loop.sampler.sync

    def sync(policy):
        loop.sync_calls.append(loop.k)
        return real_sync(policy)

    loop.sampler.sync = sync
    loop.optimizer_steps = 0
    real_step = loop.optimizer.step

    def step(*args, **kwargs):
        loop.optimizer_steps += 1
        return real_step(*args, **kwargs)

    loop.optimizer.step = step
    return loop


def test_v1_syncs_every_step_and_lag_is_zero():
    loop = counting_loop(v=1, steps=6)
    records = list(loop.run())
    assert loop.sync_calls == list(range(6))
    assert [r.lag for r in records] == [0] * 6 and all(r.synced for r in records)
    assert all(r.ratio_k_max == pytest.approx(1.0) for r in records if not r.skipped)   # α = π_k exactly


def test_v4_syncs_at_0_4_8_and_lag_cycles():
    loop = counting_loop(v=4, steps=10)
    records = list(loop.run())
    assert loop.sync_calls == [0, 4, 8]
    assert [r.lag for r in records] == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    # the sampler really lags: α differs from π_θ inside a period, equals it right after a sync
    assert any(r.log_ratio_k_abs > 0 for r in records if r.lag > 0)
    assert all(r.log_ratio_k_abs == 0 for r in records if r.lag == 0)


def test_i3_makes_three_optimiser_steps_per_batch():
    loop = counting_loop(i=3, steps=4, eps_low=0.05)
    records = list(loop.run())
    assert loop.optimizer_steps == 3 * sum(not r.skipped for r in records)
    # passes 2–3 move π_θ away from π_k, so the band starts to bite (pass 1 never clips)
    assert any(r.clip_low_frac + r.clip_high_frac > 0 for r in records)
    assert loop.sync_calls == [0, 1, 2, 3]


@pytest.mark.parametrize("band", ["additive", "multiplicative"])
def test_the_clip_never_acts_at_i1_whatever_the_lag(band):
    """At the only pass π_θ = π_k, so r = r′ lies inside either band: no token is ever clipped, even at lag > 0."""
    records = list(counting_loop(v=4, i=1, steps=12, eps_low=0.01, band=band).run())
    assert any(r.lag > 0 and r.log_ratio_k_abs > 0 for r in records)          # α really lags
    assert all(r.clip_low_frac == 0 and r.clip_high_frac == 0 for r in records)
    assert any(r.clip_low_frac + r.clip_high_frac > 0
               for r in counting_loop(v=4, i=2, steps=12, eps_low=0.01, band=band).run())


def test_each_batch_is_freshly_sampled_even_when_lagged():
    loop = counting_loop(v=5, steps=3)
    seen = []
    real_sample = loop.sampler.sample
    loop.sampler.sample = lambda *a: seen.append(real_sample(*a)) or seen[-1]
    list(loop.run())
    assert len(seen) == 3 and not torch.equal(seen[0].completions, seen[1].completions)


def test_all_masked_step_is_skipped_with_zero_loss():
    p = torch.ones(3, 2)                       # every arm always pays: every group is all-right
    loop = build_bandit_loop(BanditProblem(p), bandit_config(steps=2), runs=1)
    before = loop.policy.logits.detach().clone()
    records = list(loop.run())
    assert all(r.skipped and r.loss == 0.0 and r.masked_frac == 1.0 for r in records)
    assert torch.equal(loop.policy.logits.detach(), before)


def test_mask_off_counts_constant_groups_in_the_denominator():
    loop_on = build_bandit_loop(BanditProblem.random(4, 3), bandit_config(steps=1), runs=1)
    loop_off = build_bandit_loop(BanditProblem.random(4, 3), bandit_config(steps=1, mask_zero_variance=False), runs=1)
    r_on, r_off = loop_on.step(), loop_off.step()
    assert r_on.masked_frac == r_off.masked_frac          # measured either way
    assert 0 < r_on.masked_frac < 1                       # this batch has constant groups and others
    assert r_on.num_tokens == round(r_off.num_tokens * (1 - r_on.masked_frac))  # off: every group's tokens count


def test_batch_normalisation_scales_the_sgd_step_by_the_kept_fraction():
    """``mask_normalize="batch"`` (the paper) = ``"unmasked"`` × kept fraction, step for step (SGD, β = 0)."""
    problem = BanditProblem.random(6, 3, seed=2, hardness=3.0)
    moves, masked = {}, set()
    for normalize in ("batch", "unmasked"):
        loop = build_bandit_loop(problem, bandit_config(steps=1, mask_normalize=normalize), runs=1)
        before = loop.policy.logits.detach().clone()
        masked.add(loop.step().masked_frac)
        moves[normalize] = loop.policy.logits.detach() - before
    (masked_frac,) = masked
    assert 0 < masked_frac < 1
    torch.testing.assert_close(moves["batch"], moves["unmasked"] * (1 - masked_frac), rtol=1e-6, atol=1e-9)


def test_tv_estimate_is_zero_after_a_sync_and_the_same_for_any_micro_batch():
    records = {size: list(counting_loop(v=4, steps=8, micro_batch_size=size).run()) for size in (None, 8)}
    assert all(r.tv_estimate == 0.0 for r in records[None] if r.lag == 0)
    assert sum(r.tv_estimate > 0.0 for r in records[None] if r.lag > 0) >= 4     # α lags: π_k ≠ α on drawn contexts
    # with micro-batches of one group, wholly masked groups get log π_k from a no-grad forward
    assert any(0 < r.masked_frac for r in records[8])
    assert [r.tv_estimate for r in records[8]] == pytest.approx([r.tv_estimate for r in records[None]], rel=1e-6)


def test_beta_zero_keeps_no_reference_and_ref_reset_copies():
    assert counting_loop(beta=0.0).reference is None
    loop = counting_loop(beta=0.1, ref_period=2, steps=4)
    records = list(loop.run())
    assert [r.ref_reset for r in records] == [False, True, False, True]
    assert torch.equal(loop.reference.logits, loop.policy.logits.detach())
    assert not loop.reference.logits.requires_grad


def test_same_seed_same_records_different_seed_differs():
    def curve(seed):
        return [r.reward_mean for r in counting_loop(seed=seed, steps=20).run()]
    assert curve(3) == curve(3)
    assert curve(3) != curve(4)


def test_resume_from_state_dict_is_bit_identical():
    full = counting_loop(v=3, beta=0.05, ref_period=4, steps=12)
    list(full.run())
    first = counting_loop(v=3, beta=0.05, ref_period=4, steps=12)
    list(first.run(7))
    state = copy.deepcopy(first.state_dict())
    second = counting_loop(v=3, beta=0.05, ref_period=4, steps=12)
    second.load_state_dict(state)
    list(second.run())
    assert [r.reward_mean for r in second.history] == [r.reward_mean for r in full.history]
    assert torch.equal(second.policy.logits, full.policy.logits)
    assert torch.equal(second.sampler.logits, full.sampler.logits)


def test_resume_refuses_a_different_config():
    a, b = counting_loop(v=2), counting_loop(v=3)
    with pytest.raises(ValueError, match="'v': \\(2, 3\\)"):
        b.load_state_dict(a.state_dict())


def test_resume_accepts_more_steps_and_another_micro_batch_size():
    saved = counting_loop(v=2, steps=4)
    list(saved.run())
    longer = counting_loop(v=2, steps=8, micro_batch_size=3)
    longer.load_state_dict(saved.state_dict())
    assert longer.k == 4 and len(list(longer.run())) == 4


def test_failed_sampling_leaves_state_unchanged():
    loop = counting_loop(v=2, steps=4)
    loop.step()
    rng, logits, k = loop.generator.get_state(), loop.policy.logits.detach().clone(), loop.k

    def broken(rollout, generator):
        raise RuntimeError("reward server down")

    real = loop.task.rewards
    loop.task.rewards = broken
    with pytest.raises(RuntimeError):
        loop.step()
    assert loop.k == k and torch.equal(loop.generator.get_state(), rng) and len(loop.history) == 1
    assert torch.equal(loop.policy.logits.detach(), logits)
    loop.task.rewards = real
    assert loop.step().step == 1


def test_reward_function_returning_nan_names_prompt_and_value():
    loop = counting_loop()

    def nan_rewards(rollout, generator):
        r = torch.zeros(len(rollout.prompts), rollout.group_size)
        r[1, 2] = float("nan")
        return r

    loop.task.rewards = nan_rewards
    with pytest.raises(ValueError, match=r"rewards\[1, 2\] = nan \(prompt 1, sample 2\)"):
        loop.step()


def test_sync_schedules():
    s = SyncSchedule(3)
    synced = []
    for k in range(7):
        if s.begin(k):
            s.mark_synced(k)
            synced.append(k)
        s.end(0.3)                              # a fixed schedule ignores the drift
    assert synced == [0, 3, 6] and s.lag(7) == 1
    a = AdaptiveSyncSchedule(v=5, threshold=0.1)
    assert a.begin(0)
    a.mark_synced(0)
    a.end(0.05)
    assert not a.begin(1)
    a.end(0.2)
    assert a.begin(2) and a.begin(2)            # drift passed the threshold; begin decides, changes nothing
    a.mark_synced(2)
    a.end(None)                                 # measured nothing: the 0 of the sync stays
    assert not a.begin(3)
    a.end(0.0)
    assert not a.begin(6) and a.begin(7)        # longest lag v = 5
    a.end(0.2)
    a.end(None)                                 # a step that measured nothing keeps the last drift
    assert a.last_drift == 0.2 and a.begin(3)
    with pytest.raises(ValueError, match="drift must be a finite number"):
        a.end(float("nan"))
    r = RefResetSchedule(3)
    assert [k for k in range(9) if r.should_reset(k)] == [2, 5, 8]
    assert not any(RefResetSchedule(0).should_reset(k) for k in range(10))


def test_adaptive_schedule_runs_in_the_loop():
    """The loop syncs exactly where the adaptive rule says: at k = 0, when the last measured drift
    (``log_ratio_k_abs``) passed the threshold, or at the longest lag v; neither every step nor every v."""
    v, threshold = 8, 1e-3
    loop = counting_loop(sync="adaptive", v=v, sync_threshold=threshold, steps=12)
    records = list(loop.run())
    last_sync, drift = -1, 0.0
    for r in records:
        assert r.synced == (last_sync < 0 or r.step - last_sync >= v or drift > threshold), r.step
        if r.synced:
            last_sync, drift = r.step, 0.0
        if not r.skipped:
            drift = r.log_ratio_k_abs
    assert loop.sync_calls == [r.step for r in records if r.synced]
    assert any(k % v for k in loop.sync_calls) and len(loop.sync_calls) < len(records)  # not fixed v, not v = 1


def test_skipped_step_keeps_the_measured_drift():
    loop = counting_loop(sync="adaptive", v=8, sync_threshold=0.5, steps=3)
    loop.step()
    loop.schedule.end(0.3)                      # drift measured on step 0, below the threshold: no sync at 1

    def all_equal_rewards(rollout, generator):  # step 1: every group masked → skipped, no drift measured
        return torch.ones(len(rollout.prompts), rollout.group_size)

    loop.task.rewards = all_equal_rewards
    record = loop.step()
    assert record.skipped and not record.synced
    assert loop.schedule.last_drift == 0.3      # not reset to the 0 of an empty measurement


def test_ess_falls_as_the_lag_grows_on_the_bandit():
    """ESS/n of r′ = π_k/α, per token and per sequence, mean over steps: 1 at v = 1 (α = π_k), lower at v = 4,
    lower still at v = 16; the log r′ quantiles grow the other way."""
    from grpo_lab.exact.bandit import run_bandit

    problem = BanditProblem.random(contexts=10, arms=6, seed=1, hardness=3.0)
    runs = {v: run_bandit(problem, bandit_config(steps=48, lr=1.0, v=v, seed=2), runs=3).records for v in (1, 4, 16)}
    ess = {v: sum(r.ess_token for r in records) / len(records) for v, records in runs.items()}
    assert ess[1] == pytest.approx(1.0, abs=1e-12)
    assert ess[1] > ess[4] > ess[16]
    assert all(r.ess_seq == r.ess_token for records in runs.values() for r in records)  # one-token responses
    p99 = {v: max(r.log_ratio_k_p99 for r in records) for v, records in runs.items()}
    assert p99[1] == 0 and p99[16] > p99[4] > 0
    assert all(r.cap_frac == 0 for records in runs.values() for r in records)  # is_correction = "ratio"


def test_cap_frac_counts_ratios_above_the_cap_under_truncated():
    from grpo_lab.exact.bandit import run_bandit

    problem = BanditProblem.random(contexts=10, arms=6, seed=1, hardness=3.0)
    config = bandit_config(steps=30, lr=2.0, v=10, seed=2, is_correction="truncated", is_cap=1.1)
    records = run_bandit(problem, config, runs=2).records
    assert all(r.cap_frac == 0 for r in records if r.lag == 0)
    assert max(r.cap_frac for r in records) > 0.05
