"""The text task of an LLM run: problems as chat prompts, scored by a verifiable reward.

:class:`TextTask` is the loop's ``Task`` for a language model; :func:`train_problems` and
:func:`eval_problems` load the problems a :class:`~grpo_lab.lm.train_config.TrainConfig` names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..loop import Rollout
from .tasks import Problem, build_prompt, load_problems, sample_problems
from .train_config import TrainConfig


class TextTask:
    """Problems as chat prompts, scored by a verifiable reward (the loop's ``Task``).

    ``reward_fn(completion, problem) -> float`` defaults to
    :func:`grpo_lab.lm.rewards.answer_reward` with the problem's answer format.
    """

    def __init__(self, problems: Sequence[Problem], tokenizer: Any, system_prompt: str | None = None,
                 reward_fn: Callable[[str, Problem], float] | None = None, format_weight: float = 0.0) -> None:
        if len(problems) == 0:
            raise ValueError("problems is empty: the task has nothing to train on")
        from .rewards import answer_reward

        self.problems = list(problems)
        self.prompt_of = {id(p): build_prompt(p, tokenizer, system_prompt) for p in self.problems}
        self.problem_of = {self.prompt_of[id(p)]: p for p in self.problems}
        self.reward_fn = reward_fn or (lambda text, p: answer_reward(text, p.answer, p.answer_format, format_weight))

    def prompts(self, n: int, generator: torch.Generator) -> list[str]:
        return [self.prompt_of[id(p)] for p in sample_problems(self.problems, n, generator)]

    def rewards(self, rollout: Rollout, generator: torch.Generator) -> torch.Tensor:
        from .rewards import compute_rewards

        G = rollout.group_size
        problems = [self.problem_of[prompt] for prompt in rollout.prompts for _ in range(G)]
        values = compute_rewards(self.reward_fn, rollout.extra["texts"], problems,
                                 [j // G for j in range(len(problems))])
        return values.reshape(len(rollout.prompts), G)


def _load(name: str, n: int, seed: int, split: str | None, data_files: str | None) -> list[Problem]:
    """Generated tasks take a seed; datasets take a split and optional local files."""
    from .tasks import GYM_TASKS

    if name in GYM_TASKS:
        return load_problems(name, n, seed=seed)
    return load_problems(name, n, split=split, data_files=data_files)


def train_problems(config: TrainConfig) -> list[Problem]:
    """The training problems: ``config.task``'s first ``train_problems`` (generated from ``config.seed``)."""
    return _load(config.task, config.train_problems, config.seed, config.train_split, config.data_files)


def eval_problems(config: TrainConfig) -> list[Problem]:
    """Held-out problems: another seed of a generated task, or a dataset's evaluation split."""
    name = config.eval_task or config.task
    return _load(name, config.eval_problems, config.seed + 10_000, config.eval_split, config.eval_data_files)
