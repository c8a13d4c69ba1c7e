import pytest

from grpo_lab.loop import StepRecord
from grpo_lab.scale.costmodel import (
    StepCostModel,
    fit_from_records,
    fit_from_step_times,
    paper_cost_model,
    paper_effective_bandwidth_gb_s,
    paper_iterations_to_resolve,
    paper_standard_errors,
    sync_seconds_for,
)


def test_paper_numbers():
    # 1/0.02828 = 35.36 s, 1/0.03828 = 26.12 s ⇒ a + s = 35.36, a + s/10 = 26.12 ⇒ s = 10.27, a = 25.09
    m = paper_cost_model()
    assert m.step_seconds(1) == pytest.approx(1 / 0.02828)
    assert m.step_seconds(10) == pytest.approx(1 / 0.03828)
    assert m.sync == pytest.approx((1 / 0.02828 - 1 / 0.03828) / 0.9)
    assert m.speedup(10) == pytest.approx(0.03828 / 0.02828)
    assert paper_effective_bandwidth_gb_s() == pytest.approx(15.2 / m.sync)


def test_paper_standard_errors_shrink_as_one_over_root_n():
    """The ± is a spread over iterations: the means' standard errors are spread/√N, hand-computed at N = 100."""
    se = paper_standard_errors(100)
    assert se["rate_v1"] == pytest.approx(0.0017) and se["rate_v10"] == pytest.approx(0.0016)
    assert se["step_seconds_v1"] == pytest.approx(0.0017 / 0.02828 ** 2)
    se_t1, se_t10 = 0.0017 / 0.02828 ** 2, 0.0016 / 0.03828 ** 2
    assert se["sync_seconds"] == pytest.approx((se_t1 ** 2 + se_t10 ** 2) ** 0.5 / 0.9)
    relative = ((0.0017 / 0.02828) ** 2 + (0.0016 / 0.03828) ** 2) ** 0.5
    assert se["speedup"] == pytest.approx(0.03828 / 0.02828 * relative)
    assert paper_standard_errors(400)["speedup"] == pytest.approx(se["speedup"] / 2)
    with pytest.raises(ValueError, match="n_iterations must be"):
        paper_standard_errors(1)


def test_paper_iterations_to_resolve_is_the_first_n_two_standard_errors_above_1():
    n = paper_iterations_to_resolve()
    speedup = 0.03828 / 0.02828
    assert speedup - 1 >= 2 * paper_standard_errors(n)["speedup"]
    assert speedup - 1 < 2 * paper_standard_errors(n - 1)["speedup"]
    assert paper_iterations_to_resolve(3.0) > n


def test_overlap_hides_the_shorter_of_gen_and_train_between_syncs():
    m = StepCostModel(gen=6.0, train=4.0, sync=2.0)
    assert m.step_seconds(1, overlap=True) == pytest.approx(m.step_seconds(1)) == pytest.approx(12.0)
    # a period of v = 4: sync 2 + gen 6 + 3 overlapped steps of max(6, 4) + the last train 4 = 30 s
    assert m.step_seconds(4, overlap=True) == pytest.approx(30.0 / 4)
    assert m.speedup(4, overlap=True) == pytest.approx(12.0 / 7.5) and m.speedup(4) == pytest.approx(12.0 / 10.5)
    assert m.step_seconds(1e9, overlap=True) == pytest.approx(6.0)       # → max(gen, train)
    paper = paper_cost_model()                                            # gen and train unsplit: nothing to overlap
    assert paper.speedup(10, overlap=True) == pytest.approx(paper.speedup(10))


def test_fit_from_step_times_recovers_terms():
    truth = StepCostModel(gen=3.0, train=2.0, sync=4.0)
    fit = fit_from_step_times({v: truth.step_seconds(v) for v in (1, 2, 4, 10)})
    assert fit.gen == pytest.approx(5.0) and fit.sync == pytest.approx(4.0)
    with pytest.raises(ValueError, match="at least two values of v"):
        fit_from_step_times({1: 3.0})
    with pytest.raises(ValueError, match=r"step_seconds\[4\] must be a finite number"):
        fit_from_step_times({1: 3.0, 4: -1.0})


def record(step, synced, sample, train, sync):
    return StepRecord(step=step, lag=0, synced=synced, skipped=False, reward_mean=0.0, masked_frac=0.0, loss=0.0,
                      clip_low_frac=0.0, clip_high_frac=0.0, ratio_k_mean=1.0, ratio_k_max=1.0, log_ratio_k_abs=0.0,
                      tv_estimate=0.0, kl=0.0, grad_norm=0.0, num_tokens=1, sync_bytes=0, sample_seconds=sample,
                      train_seconds=train, sync_seconds=sync, ref_reset=False)


def test_fit_from_records():
    records = [record(0, True, 1.0, 2.0, 0.5), record(1, False, 3.0, 2.0, 0.0), record(2, True, 2.0, 5.0, 1.5)]
    m = fit_from_records(records)
    assert (m.gen, m.train, m.sync) == (2.0, 3.0, 1.0)
    assert m.sync_fraction(1) == pytest.approx(1 / 6)
    with pytest.raises(ValueError, match="no record synced"):
        fit_from_records([record(1, False, 1.0, 1.0, 0.0)])


def test_sync_seconds_for():
    assert sync_seconds_for(1e9, bandwidth_gb_s=2.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="bandwidth_gb_s must be"):
        sync_seconds_for(1e9, bandwidth_gb_s=0)


def test_run_cost_of_the_gsm8k_recipe_by_hand():
    """GSM8K on-policy on an H100 (989 TFLOP/s, 3.35 TB/s), N = 0.49e9, 500 steps of P·G = 16·8 = 128, T = 512,
    β = 0.04, i = 1; 1,319 questions × 50 samples. A round at 128 sequences: 0.025 + max(2·0.49e9·128 / (0.3·989e12)
    = 4.2278e-4, 0.98e9 / 3.35e12 = 2.925e-4) s; 500·512 rounds = 6,508.2 s. Training (6 + 2)·0.49e9·32,768,000 /
    2.967e14 = 432.93 s. Evaluation: ⌈1319/8⌉ = 165 batches of 400 sequences, 165·512·(0.025 + 1.3212e-3) =
    2,223.6 s."""
    from grpo_lab.lm.recipes import recipe
    from grpo_lab.scale.costmodel import H100, paper_run_seconds, run_cost

    cost = run_cost(recipe("gsm8k_qwen05b_onpolicy"), H100)
    assert (cost.steps, cost.completions, cost.tokens, cost.eval_completions) == (500, 64_000, 32_768_000, 65_950)
    assert cost.sample_seconds == pytest.approx(6508.23, abs=0.01)
    assert cost.train_seconds == pytest.approx(432.93, abs=0.01)
    assert cost.eval_seconds == pytest.approx(2223.61, abs=0.01)
    assert cost.seconds(5) == pytest.approx(6508.23 + 432.93 + 5 * 2223.61, abs=0.1)
    reuse = run_cost(recipe("gsm8k_qwen05b_reuse_i10"), H100)   # ten forward–backward passes a step
    assert reuse.train_seconds == pytest.approx(432.93 * 62 / 8, abs=0.01)
    assert paper_run_seconds(100, 1) == pytest.approx(100 / 0.02828)
    with pytest.raises(ValueError, match="no parameter count on record for 'my/model'"):
        run_cost(recipe("gsm8k_qwen05b_onpolicy", model="my/model"), H100)
    assert run_cost(recipe("gsm8k_qwen05b_onpolicy", model="my/model"), H100, params=0.49e9) == cost
