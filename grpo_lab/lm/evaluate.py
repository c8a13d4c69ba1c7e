"""Pass@k of a policy on held-out problems, n samples per question (docs/theory.md §6).

Pass@1 with n samples is the mean correctness over the n·Q completions; the
general Pass@k uses the unbiased estimator 1 − C(n−c, k)/C(n, k) per question
(c correct out of n), averaged over questions.

Every completion is scored both ways (:mod:`grpo_lab.lm.rewards`): **strict** (it finished
within the budget and is in the requested form with the right answer) and **lenient** (its
last box or number is right, truncated or not). Strict Pass@1 = (1 − truncated share) ×
accuracy of the finished ones, so a gain splits into terseness (fewer truncated) and
arithmetic (more of the finished right); lenient − strict is the credit for the wrong form
or for truncated text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import comb
from typing import Any

import torch

from ..checks import require_choice, require_int_at_least
from .rewards import SCORINGS
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
    """Per question (Q of them, n samples each): strict and lenient correct counts, truncated
    counts (no EOS within ``max_completion_length`` tokens), and the first sample of the first E
    questions to read (E = :func:`evaluate`'s ``examples``).

    =================== ====== ================================================
    field               length meaning
    =================== ====== ================================================
    ``correct``         Q      strict-correct completions of each question
    ``correct_lenient`` Q      lenient-correct completions of each question
    ``truncated``       Q      completions that ran out of tokens
    ``examples``        ≤ E    (question, gold, first completion, its strict reward)
    =================== ====== ================================================
    """

    n: int
    correct: list[int]
    correct_lenient: list[int]
    examples: list[tuple[str, str, str, float]]
    truncated: list[int]

    def pass_at(self, k: int = 1, scoring: str = "strict") -> float:
        """Pass@k under ``scoring`` (``"strict"`` or ``"lenient"``), averaged over questions."""
        counts = self.correct if require_choice("scoring", scoring, SCORINGS) == "strict" else self.correct_lenient
        return sum(pass_at_k(self.n, c, k) for c in counts) / len(counts)

    def truncated_frac(self) -> float:
        """Share of the n·Q completions that ran out of tokens."""
        return sum(self.truncated) / (self.n * len(self.truncated))

    def accuracy_finished(self) -> float:
        """Strict accuracy among the finished completions (0 if none finished): strict Pass@1 over
        (1 − truncated share)."""
        finished = self.n * len(self.truncated) - sum(self.truncated)
        return sum(self.correct) / finished if finished else 0.0


@torch.no_grad()
def evaluate(policy: Any, tokenizer: Any, problems: Sequence[Problem], n: int = 8, max_completion_length: int = 64,
             prompts_per_batch: int = 8, seed: int = 0, system_prompt: str | None = None,
             progress: bool = True, examples: int = 4) -> EvalResult:
    """Sample n completions per question from ``policy`` (an :class:`~grpo_lab.lm.policy.LMPolicy`,
    at its temperature) and score their correctness, strict and lenient."""
    from tqdm.auto import tqdm

    from .rewards import finished_completions, lenient_reward, strict_reward
    from .sampling import HFSampler

    require_int_at_least("n", n, 1)
    require_int_at_least("prompts_per_batch", prompts_per_batch, 1)
    if len(problems) == 0:
        raise ValueError("problems is empty: nothing to evaluate")
    sampler = HFSampler(policy, tokenizer, max_completion_length)
    generator = torch.Generator().manual_seed(seed)
    correct, lenient, truncated, shown = [], [], [], []
    batches = range(0, len(problems), prompts_per_batch)
    for start in tqdm(batches, desc="eval", unit="batch", disable=not progress):
        batch = problems[start:start + prompts_per_batch]
        rollout = sampler.sample([build_prompt(p, tokenizer, system_prompt) for p in batch], n, generator)
        texts = rollout.extra["texts"]
        finished = finished_completions(rollout.completions, rollout.mask, sampler.eos_token_ids).tolist()
        for q, problem in enumerate(batch):
            rows = range(q * n, (q + 1) * n)
            strict = [strict_reward(texts[j], finished[j], problem.answer, problem.answer_format) for j in rows]
            correct.append(int(sum(strict)))
            lenient.append(int(sum(lenient_reward(texts[j], problem.answer) for j in rows)))
            truncated.append(sum(not finished[j] for j in rows))
            if len(shown) < examples:
                shown.append((problem.question, problem.answer, texts[q * n], strict[0]))
    return EvalResult(n=n, correct=correct, correct_lenient=lenient, examples=shown, truncated=truncated)


# ----------------------------------------------------------------------------- evaluating a checkpoint

EVAL_FIELDS = ("task", "eval_task", "eval_split", "eval_data_files", "eval_problems", "eval_disjoint", "eval_samples",
               "scoring", "system_prompt", "max_completion_length", "top_p", "top_k", "seed", "device")
"""What an evaluation of a checkpoint may set: which questions, how many samples, how they are scored, the
prompt and sampling settings, where it runs. None of them changes the model being evaluated."""
MODEL_FIELDS = ("model", "dtype", "trust_remote_code", "temperature")
"""What makes another model than the checkpoint's π_θ: its architecture and tokenizer, its weights' precision,
the code that runs it, and T (π_θ = softmax(logits / T) is the policy the run trained)."""


def checkpoint_eval_config(saved: dict[str, Any], given: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The config to evaluate a checkpoint under: the checkpoint's own (``saved``) with the evaluation settings
    among the ``given`` fields (:data:`EVAL_FIELDS`) applied. A given field of :data:`MODEL_FIELDS` that differs
    from the checkpoint's is an error naming it; the other given fields (training-only knobs such as ``v`` or
    ``lr``) do not act on an evaluation: they are returned, ``{field: (given, kept)}``, for the caller to report."""
    from .recipes import train_config

    checkpoint = train_config(saved)
    kept = checkpoint.to_dict()
    changed = {name: value for name, value in train_config({**saved, **given}).to_dict().items()
               if name in given and value != kept[name]}
    refused = {name: (kept[name], value) for name, value in changed.items() if name in MODEL_FIELDS}
    if refused:
        raise ValueError(f"these settings change the model being evaluated (checkpoint's, given): {refused}; "
                         "drop them to evaluate the checkpoint's π_θ")
    ignored = {name: (value, kept[name]) for name, value in changed.items() if name not in EVAL_FIELDS}
    applied = {name: value for name, value in changed.items() if name in EVAL_FIELDS}
    return checkpoint.replace(**applied), ignored


def load_eval_policy(config: Any, checkpoint: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """π_θ (an :class:`~grpo_lab.lm.policy.LMPolicy` at the config's T) and its tokenizer: ``config.model``,
    with the weights of ``checkpoint`` (a state read by :func:`~grpo_lab.lm.checkpoint.read_checkpoint`) if given."""
    from .models import load_policy
    from .policy import LMPolicy

    model, tokenizer = load_policy(config.model, dtype=config.weights_dtype(), device=config.torch_device(),
                                   trust_remote_code=config.trust_remote_code)
    policy = LMPolicy(model, temperature=config.temperature, share_prompt=config.share_prompt,
                      compute_dtype=config.compute_dtype())
    if checkpoint is not None:
        policy.load_state_dict(checkpoint["policy"])
    return policy.eval().requires_grad_(False), tokenizer
