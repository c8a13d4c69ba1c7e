"""Group-relative advantages (docs/theory.md §2): whitening and the zero-variance mask.

The G rewards of one prompt were sampled from the server's policy α, so their
mean and variance estimate μ_α(x) and σ_α(x)²; the advantage of response j is
its reward whitened by those group statistics.
"""

from __future__ import annotations

import torch

from .checks import require_choice, require_int_at_least, require_number_in

EPS_PLACEMENTS = ("under_sqrt", "added_to_std")


def whiten(rewards: torch.Tensor, eps: float = 1e-4, unbiased: bool = False,
           eps_placement: str = "under_sqrt") -> torch.Tensor:
    """Whiten each group's rewards into advantages A_α.

    Equation (docs/theory.md §2, the paper's σ_{α,r,ε})::

        A_α(x, y_j) = (r_j − μ_α(x)) / sqrt(σ_α(x)² + eps)          eps_placement="under_sqrt"
        A(x, y_j)   = (r_j − μ(x))   / (σ(x) + eps)                  eps_placement="added_to_std" (TRL's ε; TRL's σ
                                                                     also divides by G − 1: add unbiased_std=True)

    ====== ========== ==========================================================
    symbol shape      meaning
    ====== ========== ==========================================================
    r      ``[P, G]`` rewards: P prompts, G sampled responses each
    μ      ``[P, 1]`` group mean
    σ²     ``[P, 1]`` group variance: population (/G) by default — the paper's
                      theory uses the variance of the reward under α — or sample
                      (/(G−1)) with ``unbiased=True``
    eps    scalar     ε_std, under the square root by default
    A      ``[P, G]`` advantages (returned)
    ====== ========== ==========================================================

    A group whose rewards all agree gets advantage 0 exactly, by construction, whatever ``eps`` (never NaN):
    its r − μ is set to 0 where :func:`zero_variance_mask` is False. Computed, it need not be 0: the float mean
    of G equal rewards that are not dyadic (0.1, partial format credit) can differ from them in the last bit,
    and that rounding, divided by a σ of the same order, gave −1 per member at ``eps = 0`` (−7.5e-7 at
    ε_std = 1e-4). So such a group carries no gradient at β = 0 with the mask on or off, and
    :func:`grpo_lab.plan.plan_step` sees a step of such groups as empty.
    """
    require_number_in("eps", eps, 0.0)
    require_choice("eps_placement", eps_placement, EPS_PLACEMENTS)
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must have shape [P, G] with G >= 2, got {tuple(rewards.shape)}")
    centred = torch.where(zero_variance_mask(rewards)[:, None], rewards - rewards.mean(dim=1, keepdim=True), 0.0)
    var = rewards.var(dim=1, keepdim=True, unbiased=unbiased)
    scale = (var + eps).sqrt() if eps_placement == "under_sqrt" else var.sqrt() + eps
    safe_scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return centred / safe_scale


def zero_variance_mask(rewards: torch.Tensor) -> torch.Tensor:
    """Mask m(x) = 1[σ(x) ≠ 0] of docs/theory.md §2: which groups carry learning signal.

    ====== ========== =====================================================
    symbol shape      meaning
    ====== ========== =====================================================
    r      ``[P, G]`` rewards of P groups of G responses
    m      ``[P]``    bool, True where the G rewards are not all equal
    ====== ========== =====================================================

    Exact comparison, no tolerance: a group is masked only when every reward
    equals the first (all right or all wrong), where Theorem 1's weight
    (1 − σ)/σ blows up.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape [P, G], got {tuple(rewards.shape)}")
    return (rewards != rewards[:, :1]).any(dim=1)


def masking_probability(p: torch.Tensor | float, G: int) -> torch.Tensor:
    """P(a group of G rewards ~ Bernoulli(p) all agree) = p^G + (1 − p)^G: how often the zero-variance mask,
    which sees G samples and not the true σ, drops a prompt that α solves with probability p
    (docs/theory.md §2). 0.663 at p = 0.05, G = 8."""
    require_int_at_least("G", G, 1)
    p = torch.as_tensor(p, dtype=torch.float64)
    if not bool(((p >= 0) & (p <= 1)).all()):
        raise ValueError(f"p must lie in [0, 1], got {p.tolist()}")
    return p ** G + (1 - p) ** G
