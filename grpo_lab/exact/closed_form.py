"""The bandit's loop with the gradient in closed form: the live panel's engine.

:func:`~grpo_lab.exact.bandit.run_bandit` trains the tabular policy through
:class:`~grpo_lab.loop.GRPOLoop`, the code path of the language models: autograd
through :func:`~grpo_lab.objective.grpo_objective`, a :class:`StepRecord` of
every metric and checks at every step, hundreds of small torch calls a step:
too slow for a slider that re-trains on every change (``benchmarks/bandit_rerun.py``
times both engines; docs/benchmarks.md has the figures).

:func:`run_bandit_closed_form` takes the same steps (the same sampler, task, random
draws, schedules, step plan of :func:`~grpo_lab.plan.plan_step`, clip band and optimiser rule) but writes
∂loss/∂logits by hand and records only the curves (no per-step :class:`StepRecord`). For a softmax table,
∂ log π(y|x) / ∂ logits[x] = onehot(y) − π(·|x), so with

    g_j = ∂loss/∂ log π(y_j|x_j) = w_j · ( −c_j r_j A_j · u_j + β · ∂KL̂_j/∂ log π )
    u_j = 0 if (A_j > 0 and r_j > hi(r′_j)) or (A_j < 0 and r_j < lo(r′_j)), else 1

with r = π_θ/base, r′ = π_k/base and the weight c of ``is_correction``
(:func:`~grpo_lab.objective.is_correction_terms`, called here as in the loop): ``ratio`` base = α,
c = 1; the others base = π_k and c of ρ = π_k/α: min(ρ, C) (``truncated``), ρ inside the band and 0
outside (``mask`` [1/C, C], ``icepop`` [a, C]), 1 (``none``). So at the first pass g_j = −w_j A_j times
r′_j or c_j. The KL weight q = π_θ/base (:func:`~grpo_lab.objective.kl_weight`) makes the KL's slope q·∂KL̂
(``kl_importance_weighted``, detached) or q·(KL̂ + ∂KL̂) (``kl_weight_differentiable``). One-token responses: the
sequence's ratio is the token's, so ``level`` changes nothing here.

The gradient of logits[x] is Σ_{j: x_j = x} g_j (onehot(y_j) − π(·|x)). u is
autograd's rule for min(r A, clamp(r, lo, hi) A): the clamp passes the gradient
inside [lo, hi], bounds included, and the min keeps the smaller branch. At the
first pass r = r′ lies inside the band, so the clip only acts when i > 1.
``tests/test_bandit_closed_form.py`` checks the curves against
:func:`~grpo_lab.exact.bandit.run_bandit` for every knob of the panel and more.
"""

from __future__ import annotations

import numpy as np
import torch

from ..checks import require_int_at_least
from ..config import GRPOConfig
from ..loop import make_optimizer
from ..objective import clip_bounds, is_correction_terms, kl_estimate
from ..plan import ObjectiveArgs, plan_step
from ..schedules import RefResetSchedule, make_sync_schedule
from .bandit import (
    BanditProblem,
    BanditRun,
    BanditTask,
    J,
    LaggedTabularSampler,
    TabularPolicy,
    single_thread,
)


def kl_gradient(d: torch.Tensor, kind: str) -> torch.Tensor:
    """∂KL̂/∂ log π_θ for d = log π_ref − log π_θ (see :func:`~grpo_lab.objective.kl_estimate`):
    k1 = −d → 1;  k2 = d²/2 → −d;  k3 = e^d − d − 1 → −(e^d − 1)."""
    if kind == "k1":
        return torch.ones_like(d)
    if kind == "k2":
        return -d
    return -torch.expm1(d)


def run_bandit_closed_form(problem: BanditProblem, config: GRPOConfig, runs: int = 8) -> BanditRun:
    """:func:`~grpo_lab.exact.bandit.run_bandit` without autograd: the same J curve, masked
    fraction, lag, optimiser passes and gradient norms (``records`` stays empty: everything
    :mod:`grpo_lab.exact.bandit_lab` reads from a run is in these arrays)."""
    require_int_at_least("runs", runs, 1)
    with single_thread(), torch.inference_mode():
        return _run(problem, config, runs)


def _run(problem: BanditProblem, config: GRPOConfig, runs: int) -> BanditRun:
    cfg, P, G, K = config, config.prompts_per_step, config.G, problem.arms
    policy = TabularPolicy(runs, problem.contexts, problem.arms)
    sampler = LaggedTabularSampler(runs, problem.contexts, problem.arms)
    task = BanditTask(problem, runs)
    theta = policy.logits.detach()                    # [R, C, K], the optimiser's tensor: updated in place
    optimizer = make_optimizer(policy.parameters(), cfg) if cfg.optimizer != "sgd" else None
    reference = theta.clone() if cfg.beta > 0 else None
    schedule = make_sync_schedule(cfg.sync, cfg.v, cfg.sync_threshold)
    ref_schedule = RefResetSchedule(cfg.ref_period)
    generator = torch.Generator().manual_seed(cfg.seed)
    group_run = torch.arange(runs).repeat_interleave(P)                # [N]: the run of each of N = R·P groups
    run_ids = group_run.repeat_interleave(G)                           # [N·G]: the run of each draw
    sampled = torch.ones(runs * P * G, 1, dtype=torch.bool)            # one-token completions

    thetas, informative_per_step, lags, passes, grad_norms = [theta.clone()], [], [], [], []
    for k in range(cfg.steps):
        synced = schedule.begin(k)
        if synced:
            sampler.sync(policy)
        prompts = task.prompts(P, generator)                           # [N] contexts
        arms, logp_alpha = sampler.draw(prompts, G, generator)         # [N, G]
        rewards = task.bernoulli(prompts, arms, generator)             # [N, G]
        plan = plan_step(rewards, sampled, cfg, run_ids, dtype=logp_alpha.dtype)
        if synced:
            schedule.mark_synced(k)
        lags.append(schedule.lag(k))

        informative_per_step.append(plan.informative)
        passes.append(cfg.i if plan.trains else 0)
        grad_norm, drift = 0.0, None
        if plan.trains:
            weights = plan.weights.view(-1, G)                         # [N, G], 0 on masked groups
            rows = group_run * problem.contexts + prompts             # [N] rows of the [R·C, K] table
            logp_ref = (torch.log_softmax(reference.view(-1, K).index_select(0, rows), -1).gather(1, arms)
                        if reference is not None else None)
            grad_norm, drift = _train_passes(policy, theta, optimizer, cfg, plan.objective, rows, arms, logp_alpha,
                                             plan.advantages.view(-1, G) * weights, weights, logp_ref)
        schedule.end(plan.observed_drift(drift))
        grad_norms.append(grad_norm)
        if reference is not None and ref_schedule.should_reset(k):
            reference.copy_(theta)
        thetas.append(theta.clone())

    J_curve = J(torch.softmax(torch.stack(thetas), -1), problem.p).mean(-1)              # [steps + 1, R]
    masked_frac = (1.0 - torch.stack(informative_per_step).to(torch.float64).mean(-1) if informative_per_step
                   else torch.zeros(0, dtype=torch.float64))
    return BanditRun(config=cfg, J=J_curve.numpy(), masked_frac=masked_frac.numpy(),
                     lag=np.array(lags, dtype=np.int64), optimizer_passes=np.cumsum(passes, dtype=np.int64),
                     grad_norm=np.array(grad_norms))


def _train_passes(policy: TabularPolicy, theta: torch.Tensor, optimizer: torch.optim.Optimizer | None,
                  cfg: GRPOConfig, objective: ObjectiveArgs, rows: torch.Tensor, arms: torch.Tensor,
                  logp_alpha: torch.Tensor, weighted_advantages: torch.Tensor, weights: torch.Tensor,
                  logp_ref: torch.Tensor | None) -> tuple[float, float | None]:
    """The ``cfg.i`` optimiser passes on one batch; returns the last gradient norm and the drift
    mean |log r′| over the counted draws (None when no draw counts: an empty step that
    ``empty_step="optimizer_step"`` still steps, on a zero gradient).

    ============================ ============ =============================================
    argument                     shape        meaning
    ============================ ============ =============================================
    ``objective``                —            the plan's loss knobs (:class:`~grpo_lab.plan.ObjectiveArgs`)
    ``theta``                    ``[R, C, K]`` the logits table, updated in place
    ``rows``                     ``[N]``      the table row of each group (run · C + context)
    ``arms``, ``logp_alpha``     ``[N, G]``   the sampled arms and their log α
    ``weighted_advantages``      ``[N, G]``   w·A (0 on masked groups)
    ``weights``                  ``[N, G]``   the loss weight w of each draw (``StepPlan.weights``)
    ``logp_ref``                 ``[N, G]``   log π_ref of the arms (None when β = 0)
    ============================ ============ =============================================

    Written in numpy on views of the same memory: on arrays this small numpy's cost per operation
    is below torch's dispatch alone, and i = 10 runs ten passes a step.
    """
    K = theta.shape[-1]
    table = theta.numpy().reshape(-1, K)                              # θ's storage
    rows, arms, logp_alpha = rows.numpy(), arms.numpy(), logp_alpha.numpy()
    minus_wa, positive = -weighted_advantages.numpy(), weighted_advantages.numpy() > 0
    counted = weights.numpy() > 0
    sampled = (rows[:, None] * K + arms).ravel()                      # flat table index of each drawn arm
    row_entries = (rows[:, None] * K + np.arange(K)).ravel()          # flat table index of each row's K logits
    grad_norm, drift = 0.0, None
    for pass_index in range(cfg.i):
        logits = table[rows]                                          # [N, K]
        shifted = logits - logits.max(1, keepdims=True)
        logp_table = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
        logp = np.take_along_axis(logp_table, arms, 1)                # [N, G]
        if pass_index == 0:                                           # π_θ = π_k
            base, correction = is_correction_terms(torch.from_numpy(logp), torch.from_numpy(logp_alpha),
                                                   objective.is_correction, objective.is_cap,
                                                   objective.is_floor)
            base = base.numpy().copy()                                # log α, or log π_k
            minus_cwa = minus_wa if correction is None else correction.numpy() * minus_wa
            low, high = (b.numpy() for b in clip_bounds(torch.from_numpy(np.exp(logp - base)),
                                                        objective.eps_low, objective.eps_high, objective.band))
            # u = 0 where the band clipped r on the side A pushes towards: above hi if A > 0, below lo if not
            upper, lower = np.where(positive, high, np.inf), np.where(positive, -np.inf, low)
            drift = float(np.abs(logp - logp_alpha)[counted].mean()) if counted.any() else None
        ratio = np.exp(logp - base)                                   # r = π_θ/base
        # w·∂(−c·f_ε)/∂ log π = −c·r·w·A·u
        g = np.where((ratio > upper) | (ratio < lower), 0.0, ratio * minus_cwa)
        if logp_ref is not None:
            dkl = kl_gradient(torch.from_numpy(logp_ref.numpy() - logp), objective.kl_kind).numpy()
            if objective.kl_weight_differentiable:       # ∂(q·KL̂)/∂ log π = q·(KL̂ + ∂KL̂), q = π_θ/base
                value = kl_estimate(torch.from_numpy(logp), logp_ref, objective.kl_kind).numpy()
                dkl = ratio * (dkl + value)
            elif objective.kl_importance_weighted:
                dkl = dkl * ratio
            g = g + (objective.beta * weights.numpy()) * dkl
        g = np.where(counted, g, 0.0)                                 # [N, G]
        # Σ_g g_g (onehot(y_g) − π): g added at the drawn arms, (Σ_g g_g)·π taken from the row's K logits
        grad = (np.bincount(sampled, g.ravel(), minlength=table.size)
                - np.bincount(row_entries, (g.sum(1, keepdims=True) * np.exp(logp_table)).ravel(),
                              minlength=table.size))
        grad_norm = _optimizer_step(policy, table, grad, optimizer, cfg)
    return grad_norm, drift


def _optimizer_step(policy: TabularPolicy, table: np.ndarray, grad: np.ndarray,
                    optimizer: torch.optim.Optimizer | None, cfg: GRPOConfig) -> float:
    """Clip like the loop (``clip_grad_norm_``'s rule: × min(max_norm / (‖∇‖ + 1e-6), 1)), then SGD
    written out (θ ← θ − lr·(∇ + wd·θ), ``torch.optim.SGD``'s rule without its per-call overhead) or
    the loop's optimiser (AdamW). ``grad`` is flat, ``table`` θ's ``[R·C, K]`` view. Returns the norm
    before clipping, as the loop records it."""
    norm = float(np.sqrt(grad @ grad))
    if cfg.max_grad_norm is not None:
        grad *= min(cfg.max_grad_norm / (norm + 1e-6), 1.0)
    if optimizer is None:
        table -= cfg.lr * (grad + cfg.weight_decay * table.ravel() if cfg.weight_decay else grad).reshape(table.shape)
    else:
        policy.logits.grad = torch.from_numpy(grad.reshape(policy.logits.shape))
        optimizer.step()
    return norm
