"""The rules of one step (docs/theory.md §2, §3, §5), written once for every driver.

:class:`~grpo_lab.loop.GRPOLoop`, the closed-form bandit engine (:mod:`grpo_lab.exact.closed_form`)
and the TRL adapter (:mod:`grpo_lab.scale.trl`) each call :func:`plan_step` on a step's rewards and
sampled tokens, before any forward pass, and act on what it decides: the advantages A_α, the
zero-variance mask m(x), the token weights w of the loss, whether the optimiser steps at all
(``GRPOConfig.empty_step``), what the sync schedule is told of the step's drift
(:meth:`StepPlan.observed_drift`), and the loss's knobs, resolved once (:class:`ObjectiveArgs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .advantages import whiten, zero_variance_mask
from .checks import require_reward_groups
from .config import GRPOConfig
from .objective import clip_widths, correction_level, loss_weights


@dataclass(frozen=True)
class ObjectiveArgs:
    """The knobs of :func:`~grpo_lab.objective.grpo_objective`, resolved from a config once
    (``eps_high`` None → ε_low, :func:`~grpo_lab.objective.clip_widths`; ``is_level`` None → ``level``,
    :func:`~grpo_lab.objective.correction_level`): every driver passes them whole,
    ``grpo_objective(…, **plan.objective.kwargs())``, so none spells them out again."""

    beta: float
    eps_low: float
    eps_high: float
    band: str
    kl_kind: str
    kl_importance_weighted: bool
    kl_weight_differentiable: bool
    level: str
    is_correction: str
    is_cap: float
    is_floor: float | None
    is_level: str

    @classmethod
    def of(cls, config: GRPOConfig) -> ObjectiveArgs:
        eps_low, eps_high = clip_widths(config.eps_low, config.eps_high)
        return cls(beta=config.beta, eps_low=eps_low, eps_high=eps_high, band=config.band, kl_kind=config.kl_kind,
                   kl_importance_weighted=config.kl_importance_weighted,
                   kl_weight_differentiable=config.kl_weight_differentiable, level=config.level,
                   is_correction=config.is_correction, is_cap=config.is_cap, is_floor=config.is_floor,
                   is_level=correction_level(config.is_correction, config.level, config.is_level))

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``grpo_objective``."""
        return dict(vars(self))


@dataclass(frozen=True, eq=False)
class StepPlan:
    """What one step trains on and whether it trains, decided from rewards and sampled tokens alone.

    ================ ========== ===============================================================
    field            shape      meaning
    ================ ========== ===============================================================
    ``advantages``   ``[B]``    A_α, rewards whitened per group; rows prompt-major (b = p·G + g)
    ``informative``  ``[P]``    m(x) = 1[σ(x) ≠ 0]: the group's G rewards do not all agree
    ``keep``         ``[P]``    groups in the loss: ``informative`` with the mask on, else all
    ``mask``         ``[B, T]`` counted tokens: sampled tokens of kept groups
    ``weights``      ``[B, T]`` w of :func:`~grpo_lab.objective.loss_weights`, 0 off ``mask``:
                                the loss is Σ w·(−f_ε + β·KL̂) (``loss_type``, ``mask_normalize``)
    ``masked_frac``  float      1 − mean m(x): measured with the mask on or off
    ``empty``        bool       no counted token carries a gradient: none is counted, or β = 0
                                and A = 0 on every counted row
    ``trains``       bool       the optimiser steps: not ``empty``, or ``empty_step="optimizer_step"``;
                                with ``empty_step="skip_kl_only"``: some counted row has A ≠ 0
    ``objective``    —          the loss's knobs, resolved (:class:`ObjectiveArgs`)
    ================ ========== ===============================================================

    With stacked runs (``run_ids``) each run is normalised alone, but ``empty`` and ``trains`` are
    the batch's: the runs share one optimiser step.
    """

    advantages: torch.Tensor
    informative: torch.Tensor
    keep: torch.Tensor
    mask: torch.Tensor
    weights: torch.Tensor
    masked_frac: float
    empty: bool
    trains: bool
    objective: ObjectiveArgs

    @property
    def skipped(self) -> bool:
        """No optimiser step: the step is recorded as ``skipped``."""
        return not self.trains

    def observed_drift(self, drift: float | None) -> float | None:
        """What the sync schedule's ``end`` is told: the drift the step measured over its counted
        tokens if it trained on any, else None (it measured nothing; the schedule keeps what it saw
        before). The one rule of every driver."""
        return drift if self.trains and bool(self.mask.any()) else None


def plan_step(rewards: torch.Tensor, sampled_mask: torch.Tensor, config: GRPOConfig,
              run_ids: torch.Tensor | None = None, *, dtype: torch.dtype = torch.float32) -> StepPlan:
    """The :class:`StepPlan` of one batch (docs/theory.md §2–§3, §5).

    ================ ========== ===============================================================
    argument         shape      meaning
    ================ ========== ===============================================================
    ``rewards``      ``[P, G]`` rewards in [0, 1] of P groups of G completions
    ``sampled_mask`` ``[B, T]`` the tokens α sampled (padding False), B = P·G, rows prompt-major
    ``config``       —          reads ``eps_std``, ``unbiased_std``, ``eps_placement``,
                                ``mask_zero_variance``, ``mask_normalize``, ``loss_type``,
                                ``max_completion_length``, ``beta``, ``empty_step`` (P, G from ``rewards``),
                                the loss's knobs (:meth:`ObjectiveArgs.of`)
    ``run_ids``      ``[B]``    optional: stacked independent runs, each normalised alone
    ``dtype``        —          of ``weights`` (the dtype of the loss they weight)
    ================ ========== ===============================================================

    Data parallelism: pass the rewards and sampled tokens gathered over every process; each
    process then takes its rows of ``advantages`` and ``weights`` (and scales the weights by
    the number of processes where the gradients are averaged).
    """
    rewards = require_reward_groups(rewards)
    P, G = rewards.shape
    if sampled_mask.dim() != 2 or sampled_mask.shape[0] != P * G:
        raise ValueError(f"sampled_mask must have shape [B, T] with B = P·G = {P * G}, "
                         f"got {tuple(sampled_mask.shape)}")
    if run_ids is not None and tuple(run_ids.shape) != (P * G,):
        raise ValueError(f"run_ids must have shape [B] = [{P * G}], got {tuple(run_ids.shape)}")
    advantages = whiten(rewards, config.eps_std, config.unbiased_std, config.eps_placement).reshape(-1)
    informative = zero_variance_mask(rewards)
    keep = informative if config.mask_zero_variance else torch.ones_like(informative)
    sampled = sampled_mask.bool()
    mask = sampled & keep.to(sampled.device).repeat_interleave(G)[:, None]
    weights = loss_weights(mask, config.loss_type, config.max_completion_length, run_ids, dtype,
                           sampled if config.mask_normalize == "batch" else None)
    counted_rows = mask.any(dim=1).to(advantages.device)
    carries_gradient = counted_rows if config.beta > 0 else counted_rows & (advantages != 0)
    empty = not bool(carries_gradient.any())
    if config.empty_step == "skip_kl_only":  # a step whose only gradient is the KL's is empty too
        trains = bool((counted_rows & (advantages != 0)).any())
    else:
        trains = not empty or config.empty_step == "optimizer_step"
    return StepPlan(advantages=advantages, informative=informative, keep=keep, mask=mask, weights=weights,
                    masked_frac=1.0 - float(informative.sum()) / P, empty=empty, trains=trains,
                    objective=ObjectiveArgs.of(config))
