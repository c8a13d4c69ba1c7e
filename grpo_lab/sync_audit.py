"""Did the sync take? The second line of the sync audit: α's behaviour on a probe (docs/metrics.md).

The first line proves the weights (:mod:`grpo_lab.fingerprint`): every tensor the sampler serves against
π_θ's. This module judges behaviour instead, which catches what fingerprints cannot (right bytes served
through a wrong layout), but only conditionally: see the end of this docstring.

A sync that silently does nothing (an engine asleep during the push, weights loaded under the wrong names,
a tied LM head left behind, a sampler whose ``sync`` forgot a tensor) leaves α at old weights while the run
goes on as if it were fresh: r′ = π_k/α still corrects for it, so training does not fail, it just runs at a
lag nobody chose. The audit scores a small fixed probe — a few tokens of the first batch sampled right after a
sync, after a few tokens of their prompt (:func:`probe_of`) — with π_θ and with the sampler, once when the probe
is taken (the reference) and after every sync.

The rule (:meth:`SyncAudit.check`), on the probe's n tokens, against the reference r::

    moved    = mean_t |log π_θ − log π_θ^(r)|        how far π_θ moved since the reference
    followed = mean_t |log α − log α^(r)|            how far α moved since the reference
    M        = the largest mean_t |log α − log π_θ| at the reference and at every audit passed since
               (the engine's mismatch on the probe: its numerics at equal weights)
    moved ≤ τ + 6·M            → not judged yet; the reference stays, so the moves add up
    followed < moved / 2       → SyncError
    otherwise                  → the sync took; this audit becomes the reference

τ is :data:`AUDIT_TOLERANCE` of the dtype π_θ's forward computes in. Why movement and not closeness
(|log α − log π_θ| after the sync against before it): an engine's numerics differ from the trainer's at equal
weights, so right after a good sync α is *not* close to π_θ when π_θ moved little, and a closeness rule fires on
mismatch alone. Why the margin 6·M: after a good sync, α's move differs from π_θ's by at most the mismatch now
plus the mismatch at the reference (triangle inequality), so once π_θ moved by more than 6·M, α moved by more
than half of it whenever the mismatch now is at most 2·M; after a sync that did nothing, α did not move at all.
The mismatch need not be independent of the move: a bfloat16 engine fed a float32 trainer's weights rounds small updates
away, so on a few tokens α's move can be a fraction of π_θ's at one sync and a multiple of it at the next
(docs/benchmarks.md, sync audit); the margin covers that too, at the price of judging such a run only after
π_θ moved by several mismatches. With a float32 engine M is tiny and a sync is judged as soon as π_θ moves.
What the rule does not catch: a sync that moves α as far as π_θ moved, but elsewhere (wrong weights loaded
in full), nor one that misses a tensor whose change is small (α still moves more than half as far). And its
no-false-alarm argument needs the mismatch to stay within 2·M: a bfloat16 engine fed float32 weights moved
the batch mismatch from 0.038 to 0.725 nats a token within two steps (``results/offpolicy_split``), and at
M ≈ 0.7 a sync is judged only after π_θ moved τ + 4.2 nats a token on the probe, effectively never. There "no
SyncError" from this rule is no evidence that a sync took: its verdict says ``"not judged yet"``, and only
the weights' proof stands.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from .checks import require_number_in
from .rollout import Rollout

AUDIT_TOLERANCE: dict[torch.dtype, float] = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-2,
                                             torch.bfloat16: 5e-2}
"""τ per dtype of π_θ's forward (its weights', or its autocast dtype under mixed precision): the mean |change| of
the probe's log-probs below which π_θ counts as unmoved, above a forward's run-to-run noise in that dtype (a GPU's
reductions may differ between two forwards of equal weights, by up to a rounding of the logits in 16-bit)."""

PROBE_TOKENS = 8
"""Completion tokens of the probe: the first this many of the batch, row by row (all of them if fewer). One
forward of π_θ and one of the sampler (on vLLM, one one-token request per probe token) per sync."""

PROBE_CONTEXT = 8
"""Prompt tokens a language model's probe keeps, its last ones. Both sides score the probe's tokens after the
same short input, which is all the audit compares, for a fraction of a whole prompt's forward."""

MISMATCH_MARGIN = 6.0
"""A sync is judged once π_θ moved by more than τ + this × the largest mismatch seen on the probe (see the
module docstring: safe while the mismatch stays within twice that largest)."""

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
