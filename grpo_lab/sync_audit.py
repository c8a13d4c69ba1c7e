"""Did the sync take? The second line of the sync audit: α's behaviour on a probe (docs/metrics.md).

The first line, :mod:`grpo_lab.fingerprint`, proves the weights; behaviour also catches right bytes served
through a wrong layout. A sync that silently does nothing leaves α at old weights while r′ = π_k/α corrects
for it: training goes on at a lag nobody chose. The audit scores a small fixed probe (:func:`probe_of`: a few
tokens of the first batch sampled after a sync, after a few of their prompt's) with π_θ and with the sampler,
once as the reference and after every sync.

The rule (:meth:`SyncAudit.check`), on the probe's n tokens, against the reference r::

    moved    = mean_t |log π_θ − log π_θ^(r)|
    followed = mean_t |log α − log α^(r)|
    moved ≤ τ + 6·M            → not judged yet; the reference stays, so the moves add up
    followed < moved / 2       → SyncError
    otherwise                  → the sync took; this audit becomes the reference

========== ==========================================================================================
symbol     meaning
========== ==========================================================================================
·^(r)      the probe's log-probs at the reference
moved      how far π_θ moved on the probe since the reference
followed   how far α moved since the reference
M          the largest mean_t |log α − log π_θ| at the reference and at every audit passed since:
           the engine's mismatch at equal weights (6: :data:`MISMATCH_MARGIN`)
τ          :data:`AUDIT_TOLERANCE` of the dtype π_θ's forward computes in
========== ==========================================================================================

Movement, not closeness: an engine's numerics differ from the trainer's at equal weights. The rule misses a
sync that moves α as far as π_θ but elsewhere, or one that skips a tensor whose change is small; and where the
mismatch grows past 2·M (a bfloat16 engine fed float32 weights) it may never judge: its verdict then says
``"not judged yet"``, and only the weights' proof stands. Why, and the measured mismatch:
docs/internals.md#sync-audit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from .checks import require_number_in
from .protocols import Rollout

AUDIT_TOLERANCE: dict[torch.dtype, float] = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-2,
                                             torch.bfloat16: 5e-2}
"""τ per dtype of π_θ's forward (its weights', or its autocast dtype under mixed precision): the mean |change| of
the probe's log-probs below which π_θ counts as unmoved, above a forward's run-to-run noise in that dtype (a GPU's
reductions may differ between two forwards of equal weights, by up to a rounding of the logits in 16-bit)."""

LAG0_MISMATCH: dict[torch.dtype, float] = {torch.float32: 1e-3, torch.bfloat16: 0.25}
"""The mean |log π_k − log α| per token (``StepRecord.log_ratio_k_abs``) a step at lag 0 stays under with an
untruncated in-process sampler, by the dtype π_θ's forward computes in (α decodes under the same autocast). After a
proved sync α holds π_θ's weights, so this gap is the kernels' rounding (a cached one-token decode against one
packed forward), not a lag: r′ = π_k/α is 1 only up to it. Measured on SmolLM2-135M, six steps at v = 1 on a CPU
(experiments/lag0_compute_dtype.py; results/offpolicy_split/lag0_dtype.json): float32 at most 6.7e-6 a token (r′ ≤
1.00003); bfloat16 0.021 to 0.064 (r′ up to 1.40). The bounds leave room for a GPU's kernels, which round otherwise:
float32's over a hundred times its figure, bfloat16's about four times. Only these two dtypes were measured. In
bfloat16 the rounding is as large as one training step's drift (0.08 a token at lag 1 in the CPU frontier study), so
this bound cannot tell a stale α from a synced one: the weights' proof (:mod:`grpo_lab.fingerprint`) does."""

PROBE_TOKENS = 8
"""Completion tokens of the probe: the first this many of the batch, row by row (all of them if fewer). One
forward of π_θ and one of the sampler (on vLLM, one one-token request per probe token) per sync."""

PROBE_CONTEXT = 8
"""Prompt tokens a language model's probe keeps, its last ones. Both sides score the probe's tokens after the
same short input, which is all the audit compares, for a fraction of a whole prompt's forward."""

MISMATCH_MARGIN = 6.0
"""A sync is judged once π_θ moved by more than τ + this × the largest mismatch seen on the probe (see the
docs/internals.md#sync-audit: safe while the mismatch stays within twice that largest)."""

CHECKS = ("the sampler's sync (does it copy every weight into the engine that samples?)",
          "the engine's weight loading (vLLM: reload_weights / load_weights, a tied LM head)",
          "sleep mode (an engine asleep during the push keeps its old weights)")
"""What a :class:`SyncError` tells to check."""


JUDGED, NOT_JUDGED = "judged", "not judged yet"
"""The probe's verdicts: the sync was judged and took, or π_θ has not moved far enough since the reference to
judge it (the first call, the reference, included)."""


class SyncError(RuntimeError):
    """A sync did not take: after α ← π_θ the sampler still serves (nearly) the weights it had."""


def probe_span(mask: torch.Tensor, tokens: int = PROBE_TOKENS) -> tuple[slice, torch.Tensor]:
    """The probe's part of a batch's completion ``mask [B, T]`` (True on a prefix of each row): its first
    ``tokens`` True entries in row order, as the rows ``0 … n−1`` that hold them and ``keep [n, c]``, True on
    them, cut to the c columns they span."""
    sampled = mask.bool()
    if not sampled.any():
        raise ValueError("the batch has no completion token to take the sync audit's probe from")
    keep = sampled & (sampled.flatten().long().cumsum(0).view(sampled.shape) <= tokens)
    n, c = (int(keep.any(dim).nonzero().max()) + 1 for dim in (1, 0))
    return slice(0, n), keep[:n, :c]


def probe_of(rollout: Rollout) -> Rollout:
    """The audit's probe of a batch: :func:`probe_span` of its rows and completion tokens (``mask`` True on the
    probe's tokens only), the entries of ``extra`` that hold one item per row cut alike, and, in a language
    model's rollout (left-padded ``extra["prompt_ids"]`` and ``["prompt_mask"]``, :mod:`grpo_lab.lm.sampling`),
    the last :data:`PROBE_CONTEXT` prompt tokens only."""
    rows, keep = probe_span(rollout.mask)
    B, (n, c) = rollout.completions.shape[0], keep.shape

    def cut(value: object) -> object:
        per_row = (torch.is_tensor(value) and value.dim() > 0 or isinstance(value, list)) and len(value) == B
        return value[rows] if per_row else value

    extra = {key: cut(value) for key, value in rollout.extra.items()}
    if "prompt_ids" in extra:
        extra["prompt_ids"] = extra["prompt_ids"][:, -PROBE_CONTEXT:]
        extra["prompt_mask"] = extra["prompt_mask"][:, -PROBE_CONTEXT:]
    return dataclasses.replace(rollout, prompts=rollout.prompts[:-(-n // rollout.group_size)],
                               completions=rollout.completions[rows, :c], logp_alpha=rollout.logp_alpha[rows, :c],
                               mask=keep, extra=extra)


@dataclass
class SyncAudit:
    """The audit's reference and rule (module docstring). ``tolerance`` is τ; build it with
    :meth:`for_dtype`. Drivers call :meth:`check` once when they take the probe and after every sync."""

    tolerance: float
    reference: tuple[torch.Tensor, torch.Tensor, int] | None = field(default=None, init=False)
    """log π_θ and log α of the probe's tokens at the last judged audit (or the first), and its step."""
    mismatch: float = field(default=0.0, init=False)
    """M: the largest mean |log α − log π_θ| on the probe at the reference and at every audit passed."""

    def __post_init__(self) -> None:
        require_number_in("tolerance", self.tolerance, 0.0, low_open=True)

    @classmethod
    def for_dtype(cls, dtype: torch.dtype) -> SyncAudit:
        if dtype not in AUDIT_TOLERANCE:
            raise ValueError(f"dtype = {dtype} has no sync-audit tolerance (one of {list(AUDIT_TOLERANCE)})")
        return cls(AUDIT_TOLERANCE[dtype])

    def reset(self) -> None:
        """Forget the reference and M (α was replaced by other means than a sync, e.g. a resume)."""
        self.reference, self.mismatch = None, 0.0

    def check(self, logp_policy: torch.Tensor, logp_alpha: torch.Tensor, step: int) -> str:
        """Judge the sync of step ``step`` from log π_θ and log α of the probe's tokens (1-D, the same tokens
        at every call); the first call, right after a sync, only keeps them as the reference. Returns the
        verdict, :data:`JUDGED` or :data:`NOT_JUDGED`; raises :class:`SyncError` (the verdict "failed").
        Scores that are not all finite are not judged (nor kept): a non-finite log π_θ is the loss's to report,
        with the step and pass named."""
        if logp_policy.shape != logp_alpha.shape or logp_policy.dim() != 1 or logp_policy.numel() == 0:
            raise ValueError(f"the probe's scores must be two 1-D tensors of one length > 0, got "
                             f"{tuple(logp_policy.shape)} and {tuple(logp_alpha.shape)}")
        logp_policy, logp_alpha = logp_policy.detach().double().cpu(), logp_alpha.detach().double().cpu()
        if not (torch.isfinite(logp_policy).all() and torch.isfinite(logp_alpha).all()):
            return NOT_JUDGED
        gap = float((logp_alpha - logp_policy).abs().mean())
        if self.reference is None:
            self.reference, self.mismatch = (logp_policy, logp_alpha, step), gap
            return NOT_JUDGED
        policy_then, alpha_then, then = self.reference
        moved = float((logp_policy - policy_then).abs().mean())
        if moved <= self.tolerance + MISMATCH_MARGIN * self.mismatch:
            return NOT_JUDGED
        followed = float((logp_alpha - alpha_then).abs().mean())
        if followed < moved / 2:
            raise SyncError(
                f"the sync at step {step} did not take: on the audit's probe ({logp_policy.numel()} tokens) log π_θ "
                f"moved by {moved:.3g} per token since step {then} and log α by {followed:.3g} (less than half; "
                f"the engine's mismatch there is at most {self.mismatch:.3g}): α still serves old weights. Check "
                + "; ".join(CHECKS) + ". (sync_audit=False turns this off.)")
        self.reference, self.mismatch = (logp_policy, logp_alpha, step), max(self.mismatch, gap)
        return JUDGED
