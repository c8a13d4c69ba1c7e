"""The bandit's loop with the gradient in closed form: the live panel's engine.

:func:`~grpo_lab.bandit.run_bandit` trains the tabular policy through
:class:`~grpo_lab.loop.GRPOLoop`, the code path of the language models: autograd
through :func:`~grpo_lab.objective.grpo_objective`, a :class:`StepRecord` of
every metric and checks at every step, hundreds of small torch calls a step.
A 300 × 8 re-run then takes 0.5-1 s on a 2-core CPU: too slow for a slider.

:func:`run_bandit_closed_form` takes the same steps (the same sampler, task, random
draws, schedules, whitening, mask, clip band and optimiser rule) but writes
∂loss/∂logits by hand and records only the curves. For a softmax table,
∂ log π(y|x) / ∂ logits[x] = onehot(y) − π(·|x), so with

    g_j = ∂loss/∂ log π(y_j|x_j) = w_j · ( −r_j A_j · u_j + β · ∂KL̂_j/∂ log π )
    u_j = 0 if (A_j > 0 and r_j > hi(r′_j)) or (A_j < 0 and r_j < lo(r′_j)), else 1

the gradient of logits[x] is Σ_{j: x_j = x} g_j (onehot(y_j) − π(·|x)). u is
autograd's rule for min(r A, clamp(r, lo, hi) A): the clamp passes the gradient
inside [lo, hi], bounds included, and the min keeps the smaller branch. At the
first pass r = r′ lies inside the band, so the clip only acts when i > 1.
``tests/test_bandit_closed_form.py`` checks the curves against
:func:`~grpo_lab.bandit.run_bandit` for every knob of the panel and more.
"""

from __future__ import annotations

import numpy as np
import torch

from .advantages import whiten, zero_variance_mask
from .bandit import (
    BanditProblem,
    BanditRun,
    BanditTask,
    J,
    LaggedTabularSampler,
    TabularPolicy,
    single_thread,
)
from .checks import require_int_at_least
from .config import GRPOConfig
from .loop import make_optimizer, make_sync_schedule
from .objective import clip_bounds
from .schedules import RefResetSchedule


def kl_gradient(d: torch.Tensor, kind: str) -> torch.Tensor:
    """∂KL̂/∂ log π_θ for d = log π_ref − log π_θ (see :func:`~grpo_lab.objective.kl_estimate`):
    k1 = −d → 1;  k2 = d²/2 → −d;  k3 = e^d − d − 1 → −(e^d − 1)."""
    if kind == "k1":
        return torch.ones_like(d)
    if kind == "k2":
        return -d
    return -torch.expm1(d)


def run_bandit_closed_form(problem: BanditProblem, config: GRPOConfig, runs: int = 8) -> BanditRun:
    """:func:`~grpo_lab.bandit.run_bandit` without autograd: the same J curve, masked
    fraction, lag and optimiser passes (``records`` stays empty)."""
    require_int_at_least("runs", runs, 1)
    with single_thread(), torch.inference_mode():
        return _run(problem, config, runs)


def sequence_weights(keep: torch.Tensor, runs: int, config: GRPOConfig) -> torch.Tensor:
    """:func:`~grpo_lab.objective.loss_weights` for one-token completions, per group ``[R·P, 1]``:
    0 on masked groups, else 1 / (sequences in the run's denominator: all P·G under
    ``mask_normalize="batch"``, the kept ones under ``"unmasked"``), times 1 / ``max_completion_length``
    for ``dr_grpo`` (every ``loss_type`` divides by the counted sequences when T = 1)."""
    per_run = keep.view(runs, -1)
    counted = torch.ones_like(per_run) if config.mask_normalize == "batch" else per_run
    kept = counted.sum(1, keepdim=True).to(torch.float64) * config.G     # [R, 1]
    if config.loss_type == "dr_grpo" and config.max_completion_length is not None:
        kept = kept * config.max_completion_length
    return (per_run / kept.clamp(min=1.0)).view(-1, 1)


def _run(problem: BanditProblem, config: GRPOConfig, runs: int) -> BanditRun:
    cfg, P, G, K = config, config.prompts_per_step, config.G, problem.arms
    policy = TabularPolicy(runs, problem.contexts, problem.arms)
    sampler = LaggedTabularSampler(runs, problem.contexts, problem.arms)
    task = BanditTask(problem, runs)
    theta = policy.logits.detach()                    # [R, C, K], the optimiser's tensor: updated in place
    optimizer = make_optimizer(policy.parameters(), cfg) if cfg.optimizer != "sgd" else None
    reference = theta.clone() if cfg.beta > 0 else None
    schedule = make_sync_schedule(cfg)
    ref_schedule = RefResetSchedule(cfg.ref_period)
    generator = torch.Generator().manual_seed(cfg.seed)
    eps_high = cfg.eps_low if cfg.eps_high is None else cfg.eps_high
    group_run = torch.arange(runs).repeat_interleave(P)                # [N]: the run of each of N = R·P groups

    thetas, informative_per_step, lags, passes = [theta.clone()], [], [], []
    for k in range(cfg.steps):
        synced = schedule.should_sync(k)
        if synced:
            sampler.sync(policy)
        lags.append(0 if synced else k - schedule.last_sync)
        prompts = task.prompts(P, generator)                           # [N] contexts
        arms, logp_alpha = sampler.draw(prompts, G, generator)         # [N, G]
        rewards = task.bernoulli(prompts, arms, generator)             # [N, G]
        if synced:
            schedule.mark_synced(k)

        informative = zero_variance_mask(rewards)                      # [N]
        informative_per_step.append(informative)
        keep = informative if cfg.mask_zero_variance else torch.ones_like(informative)
        trained = bool(keep.any())
        passes.append(cfg.i if trained else 0)
        if trained:
            weights = sequence_weights(keep, runs, cfg)                # [N, 1], 0 on masked groups
            counted = (weights > 0).expand(-1, G)
            weighted_advantages = whiten(rewards, cfg.eps_std, cfg.unbiased_std, cfg.eps_placement) * weights
            positive = weighted_advantages > 0
            rows = group_run * problem.contexts + prompts             # [N] rows of the [R·C, K] table
            logp_ref = (torch.log_softmax(reference.view(-1, K).index_select(0, rows), -1).gather(1, arms)
                        if reference is not None else None)
            for pass_index in range(cfg.i):
                logp_table = torch.log_softmax(theta.view(-1, K).index_select(0, rows), -1)   # [N, K]
                logp = logp_table.gather(1, arms)                                          # [N, G]
                log_ratio = logp - logp_alpha
                ratio = torch.exp(log_ratio)                                               # r = π_θ/α
                if pass_index == 0:                                                        # π_θ = π_k: r′ = r
                    low, high = clip_bounds(ratio, cfg.eps_low, eps_high, cfg.band)
                    log_ratio_k = log_ratio
                # w·∂(−f_ε)/∂ log π = −r·w·A·u  (u = 0: the band clipped r on the side A pushes towards)
                clipped = torch.where(positive, ratio > high, ratio < low)
                g = torch.where(clipped, 0.0, -ratio * weighted_advantages)
                if logp_ref is not None:
                    dkl = kl_gradient(logp_ref - logp, cfg.kl_kind)
                    g = g + (cfg.beta * weights) * (dkl * ratio if cfg.kl_importance_weighted else dkl)
                g = torch.where(counted, g, 0.0)                                           # [N, G]
                # Σ_g g_g (onehot(y_g) − π): g scattered onto the sampled arms, minus (Σ_g g_g)·π
                row_grad = (torch.zeros_like(logp_table).scatter_add_(1, arms, g)
                            - g.sum(1, keepdim=True) * logp_table.exp())
                grad = torch.zeros_like(theta)
                grad.view(-1, K).index_add_(0, rows, row_grad)
                _optimizer_step(policy, theta, grad, optimizer, cfg)
            if cfg.sync == "adaptive":
                schedule.observe(float(log_ratio_k.abs()[counted].mean()))
        if reference is not None and ref_schedule.should_reset(k):
            reference.copy_(theta)
        thetas.append(theta.clone())

    J_curve = J(torch.softmax(torch.stack(thetas), -1), problem.p).mean(-1)              # [steps + 1, R]
    masked_frac = (1.0 - torch.stack(informative_per_step).to(torch.float64).mean(-1) if informative_per_step
                   else torch.zeros(0, dtype=torch.float64))
    return BanditRun(config=cfg, J=J_curve.numpy(), masked_frac=masked_frac.numpy(),
                     lag=np.array(lags, dtype=np.int64), optimizer_passes=np.cumsum(passes, dtype=np.int64))


def _optimizer_step(policy: TabularPolicy, theta: torch.Tensor, grad: torch.Tensor,
                    optimizer: torch.optim.Optimizer | None, cfg: GRPOConfig) -> None:
    """Clip like the loop, then SGD written out (θ ← θ − lr·(∇ + wd·θ), torch.optim.SGD's rule
    without its per-call overhead) or the loop's optimiser (AdamW)."""
    policy.logits.grad = grad
    if cfg.max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_([policy.logits], cfg.max_grad_norm)  # scales grad in place
    if optimizer is None:
        theta.add_(grad.add(theta, alpha=cfg.weight_decay) if cfg.weight_decay else grad, alpha=-cfg.lr)
    else:
        optimizer.step()
