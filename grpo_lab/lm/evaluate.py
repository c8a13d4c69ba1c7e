"""Pass@k of a policy on held-out problems, n samples per question (docs/theory.md §6).

Pass@1 with n samples is the mean correctness over the n·Q completions; the
general Pass@k uses the unbiased estimator 1 − C(n−c, k)/C(n, k) per question
(c correct out of n), averaged over questions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import comb
from typing import Any

import torch

from ..checks import require_int_at_least
from .tasks import Problem, build_prompt


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k of one question with c correct among n samples."""
    require_int_at_least("n", n, 1)
    require_int_at_least("k", k, 1)
    if not 0 <= c <= n or k > n:
        raise ValueError(f"need 0 <= c <= n and k <= n, got n = {n}, c = {c}, k = {k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass
class EvalResult:
    """Correct and truncated counts per question, and a few completions to read.

    A completion is truncated when it used all ``max_completion_length`` tokens
    without an EOS: it ran out of budget. Pass@1 = (1 − truncated share) ×
    accuracy of the finished ones, which separates a gain in terseness from
    one in arithmetic (docs/benchmarks.md, the CPU task scan).
    """

    n: int
    correct: list[int]
    examples: list[tuple[str, str, str, float]]   # (question, gold, completion, reward)
    truncated: list[int]

    def pass_at(self, k: int = 1) -> float:
        return sum(pass_at_k(self.n, c, k) for c in self.correct) / len(self.correct)

    def truncated_frac(self) -> float:
        """Share of the n·Q completions that ran out of tokens."""
        return sum(self.truncated) / (self.n * len(self.truncated))


@torch.no_grad()
def evaluate(policy: Any, tokenizer: Any, problems: Sequence[Problem], n: int = 8, max_completion_length: int = 64,
             prompts_per_batch: int = 8, seed: int = 0, system_prompt: str | None = None,
             progress: bool = True, examples: int = 4) -> EvalResult:
    """Sample n completions per question from ``policy`` (an :class:`~grpo_lab.lm.policy.LMPolicy`,
    at its temperature) and score their correctness."""
    from tqdm.auto import tqdm

    from .rewards import correctness_reward
    from .sampling import HFSampler

    require_int_at_least("n", n, 1)
    require_int_at_least("prompts_per_batch", prompts_per_batch, 1)
    if len(problems) == 0:
        raise ValueError("problems is empty: nothing to evaluate")
    sampler = HFSampler(policy, tokenizer, max_completion_length)
    generator = torch.Generator().manual_seed(seed)
    correct, truncated, shown = [], [], []
    batches = range(0, len(problems), prompts_per_batch)
    for start in tqdm(batches, desc="eval", unit="batch", disable=not progress):
        batch = problems[start:start + prompts_per_batch]
        rollout = sampler.sample([build_prompt(p, tokenizer, system_prompt) for p in batch], n, generator)
        texts = rollout.extra["texts"]
        ran_out = is_truncated(rollout, max_completion_length, sampler.eos_token_ids)
        for q, problem in enumerate(batch):
            rewards = [correctness_reward(texts[q * n + j], problem.answer) for j in range(n)]
            correct.append(int(sum(rewards)))
            truncated.append(int(ran_out[q * n:(q + 1) * n].sum()))
            if len(shown) < examples:
                shown.append((problem.question, problem.answer, texts[q * n], rewards[0]))
    return EvalResult(n=n, correct=correct, examples=shown, truncated=truncated)


def is_truncated(rollout: Any, max_completion_length: int, eos_token_ids: Sequence[int]) -> torch.Tensor:
    """``[B]`` True where a completion used all ``max_completion_length`` tokens and its last is no EOS."""
    lengths = rollout.mask.sum(dim=1)
    last = rollout.completions[:, -1]
    ended = torch.isin(last, torch.as_tensor(list(eos_token_ids)))
    return (lengths == max_completion_length) & ~ended
