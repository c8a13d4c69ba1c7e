import pytest

from grpo_lab.loop import StepRecord
from grpo_lab.scale.costmodel import (
    StepCostModel,
    fit_from_records,
    fit_from_step_times,
    paper_cost_model,
    paper_effective_bandwidth_gb_s,
    paper_intervals,
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


def test_paper_intervals_carry_the_reported_spread():
    """0.02828 ± 0.017 and 0.03828 ± 0.016 iter/s: hand-computed corners; the central values lie inside."""
    box = paper_intervals()
    assert box["step_seconds_v1"] == pytest.approx((1 / 0.04528, 1 / 0.01128))
    assert box["speedup"] == pytest.approx((0.02228 / 0.04528, 0.05428 / 0.01128))   # fit through both points
    assert box["sync_seconds"] == pytest.approx(((1 / 0.04528 - 1 / 0.02228) / 0.9, (1 / 0.01128 - 1 / 0.05428) / 0.9))
    m = paper_cost_model()
    for key, central in [("sync_seconds", m.sync), ("sync_share", m.sync_fraction(1)), ("speedup", m.speedup(10))]:
        low, high = box[key]
        assert low < central < high
    assert box["sync_share"][0] < 0 < box["sync_share"][1] and box["speedup"][0] < 1 < box["speedup"][1]


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
