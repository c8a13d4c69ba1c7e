"""What a lag of v buys (docs/theory.md §7): the step-time model  step(v) = gen + train + sync / v.

A sync pushes every weight to the inference engine (copy, reshard, cache reset);
with a lag of v it is paid once per v steps. Fit the three terms to measured
step records (or to two measured step times), then read off the speed-up
step(1) / step(v) for any v.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ..checks import require_int_at_least, require_number_in

# The paper's throughput run (docs/theory.md §6): Qwen2.5-7B, TRL colocate, vLLM TP=4, 8 GPUs.
PAPER_ITERS_PER_SECOND = {1: 0.02828, 10: 0.03828}
PAPER_ITERS_PER_SECOND_SPREAD = {1: 0.017, 10: 0.016}
"""The ± the paper reports with each rate; :func:`paper_intervals` carries it into every derived number."""
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

    def step_seconds(self, v: float | np.ndarray) -> float | np.ndarray:
        return self.gen + self.train + self.sync / np.asarray(v, dtype=float)

    def speedup(self, v: float | np.ndarray) -> float | np.ndarray:
        """step(1) / step(v): how much faster a lag of v makes each step."""
        return self.step_seconds(1) / self.step_seconds(v)

    def sync_fraction(self, v: float = 1) -> float:
        """Share of a step spent syncing at lag v."""
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
    """The model fitted to the paper's 7B throughput (0.02828 vs 0.03828 iter/s):
    ≈35.4 s per step at v = 1, ≈26.1 s at v = 10 ⇒ one sync ≈ 10.3 s."""
    return fit_from_step_times({v: 1.0 / ips for v, ips in PAPER_ITERS_PER_SECOND.items()})


def paper_intervals(v: int = 10) -> dict[str, tuple[float, float]]:
    """What the paper's rates imply once their ± is taken as a range (each rate anywhere in mean ± spread):
    ``step_seconds`` at v = 1 and at v = 10, ``sync_seconds`` and ``sync_share`` (of a v = 1 step) of the
    two-point fit, and the ``speedup`` step(1)/step(v) that the fit predicts at ``v``. Each is monotone in the
    two rates, so the extremes lie at the corners of the rate box. With the paper's numbers every interval is
    wide: the sync share includes 0 and the measured speed-up at v = 10 includes 1."""
    require_int_at_least("v", v, 1)
    rate, spread = PAPER_ITERS_PER_SECOND, PAPER_ITERS_PER_SECOND_SPREAD
    corners = [{1: rate[1] + s1 * spread[1], 10: rate[10] + s10 * spread[10]} for s1 in (-1, 1) for s10 in (-1, 1)]
    values: dict[str, list[float]] = {}
    for rates in corners:
        model = fit_from_step_times({n: 1.0 / r for n, r in rates.items()})
        for key, value in [("step_seconds_v1", 1.0 / rates[1]), ("step_seconds_v10", 1.0 / rates[10]),
                           ("sync_seconds", model.sync), ("sync_share", model.sync / float(model.step_seconds(1))),
                           ("speedup", float(model.speedup(v)))]:
            values.setdefault(key, []).append(value)
    return {key: (min(xs), max(xs)) for key, xs in values.items()}


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
