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
off the speed-up step_serial(1) / step(v) for any v. The paper's two rates (:data:`PAPER_ITERS_PER_SECOND`) are
the PAPER's figures, 1.35× between them; the kit has not measured that ratio on GPUs
(:mod:`grpo_lab.scale.repeats` is how it would).

What a recipe's run costs before it starts (notebooks' GPU sections): :func:`run_cost`, a ROUGH estimate from the
recipe's sizes and a card's datasheet under stated assumptions, and :func:`paper_run_seconds` at the paper's rates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..checks import require_choice, require_int_at_least, require_number_in

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

    ====================== =====================================================================
    ``rate_v1``, ``_v10``  s / √N, iter/s
    ``step_seconds_v1``,   SE(r) / r²: the step time taken as 1 / mean rate
    ``step_seconds_v10``
    ``sync_seconds``       √(SE(t₁)² + SE(t₁₀)²) / 0.9 of the two-point fit (t₁ − t₁₀) / 0.9
    ``speedup``            S·√((SE(r₁)/r₁)² + (SE(r₁₀)/r₁₀)²), S = r₁₀/r₁
    ====================== =====================================================================
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


# ----------------------------------------------------------------------------- what a recipe's run costs (rough)

@dataclass(frozen=True)
class Card:
    """A GPU by its datasheet: dense bfloat16 peak (TFLOP/s) and memory bandwidth (TB/s)."""

    name: str
    bf16_tflops: float
    memory_tb_s: float


H100 = Card("NVIDIA H100 SXM 80 GB", bf16_tflops=989.0, memory_tb_s=3.35)
MODEL_PARAMS = {"smollm2-135m": 0.135e9, "Qwen/Qwen2.5-0.5B-Instruct": 0.49e9,
                "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": 1.78e9, "Qwen/Qwen2.5-7B": PAPER_PARAMS_7B}
"""Parameter counts N of the recipes' models (their model cards)."""
ROUND_SECONDS = 0.025
"""ASSUMED fixed cost of one decoding round (one token for every sequence of a batch) on the one-process route:
kernel launches and Python, which dominate a small model's decoding. Anchored on the one GPU run on record
(docs/benchmarks.md, *On a GPU*): the Qwen2.5-0.5B shape took 0.9–1.4 s a step at 32 tokens, training included,
≈ 30–40 ms a token."""
MFU = 0.3
"""ASSUMED share of the card's bf16 peak that training and batched decoding reach."""
EVAL_PROMPTS_PER_BATCH = 8
"""Questions per batch of :func:`~grpo_lab.lm.evaluate.evaluate` (its default)."""


@dataclass(frozen=True)
class RunCost:
    """What one recipe's run costs on the one-process route (``grpo-lab train``, α sampled in process), and a
    ROUGH time: every completion is taken to run to T (an upper bound: answers that stop earlier cost less),
    prompts are left out, and the rates are :data:`ROUND_SECONDS` and :data:`MFU` (assumptions, not measurements).

    ==================== =================================================================================
    ``steps``            steps k
    ``completions``      steps · P · G sampled completions
    ``tokens``           completions · T: the most tokens they can hold
    ``eval_completions`` eval_problems · eval_samples, per evaluation
    ``sample_seconds``   steps · T rounds, each ROUND_SECONDS + max(2·N·P·G / (MFU · peak), 2·N bytes /
                         bandwidth): the fixed cost, then the batch's compute or the bf16 weights' read
    ``train_seconds``    (6·i + 2·[β > 0]) · N · tokens / (MFU · peak): i forward–backward passes, the
                         π_ref forward where β > 0
    ``eval_seconds``     ⌈eval_problems / 8⌉ batches of T rounds each, as sampling, per evaluation
    ==================== =================================================================================
    """

    steps: int
    completions: int
    tokens: int
    eval_completions: int
    sample_seconds: float
    train_seconds: float
    eval_seconds: float

    def seconds(self, evaluations: int = 1) -> float:
        """Training plus ``evaluations`` evaluations."""
        return self.sample_seconds + self.train_seconds + evaluations * self.eval_seconds


def run_cost(config: Any, card: Card, params: float | None = None) -> RunCost:
    """:class:`RunCost` of a :class:`~grpo_lab.lm.train_config.TrainConfig` on ``card``; ``params``: N (None: the
    recipe's model in :data:`MODEL_PARAMS`, else a ValueError naming the model)."""
    if params is None:
        if config.model not in MODEL_PARAMS:
            raise ValueError(f"no parameter count on record for {config.model!r}: pass params "
                             f"(known: {sorted(MODEL_PARAMS)})")
        params = MODEL_PARAMS[config.model]
    require_number_in("params", params, 0.0, low_open=True)
    flops, weight_read = card.bf16_tflops * 1e12 * MFU, 2 * params / (card.memory_tb_s * 1e12)

    def round_seconds(sequences: int) -> float:
        return ROUND_SECONDS + max(2 * params * sequences / flops, weight_read)

    batch, T = config.prompts_per_step * config.G, config.max_completion_length
    tokens = config.steps * batch * T
    passes = 6 * config.i + (2 if config.beta > 0 else 0)
    eval_batches = -(-config.eval_problems // EVAL_PROMPTS_PER_BATCH)
    return RunCost(steps=config.steps, completions=config.steps * batch, tokens=tokens,
                   eval_completions=config.eval_problems * config.eval_samples,
                   sample_seconds=config.steps * T * round_seconds(batch),
                   train_seconds=passes * params * tokens / flops,
                   eval_seconds=eval_batches * T * round_seconds(EVAL_PROMPTS_PER_BATCH * config.eval_samples))


def paper_run_seconds(steps: int, v: int) -> float:
    """``steps`` steps at the paper's mean rate at lag v (PAPER: 7B colocate, 8 GPUs; its batch and lengths, which
    it does not report, may differ from the recipe's), loading and initialisation left out."""
    require_int_at_least("steps", steps, 1)
    require_choice("v", v, PAPER_ITERS_PER_SECOND)
    return steps / PAPER_ITERS_PER_SECOND[v]
