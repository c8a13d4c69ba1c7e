"""What a lag of v buys (docs/theory.md §7): two step-time models.

A sync pushes every weight to the inference engine (copy, reshard, cache reset);
with a lag of v it is paid once per v steps.

======== ====================================================== ==========================================
model    step(v)                                                when
======== ====================================================== ==========================================
serial   gen + train + sync / v                                 generation and training take turns (the
                                                                kit's loop; a colocated engine that shares
                                                                the devices with training)
overlap  max(gen, train) + (min(gen, train) + sync) / v         generation of the next batch runs beside
                                                                training of this one, which a lag allows:
                                                                ≈ max(gen, train) + sync / v for large v
======== ====================================================== ==========================================

Fit the three terms to measured step records (or to two measured step times), then read
off the speed-up step_serial(1) / step(v) for any v.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ..checks import require_int_at_least, require_number_in

# The paper's throughput run (docs/theory.md §6): Qwen2.5-7B, TRL colocate, vLLM TP=4, 8 GPUs.
PAPER_ITERS_PER_SECOND = {1: 0.02828, 10: 0.03828}
PAPER_ITERS_PER_SECOND_SPREAD = {1: 0.017, 10: 0.016}
"""The ± the paper reports with each rate, which it does not define (docs/theory.md §7 shows both readings).
If it is the spread of the rate across a run's iterations, the mean's standard error is spread / √N for N
independent iterations (:func:`paper_standard_errors`), and the paper gives no N; as bounds on the mean it
would allow a negative sync time."""
PAPER_PARAMS_7B = 7.6e9


@dataclass(frozen=True)
class StepCostModel:
    """step(v) = gen + train + sync / v, all in seconds.

    ======= =========================================================
    gen     sampling G completions for the batch (per step)
    train   the i optimiser passes (per step)
    sync    one weight push to the sampler (paid every v steps)
    ======= =========================================================
    """

    gen: float
    train: float
    sync: float

    def step_seconds(self, v: float | np.ndarray, overlap: bool = False) -> float | np.ndarray:
        """Seconds per step at lag v. ``overlap``: the pipeline of the table above. In a sync period of
        v steps the first batch is generated after the sync and the last is trained alone; the v − 1
        batches between are generated while the previous one trains. At v = 1 nothing overlaps."""
        v = np.asarray(v, dtype=float)
        if not overlap:
            return self.gen + self.train + self.sync / v
        return max(self.gen, self.train) + (min(self.gen, self.train) + self.sync) / v

    def speedup(self, v: float | np.ndarray, overlap: bool = False) -> float | np.ndarray:
        """step(1) / step(v) against the on-policy step, which is serial (α = π_k needs the last update)."""
        return self.step_seconds(1) / self.step_seconds(v, overlap)

    def sync_fraction(self, v: float = 1) -> float:
        """Share of a serial step spent syncing at lag v."""
        return float((self.sync / v) / self.step_seconds(v))


def fit_from_records(records: Iterable) -> StepCostModel:
    """Terms from measured :class:`~grpo_lab.loop.StepRecord` s: mean sample and
    train seconds over all steps, mean sync seconds over the steps that synced."""
    records = list(records)
    if not records:
        raise ValueError("records is empty: run some steps first")
    syncs = [r.sync_seconds for r in records if r.synced]
    if not syncs:
        raise ValueError("no record synced: the sync cost cannot be measured")
    return StepCostModel(gen=float(np.mean([r.sample_seconds for r in records])),
                         train=float(np.mean([r.train_seconds for r in records])),
                         sync=float(np.mean(syncs)))


def fit_from_step_times(step_seconds: Mapping[int, float]) -> StepCostModel:
    """Least-squares fit of step(v) = a + sync/v to mean step times at ≥ 2 values of v.

    ``gen`` and ``train`` can't be told apart from step times alone: the fit
    returns a = gen + train in ``gen`` and 0 in ``train``.
    """
    if len(step_seconds) < 2:
        raise ValueError(f"need step times for at least two values of v, got {dict(step_seconds)}")
    for v, t in step_seconds.items():
        require_int_at_least("v", v, 1)
        require_number_in(f"step_seconds[{v}]", t, 0.0, low_open=True)
    v = np.array(list(step_seconds), dtype=float)
    t = np.array(list(step_seconds.values()), dtype=float)
    (a, sync), *_ = np.linalg.lstsq(np.stack([np.ones_like(v), 1 / v], axis=1), t, rcond=None)
    return StepCostModel(gen=float(a), train=0.0, sync=float(sync))


def paper_cost_model() -> StepCostModel:
    """The serial model through the paper's two mean rates (0.02828 vs 0.03828 iter/s): ≈35.4 s per
    step at v = 1, ≈26.1 s at v = 10 ⇒ one sync ≈ 10.3 s. Two points fix the two unknowns exactly, so
    no degree of freedom is left to test the model on the paper's data, and gen and train stay unsplit."""
    return fit_from_step_times({v: 1.0 / ips for v, ips in PAPER_ITERS_PER_SECOND.items()})


def paper_standard_errors(n_iterations: int) -> dict[str, float]:
    """Standard errors of what the paper's two rates give if each is the mean of ``n_iterations``
    independent iterations spread by the reported ± (the paper does not give N; correlated
    iterations count as fewer). To first order (delta method), with s the spread and r the rate:

    ==================== =====================================================================
    ``rate_v1``, ``_v10`` s / √N, iter/s
    ``step_seconds_v1``,  SE(r) / r²: the step time taken as 1 / mean rate
    ``step_seconds_v10``
    ``sync_seconds``     √(SE(t₁)² + SE(t₁₀)²) / 0.9 of the two-point fit (t₁ − t₁₀) / 0.9
    ``speedup``          S·√((SE(r₁)/r₁)² + (SE(r₁₀)/r₁₀)²), S = r₁₀/r₁
    ==================== =====================================================================
    """
    require_int_at_least("n_iterations", n_iterations, 2)
    rate, spread = PAPER_ITERS_PER_SECOND, PAPER_ITERS_PER_SECOND_SPREAD
    se_rate = {v: spread[v] / np.sqrt(n_iterations) for v in rate}
    se_step = {v: se_rate[v] / rate[v] ** 2 for v in rate}
    speedup = rate[10] / rate[1]
    return {"rate_v1": float(se_rate[1]), "rate_v10": float(se_rate[10]),
            "step_seconds_v1": float(se_step[1]), "step_seconds_v10": float(se_step[10]),
            "sync_seconds": float(np.hypot(se_step[1], se_step[10]) / 0.9),
            "speedup": float(speedup * np.hypot(se_rate[1] / rate[1], se_rate[10] / rate[10]))}


def paper_iterations_to_resolve(z: float = 2.0) -> int:
    """The smallest N (iterations per rate, as in :func:`paper_standard_errors`) at which the paper's
    speed-up r₁₀/r₁ lies ``z`` standard errors above 1. Fewer iterations and the rates alone would not
    exclude "no speed-up"; the paper does not say how many it averaged."""
    require_number_in("z", z, 0.0, low_open=True)
    rate, spread = PAPER_ITERS_PER_SECOND, PAPER_ITERS_PER_SECOND_SPREAD
    speedup = rate[10] / rate[1]
    relative = float(np.hypot(spread[1] / rate[1], spread[10] / rate[10]))
    return int(np.ceil((z * speedup * relative / (speedup - 1)) ** 2))


def sync_seconds_for(params: float, bandwidth_gb_s: float, bytes_per_param: int = 2,
                     overhead_s: float = 0.0) -> float:
    """Sync time of a model with ``params`` parameters at an effective bandwidth
    (GB/s, 1e9 bytes) plus a fixed overhead (reshard, cache reset)."""
    require_number_in("params", params, 0.0, low_open=True)
    require_number_in("bandwidth_gb_s", bandwidth_gb_s, 0.0, low_open=True)
    return params * bytes_per_param / (bandwidth_gb_s * 1e9) + overhead_s


def paper_effective_bandwidth_gb_s(bytes_per_param: int = 2) -> float:
    """The bandwidth that makes a 7.6B-parameter bf16 push take the paper's sync time."""
    return PAPER_PARAMS_7B * bytes_per_param / 1e9 / paper_cost_model().sync
