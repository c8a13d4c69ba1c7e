"""The protocols the loop talks to, and the batch they pass (docs/theory.md §5).

:class:`Policy` (π_θ), :class:`Sampler` (α) and :class:`Task` (prompts and a verifiable reward) are what
:class:`~grpo_lab.loop.GRPOLoop` drives, and :class:`ScoringSampler` the sampler that the sync audit and the
off-policy split also need; :class:`Rollout` is one batch a sampler draws from α. Their own module, below the
loop and the sync audit, so both import them without importing each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass
class Rollout:
    """P prompts × G completions drawn from α, rows ordered prompt-major (row = p·G + g).

    =============== ========== ================================================
    field           shape      meaning
    =============== ========== ================================================
    ``prompts``     P items    whatever the task uses as a prompt
    ``completions`` ``[B, T]`` sampled tokens (or arm indices, T = 1)
    ``logp_alpha``  ``[B, T]`` log α of each sampled token, from the sampler
    ``mask``        ``[B, T]`` True on real completion tokens (padding False)
    ``extra``       dict       sampler-specific data (e.g. prompt token ids)
    =============== ========== ================================================
    """

    prompts: Sequence[Any]
    completions: torch.Tensor
    logp_alpha: torch.Tensor
    mask: torch.Tensor
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def group_size(self) -> int:
        return self.completions.shape[0] // len(self.prompts)


@runtime_checkable
class Policy(Protocol):
    """π_θ: an ``nn.Module`` that scores a rollout's completions."""

    def logprobs(self, rollout: Rollout, rows: slice) -> torch.Tensor:
        """log π_θ of ``rollout.completions[rows]`` at the sampling temperature, ``[b, T]``."""

    def parameters(self) -> Any: ...

    def state_dict(self) -> dict[str, torch.Tensor]: ...


@runtime_checkable
class Sampler(Protocol):
    """The inference server: holds α, samples with log α, and is synced to π_θ."""

    def sample(self, prompts: Sequence[Any], group_size: int, generator: torch.Generator) -> Rollout: ...

    def sync(self, policy: Policy) -> int:
        """Copy π_θ's weights into α in place; return the bytes moved."""

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> Any: ...


@runtime_checkable
class ScoringSampler(Sampler, Protocol):
    """A sampler that also scores given tokens: what the sync audit (``score``, ``GRPOConfig.sync_audit``) and
    the off-policy split (``synced_logprobs``, ``GRPOConfig.offpolicy_split``) need. Both return ``[b, T]``
    without gradient, as :meth:`Policy.logprobs` lays them out."""

    def score(self, rollout: Rollout, rows: slice) -> torch.Tensor:
        """log α of ``rollout.completions[rows]`` from the engine that samples, at the sampling temperature,
        untruncated (the audit checks weights, not the truncation)."""

    def synced_logprobs(self, rollout: Rollout, rows: slice) -> torch.Tensor:
        """log π_sync: the trainer's forward (as :meth:`Policy.logprobs`) at the weights of the last sync."""


@runtime_checkable
class Task(Protocol):
    """Prompts and a verifiable reward."""

    def prompts(self, n: int, generator: torch.Generator) -> Sequence[Any]: ...

    def rewards(self, rollout: Rollout, generator: torch.Generator) -> torch.Tensor:
        """Rewards ``[P, G]`` in [0, 1] for the rollout's completions."""
