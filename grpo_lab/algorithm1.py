"""Algorithm 1 on one page: one off-policy GRPO step at the paper's defaults (docs/theory.md §2–§5).

Read this first. :meth:`GRPOLoop.step <grpo_lab.loop.GRPOLoop.step>` computes the same step, and
``tests/test_algorithm1.py`` checks that the two give the same loss, gradients and update on the bandit and on
language models. The loop adds what a real run needs: micro-batches, the sync audit, metrics, resumable state,
interrupts held until a step is whole, and every other knob of :class:`~grpo_lab.config.GRPOConfig`.

Step k, equation → code::

    if k % v == 0: α ← π_θ                                    sampler.sync(policy): α changes only here
    P prompts x; G completions y ~ α(·|x) each, with log α    task.prompts, sampler.sample
    rewards r(x, y) in [0, 1]                                 task.rewards
    A_α(x, y_j) = (r_j − μ_α(x)) / sqrt(σ_α(x)² + ε_std)      whiten (σ² over the G rewards, ε_std under the root)
    m(x) = 1[σ_α(x) ≠ 0]; every m(x) = 0: skip the step       zero_variance_mask
    w_{b,t} = m(x_b) / (L_b · B)                              loss_weights: mean over each completion's L_b
                                                              tokens, then over all B completions
    log π_k = log π_θ before the first pass                   no gradient: fixed for the whole step
    repeat i times:
        r = π_θ/α,  r′ = π_k/α                                per token, inside clipped_surrogate
        f_ε(r, r′, A) = min(r·A, clip(r, max(r′ − ε, 0), r′ + ε)·A)       clipped_surrogate
        KL ≈ k3 = exp(d) − d − 1,  d = log π_ref − log π_θ   kl_estimate (β > 0 only)
        loss = Σ_{b,t} w_{b,t} · (−f_ε + β·k3)  = −(L^c_α − β·KL)          weighted_sum
        θ ← θ − optimiser step on ∇_θ loss                   optimizer_step: AdamW, gradient norm clipped

π_ref stays fixed (the paper's default; the loop's ``ref_period`` resets it).

========= =========== ====================== ==============================================================
symbol    shape       code                   meaning
========= =========== ====================== ==============================================================
G         int         ``config.G``           completions sampled per prompt (a group)
P         int         ``prompts_per_step``   prompts per step; B = P·G rows, prompt-major (b = p·G + g)
T         int         —                      completion tokens, padded (1 for the bandit: one arm)
v         int         ``config.v``           sync period: α ← π_θ when k % v == 0, so α = π_{v⌊k/v⌋}
i         int         ``config.i``           optimiser passes over each batch (i > 1: sample reuse)
ε         float       ``config.eps_low``     clip half-width around r′
β         float       ``config.beta``        weight of the KL to π_ref (0: no reference at all)
ε_std     float       ``config.eps_std``     under the root of the whitening
α         —           ``sampler``            the inference server's (lagged) policy; log α ``[B, T]``
π_θ       —           ``policy``             the policy being trained; ``logp`` ``[B, T]`` has gradient
π_k       —           ``logp_k``             π_θ at the start of step k, ``[B, T]``, detached
π_ref     —           ``reference``          the KL anchor; ``logp_ref`` ``[B, T]``, no gradient
r(x, y)   ``[P, G]``  ``rewards``            one reward per completion
A         ``[B, 1]``  ``A``                  A_α, broadcast over the tokens of a completion
m         ``[P]``     ``m``                  zero-variance mask: the group's rewards do not all agree
w         ``[B, T]``  ``w``                  token weights (0 on padding and on masked groups)
r, r′     ``[B, T]``  in ``f``               π_θ/α (with gradient) and π_k/α (without)
f_ε       ``[B, T]``  ``f``                  the clipped surrogate, maximised
========= =========== ====================== ==============================================================

A run (what :class:`~grpo_lab.loop.GRPOLoop` holds)::

    optimizer = make_optimizer(policy.parameters(), config)
    reference = copy.deepcopy(policy).requires_grad_(False) if config.beta > 0 else None
    generator = torch.Generator().manual_seed(config.seed)
    for k in range(config.steps):
        losses = off_policy_step(k, policy, sampler, task, reference, optimizer, generator, config)
"""

from __future__ import annotations

import torch

from .advantages import whiten, zero_variance_mask
from .config import GRPOConfig
from .loop import optimizer_step
from .objective import clipped_surrogate, kl_estimate, loss_weights, weighted_sum
from .protocols import Policy, Sampler, Task

FIXED_KNOBS = ("sync", "eps_high", "band", "kl_kind", "kl_importance_weighted", "kl_weight_differentiable",
               "ref_period", "eps_placement", "unbiased_std", "mask_zero_variance", "mask_normalize", "empty_step",
               "loss_type", "level", "is_correction")
"""The knobs this page writes out at their defaults, the paper's choices; :class:`~grpo_lab.loop.GRPOLoop` reads
them."""


def off_policy_step(k: int, policy: Policy, sampler: Sampler, task: Task, reference: Policy | None,
                    optimizer: torch.optim.Optimizer, generator: torch.Generator, config: GRPOConfig) -> list[float]:
    """Step k of Algorithm 1 (module docstring): the loss of each of the i passes, or [] for a skipped step
    (every group masked: no optimiser step). ``reference`` is π_ref, None when β = 0."""
    require_paper_defaults(config, reference)
    if k % config.v == 0:                                                    # sync: α ← π_θ
        sampler.sync(policy)
    prompts = task.prompts(config.prompts_per_step, generator)
    rollout = sampler.sample(prompts, config.G, generator)                  # G completions per prompt, log α
    rewards = task.rewards(rollout, generator)                              # r(x, y) [P, G]

    A = whiten(rewards, config.eps_std).reshape(-1, 1).to(rollout.logp_alpha)   # A_α [B, 1], ε_std under the root
    m = zero_variance_mask(rewards).to(rollout.mask.device)                 # m(x) [P]
    if not m.any():
        return []
    counted = rollout.mask & m.repeat_interleave(config.G)[:, None]         # tokens of kept groups [B, T]
    w = loss_weights(counted, "grpo", dtype=rollout.logp_alpha.dtype, denominator_mask=rollout.mask)  # 1/(L_b·B)

    everything = slice(None)
    logp_ref = None
    if reference is not None:
        with torch.no_grad():
            logp_ref = reference.logprobs(rollout, everything)              # log π_ref [B, T]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    losses = []
    for pass_index in range(config.i):
        optimizer.zero_grad(set_to_none=True)
        logp = policy.logprobs(rollout, everything)                         # log π_θ [B, T], with gradient
        if pass_index == 0:
            logp_k = logp.detach()                                          # log π_k: π_θ before any pass
        f = clipped_surrogate(logp, logp_k, rollout.logp_alpha, A, config.eps_low)   # f_ε(r, r′, A)
        per_token = -f if logp_ref is None else -f + config.beta * kl_estimate(logp, logp_ref, "k3")
        loss = weighted_sum(per_token, w)                                   # −(L^c_α − β·KL)
        loss.backward()
        optimizer_step(optimizer, params, config, policy.named_parameters, f"at step {k}, pass {pass_index}")
        losses.append(float(loss.detach()))
    return losses


def require_paper_defaults(config: GRPOConfig, reference: Policy | None) -> None:
    """Raise, naming them, if ``config`` moves a knob of :data:`FIXED_KNOBS` from its default, or if
    ``reference`` is not given exactly when β > 0."""
    default = GRPOConfig()
    changed = {name: getattr(config, name) for name in FIXED_KNOBS if getattr(config, name) != getattr(default, name)}
    if changed:
        raise ValueError(f"off_policy_step runs the paper's defaults; GRPOLoop runs these knobs: {changed}")
    if (config.beta > 0) != (reference is not None):
        raise ValueError(f"beta = {config.beta} needs a reference policy π_ref exactly when beta > 0, "
                         f"got reference = {type(reference).__name__}")
