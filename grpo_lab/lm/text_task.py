"""The text task of an LLM run: problems as chat prompts, scored by a verifiable reward.

:class:`TextTask` is the loop's ``Task`` for a language model; :func:`train_problems` and
:func:`eval_problems` load the problems a :class:`~grpo_lab.lm.train_config.TrainConfig` names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..protocols import Rollout
from .tasks import Problem, build_prompt, load_problems, sample_problems
from .train_config import TrainConfig


class TextTask:
    """Problems as chat prompts, scored by a verifiable reward (the loop's ``Task``).

    ``reward_fn(completion, problem, finished) -> float`` defaults to
    :func:`grpo_lab.lm.rewards.answer_reward` with the problem's answer format and ``scoring``
    (``"strict"``: only a finished completion in the requested form scores; ``"lenient"``: the last
    box or number, truncated or not). ``finished`` says whether the completion ended with one of
    ``eos_token_ids`` (default: the tokenizer's EOS; pass the sampler's stop ids) within its budget.
    """

    def __init__(self, problems: Sequence[Problem], tokenizer: Any, system_prompt: str | None = None,
                 reward_fn: Callable[[str, Problem, bool], float] | None = None, format_weight: float = 0.0,
                 scoring: str = "strict", eos_token_ids: Sequence[int] | None = None) -> None:
        if len(problems) == 0:
            raise ValueError("problems is empty: the task has nothing to train on")
        from ..checks import require_choice
        from .rewards import SCORINGS, answer_reward

        require_choice("scoring", scoring, SCORINGS)
        self.problems = list(problems)
        self.tokenizer = tokenizer
        """The tokenizer that renders the prompts (and decodes completions: :mod:`~grpo_lab.lm.group_view`)."""
        self.prompt_of = {id(p): build_prompt(p, tokenizer, system_prompt) for p in self.problems}
        self.problem_of = {self.prompt_of[id(p)]: p for p in self.problems}
        self.eos_token_ids = list(eos_token_ids) if eos_token_ids is not None else [tokenizer.eos_token_id]
        if None in self.eos_token_ids or len(self.eos_token_ids) == 0:
            raise ValueError(f"eos_token_ids must name the ids that end a completion, got {self.eos_token_ids} "
                             "(the tokenizer has no EOS token: pass eos_token_ids)")
        self.drawn: list[Problem] = []
        """The problems of the last :meth:`prompts` call (a study logs which questions each step trained on)."""
        self.reward_fn = reward_fn or (lambda text, p, finished: answer_reward(
            text, p.answer, p.answer_format, format_weight, finished=finished, scoring=scoring))

    def prompts(self, n: int, generator: torch.Generator) -> list[str]:
        """``n`` distinct problems' prompts, drawn with ``generator``; the problems are kept in :attr:`drawn`."""
        self.drawn = sample_problems(self.problems, n, generator)
        return [self.prompt_of[id(p)] for p in self.drawn]

    def rewards(self, rollout: Rollout, generator: torch.Generator) -> torch.Tensor:
        from .rewards import compute_rewards, finished_completions

        G = rollout.group_size
        problems = [self.problem_of[prompt] for prompt in rollout.prompts for _ in range(G)]
        finished = finished_completions(rollout.completions, rollout.mask, self.eos_token_ids).tolist()
        values = compute_rewards(lambda text, target: self.reward_fn(text, *target), rollout.extra["texts"],
                                 list(zip(problems, finished, strict=True)), [j // G for j in range(len(problems))])
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
    """Held-out problems: another seed of a generated task, or a dataset's evaluation split.

    With ``config.eval_disjoint`` a generated task's questions are distinct and none is a training
    question; a task too small for that raises a ValueError with its counts.
    """
    name = config.eval_task or config.task
    n, seed = config.eval_problems, config.seed + 10_000
    if not config.eval_disjoint:
        return _load(name, n, seed, config.eval_split, config.eval_data_files)
    from .tasks import GYM_TASKS

    if name not in GYM_TASKS:
        raise ValueError(f"eval_disjoint applies to generated tasks, not {name!r} (a dataset's splits are its own)")
    seen = {p.question for p in train_problems(config)}
    pool = _load(name, 20 * n, seed, None, None)
    held_out = []
    for problem in pool:
        if problem.question not in seen:
            seen.add(problem.question)
            held_out.append(problem)
    if len(held_out) < n:
        raise ValueError(f"eval_disjoint: task {name!r} gave {len(held_out)} distinct questions outside its "
                         f"{config.train_problems} training problems in {len(pool)} draws, not eval_problems = {n}: "
                         "use a larger task, fewer eval_problems, or eval_disjoint = false")
    return held_out[:n]
