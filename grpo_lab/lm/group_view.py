"""What one group looks like on a language model: G completions of one prompt from α, their
rewards, whitened advantages, whether the zero-variance mask keeps the group, and the
per-token r′ = π_k/α that corrects for the server's lag (docs/theory.md §3).

Also :func:`token_ratios`, r′ per token from logged log-probs (the TV estimate from the same
log-probs is :func:`grpo_lab.objective.tv_terms`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..loop import GRPOLoop
from ..objective import tv_terms
from .rewards import finished_completions


def token_ratios(logp_k: torch.Tensor, logp_alpha: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """r′_t = π_k(y_t | x, y_<t) / α(y_t | x, y_<t) on real tokens, 0 on padding. All ``[B, T]``."""
    return torch.where(mask.bool(), torch.exp(logp_k - logp_alpha), torch.zeros_like(logp_k))


@dataclass
class GroupView:
    """One prompt's group: what the loss sees of it at the next step."""

    prompt: str
    texts: list[str]
    tokens: list[list[str]]            # each completion's tokens, as text
    rewards: torch.Tensor              # [G]
    advantages: torch.Tensor           # [G], whitened within the group
    kept: bool                         # False: the zero-variance mask drops the group
    ratios: torch.Tensor               # [G, T] r′ per token, 0 on padding
    tv: float                          # TV(π_k, α) estimated from these G samples
    lag: int                           # steps since α was synced: k − k0 (the figure's title and the note's)
    trained: int                       # optimiser steps π_θ took since α was synced (skipped steps take none)
    finished: list[bool]               # whether each completion ended with a stop token within its budget

    @property
    def end_ratios(self) -> list[float]:
        """r′ on the stop token of each finished completion: how much less (or more) π_k ends there than α."""
        return [float(row[len(tokens) - 1]) for row, tokens, done in zip(self.ratios, self.tokens, self.finished,
                                                                          strict=True) if done]

    @property
    def note(self) -> str:
        """Why r′ is what it is, at :attr:`lag` (steps since the sync, the figure's title): π_θ moved since the
        sync (r′ drifts from 1), or it did not (r′ = 1). Of the lag's steps, those skipped (every group masked)
        took no optimiser step: ``trained`` of them did."""
        steps = f"{self.lag} step{'s' * (self.lag != 1)} since α was last synced"
        skipped = self.lag - self.trained
        if self.trained:
            return (f"{steps}, {self.trained} of which took an optimiser step" +
                    (f" ({skipped} skipped: every group masked)" if skipped else "") + ": π_θ moved, r′ drifts from 1")
        if self.lag == 0:
            return "α was synced at this step, so π_k = α and r′ = 1 on every token"
        return (f"{steps}, all skipped (every group masked: no optimiser step), so π_θ has not moved, π_k = α and "
                "r′ = 1 on every token")


@torch.no_grad()
def group_view(loop: GRPOLoop, seed: int = 0, tries: int = 8) -> GroupView:
    """Sample one prompt's G completions from the loop's α (as step ``loop.k`` would) and score
    them with π_θ, which is π_k of that step. Draws up to ``tries`` prompts (seeded by
    ``seed``) and keeps the first whose group the mask keeps, else the last one."""
    generator = torch.Generator().manual_seed(seed)
    cfg = loop.config
    for _ in range(tries):
        prompts = loop.task.prompts(1, generator)
        rollout = loop.sampler.sample(prompts, cfg.G, generator)
        rewards = loop.task.rewards(rollout, generator)
        plan = loop.plan(rollout, rewards)
        if bool(plan.informative[0]):
            break
    logp_k = loop.policy.logprobs(rollout, slice(None))
    mask = rollout.mask
    tokenizer = loop.task.tokenizer
    tokens = [[tokenizer.decode([t]) for t in row[keep].tolist()]
              for row, keep in zip(rollout.completions, mask, strict=True)]
    return GroupView(prompt=prompts[0], texts=list(rollout.extra["texts"]), tokens=tokens, rewards=rewards[0].float(),
                     advantages=plan.advantages.float(), kept=bool(plan.informative[0]),
                     ratios=token_ratios(logp_k, rollout.logp_alpha, mask),
                     tv=float(tv_terms(logp_k, rollout.logp_alpha, mask).mean()), lag=loop.schedule.lag(loop.k),
                     trained=sum(not r.skipped for r in loop.history[max(loop.schedule.last_sync, 0):]),
                     finished=finished_completions(rollout.completions, mask, loop.task.eos_token_ids).tolist())
