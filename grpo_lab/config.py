"""One config for the (v, i) loop. Every field is a knob of docs/theory.md §2–§5, named by
its symbol there; the TRL name is given where the concept is TRL's."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from .advantages import EPS_PLACEMENTS
from .checks import require_choice, require_int_at_least, require_number_in
from .objective import (
    BANDS,
    IS_CORRECTIONS,
    KL_KINDS,
    LEVELS,
    LOSS_TYPES,
    MASK_NORMALIZATIONS,
    correction_level,
    require_is_floor,
)
from .schedules import SYNC_MODES

SMOKE_ENV = "GRPO_LAB_SMOKE"
FULL_ENV = "GRPO_LAB_FULL"
OPTIMIZERS = ("adamw", "sgd")
EMPTY_STEPS = ("skip", "optimizer_step", "skip_kl_only", "skip_after_backward")
RESUME_FREE_FIELDS = ("micro_batch_size", "steps", "output_dir", "checkpoint_every")
"""Fields a resumed run may change: they set how far to go, in what pieces and where and how often it saves,
not what any step computes (the memory guard may pick a different ``micro_batch_size`` on another machine;
a run folder may be moved)."""


@dataclass
class GRPOConfig:
    """Hyper-parameters of Algorithm 1 (docs/theory.md §5); validated on construction."""

    G: int = 8
    """Group size: responses sampled per prompt (TRL ``num_generations``)."""
    prompts_per_step: int = 8
    """P, prompts drawn per step; a step's batch is P·G sequences."""
    v: int = 1
    """Sync period: α ← π_θ at every step k with k % v == 0; the lag k − k0 runs 0…v−1.
    With ``sync="adaptive"`` it is the longest lag allowed."""
    i: int = 1
    """Optimiser passes over each batch (TRL ``num_iterations``). i > 1 is sample reuse."""
    sync: str = "fixed"
    """``fixed`` (every v steps) or ``adaptive`` (when drift > ``sync_threshold``, and at least every v)."""
    sync_threshold: float = 0.05
    """Adaptive sync: mean |log π_k − log α| above which the next step syncs."""
    eps_low: float = 0.2
    """ε_low, lower clip half-width (TRL ``epsilon``)."""
    eps_high: float | None = None
    """ε_high, upper clip half-width; None means ε_high = ε_low (DAPO uses 0.28)."""
    band: str = "additive"
    """Clip interval around r′: ``additive`` [max(r′−ε,0), r′+ε] (paper) or ``multiplicative`` r′(1±ε) (TRL's
    formula, when its weight is a token's r′: docs/theory.md §3)."""
    beta: float = 0.0
    """β, weight of KL(π_θ ‖ π_ref). 0 keeps no reference model at all (TRL ``beta``)."""
    kl_kind: str = "k3"
    """KL estimator per token: ``k1``, ``k2`` or ``k3``."""
    kl_importance_weighted: bool = False
    """Weight each KL estimate by the detached π_θ/base, base the ratios' denominator of ``is_correction``
    (docs/theory.md §3, *KL from lagged samples*). Under ``is_correction="ratio"`` base = α, so for one-token
    responses the weight undoes the bias of sampling from α: value and gradient are each estimator's on-policy
    ones (k3's gradient stays the forward KL's). Under ``truncated`` and ``none`` base = π_k, so the weight is
    π_θ/π_k and the KL stays α-biased at lag > 0. On sequences it corrects each token given its prefix only."""
    kl_weight_differentiable: bool = False
    """Weight each KL estimate by π_θ/base *with* its gradient (TRL's ``use_bias_correction_kl``, True by default
    in TRL 1.16: its k3 times the non-detached ``coef_1``). Implies the weight, whatever
    ``kl_importance_weighted``. The loss term's gradient is then (π_θ/base)·(k + ∂k/∂log π)·∇log π; with base = α
    (``is_correction="ratio"``) its expectation is ∇E_{π_θ}[k], the gradient of the value the estimator
    estimates: ∇KL(π_θ ‖ π_ref), the *reverse* KL, for k1 and k3 (for k2 the gradient of its second-order value).
    It changes the gradient even on-policy, where the weight's value is 1. Under ``truncated`` and ``none`` base
    = π_k, exact only at lag 0. The weight is per token at either ``level``. TRL's is π_θ/π_old, one per sequence
    under ``importance_sampling_level="sequence"``: the kit's only per token and off ``ratio`` (base π_k = π_old),
    so at β > 0 a stock ``GRPOTrainer`` computes the kit's KL term only there (docs/theory.md §3)."""
    ref_period: int = 0
    """Reset π_ref ← π_θ after every ``ref_period`` steps; 0 = never (TRL ``ref_model_sync_steps``)."""
    eps_std: float = 1e-4
    """ε_std in the whitening sqrt(σ² + ε_std)."""
    unbiased_std: bool = False
    """Whitening variance: population /G (False, the paper's theory) or sample /(G−1)."""
    eps_placement: str = "under_sqrt"
    """``under_sqrt`` (paper) or ``added_to_std`` (TRL's std + ε; TRL's std also divides by G − 1, ``unbiased_std``)."""
    mask_zero_variance: bool = True
    """Drop groups whose G rewards all agree (m(x) = 1[σ ≠ 0]) from the loss's terms."""
    mask_normalize: str = "batch"
    """What the loss divides by when groups are masked (docs/theory.md §2). ``batch`` (default, the
    paper's E_x[m(x)·(L^c − β·KL)]): masked groups stay in the denominator as zero terms, so the
    step size does not depend on how many groups happen to be masked. ``unmasked``: they leave
    it, which multiplies the gradient by 1/(1 − masked fraction). With β = 0, masked groups have
    A = 0 and contribute no gradient anyway, so under ``batch`` the mask leaves each step's gradient
    unchanged. What the factor of ``unmasked`` does depends on the optimiser: under SGD without
    clipping it scales the step (a larger effective learning rate); once ``max_grad_norm`` cuts the
    gradient, it changes nothing (notebook 01 §5 (a) and (a′) show both)."""
    empty_step: str = "skip"
    """What a step with no signal does (docs/theory.md §2): no counted token, or β = 0 and every counted
    advantage 0 (every group masked, or with the mask off every group's rewards agree). ``skip``
    (default): no optimiser step, recorded as ``skipped``. ``optimizer_step`` (TRL's behaviour): the
    optimiser steps on the zero gradient, so AdamW's momentum and weight decay still move θ.
    ``skip_kl_only``: also skip a step whose only gradient is the KL's (β > 0 with the mask off and every
    group's rewards agreeing), so a run without the mask takes the optimiser steps the masked run takes
    (the frontier study's mask arms compare the mask, not the count of AdamW steps).
    ``skip_after_backward``: as ``skip``, but :class:`~grpo_lab.loop.GRPOLoop` first runs the forward and
    backward of every row, as a trained step would, and drops the gradients: θ and the optimiser's state end as
    under ``skip``, at the cost of a trainer that backpropagates every batch (TRL's; issue 38 measures what
    skipping that compute buys). Other drivers treat it as ``skip``."""
    loss_type: str = "grpo"
    """Token aggregation: ``grpo``, ``bnpo``, ``dapo`` or ``dr_grpo`` (TRL ``loss_type``). ``bnpo`` and ``dapo``
    both divide by the whole batch's token count, TRL's ``dapo`` (its default); TRL's ``bnpo`` divides per
    micro-batch. ``dr_grpo`` is Dr. GRPO's aggregation only, with the whitened advantage (docs/theory.md §3)."""
    level: str = "token"
    """The clipped importance ratio per ``token`` or per ``sequence`` (GSPO; TRL ``importance_sampling_level``).
    Unless ``is_level`` sets it apart, also the level of the correction's weight c: at ``sequence`` one per
    sequence, of the whole-sequence ratio Π_t π_k/α (TRL's ``sequence_*`` modes)."""
    is_correction: str = "ratio"
    """How the surrogate corrects for sampling from α (docs/theory.md §3, *The correction knob*), ρ = r′ = π_k/α
    (per token, or per sequence at ``is_level="sequence"``, by default ``level``'s): ``ratio`` (the paper)
    r = π_θ/α with the band around r′; the others weight PPO's clipped surrogate of π_θ/π_k by c: ``truncated``
    c = min(ρ, C) (truncated importance sampling, TRL ``vllm_importance_sampling_mode="token_truncate"`` /
    ``"sequence_truncate"``); ``mask`` c = ρ inside [1/C, C], 0 outside (TRL ``token_mask`` / ``sequence_mask``
    with clip_min 1/C); ``icepop`` c = ρ inside [a, C], a = ``is_floor``, 0 outside (IcePop; TRL's ``*_mask`` with
    clip_min a); ``none`` c = 1, α ignored: the samples are treated as on-policy, as a naive asynchronous trainer
    does."""
    is_cap: float = 2.0
    """C > 1, the upper bound on ρ of ``truncated`` (its cap), ``mask`` and ``icepop`` (verl's default 2; TRL's
    ``vllm_importance_sampling_clip_max`` defaults to 3). The step's ``cap_frac`` is the share of sampled tokens
    with r′ > C under those three; ``drop_frac`` the share the masks drop."""
    is_floor: float | None = 0.5
    """a in (0, 1), the lower bound on ρ of ``is_correction="icepop"`` (IcePop's and verl's ``"0.5_5.0"``: 0.5;
    TRL ``vllm_importance_sampling_clip_min``, verl ``rollout_rs_threshold_lower``); None: no lower bound (TRL's
    default clip_min). ``mask`` takes a = 1/C instead; the other values do not read it."""
    is_level: str | None = None
    """The level of the correction's weight c under ``truncated``, ``mask`` and ``icepop``: ``token`` (each
    token's ρ = π_k/α) or ``sequence`` (one ρ = Π_t π_k/α per sequence, on its every token); None: ``level``'s.
    Set apart from ``level`` (the clipped ratio's) as TRL sets ``vllm_importance_sampling_mode`` apart from
    ``importance_sampling_level``: TRL 1.16's default is ``icepop`` with ``level="token"``,
    ``is_level="sequence"``, C = 3 and ``is_floor=None``. ``ratio`` and ``none`` have no weight c: for them it must
    be None or ``level``."""
    lr: float = 1e-6
    """Learning rate."""
    optimizer: str = "adamw"
    """``adamw`` (default) or ``sgd`` (plain gradient ascent, for exact bandit studies)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient norm; None = no clipping."""
    micro_batch_size: int | None = None
    """Sequences per forward/backward; None = whole batch. The loss is exact for any value."""
    max_completion_length: int | None = None
    """Tokens per completion (LLM); also the ``dr_grpo`` denominator."""
    temperature: float = 1.0
    """Sampling temperature T; log α and log π are taken at the same T."""
    steps: int = 100
    """Number of steps k to run."""
    seed: int = 0
    """Seeds every random draw (prompts, samples, rewards)."""
    sync_audit: bool = True
    """After each sync, check that α now serves π_θ's weights: the sampler's ``prove_sync`` compares fingerprints
    of every tensor it serves with π_θ's (:mod:`grpo_lab.fingerprint`), then, as a second line, a few tokens of
    the first batch sampled after a sync (the probe) are scored by the sampler and by π_θ, one small forward
    each per sync (:mod:`grpo_lab.sync_audit`); either raises :class:`~grpo_lab.sync_audit.SyncError`. A sampler
    without ``prove_sync`` runs unproved, one without ``score`` (see :class:`~grpo_lab.protocols.ScoringSampler`)
    without the probe (the loop warns once). The TRL adapter runs the same audit (``sync_audit``)."""
    offpolicy_split: bool = False
    """Split log r′ = log(π_k/α) at π_sync, the trainer's forward at the weights of the last sync, into
    staleness log(π_k/π_sync) and mismatch log(π_sync/α) (docs/metrics.md). Costs one no-grad forward of the
    batch per step (through the sampler's ``synced_logprobs``: α's own copy for the in-process samplers, a
    copy of the synced weights that VLLMSampler keeps anyway), no extra memory. Needs a sampler with
    ``synced_logprobs``."""

    def __post_init__(self) -> None:
        require_int_at_least("G", self.G, 2)
        require_int_at_least("prompts_per_step", self.prompts_per_step, 1)
        require_int_at_least("v", self.v, 1)
        require_int_at_least("i", self.i, 1)
        require_choice("sync", self.sync, SYNC_MODES)
        require_number_in("sync_threshold", self.sync_threshold, 0.0, low_open=True)
        require_number_in("eps_low", self.eps_low, 0.0)
        if self.eps_high is not None:
            require_number_in("eps_high", self.eps_high, 0.0)
        require_choice("band", self.band, BANDS)
        require_number_in("beta", self.beta, 0.0)
        require_choice("kl_kind", self.kl_kind, KL_KINDS)
        require_int_at_least("ref_period", self.ref_period, 0)
        require_number_in("eps_std", self.eps_std, 0.0)
        require_choice("eps_placement", self.eps_placement, EPS_PLACEMENTS)
        require_choice("mask_normalize", self.mask_normalize, MASK_NORMALIZATIONS)
        require_choice("empty_step", self.empty_step, EMPTY_STEPS)
        require_choice("loss_type", self.loss_type, LOSS_TYPES)
        require_choice("level", self.level, LEVELS)
        require_choice("is_correction", self.is_correction, IS_CORRECTIONS)
        require_number_in("is_cap", self.is_cap, 1.0, low_open=True)
        require_is_floor(self.is_floor)
        correction_level(self.is_correction, self.level, self.is_level)
        require_number_in("lr", self.lr, 0.0, low_open=True)
        require_choice("optimizer", self.optimizer, OPTIMIZERS)
        require_number_in("weight_decay", self.weight_decay, 0.0)
        if self.max_grad_norm is not None:
            require_number_in("max_grad_norm", self.max_grad_norm, 0.0, low_open=True)
        if self.micro_batch_size is not None:
            require_int_at_least("micro_batch_size", self.micro_batch_size, 1)
        if self.max_completion_length is not None:
            require_int_at_least("max_completion_length", self.max_completion_length, 1)
        require_number_in("temperature", self.temperature, 0.0, low_open=True)
        require_int_at_least("steps", self.steps, 0)
        require_int_at_least("seed", self.seed, 0)
        for name in ("sync_audit", "offpolicy_split"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.ref_period > 0 and self.beta == 0:
            raise ValueError(f"ref_period = {self.ref_period} resets π_ref, but beta = 0 keeps no reference")

    def replace(self, **changes: Any) -> GRPOConfig:
        """A copy with ``changes`` applied (and validated)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown GRPOConfig field(s): {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def smoke_mode() -> bool:
    """True when ``GRPO_LAB_SMOKE`` is set (to anything but ``""``/``"0"``): every notebook run shrinks for CI."""
    return os.environ.get(SMOKE_ENV, "").strip() not in ("", "0")


def full_mode() -> bool:
    """True when ``GRPO_LAB_FULL`` is set (to anything but ``""``/``"0"``): the one switch that lets a notebook start
    its GPU recipes' long runs (hours); without it a GPU section prints each run's cost and command instead."""
    return os.environ.get(FULL_ENV, "").strip() not in ("", "0")
