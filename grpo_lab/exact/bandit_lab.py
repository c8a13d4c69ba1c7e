"""The numbers behind notebook 01: the bandit lab's runs and exact measurements, no plotting.

Everything here runs on :mod:`grpo_lab.exact.bandit` (exact J, L_α, TV, Theorem 1)
and the library primitives; :mod:`grpo_lab.viz.plots` turns the results into
figures. ``GRPO_LAB_SMOKE=1`` shrinks every run (:func:`lab_size`) so CI can
execute the notebook in seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from ..advantages import whiten, zero_variance_mask
from ..checks import require_int_at_least, require_number_in
from ..config import GRPOConfig, smoke_mode
from ..objective import KL_KINDS, clip_bounds, clipped_surrogate, kl_estimate, ratios_as_log_probs
from ..scale.costmodel import StepCostModel, paper_cost_model
from .bandit import (
    BanditProblem,
    BanditRun,
    BanditTask,
    LaggedTabularSampler,
    bandit_config,
    build_bandit_loop,
    improvement_lower_bound,
    kl_expected_gradient,
    run_bandit,
    sigma_alpha,
    single_thread,
    surrogate_L,
    true_improvement,
    tv,
)
from .closed_form import run_bandit_closed_form

Array = TypeVar("Array", np.ndarray, torch.Tensor)
LAB_PROBLEM = dict(contexts=16, arms=8, seed=0, hardness=3.0)
"""Hard enough that about a third of the groups are all-wrong or all-right (masked)."""
LAB_LR = 1.0
"""SGD step on the logits: slow enough to stay stable, fast enough to converge in ~1000 steps."""
TRL_IS_CAP = 3.0
"""TRL 1.16's ``vllm_importance_sampling_clip_max``. TRL's weight w it caps is π_old/α_vLLM (π_old: the trainer's own
forward at generation, with the weights just pushed to vLLM), so it measures the engine's mismatch, never a lag; in
the default ``vllm_importance_sampling_mode="sequence_mask"`` w is one number per sequence, set to 0 above the cap
(``trl/trainer/grpo_trainer.py``, ``_generate_and_score_completions``; docs/theory.md §3)."""
TRAIN_SHARE = 0.4
"""Assumed share of training in the paper's non-sync step time (the paper reports only the total)."""


@dataclass(frozen=True)
class LabSize:
    """How long the notebook's runs are: ``steps`` per run, ``runs`` stacked runs (seeds)."""

    steps: int
    runs: int


FULL, SMOKE = LabSize(steps=300, runs=8), LabSize(steps=60, runs=4)


def lab_size() -> LabSize:
    return SMOKE if smoke_mode() else FULL


def lab_problem(**changes: object) -> BanditProblem:
    """The notebook's bandit: :data:`LAB_PROBLEM` with ``changes``."""
    return BanditProblem.random(**{**LAB_PROBLEM, **changes})


def lab_config(**changes: object) -> GRPOConfig:
    """The notebook's config: SGD at :data:`LAB_LR`, :func:`lab_size` steps, then ``changes``."""
    return bandit_config(**{"lr": LAB_LR, "steps": lab_size().steps, **changes})


# ----------------------------------------------------------------------------- §2 whitening on real samples

@dataclass
class GroupBatch:
    """One sampled batch: P contexts × G arms drawn from α, their rewards and what whitening makes of them."""

    contexts: torch.Tensor    # [P]
    arms: torch.Tensor        # [P, G]
    rewards: torch.Tensor     # [P, G]
    advantages: torch.Tensor  # [P, G]  A_α = (r − μ)/sqrt(σ² + ε_std)
    keep: torch.Tensor        # [P]     zero-variance mask m(x)
    eps_std: float


def example_batch(problem: BanditProblem, config: GRPOConfig, seed: int = 0, max_tries: int = 100) -> GroupBatch:
    """The first batch, sampled from the initial (uniform) α, that contains a masked group."""
    task, sampler = BanditTask(problem, runs=1), LaggedTabularSampler(1, problem.contexts, problem.arms)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(max_tries):
        prompts = task.prompts(config.prompts_per_step, generator)
        rollout = sampler.sample(prompts, config.G, generator)
        rewards = task.rewards(rollout, generator)
        keep = zero_variance_mask(rewards)
        if not keep.all():
            return GroupBatch(prompts, rollout.completions.reshape(len(prompts), -1), rewards,
                              whiten(rewards, config.eps_std, config.unbiased_std, config.eps_placement),
                              keep, config.eps_std)
    raise ValueError(f"no masked group in {max_tries} batches: use a harder problem or a smaller G")


# ----------------------------------------------------------------------------- §3 clipped surrogate

def surrogate_curves(ratio: torch.Tensor, ratio_ks: list[float], advantage: float, eps: float,
                     band: str) -> torch.Tensor:
    """f_ε(r, r′, A) for each r′ in ``ratio_ks`` over the grid ``ratio`` (α ≡ 1), ``[len(ratio_ks), N]``."""
    rows = [clipped_surrogate(*ratios_as_log_probs(ratio, torch.full_like(ratio, rk)),
                              torch.full_like(ratio, advantage), eps, band=band) for rk in ratio_ks]
    return torch.stack(rows)


def trl_surrogate_curves(ratio: torch.Tensor, ratio_ks: list[float], advantage: float, eps: float,
                         cap: float = TRL_IS_CAP) -> torch.Tensor:
    """TRL 1.16's loss formula, written as TRL writes it, with its weight fed the kit's r′ (one-token responses,
    α ≡ 1): ρ = π_θ/π_k, w = r′ if r′ ≤ ``cap`` else 0, f = w · min(ρ·A, clip(ρ, 1 − ε, 1 + ε)·A). For r′ ≤ cap this
    is the multiplicative band (w·ρ = r), beyond it the response is masked. Stock TRL never feeds its w a lag (its w
    is π_old/α_vLLM, the engine's mismatch; ``TRL_IS_CAP``): this is what its formula would do with a lagged
    one-token sampler. ``[len(ratio_ks), N]``."""
    rows = []
    for rk in ratio_ks:
        rho, weight = ratio / rk, rk if rk <= cap else 0.0
        rows.append(weight * torch.minimum(rho * advantage, rho.clamp(1 - eps, 1 + eps) * advantage))
    return torch.stack(rows)


def clip_fraction(run: BanditRun) -> float:
    """Mean over the steps that trained of clip_low_frac + clip_high_frac (each averaged over the i passes)."""
    return float(np.mean([r.clip_low_frac + r.clip_high_frac for r in run.records if not r.skipped]))


def band_gaps(ratio_ks: list[float], eps: float, ratio: torch.Tensor) -> list[dict[str, float]]:
    """Per r′: both clip intervals and the largest |f_add − f_mult| over ``ratio`` for A = +1 and A = −1."""
    rows = []
    for rk in ratio_ks:
        row: dict[str, float] = {"r_prime": rk}
        for band in ("additive", "multiplicative"):
            lo, hi = clip_bounds(torch.tensor(rk, dtype=ratio.dtype), eps, eps, band)
            row[f"{band}_low"], row[f"{band}_high"] = float(lo), float(hi)
        for a in (1.0, -1.0):
            gap = (surrogate_curves(ratio, [rk], a, eps, "additive")
                   - surrogate_curves(ratio, [rk], a, eps, "multiplicative")).abs().max()
            row[f"max_gap_A{'+' if a > 0 else '-'}"] = float(gap)
            trl = (trl_surrogate_curves(ratio, [rk], a, eps) - surrogate_curves(ratio, [rk], a, eps, "multiplicative"))
            row[f"trl_gap_A{'+' if a > 0 else '-'}"] = float(trl.abs().max())
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- §3 KL estimators

def policy_trajectory(problem: BanditProblem, config: GRPOConfig) -> torch.Tensor:
    """π_θ after every step of one run, ``[steps + 1, C, K]`` (index 0 is the initial policy)."""
    with single_thread():
        loop = build_bandit_loop(problem, config, runs=1)
        tables = [loop.policy.probs()[0]]
        for _ in range(config.steps):
            loop.step()
            tables.append(loop.policy.probs()[0])
    return torch.stack(tables)


@dataclass
class KLEstimates:
    """Each estimator's exact mean and per-sample std when y ~ α = π_{k−lag}, against KL(π_k ‖ π_ref)."""

    lags: np.ndarray                # [L]
    exact: float                    # KL(π_k ‖ π_ref), mean over contexts
    mean: dict[str, np.ndarray]     # kind → [L]  E_{x, y~α}[k̂]
    std: dict[str, np.ndarray]      # kind → [L]  per-sample standard deviation
    iw_mean: dict[str, float]       # kind → E_{y~α}[(π/α)·k̂] (the same for every lag)


def lagged_tables(trajectory: torch.Tensor, lags: list[int],
                  ref_lag: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """π (the last table), π_ref (``ref_lag`` steps earlier) and α for each lag (``lag`` steps earlier)."""
    last = trajectory.shape[0] - 1
    for name, value in [("ref_lag", ref_lag), *(("lags", lag) for lag in lags)]:
        require_int_at_least(name, value, 0)
        if value > last:
            raise ValueError(f"{name} must be <= {last} (the trajectory's steps), got {value}")
    return trajectory[last], trajectory[last - ref_lag], [trajectory[last - lag] for lag in lags]


def kl_study(trajectory: torch.Tensor, lags: list[int], ref_lag: int) -> KLEstimates:
    """π = last table, π_ref = ``ref_lag`` steps earlier, α = ``lag`` steps earlier.

    Expectations are exact sums over the K arms (contexts weighted uniformly),
    the estimators are :func:`grpo_lab.kl_estimate` on every arm.
    """
    pi, pi_ref, alphas = lagged_tables(trajectory, lags, ref_lag)
    exact = float((pi * (pi.log() - pi_ref.log())).sum(-1).mean())
    mean, std, iw = {}, {}, {}
    for kind in KL_KINDS:
        values = kl_estimate(pi.log(), pi_ref.log(), kind)                       # [C, K]
        iw[kind] = float((pi * values).sum(-1).mean())
        m, s = [], []
        for alpha in alphas:
            first = float((alpha * values).sum(-1).mean())
            second = float((alpha * values ** 2).sum(-1).mean())
            m.append(first)
            s.append(max(second - first ** 2, 0.0) ** 0.5)
        mean[kind], std[kind] = np.array(m), np.array(s)
    return KLEstimates(np.array(lags), exact, mean, std, iw)


@dataclass
class KLGradients:
    """Each estimator's exact expected gradient (w.r.t. the logits) as a loss term, y ~ α = π_{k−lag},
    unweighted and weighted by the detached π/α, against the gradients of the exact KLs."""

    lags: np.ndarray                    # [L]
    reverse_norm: float                 # ‖∇KL(π ‖ π_ref)‖, the KL the paper writes
    forward_cosine: float               # cos(∇KL(π_ref ‖ π), ∇KL(π ‖ π_ref))
    cosine: dict[str, np.ndarray]       # "k3" / "k3 × π/α" → [L]  cos to ∇KL(π ‖ π_ref) (NaN at norm 0)
    norm: dict[str, np.ndarray]         # same keys → [L]
    gap: dict[str, float]               # the largest distance of each claimed equality (see kl_gradient_study)


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    na, nb = float(a.norm()), float(b.norm())
    return float((a * b).sum()) / (na * nb) if na > 1e-12 and nb > 1e-12 else float("nan")


def kl_gradient_study(trajectory: torch.Tensor, lags: list[int], ref_lag: int) -> KLGradients:
    """π, π_ref and α as in :func:`kl_study`; gradients by :func:`grpo_lab.exact.bandit.kl_expected_gradient`
    (flattened over contexts), the exact KLs' by autograd. ``gap`` holds the largest entry-wise distance of
    each claim: ``k1 = 0``, ``k2 = ∇reverse``, ``k3 = ∇forward`` on-policy, and ``weighted = on-policy`` at
    every lag."""
    pi, pi_ref, alphas = lagged_tables(trajectory, lags, ref_lag)
    logits = pi.log().clone().requires_grad_(True)
    logp = torch.log_softmax(logits, -1)
    (reverse,) = torch.autograd.grad((logp.exp() * (logp - pi_ref.log())).sum(), logits, retain_graph=True)
    (forward,) = torch.autograd.grad((pi_ref * (pi_ref.log() - logp)).sum(), logits)
    on_policy = {kind: kl_expected_gradient(pi, pi_ref, pi, kind) for kind in KL_KINDS}
    cosine: dict[str, list[float]] = {}
    norm: dict[str, list[float]] = {}
    weighted_gap = 0.0
    for alpha in alphas:
        for kind in KL_KINDS:
            for weighted in (False, True):
                grad = kl_expected_gradient(pi, pi_ref, alpha, kind, weighted)
                key = f"{kind} × π/α" if weighted else kind
                cosine.setdefault(key, []).append(_cosine(grad, reverse))
                norm.setdefault(key, []).append(float(grad.norm()))
                if weighted:
                    weighted_gap = max(weighted_gap, float((grad - on_policy[kind]).abs().max()))
    gap = {"k1 = 0": float(on_policy["k1"].abs().max()),
           "k2 = ∇KL(π‖π_ref)": float((on_policy["k2"] - reverse).abs().max()),
           "k3 = ∇KL(π_ref‖π)": float((on_policy["k3"] - forward).abs().max()),
           "weighted = on-policy": weighted_gap}
    return KLGradients(np.array(lags), float(reverse.norm()), _cosine(forward, reverse),
                           {k: np.array(v) for k, v in cosine.items()}, {k: np.array(v) for k, v in norm.items()}, gap)


# ----------------------------------------------------------------------------- §4 Theorem 1 against v

@dataclass
class LagSweep:
    """Means over steps, runs and contexts of Theorem 1's pieces for each sync period v."""

    v: np.ndarray             # [n]
    tv_pi_alpha: np.ndarray   # [n]  TV(π_{k+1}, α)
    tv_pik_alpha: np.ndarray  # [n]  TV(π_k, α)
    bound: np.ndarray         # [n]  Theorem 1's right-hand side
    improvement: np.ndarray   # [n]  J(π_{k+1}) − J(π_k)
    violations: int           # entries (step, run, context) where improvement < bound


def lag_study(problem: BanditProblem, config: GRPOConfig, vs: list[int], runs: int) -> LagSweep:
    """Train with each v (``track_bound=True``) and average the bound's terms."""
    rows = []
    for v in vs:
        r = run_bandit(problem, config.replace(v=v), runs=runs, track_bound=True)
        rows.append((r.tv_pi_alpha.mean(), r.tv_pik_alpha.mean(), r.bound.mean(), r.improvement.mean(),
                     int((r.improvement < r.bound).sum())))
    a, b, c, d, e = zip(*rows, strict=True)
    return LagSweep(np.array(vs), np.array(a), np.array(b), np.array(c), np.array(d), sum(e))


@dataclass
class BoundConstants:
    """Theorem 1 with the paper's constants and with the tight ones, per step, run and context ``[steps, R, C]``:

    ============== ====================================================================
    ``paper``      L_α(π) − 2(1 − σ)/σ · TV(π, α) − 2 TV(π_k, α)  (the theorem as stated)
    ``tight``      L_α(π) − (1 − σ)/σ · TV(π, α) − TV(π_k, α)    (docs/theory.md §4)
    ``ceiling``    TV(π, α) − TV(π_k, α), the most ``tight`` can be for rewards in [0, 1]
    ============== ====================================================================

    with π = π_{k+1}, the policy after step k, and α the sampler's policy at step k."""

    improvement: np.ndarray   # J(π_{k+1}) − J(π_k)
    paper: np.ndarray
    tight: np.ndarray
    ceiling: np.ndarray


def tight_lower_bound(L: Array, sigma: Array, tv_pi_alpha: Array, tv_pik_alpha: Array) -> Array:
    """Theorem 1 with the tight constants (docs/theory.md §4), elementwise (numpy or torch):
    L_α(π) − (1 − σ)/σ · TV(π, α) − TV(π_k, α)."""
    return L - (1 - sigma) / sigma * tv_pi_alpha - tv_pik_alpha


def bound_constants_study(problem: BanditProblem, config: GRPOConfig, runs: int) -> BoundConstants:
    """Train ``runs`` stacked runs through the loop (as :func:`~grpo_lab.exact.bandit.run_bandit` with
    ``track_bound=True``: the same draws) and evaluate both versions of the bound on the exact tables."""
    require_int_at_least("runs", runs, 1)
    rows: dict[str, list[torch.Tensor]] = {"improvement": [], "paper": [], "tight": [], "ceiling": []}
    with single_thread():
        loop = build_bandit_loop(problem, config, runs)
        for _ in range(config.steps):
            pi_k = loop.policy.probs()
            loop.step()
            pi, alpha = loop.policy.probs(), loop.sampler.probs()
            drift_now, drift_before = tv(pi, alpha), tv(pi_k, alpha)
            rows["improvement"].append(true_improvement(pi, pi_k, problem.p))
            rows["paper"].append(improvement_lower_bound(pi, pi_k, alpha, problem.p, config.eps_std))
            L, sigma = surrogate_L(pi, alpha, problem.p, config.eps_std), sigma_alpha(alpha, problem.p, config.eps_std)
            rows["tight"].append(tight_lower_bound(L, sigma, drift_now, drift_before))
            rows["ceiling"].append(drift_now - drift_before)
    return BoundConstants(**{key: torch.stack(values).numpy() for key, values in rows.items()})


# ----------------------------------------------------------------------------- §5 v and i on a timeline

@dataclass(frozen=True)
class TimelineStep:
    """One optimiser step t (θ_t → θ_{t+1}) of a schedule; policies named by the optimiser step whose weights they hold.

    ================= ============================================================================
    ``batch``         which batch it trains on: the kit's step k; TRL's generation g, chunk c
    ``sampler``       a: the batch was sampled by α = θ_a
    ``centre``        c: the clip band is centred on the ratio of θ_c (the kit: r′ = π_k/α,
                      π_k = θ_c; TRL: π_θ/π_old = 1, π_old = θ_c)
    ``clip_can_act``  θ_t ≠ θ_c: the ratio can have left the band; at t = c it sits at its centre
    ``sync``          α ← θ_t happened before this batch was sampled
    ================= ============================================================================
    """

    t: int
    batch: str
    sampler: int
    centre: int
    clip_can_act: bool
    sync: bool

    @property
    def lag(self) -> int:
        """Optimiser steps between the sampler's weights and the weights being trained."""
        return self.t - self.sampler


def kit_timeline(v: int, i: int, steps: int) -> list[TimelineStep]:
    """The kit's Algorithm 1 (docs/theory.md §5): step k samples a fresh batch from α = π_{k0},
    k0 = v·⌊k/v⌋, and makes i optimiser passes on it; the band is centred on r′ = π_k/α."""
    for name, value in (("v", v), ("i", i), ("steps", steps)):
        require_int_at_least(name, value, 1)
    out = []
    for k in range(steps):
        k0 = v * (k // v)
        for p in range(i):
            out.append(TimelineStep(t=k * i + p, batch=f"k={k}", sampler=k0 * i, centre=k * i,
                                    clip_can_act=p > 0, sync=k == k0 and p == 0))
    return out


def trl_timeline(steps_per_generation: int, num_iterations: int, generations: int,
                 gradient_accumulation_steps: int = 1) -> list[TimelineStep]:
    """TRL's ``GRPOTrainer`` (1.16, ``_prepare_inputs``): π_θ is pushed to vLLM before every generation; one
    generation is split into ``steps_per_generation`` micro-batches, S = steps_per_generation /
    ``gradient_accumulation_steps`` optimiser steps, and the S steps are repeated ``num_iterations`` times
    (μ) before the next generation. The ratio is π_θ/π_old with π_old the policy at the generation, clipped
    to [1 − ε, 1 + ε]. When S·μ = 1, TRL sets π_old = π_θ detached: the ratio is 1 and never clipped."""
    for name, value in (("steps_per_generation", steps_per_generation), ("num_iterations", num_iterations),
                        ("generations", generations), ("gradient_accumulation_steps", gradient_accumulation_steps)):
        require_int_at_least(name, value, 1)
    if steps_per_generation % gradient_accumulation_steps:
        raise ValueError(f"steps_per_generation = {steps_per_generation} must be a multiple of "
                         f"gradient_accumulation_steps = {gradient_accumulation_steps}")
    S = steps_per_generation // gradient_accumulation_steps
    out = []
    for g in range(generations):
        start = g * S * num_iterations
        for u in range(S * num_iterations):
            out.append(TimelineStep(t=start + u, batch=f"g={g} c={u % S}", sampler=start, centre=start,
                                    clip_can_act=u > 0, sync=u == 0))
    return out


# ----------------------------------------------------------------------------- §5 the paper's findings

FINDINGS: dict[str, dict[str, object]] = {
    "on-policy, no mask": dict(mask_zero_variance=False),
    "on-policy + mask": {},
    "mask, unmasked normalisation": dict(mask_normalize="unmasked"),
    "v = 10": dict(v=10),
    "sample reuse i = 10": dict(i=10),
    "β = 1, fixed π_ref": dict(beta=1.0),
    "β = 1, π_ref reset every 20": dict(beta=1.0, ref_period=20),
}
"""The configurations compared, as changes to :func:`lab_config` (all with v = 1, i = 1, the mask under
``mask_normalize="batch"`` unless said)."""
LONG_ON_POLICY = "on-policy, 10× the steps"
"""On-policy run with as many optimiser passes as the sample-reuse run."""
MATCHED_LR = "no mask, matched lr"
"""No mask at lr / (1 − mean masked fraction of the ``unmasked`` run): the step size that normalisation gives."""


def run_findings(problem: BanditProblem, config: GRPOConfig, runs: int) -> dict[str, BanditRun]:
    """Run every :data:`FINDINGS` configuration, plus :data:`LONG_ON_POLICY` and :data:`MATCHED_LR`, R runs each."""
    results = {name: run_bandit(problem, config.replace(**changes), runs=runs) for name, changes in FINDINGS.items()}
    results[LONG_ON_POLICY] = run_bandit(problem, config.replace(steps=10 * config.steps), runs=runs)
    kept = 1.0 - float(results["mask, unmasked normalisation"].masked_frac.mean())
    results[MATCHED_LR] = run_bandit(problem, config.replace(mask_zero_variance=False, lr=config.lr / kept), runs=runs)
    return results


OPTIMIZER_SETTINGS: dict[str, dict[str, object]] = {
    "SGD, no clipping": dict(optimizer="sgd", max_grad_norm=None),
    "AdamW, clipped": dict(optimizer="adamw", lr=0.05, max_grad_norm=0.01),
}
"""The bandit's optimiser and the language-model runs' (AdamW, ``max_grad_norm``), as changes to
:func:`lab_config`. The clip is set below every informative step's gradient norm in the bandit, so that every
such step is cut to the same norm, as the language-model configs' ``max_grad_norm = 1`` cuts every step whose
norm exceeds 1 (docs/theory.md §2)."""
MASK_ARMS: dict[str, dict[str, object]] = {
    "mask, batch": {},
    "mask, unmasked": dict(mask_normalize="unmasked"),
    "no mask": dict(mask_zero_variance=False),
    "no mask, empty steps taken": dict(mask_zero_variance=False, empty_step="optimizer_step"),
}
"""The mask's arms: ``empty_step="optimizer_step"`` takes an optimiser step on a batch whose advantages are
all 0, as stock TRL does (docs/theory.md §2)."""


def run_alone(problem: BanditProblem, config: GRPOConfig, runs: int) -> list[BanditRun]:
    """``runs`` runs trained one at a time by the closed-form engine, seeds ``config.seed`` … + runs − 1.

    Stacked runs share one optimiser step: one gradient norm to clip and one decision to skip an empty
    step. Alone, each run clips its own gradient and skips its own empty steps, as one language-model run
    does. (Under SGD without clipping or weight decay the two give the same dynamics.)"""
    require_int_at_least("runs", runs, 1)
    return [run_bandit_closed_form(problem, config.replace(seed=config.seed + n), runs=1) for n in range(runs)]


def train_runs(problem: BanditProblem, config: GRPOConfig, runs: int) -> BanditRun:
    """``runs`` runs of ``config`` as one :class:`BanditRun`: stacked in one optimiser when that leaves each run
    its own dynamics (SGD without clipping or weight decay: a run whose batch is empty gets a zero gradient,
    and a zero gradient moves nothing), else :func:`run_alone` side by side. Merged: ``J`` ``[steps + 1, R]``,
    ``masked_frac`` the mean over runs, ``optimizer_passes`` the mean over runs (rounded), ``grad_norm`` the
    norm of the runs' gradients together, ``lag`` run 0's (every run's under a fixed schedule)."""
    if config.optimizer == "sgd" and config.max_grad_norm is None and config.weight_decay == 0:
        return run_bandit_closed_form(problem, config, runs=runs)
    alone = run_alone(problem, config, runs)
    return BanditRun(config=config, J=np.concatenate([r.J for r in alone], axis=1),
                     masked_frac=np.mean([r.masked_frac for r in alone], axis=0), lag=alone[0].lag,
                     optimizer_passes=np.rint(np.mean([r.optimizer_passes for r in alone], axis=0)).astype(np.int64),
                     grad_norm=np.sqrt(np.sum([r.grad_norm ** 2 for r in alone], axis=0)))


@dataclass
class MaskOptimizerRuns:
    """The mask's arms (:data:`MASK_ARMS`) under each optimiser (:data:`OPTIMIZER_SETTINGS`), runs alone.

    Keys are ``(setting, arm)``; arrays ``[steps (+ 1 for J), R]``."""

    J: dict[tuple[str, str], np.ndarray]
    grad_norm: dict[tuple[str, str], np.ndarray]     # before clipping; 0 on a skipped step
    masked_frac: dict[tuple[str, str], np.ndarray]
    max_grad_norm: dict[str, float | None]

    def max_gap(self, setting: str, a: str, b: str) -> float:
        """max over (step, run) of |J_a − J_b|: 0 when two arms take the same steps."""
        return float(np.abs(self.J[setting, a] - self.J[setting, b]).max())


def mask_optimizer_study(problem: BanditProblem, config: GRPOConfig, runs: int) -> MaskOptimizerRuns:
    """Every arm of :data:`MASK_ARMS` under every setting of :data:`OPTIMIZER_SETTINGS`, ``runs`` runs alone."""
    J, norms, masked, clip = {}, {}, {}, {}
    for setting, optimizer in OPTIMIZER_SETTINGS.items():
        base = config.replace(**optimizer)
        clip[setting] = base.max_grad_norm
        for arm, changes in MASK_ARMS.items():
            alone = run_alone(problem, base.replace(**changes), runs)
            J[setting, arm] = np.concatenate([r.J for r in alone], axis=1)
            norms[setting, arm] = np.stack([r.grad_norm for r in alone], axis=1)
            masked[setting, arm] = np.stack([r.masked_frac for r in alone], axis=1)
    return MaskOptimizerRuns(J, norms, masked, clip)


def final_reward(run: BanditRun) -> tuple[float, float]:
    """Mean and std over runs of J(π_θ) after the last step."""
    return float(run.J[-1].mean()), float(run.J[-1].std())


def reward_at_passes(run: BanditRun, passes: int) -> np.ndarray:
    """J of each run after the first step whose cumulative optimiser passes reach ``passes``, ``[R]``."""
    reached = np.nonzero(run.optimizer_passes >= passes)[0]
    if len(reached) == 0:
        raise ValueError(f"passes = {passes} is more than the run made ({int(run.optimizer_passes[-1])})")
    return run.J[reached[0] + 1]


def mean_grad_norm(run: BanditRun) -> float:
    """Mean gradient norm over the steps that trained: the step size the mask changes."""
    trained = np.diff(run.optimizer_passes, prepend=0) > 0
    return float(np.mean(run.grad_norm[trained]))


# ----------------------------------------------------------------------------- §6 try it yourself

TRIES: dict[str, dict[str, object]] = {
    "baseline": {}, "v = 20": dict(v=20), "β = 0.5, mask": dict(beta=0.5),
    "β = 0.5, no mask": dict(beta=0.5, mask_zero_variance=False),
    "v = 20, multiplicative": dict(v=20, band="multiplicative"),
    "lr = 16, β = 0.2": dict(lr=16.0, beta=0.2), "lr = 16, β = 0": dict(lr=16.0),
    "G = 2": dict(G=2), "G = 2, unmasked": dict(G=2, mask_normalize="unmasked"),
    **{f"AdamW, {norm}": dict(**OPTIMIZER_SETTINGS["AdamW, clipped"], mask_normalize=norm)
       for norm in ("batch", "unmasked")},
    "v = 20, none": dict(v=20, is_correction="none"), "lr = 30, v = 20": dict(lr=30.0, v=20),
    "lr = 30, v = 20, none": dict(lr=30.0, v=20, is_correction="none"),
    "lr = 30, v = 20, truncated": dict(lr=30.0, v=20, is_correction="truncated", is_cap=2.0),
}
"""The panel settings notebook 01 §6 asks about, as changes to :func:`lab_config`, each trained by
:func:`train_runs`."""


@dataclass(frozen=True)
class TryIt:
    """One question of notebook 01 §6: the tries it compares (names in :data:`TRIES`; the learner predicts the
    first's final J) and its answer, written from the trained runs, so that its numbers are this run's."""

    question: str
    tries: tuple[str, ...]
    answer: Callable[[dict[str, BanditRun]], str]


def final_j(runs: dict[str, BanditRun], name: str) -> float:
    """Mean over runs of the try ``name``'s J after its last step."""
    return float(runs[name].J[-1].mean())


def peak_drop(run: BanditRun) -> float:
    """Mean over runs of how far J fell from its peak by the last step."""
    return float((run.J.max(0) - run.J[-1]).mean())


TRY_IT = (
    TryIt("1. v = 20", ("v = 20", "baseline"), lambda r: (
        f"Nothing visible: final J {final_j(r, 'v = 20'):.3f} against {final_j(r, 'baseline'):.3f} on-policy. What "
        "weakens is the guarantee: both TV terms of Theorem 1 grow with v (§4).")),
    TryIt("2. the mask off, β = 0.5", ("β = 0.5, no mask", "β = 0.5, mask", "baseline"), lambda r: (
        f"Barely: the KL term holds both below the baseline ({final_j(r, 'β = 0.5, no mask'):.3f} without the "
        f"mask, {final_j(r, 'β = 0.5, mask'):.3f} with it, {final_j(r, 'baseline'):.3f} at β = 0). Only with "
        "β > 0 can the mask change anything: it removes the pull towards π_ref on masked prompts.")),
    TryIt("3. the multiplicative band, v = 20", ("v = 20, multiplicative", "v = 20"), lambda r: (
        "Not at all: with i = 1 it is the additive band's run, bit for bit (identical curves: "
        f"{np.array_equal(r['v = 20, multiplicative'].J, r['v = 20'].J)}; §2). Raise i to see them differ.")),
    TryIt("4. lr = 16, β = 0.2", ("lr = 16, β = 0.2", "lr = 16, β = 0"), lambda r: (
        f"Faster at first, then unstable: the runs peak and fall back (final {final_j(r, 'lr = 16, β = 0.2'):.3f}, "
        f"{peak_drop(r['lr = 16, β = 0.2']):.3f} below their peak), while lr = 16 with β = 0 ends at "
        f"{final_j(r, 'lr = 16, β = 0'):.3f}, {peak_drop(r['lr = 16, β = 0']):.3f} below its peak. Large steps "
        "against the KL term's pull oscillate.")),
    TryIt("5. G = 2", ("G = 2", "G = 2, unmasked", "baseline"), lambda r: (
        f"A group of two is masked with probability p² + (1 − p)² ≥ ½: {r['G = 2'].masked_frac.mean():.0%} of "
        f"them here. Learning slows ({final_j(r, 'G = 2'):.3f} against {final_j(r, 'baseline'):.3f}); "
        f"`mask_normalize=\"unmasked\"` looks faster ({final_j(r, 'G = 2, unmasked'):.3f}), but that is SGD's "
        "larger step (§5 (a)).")),
    TryIt("6. AdamW, clipped, batch → unmasked", ("AdamW, unmasked", "AdamW, batch"), lambda r: (
        f"The curve hardly moves ({final_j(r, 'AdamW, batch'):.3f} under `batch`, "
        f"{final_j(r, 'AdamW, unmasked'):.3f} under `unmasked`): the clip cuts away the factor 1/(1 − masked "
        "fraction), which under SGD is a larger step (§5 (a′)).")),
    TryIt("7. correction none, v = 20, then lr = 30", ("v = 20, none", "v = 20", "lr = 30, v = 20, none",
                                                       "lr = 30, v = 20", "lr = 30, v = 20, truncated"), lambda r: (
        f"Not on this bandit: at lr = 1 `none` ends at {final_j(r, 'v = 20, none'):.3f}, `ratio` at "
        f"{final_j(r, 'v = 20'):.3f}; at lr = 30 `none` ends at {final_j(r, 'lr = 30, v = 20, none'):.3f}, "
        f"`ratio` at {final_j(r, 'lr = 30, v = 20'):.3f}, `truncated` (C = 2) at "
        f"{final_j(r, 'lr = 30, v = 20, truncated'):.3f}. The weights r′ add variance that costs more than a stale "
        "α's bias on a one-token softmax. On a language model (notebook 02), training without a correction cost J "
        "at v = 10 against `ratio`, but no run without one collapsed; the runs that collapsed, at v = 32, had one "
        "(`ratio` and `truncated`, one seed in five each).")),
)
"""Notebook 01 §6's questions, in its order; :func:`grpo_lab.viz.exercises.answer_tries` prints an answer once
its first try has been predicted."""


# ----------------------------------------------------------------------------- wall clock from a sync-cost model

def lab_cost_model(train_share: float = TRAIN_SHARE) -> StepCostModel:
    """The paper's 7B cost model (≈35.4 s/step at v = 1, ≈26.1 s at v = 10 ⇒ sync ≈ 10.3 s)
    with its non-sync time split into sampling and one optimiser pass by ``train_share``."""
    require_number_in("train_share", train_share, 0.0, 1.0)
    paper = paper_cost_model()
    base = paper.gen + paper.train
    return StepCostModel(gen=base * (1 - train_share), train=base * train_share, sync=paper.sync)


def wall_clock(run: BanditRun, model: StepCostModel) -> np.ndarray:
    """Modelled seconds after each step, ``[steps + 1]``: each step costs
    ``gen + passes · train + sync`` (the sync only on steps that synced, i.e. sync/v on average)."""
    passes = np.diff(run.optimizer_passes, prepend=0)
    synced = (run.lag == 0).astype(float)  # a step syncs exactly when its lag is 0
    return np.concatenate([[0.0], np.cumsum(model.gen + passes * model.train + synced * model.sync)])
