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
