"""The off-policy clipped objective (docs/theory.md §3): importance ratios against α, the
clipped surrogate f_ε, the KL penalty to π_ref, and loss aggregation over tokens.

Every function works per token (tensors ``[B, T]``: B = P·G sequences, T
completion tokens) and per sequence (``T = 1``). Sign convention: the paper
*maximises* L^c_α − β·KL; :func:`grpo_objective` returns the loss to *minimise*.
"""

from __future__ import annotations

import math

import torch

from .checks import require_choice, require_log_probs, require_number_in, require_same_shape

BANDS = ("additive", "multiplicative")
KL_KINDS = ("k1", "k2", "k3")
LOSS_TYPES = ("grpo", "bnpo", "dapo", "dr_grpo")
LEVELS = ("token", "sequence")
MASK_NORMALIZATIONS = ("batch", "unmasked")
IS_CORRECTIONS = ("ratio", "truncated", "mask", "icepop", "none")
IS_MASKS = ("mask", "icepop")
"""The corrections that drop (weight 0) the tokens or sequences whose r′ leaves a band."""
IS_WEIGHTS = ("truncated", *IS_MASKS)
"""The corrections with a detached weight c of ρ; ``ratio`` and ``none`` have c = 1."""
NO_TOKEN_METRICS: dict[str, float] = {"clip_low_frac": 0.0, "clip_high_frac": 0.0, "ratio_k_mean": 0.0,
                                      "ratio_k_max": 0.0, "log_ratio_k_abs": 0.0, "num_tokens": 0}
"""The metrics of :func:`grpo_objective` over no counted token."""
RATIO_DIAGNOSTICS = ("ess_token", "ess_seq", "ess_token_applied", "log_ratio_k_min", "log_ratio_k_p50",
                     "log_ratio_k_p99", "log_ratio_k_max", "log_weight_min", "log_weight_p50", "log_weight_p99",
                     "log_weight_max", "cap_frac", "drop_frac")
"""The names of :func:`ratio_diagnostics`' values."""
OFFPOLICY_SPLIT = ("staleness_abs", "mismatch_abs", "staleness_share")
"""The names of :func:`offpolicy_split`'s values."""


def clip_widths(eps_low: float, eps_high: float | None) -> tuple[float, float]:
    """(ε_low, ε_high), each checked ≥ 0; ``eps_high=None`` means ε_high = ε_low. The one place that rule is
    written: the loss, its metrics, the closed-form engine and the step plan (:class:`grpo_lab.plan.ObjectiveArgs`)
    all call it."""
    eps_low = require_number_in("eps_low", eps_low, 0.0)
    return eps_low, eps_low if eps_high is None else require_number_in("eps_high", eps_high, 0.0)


def clip_bounds(ratio_k: torch.Tensor, eps_low: float, eps_high: float,
                band: str = "additive") -> tuple[torch.Tensor, torch.Tensor]:
    """The interval that r is clipped to, centred on r′ = π_k/α.

    ``additive`` (the paper):  [max(r′ − ε_low, 0), r′ + ε_high]
    ``multiplicative`` (TRL*): [r′(1 − ε_low),      r′(1 + ε_high)]

    Both equal PPO's [1 − ε_low, 1 + ε_high] when r′ = 1 (on-policy).
    * TRL's formula only when its weight is a token's r′, never by default (docs/theory.md §3).
    """
    if band == "additive":
        return (ratio_k - eps_low).clamp(min=0.0), ratio_k + eps_high
    return ratio_k * (1.0 - eps_low), ratio_k * (1.0 + eps_high)


def clipped_surrogate(logp: torch.Tensor, logp_k: torch.Tensor, logp_alpha: torch.Tensor,
                      advantages: torch.Tensor, eps_low: float = 0.2, eps_high: float | None = None,
                      band: str = "additive") -> torch.Tensor:
    """Elementwise f_ε(r, r′, A) of docs/theory.md §3, to be maximised.

    Equation::

        r   = exp(log π_θ − log α)            (has gradient)
        r′  = exp(log π_k − log α)            (detached: π_k is fixed during the step)
        f_ε = min(r·A, clip(r, lo(r′), hi(r′))·A)      bounds from :func:`clip_bounds`

    ========== ====================== ====================================================
    symbol     shape                  meaning
    ========== ====================== ====================================================
    log π_θ    ``[B, T]``             ``logp``: log-probs of the sampled tokens, current policy
    log π_k    ``[B, T]``             ``logp_k``: same tokens, policy at the start of step k
    log α      ``[B, T]``             ``logp_alpha``: same tokens, sampler's (lagged) policy
    A          ``[B, 1]``, ``[B, T]`` ``advantages``: whitened reward, broadcast over tokens
    ε_low/high scalars                clip half-widths (``eps_high=None`` means = ``eps_low``)
    f_ε        ``[B, T]``             returned, elementwise
    ========== ====================== ====================================================

    Exact reductions (tested): with α = π_k (r′ = 1) both bands give PPO's
    ``min(r A, clip(r, 1−ε, 1+ε) A)``; at logp = logp_k the gradient is r′·A·∇log π.

    The three inputs are log-probabilities, not the ratios r, r′ themselves: a value above 0 (beyond
    :data:`grpo_lab.checks.LOG_PROB_TOLERANCE`) raises a ValueError naming the argument. To evaluate f_ε at given
    ratios, pass ``*ratios_as_log_probs(r, r_prime)`` (:func:`ratios_as_log_probs`).
    """
    eps_low, eps_high = clip_widths(eps_low, eps_high)
    require_choice("band", band, BANDS)
    require_same_shape(logp=logp, logp_k=logp_k, logp_alpha=logp_alpha)
    require_log_probs(logp=logp, logp_k=logp_k, logp_alpha=logp_alpha)
    return _surrogate_of_checked(logp, logp_k, logp_alpha, advantages, eps_low, eps_high, band)


def _surrogate_of_checked(logp: torch.Tensor, logp_k: torch.Tensor, logp_alpha: torch.Tensor,
                          advantages: torch.Tensor, eps_low: float, eps_high: float, band: str) -> torch.Tensor:
    """:func:`clipped_surrogate`'s f_ε on inputs already checked (widths from :func:`clip_widths`, a known band, log-
    probabilities of one shape): :func:`grpo_objective` checks its own inputs, so a step reads the host once for
    them, not again for the terms derived from them."""
    ratio = torch.exp(logp - logp_alpha)
    ratio_k = torch.exp(logp_k - logp_alpha).detach()
    low, high = clip_bounds(ratio_k, eps_low, eps_high, band)
    clipped = torch.clamp(ratio, low, high)  # clamp passes the gradient at the bounds (ε = 0 keeps r′·A)
    return torch.minimum(ratio * advantages, clipped * advantages)


def ratios_as_log_probs(ratio: torch.Tensor, ratio_k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log π_θ, log π_k, log α) whose ratios are ``ratio`` = π_θ/α and ``ratio_k`` = π_k/α (positive, one shape):
    log α = −max(log r, log r′, 0) per element, so all three are log-probabilities (≤ 0), as
    :func:`clipped_surrogate` requires. f_ε at given ratios is ``clipped_surrogate(*ratios_as_log_probs(r, r′), A)``."""
    require_same_shape(ratio=ratio, ratio_k=ratio_k)
    log_ratio, log_ratio_k = ratio.log(), ratio_k.log()
    logp_alpha = -torch.maximum(log_ratio, log_ratio_k).clamp(min=0.0)
    return log_ratio + logp_alpha, log_ratio_k + logp_alpha, logp_alpha


def require_is_floor(is_floor: float | None) -> float | None:
    """``is_floor`` if it is None (no floor) or a finite number in (0, 1); else raise naming it. Below 1 because
    the band [a, C] must hold r′ = 1: on-policy tokens are never dropped (and C > 1 keeps a < C)."""
    if is_floor is None:
        return None
    ok = isinstance(is_floor, (int, float)) and not isinstance(is_floor, bool) and 0 < is_floor < 1
    if not ok:
        raise ValueError(f"is_floor must be None (no floor) or a finite number in (0, 1), below r′ = 1 and so "
                         f"below is_cap, got {is_floor!r}")
    return float(is_floor)


def correction_level(is_correction: str, level: str, is_level: str | None = None) -> str:
    """The level of the correction's weight c (docs/theory.md §3, *The correction knob*): ``is_level``, or
    ``level``'s, the clipped ratio's, when None. Only the values with a weight c (:data:`IS_WEIGHTS`) may set it
    apart from ``level``, as TRL sets ``vllm_importance_sampling_mode`` (``token_*`` / ``sequence_*``) apart from
    ``importance_sampling_level``; ``ratio`` corrects through r′ inside the clipped ratio, at its level, and
    ``none`` has no weight. Raises a ValueError naming the bad value."""
    require_choice("level", level, LEVELS)
    if is_level is None:
        return level
    require_choice("is_level", is_level, LEVELS)
    if is_level != level and is_correction not in IS_WEIGHTS:
        raise ValueError(f"is_level = {is_level!r} differs from level = {level!r}, but is_correction = "
                         f"{is_correction!r} has no weight c whose level could differ: only {IS_WEIGHTS} have one")
    return is_level


def sequence_log_ratio(logp_k: torch.Tensor, logp_alpha: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log r′_b = Σ_t (log π_k − log α) over sequence b's tokens in ``mask``: the log of the whole-sequence ratio
    π_k(y_b)/α(y_b), a *sum*, not a mean (TRL's ``sequence_*`` modes: ``per_token_logps_diff.sum(dim=-1,
    keepdim=True)``). ``[B, T]`` in, ``[B, 1]`` out, detached; tokens off ``mask`` count 0, NaN or not."""
    require_same_shape(logp_k=logp_k, logp_alpha=logp_alpha, mask=mask)
    diff = (logp_k - logp_alpha).detach()
    return torch.where(mask.bool(), diff, torch.zeros_like(diff)).sum(dim=1, keepdim=True)


def is_correction_terms(logp_k: torch.Tensor, logp_alpha: torch.Tensor, is_correction: str = "ratio",
                        is_cap: float = 2.0, is_floor: float | None = 0.5,
                        log_ratio: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The one rule of ``GRPOConfig.is_correction`` (docs/theory.md §3, *The correction knob*): what the
    ratios are taken against, and the detached weight c that multiplies the surrogate. Every driver calls it:
    :func:`grpo_objective` (the loop, the TRL adapter), the closed-form bandit engine and
    :func:`ratio_diagnostics`.

    c is a function of ρ = exp(``log_ratio``): the token's r′ = π_k/α, or at the sequence level (``is_level``,
    :func:`correction_level`) the whole sequence's Π_t r′_t (:func:`sequence_log_ratio`, TRL's sum), on every
    token of the sequence.

    ============== ========= ================== =============================================================
    is_correction  base      c                  what it weights or masks; what it costs
    ============== ========= ================== =============================================================
    ``ratio``      log α     1                  f_ε(π_θ/α, π_k/α, A), the paper: each token's full r′; no bias
                                                per token, an unbounded weight (variance)
    ``truncated``  log π_k   min(ρ, C)          TIS: caps ρ at C; biased on what α under-samples by more than C
    ``mask``       log π_k   ρ·1[1/C ≤ ρ ≤ C]   drops what leaves the log-symmetric band [1/C, C], the rest
                                                keeps ρ; biased: a dropped token loses its whole gradient
    ``icepop``     log π_k   ρ·1[a ≤ ρ ≤ C]     IcePop's band, both bounds knobs (a = ``is_floor``; None: no
                                                floor, so C = 3 at is_level sequence is TRL's default mode)
    ``none``       log π_k   1                  f_ε(π_θ/π_k, 1, A): α ignored, the samples treated as
                                                on-policy; biased by the whole lag
    ============== ========= ================== =============================================================

    ``grpo_lab.scale.knobs.TRL_IS_MODES`` gives each value's TRL 1.16 arguments (``vllm_importance_sampling_mode``
    ``token_*`` / ``sequence_*``, ``…_clip_max`` = C, ``…_clip_min``).
    Under every value but ``ratio`` the surrogate is c · f_ε(π_θ/π_k, 1, A), TRL's ``per_token_loss *
    importance_sampling_ratio``. Each costs one exp per token or sequence; the masks also return 0 weights
    that :func:`ratio_diagnostics` counts (``drop_frac``). At the first pass (π_θ = π_k) the gradient is
    c·r·A·∇log π with r = π_k/base: r′·A·∇log π under ``ratio``, c·A·∇log π under the others.
    With r′ = 1 both bands are PPO's [1 − ε_low, 1 + ε_high]. The same base weights the KL term when
    ``kl_importance_weighted`` (π_θ/base, detached) or ``kl_weight_differentiable`` (π_θ/base with its gradient:
    TRL's ``coef_1`` times k3 under ``use_bias_correction_kl``, π_θ/π_old, where π_old is the weights that
    sampled); :func:`kl_weight`.

    Not values of the knob: a geometric-mean sequence weight exp(mean_t log r′) (verl's geometric rejection;
    GSPO's geometric mean is already what ``level="sequence"`` clips, π_θ/π_k and under ``ratio`` the band
    around r′), which would be a second way of forming a sequence's ratio beside TRL's sum; and M2PO's
    second-moment mask, which drops the tokens of largest |log r′| until the *batch's* mean (log r′)² is under
    a threshold: not a function of one token's ρ, so no micro-batch could apply it alone.

    ============== ========== ===============================================
    symbol         shape      meaning
    ============== ========== ===============================================
    log π_k        ``[B, T]`` ``logp_k``, detached
    log α          ``[B, T]`` ``logp_alpha``
    C              scalar     ``is_cap`` > 1 (read by truncated, mask, icepop)
    a              scalar     ``is_floor`` in (0, 1) or None (read by icepop)
    log ρ          ``[B, T]`` ``log_ratio`` (``[B, 1]`` at level sequence, :func:`sequence_log_ratio`): None
                              means log π_k − log α per token
    base           ``[B, T]`` returned: log of the ratios' denominator
    c              as log ρ   returned: the detached weight; None means c = 1
    ============== ========== ===============================================
    """
    require_choice("is_correction", is_correction, IS_CORRECTIONS)
    is_cap = require_number_in("is_cap", is_cap, 1.0, low_open=True)
    is_floor = require_is_floor(is_floor)
    require_same_shape(logp_k=logp_k, logp_alpha=logp_alpha)
    if is_correction == "ratio":
        return logp_alpha, None
    logp_k = logp_k.detach()
    if is_correction == "none":
        return logp_k, None
    rho = torch.exp((logp_k - logp_alpha) if log_ratio is None else log_ratio.detach())
    if is_correction == "truncated":
        return logp_k, rho.clamp(max=is_cap)
    floor = 1.0 / is_cap if is_correction == "mask" else is_floor
    kept = rho <= is_cap if floor is None else (rho >= floor) & (rho <= is_cap)  # TRL's comparison, on ρ itself
    return logp_k, torch.where(kept, rho, torch.zeros_like(rho))


def ratio_diagnostics(logp_k: torch.Tensor, logp_alpha: torch.Tensor, sampled_mask: torch.Tensor,
                      is_correction: str = "ratio", is_cap: float = 2.0, is_floor: float | None = 0.5,
                      level: str = "token") -> dict[str, float]:
    """Statistics of the importance weights over the sampled tokens, raw and as applied (docs/metrics.md).

    Raw: w = r′ = π_k/α, before any clip, cap or mask. Applied: the weight the first pass puts on the token's
    A·∇log π under ``is_correction`` (:func:`is_correction_terms`): r′ (``ratio``), min(ρ, C) (``truncated``),
    ρ or 0 (``mask``, ``icepop``), 1 (``none``); ρ the token's r′, or at ``level="sequence"`` its sequence's
    Π_t r′_t, on each of its tokens. Under ``ratio`` at ``level="sequence"`` the applied weight is the sequence's
    length-normalised r′_b = exp(mean_t log r′_{b,t}), the ratio :func:`grpo_objective` clips around. The raw
    values stay per token. Equations (n tokens or sequences; w_b = Π_t r′_{b,t} over sequence b's sampled tokens)::

        ess_token         = (Σ_t w_t)² / (n_tok · Σ_t w_t²)     of the raw weights; ess_seq likewise over w_b
        ess_token_applied = the same of the applied weights (a dropped token counts in n with w = 0)
        log_ratio_k_min / _p50 / _p99 / _max = min / median / 99th percentile / max of log r′ (raw)
        log_weight_min / _p50 / _p99 / _max  = the same of the applied weights' logs, over the tokens kept
        cap_frac          = share of sampled tokens whose ρ (the token's r′, or its sequence's at level sequence)
                            exceeds C, under the values that read C (``truncated``, ``mask``, ``icepop``); else 0
        drop_frac         = share of sampled tokens whose applied weight is 0: the band of ``mask`` / ``icepop``
                            dropped the token (or, at level sequence, its sequence); else 0

    ESS/n lies in [0, 1] and is a dispersion diagnostic of the weights: 1 exactly when all are equal (on-policy and
    bit-identical log-probs: every r′ = 1), smaller the more a few weights dominate, 0 when a mask drops every
    token (then the log_weight values are 0). n/ESS is Kish's variance inflation only for a self-normalised
    weighted mean whose weights are independent of the values; the token gradient estimator is neither (it is not
    self-normalised, and A and ∇log π depend on the token), so read ESS as how uneven the weights are, not as a
    variance ratio.

    ================= ========== =================================================
    argument          shape      meaning
    ================= ========== =================================================
    ``logp_k``        ``[B, T]`` log π_k of the sampled tokens
    ``logp_alpha``    ``[B, T]`` log α of the same tokens
    ``sampled_mask``  ``[B, T]`` the tokens α sampled (padding False), every group
    ``is_correction`` str        the correction (``GRPOConfig.is_correction``)
    ``is_cap``        scalar     C > 1 (``truncated``, ``mask``, ``icepop``)
    ``is_floor``      scalar     a in (0, 1) or None (``icepop``)
    ``level``         str        ``token`` or ``sequence`` (``GRPOConfig.level``)
    ================= ========== =================================================

    With no sampled token the values are an on-policy batch's: ESS 1, logs 0, cap_frac and drop_frac 0.
    """
    require_same_shape(logp_k=logp_k, logp_alpha=logp_alpha, sampled_mask=sampled_mask)
    require_choice("level", level, LEVELS)
    logp_k, logp_alpha = logp_k.detach().to(torch.float64), logp_alpha.detach().to(torch.float64)
    sampled = sampled_mask.bool()
    sequence = sequence_log_ratio(logp_k, logp_alpha, sampled) if level == "sequence" else None
    base, weight = is_correction_terms(logp_k, logp_alpha, is_correction, is_cap, is_floor, sequence)
    if not sampled.any():
        return {**dict.fromkeys(RATIO_DIAGNOSTICS, 0.0), "ess_token": 1.0, "ess_seq": 1.0, "ess_token_applied": 1.0}
    log_ratio = logp_k - logp_alpha
    if sequence is not None and is_correction == "ratio":   # the sequence's mean log r′, as grpo_objective clips
        log_applied = (sequence / sampled.sum(dim=1, keepdim=True).clamp(min=1)).expand_as(log_ratio)
    else:
        log_applied = (logp_k - base) + (0.0 if weight is None else weight.expand_as(log_ratio).log())
    tokens, applied = log_ratio[sampled], log_applied[sampled]
    sequences = sequence_log_ratio(logp_k, logp_alpha, sampled)[:, 0][sampled.any(dim=1)]
    dropped = torch.isneginf(applied) if is_correction in IS_MASKS else torch.zeros_like(applied, dtype=torch.bool)
    kept = applied[~dropped]
    levels = torch.tensor([0.5, 0.99], dtype=torch.float64, device=tokens.device)
    rho = (log_ratio if sequence is None else sequence.expand_as(log_ratio))[sampled]
    capped = (rho > math.log(is_cap)).to(torch.float64).mean() if weight is not None else tokens.new_zeros(())
    kept_stats = ([kept.min(), *torch.quantile(kept, levels), kept.max()] if kept.numel()
                  else [tokens.new_zeros(())] * 4)
    values = torch.stack([_normalised_ess(tokens), _normalised_ess(sequences),
                          _normalised_ess(applied) if kept.numel() else tokens.new_zeros(()),
                          tokens.min(), *torch.quantile(tokens, levels), tokens.max(), *kept_stats, capped,
                          dropped.to(torch.float64).mean()])
    return dict(zip(RATIO_DIAGNOSTICS, values.tolist(), strict=True))


def _normalised_ess(log_w: torch.Tensor) -> torch.Tensor:
    """(Σw)² / (n·Σw²) of w = exp(``log_w``), shifted by max log w first (the ratio is scale-free)."""
    w = torch.exp(log_w - log_w.max())
    return w.sum() ** 2 / (w.numel() * (w * w).sum())


def offpolicy_split(logp_k: torch.Tensor, logp_sync: torch.Tensor, logp_alpha: torch.Tensor,
                    sampled_mask: torch.Tensor) -> dict[str, float]:
    """log r′ split at π_sync, the trainer's forward at the weights of the last sync (docs/metrics.md)::

        log(π_k/α) = log(π_k/π_sync) + log(π_sync/α)
                      staleness          mismatch
        staleness_abs   = mean_t |log π_k − log π_sync|      π_θ moved since the last sync (0 at lag 0)
        mismatch_abs    = mean_t |log π_sync − log α|        the engine's numerics (and any truncation) at
                                                             the same weights (0 when α is the trainer's own)
        staleness_share = staleness_abs / (staleness_abs + mismatch_abs)     (0 when both are 0)

    Means over the sampled tokens (``sampled_mask [B, T]``, every group); the other arguments ``[B, T]``.
    With no sampled token every value is 0.
    """
    require_same_shape(logp_k=logp_k, logp_sync=logp_sync, logp_alpha=logp_alpha, sampled_mask=sampled_mask)
    sampled = sampled_mask.bool()
    if not sampled.any():
        return dict.fromkeys(OFFPOLICY_SPLIT, 0.0)
    k, sync, alpha = (x.detach().to(torch.float64)[sampled] for x in (logp_k, logp_sync, logp_alpha))
    staleness, mismatch = float((k - sync).abs().mean()), float((sync - alpha).abs().mean())
    total = staleness + mismatch
    return dict(zip(OFFPOLICY_SPLIT, (staleness, mismatch, staleness / total if total > 0 else 0.0), strict=True))


def kl_estimate(logp: torch.Tensor, logp_ref: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL estimators, used as *loss terms* (docs/theory.md §3), with d = log π_ref − log π_θ::

        estimator              value: E_{y~π}[k] =              gradient: E_{y~π}[∇k] =
        k1 = −d                KL(π ‖ π_ref)                     0               (no force at all)
        k2 = d² / 2            KL(π ‖ π_ref) to second order     ∇KL(π ‖ π_ref)  (the reverse KL)
        k3 = exp(d) − d − 1    KL(π ‖ π_ref), and k3 ≥ 0         ∇KL(π_ref ‖ π)  (the *forward* KL)

    (y detached; ∇k = ∂k/∂log π · ∇log π with ∂k1 = 1, ∂k2 = −d, ∂k3 = 1 − e^d.) So the
    logged value of k3 estimates KL(π ‖ π_ref), which the paper writes, while the
    gradient it adds to the loss is that of KL(π_ref ‖ π); only k2 differentiates
    the KL the paper writes. k3 is the default because it is TRL's estimator; but TRL 1.16 by default
    (``use_bias_correction_kl=True``) multiplies it by the non-detached ``coef_1`` = π_θ/π_old, which turns
    its gradient into the reverse KL's (:func:`kl_weight`, ``kl_weight_differentiable``). The table is the
    unweighted term's, which the kit uses by default.

    ========= ========== ===============================================
    symbol    shape      meaning
    ========= ========== ===============================================
    log π_θ   ``[B, T]`` ``logp``, sampled tokens under the current policy
    log π_ref ``[B, T]`` ``logp_ref``, same tokens under the reference
    KL̂        ``[B, T]`` returned, elementwise
    ========= ========== ===============================================

    The table is exact for one-token responses (the bandit). On sequences each term is the
    KL of the next-token distributions at the sampled prefix: on-policy the values sum to
    the sequence KL(π ‖ π_ref), but the gradient treats the prefix as given, so per token
    k2's is the gradient of the per-position KLs, without the sequence KL's cross terms
    (how token t changes the KL of the tokens after it; ``tests/test_kl_sequences.py``).

    Off-policy the tokens come from α, so both columns above change. Weighting each
    term by the detached π_θ/α (``grpo_objective(kl_importance_weighted=True)`` under
    ``is_correction="ratio"``) gives back the on-policy expectations of both value and gradient
    for one-token responses: the gradient of *the same* KL as on-policy, nothing more (k3 still
    follows the forward KL). Under ``truncated`` or ``none`` the weight is π_θ/π_k, so at lag > 0
    the term stays α-biased. Weighting by π_θ/α *with* its gradient
    (``kl_weight_differentiable=True``, TRL's default) gives ∇KL(π ‖ π_ref), the reverse KL, for
    k1 and k3, on-policy too (:func:`kl_weight`). On sequences the token weight corrects the
    token's distribution given its prefix, not the prefix's, which stays α's.
    ``grpo_lab.exact.bandit.kl_expected_gradient`` computes the one-token expectations exactly.
    """
    require_choice("kind", kind, KL_KINDS)
    require_same_shape(logp=logp, logp_ref=logp_ref)
    d = logp_ref - logp
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d * d
    return torch.expm1(d) - d  # = exp(d) − d − 1, without the cancellation that makes it < 0 near d = 0


def kl_weight(logp: torch.Tensor, log_base: torch.Tensor, differentiable: bool = False) -> torch.Tensor:
    """The importance weight π_θ/base that multiplies each KL estimate (``[B, T]``, docs/theory.md §3), base the
    ratios' denominator of :func:`is_correction_terms` (α under ``ratio``, π_k under ``truncated`` / ``none``).

    ================== ===================================== ===============================================
    ``differentiable`` term and its gradient                 expectation over y ~ base, one-token responses
    ================== ===================================== ===============================================
    False (detached)   w·k,   w·∂k·∇log π                    each estimator's on-policy gradient: 0 (k1),
                                                             ∇KL(π ‖ π_ref) (k2), ∇KL(π_ref ‖ π) (k3)
    True (TRL's        w·k,   w·(k + ∂k)·∇log π              ∇E_π[k]: ∇KL(π ‖ π_ref), the reverse KL, for
    ``coef_1``)                                              k1 and k3; ∇E_π[d²/2] for k2
    ================== ===================================== ===============================================

    (w = π_θ/base, ∂k = ∂k/∂log π_θ.) Both have the same value, 1 at π_θ = base; the differentiable one changes the
    gradient even there (TRL's ``use_bias_correction_kl``, on by default in TRL 1.16). When y is drawn from α but
    base = π_k (lag > 0 under ``truncated`` or ``none``), both expectations are α's, not π_θ's."""
    weight = torch.exp(logp - log_base.detach())
    return weight if differentiable else weight.detach()


def loss_weights(mask: torch.Tensor, loss_type: str = "grpo",
                 max_completion_length: int | None = None,
                 run_ids: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
                 denominator_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token weights w such that the aggregated loss is Σ w · loss_token.

    ``mask [B, T]`` is True on tokens that count: completion tokens of groups the
    zero-variance mask kept; the others get weight 0. ``denominator_mask [B, T]``
    (default: ``mask``) holds the tokens the denominators count. Passing the
    completion tokens *before* the group mask keeps masked groups in the
    denominators as zero terms: the paper's E_x[m(x)·(…)], ``mask_normalize="batch"``
    (docs/theory.md §3). With N_seq / N_tok the sequences / tokens of ``denominator_mask``
    and L_b the length of sequence b there:

    ============ =========================================== =========================================
    loss_type    w_{b,t}  (0 where ``mask`` is False)        peer
    ============ =========================================== =========================================
    ``grpo``     1 / (L_b · N_seq)                           GRPO, TRL "grpo"
    ``bnpo``     1 / N_tok                                   TRL "dapo" (not TRL "bnpo", below)
    ``dapo``     1 / N_tok (the same weights as ``bnpo``)    DAPO, TRL "dapo" (TRL 1.16's default)
    ``dr_grpo``  1 / (N_seq · max_completion_length)         Dr. GRPO's aggregation (not its unscaled A)
    ============ =========================================== =========================================

    N_tok counts the whole batch, as TRL's ``dapo`` counts its generation batch (``num_items_in_batch``).
    TRL's ``bnpo`` divides each micro-batch's sum by that micro-batch's own token count, then by the
    accumulation steps: it equals the kit's ``bnpo`` only in one process with one micro-batch (or
    micro-batches of equal token counts). Dr. GRPO also drops σ from the advantage (TRL
    ``scale_rewards="none"``), which the kit does not offer: its whitening is the paper's A_α
    (docs/theory.md §3).

    Computing w once for the whole batch makes micro-batching exact: each
    micro-batch sums its slice of w · loss. ``run_ids [B]`` (optional) stacks
    independent runs (e.g. seeds) in one batch; each run is normalised by its
    own counts, so its gradient equals the one it would get alone.
    """
    require_choice("loss_type", loss_type, LOSS_TYPES)
    if mask.dim() != 2:
        raise ValueError(f"mask must have shape [B, T], got {tuple(mask.shape)}")
    counted = mask.to(dtype)
    if denominator_mask is None:
        denominator = counted
    else:
        require_same_shape(mask=mask, denominator_mask=denominator_mask)
        if bool((mask.bool() & ~denominator_mask.bool()).any()):
            raise ValueError("denominator_mask must contain every token of mask")
        denominator = denominator_mask.to(dtype)
    if run_ids is None:
        run_ids = torch.zeros(mask.shape[0], dtype=torch.long, device=mask.device)
    num_runs = int(run_ids.max()) + 1 if run_ids.numel() else 1
    lengths = denominator.sum(dim=1)

    def per_run(x: torch.Tensor) -> torch.Tensor:
        total = torch.zeros(num_runs, dtype=x.dtype, device=x.device).index_add_(0, run_ids, x)
        return total[run_ids].clamp(min=1.0)

    if loss_type in ("bnpo", "dapo"):
        return counted / per_run(lengths)[:, None]
    num_seqs = per_run((lengths > 0).to(counted.dtype))
    if loss_type == "grpo":
        return counted / (lengths.clamp(min=1.0) * num_seqs)[:, None]
    max_len = mask.shape[1] if max_completion_length is None else max_completion_length
    if max_len < mask.shape[1]:
        raise ValueError(f"max_completion_length must be >= T = {mask.shape[1]}, got {max_len}")
    return counted / (num_seqs * max_len)[:, None]


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str = "grpo",
                   max_completion_length: int | None = None,
                   run_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Reduce ``per_token [B, T]`` to a scalar with :func:`loss_weights` (docs/theory.md §3).

    Tokens outside ``mask`` contribute exactly 0 (even if they hold NaN), so an
    all-masked batch aggregates to exactly 0.
    """
    require_same_shape(per_token=per_token, mask=mask)
    weights = loss_weights(mask, loss_type, max_completion_length, run_ids, per_token.dtype)
    return weighted_sum(per_token, weights)


def tv_terms(logp_k: torch.Tensor, logp_alpha: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """½·|r′_b − 1| per sequence, r′_b = π_k(y_b)/α(y_b) the whole-sequence ratio (the product
    of the token ratios over ``mask``), in float64, ``[B]``. Their mean over sequences drawn
    from α is an unbiased estimate of TV(π_k, α) (docs/theory.md §3) when α covers π_k's support (π_k ≪ α):
    E_α|π_k/α − 1| = Σ_{α>0}|π_k − α|, which misses π_k's mass where α = 0 (a top-p/top-k sampler).
    It is exactly 0 where log π_k = log α bit for bit (right after a sync with the trainer's own copy as α; an
    engine's mismatch makes it positive at lag 0, the more so the longer the sequences)."""
    require_same_shape(logp_k=logp_k, logp_alpha=logp_alpha, mask=mask)
    log_ratio = torch.where(mask.bool(), logp_k.detach() - logp_alpha, torch.zeros_like(logp_alpha))
    return 0.5 * torch.expm1(log_ratio.to(torch.float64).sum(dim=1)).abs()


def weighted_sum(per_token: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ w · x over tokens with w > 0 (others are ignored, NaN or not)."""
    return (torch.where(weights > 0, per_token, torch.zeros_like(per_token)) * weights).sum()


def grpo_objective(logp: torch.Tensor, logp_alpha: torch.Tensor, advantages: torch.Tensor,
                   weights: torch.Tensor, *, logp_k: torch.Tensor | None = None,
                   logp_ref: torch.Tensor | None = None, beta: float = 0.0, eps_low: float = 0.2,
                   eps_high: float | None = None, band: str = "additive", kl_kind: str = "k3",
                   kl_importance_weighted: bool = False, kl_weight_differentiable: bool = False,
                   level: str = "token", is_correction: str = "ratio", is_cap: float = 2.0,
                   is_floor: float | None = 0.5, is_level: str | None = None
                   ) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss to minimise, −(L^c_α − β·KL), and the step's metrics (docs/theory.md §3).

    Equation::

        loss = Σ_{b,t} w_{b,t} · ( −c_{b,t} · f_ε(r, r′, A_b) + β · KL̂_{b,t} )

    with r, r′ taken against the base of :func:`is_correction_terms` and c its weight
    (``is_correction="ratio"``, the default: r = π_θ/α, r′ = π_k/α, c = 1).

    The β term is a loss term: its gradient, not its value, is what acts. With
    the default k3 unweighted that gradient follows KL(π_ref ‖ π_θ), not KL(π_θ ‖ π_ref); k1's
    is 0 in expectation (see :func:`kl_estimate`). ``kl_importance_weighted`` multiplies each
    term by the detached π_θ/base (the same gradients, taken as on-policy), ``kl_weight_differentiable``
    by π_θ/base with its gradient (TRL's default ``use_bias_correction_kl``: ∇KL(π_θ ‖ π_ref) for
    k1 and k3): :func:`kl_weight`, per token at either ``level``. TRL's weight is π_θ/π_old, per token only at its
    ``importance_sampling_level="token"``: the kit's where base = π_k = π_old, not under ``ratio`` (base α)
    nor at ``level="sequence"`` (docs/theory.md §3, *The KL's weight and TRL*).

    ============== ========== ==================================================
    argument       shape      meaning
    ============== ========== ==================================================
    ``logp``       ``[B, T]`` log π_θ of the sampled tokens (with gradient)
    ``logp_alpha`` ``[B, T]`` log α, returned by the sampler with the tokens
    ``advantages`` ``[B]``    A_α per sequence (whitened group reward)
    ``weights``    ``[B, T]`` token weights w (float): ``StepPlan.weights`` of
                              :func:`grpo_lab.plan.plan_step`, or :func:`loss_weights`
                              of a mask. They carry the ``loss_type``, the
                              zero-variance mask and ``mask_normalize``; tokens
                              with w = 0 (padding, masked groups) do not count
    ``logp_k``     ``[B, T]`` log π_k; ``None`` means π_k = π_θ (first/only pass)
    ``logp_ref``   ``[B, T]`` log π_ref, needed when β > 0
    ============== ========== ==================================================

    Weights computed once for the whole batch make micro-batching exact: each
    micro-batch passes its rows ``weights[rows]`` and the losses add up.

    ``level="sequence"`` (GSPO-style) replaces per-token ratios by the ratio of
    length-normalised sequence log-probabilities, broadcast to the tokens. ``is_level`` (None: ``level``'s,
    :func:`correction_level`) is the level of the correction's weight c (``is_correction``, ``is_cap``,
    ``is_floor``): at ``"sequence"`` one per sequence, of the whole-sequence ratio Π_t π_k/α
    (:func:`sequence_log_ratio`: a sum of the token log-ratios, TRL's ``sequence_*`` modes), at ``"token"`` each
    token's π_k/α. TRL 1.16's default is ``level="token"`` with ``is_level="sequence"``.

    Metrics (floats, over counted tokens): ``clip_low_frac`` (r below the band
    with A < 0), ``clip_high_frac`` (r above with A > 0), ``ratio_k_mean`` /
    ``ratio_k_max`` (r′ = π_k/α), ``log_ratio_k_abs`` (mean |log π_k − log α|,
    the lag drift), ``kl`` (mean KL̂ to π_ref, when given) and ``num_tokens``.
    """
    beta = require_number_in("beta", beta, 0.0)
    is_level = correction_level(is_correction, level, is_level)
    require_same_shape(logp=logp, logp_alpha=logp_alpha, weights=weights)
    if not weights.is_floating_point():
        raise ValueError(f"weights must be float token weights (StepPlan.weights or loss_weights(mask)), "
                         f"got dtype {weights.dtype}")
    if advantages.dim() != 1 or advantages.shape[0] != logp.shape[0]:
        raise ValueError(f"advantages must have shape [B] = [{logp.shape[0]}], got {tuple(advantages.shape)}")
    if beta > 0 and logp_ref is None:
        raise ValueError(f"beta = {beta} > 0 needs logp_ref (the reference policy's log-probs)")
    given = dict(logp=logp, logp_alpha=logp_alpha, logp_k=logp_k, logp_ref=logp_ref)
    require_log_probs(**{name: t for name, t in given.items() if t is not None})
    mask = weights > 0
    logp_k = logp.detach() if logp_k is None else logp_k.detach()

    if level == "sequence":
        lengths = mask.sum(dim=1, keepdim=True).clamp(min=1)

        def seq_mean(x: torch.Tensor) -> torch.Tensor:
            return (torch.where(mask, x, torch.zeros_like(x)).sum(dim=1, keepdim=True) / lengths).expand_as(x)

        ratio_logp, ratio_logp_k, ratio_logp_alpha = seq_mean(logp), seq_mean(logp_k), seq_mean(logp_alpha)
    else:
        ratio_logp, ratio_logp_k, ratio_logp_alpha = logp, logp_k, logp_alpha
    weight_log_ratio = (sequence_log_ratio(logp_k, logp_alpha, mask).expand_as(logp) if is_level == "sequence"
                        else logp_k - logp_alpha)
    base, correction = is_correction_terms(ratio_logp_k, ratio_logp_alpha, is_correction, is_cap, is_floor,
                                           weight_log_ratio)
    token_base = base if level == "token" else is_correction_terms(logp_k, logp_alpha, is_correction, is_cap)[0]
    adv = advantages[:, None].to(logp.dtype)
    eps_low, eps_high = clip_widths(eps_low, eps_high)
    require_choice("band", band, BANDS)
    surrogate = _surrogate_of_checked(ratio_logp, ratio_logp_k, base, adv, eps_low, eps_high, band)
    per_token = -surrogate if correction is None else -correction.to(surrogate.dtype) * surrogate
    kl = None
    if logp_ref is not None:
        kl = kl_estimate(logp, logp_ref, kl_kind)
        if kl_importance_weighted or kl_weight_differentiable:
            kl = kl * kl_weight(logp, token_base, kl_weight_differentiable)
        if beta > 0:
            per_token = per_token + beta * kl
    loss = weighted_sum(per_token, weights)

    with torch.no_grad():
        metrics = _metrics(ratio_logp - base, ratio_logp_k - base, ratio_logp_k - ratio_logp_alpha,
                           logp_k - logp_alpha, adv, kl, mask, *clip_widths(eps_low, eps_high), band)
    return loss, metrics


def _metrics(log_ratio: torch.Tensor, log_ratio_band: torch.Tensor, log_ratio_k: torch.Tensor,
             token_log_ratio_k: torch.Tensor, adv: torch.Tensor, kl: torch.Tensor | None, counted: torch.Tensor,
             eps_low: float, eps_high: float, band: str) -> dict[str, float]:
    """The step's diagnostics over counted tokens, read out with one conversion to Python floats: the clip
    fractions of r against the band around ``log_ratio_band`` (r′ against the correction's base), the
    r′ = π_k/α statistics against α whatever the correction."""
    n = int(counted.sum())
    if n == 0:
        return {**NO_TOKEN_METRICS, **({"kl": 0.0} if kl is not None else {})}
    ratio, ratio_k = log_ratio.exp(), log_ratio_k.exp()
    low, high = clip_bounds(log_ratio_band.exp(), eps_low, eps_high, band)
    weight = counted.to(torch.float64) / n
    values = [((ratio < low) & (adv < 0)), ((ratio > high) & (adv > 0)), ratio_k, token_log_ratio_k.abs()]
    values += [kl] if kl is not None else []
    means = torch.stack([(v.to(torch.float64) * weight).sum() for v in values])
    peak = torch.where(counted, ratio_k, torch.zeros_like(ratio_k)).max().to(torch.float64)
    out = torch.cat([means, peak[None]]).tolist()
    metrics = dict(zip(("clip_low_frac", "clip_high_frac", "ratio_k_mean", "log_ratio_k_abs"), out[:4]))
    if kl is not None:
        metrics["kl"] = out[4]
    metrics["ratio_k_max"], metrics["num_tokens"] = out[-1], n
    return metrics
