"""``build_loop``: a language model's run wired into the one (v, i) loop::

    load_policy(model) ─► LMPolicy (π_θ) ─► HFSampler (α, a frozen copy) ─┐
    train_problems(config) ─► TextTask (prompts, verifiable rewards) ─────┴─► GRPOLoop
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .loop import GRPOLoop
from .tasks import Problem
from .text_task import TextTask, train_problems
from .train_config import DTYPES, TrainConfig


def build_loop(config: TrainConfig, model: Any = None, tokenizer: Any = None,
               problems: Sequence[Problem] | None = None) -> GRPOLoop:
    """π_θ, α, the task and the loop of a run (loading the model and problems unless given).

    The memory guard checks the run fits before α is copied (it may shrink ``micro_batch_size``).
    """
    from .memory import guard_memory, longest_prompt
    from .models import load_policy
    from .policy import LMPolicy
    from .sampling import HFSampler

    if model is None:
        model, tokenizer = load_policy(config.model, dtype=DTYPES[config.dtype], device=config.torch_device(),
                                       trust_remote_code=config.trust_remote_code)
    if problems is None:
        problems = train_problems(config)
    if config.prompts_per_step > len(problems):
        raise ValueError(f"prompts_per_step = {config.prompts_per_step} exceeds the {len(problems)} problems")
    model.requires_grad_(True)
    task = TextTask(problems, tokenizer, config.system_prompt, format_weight=config.format_weight)
    config = guard_memory(config, model, longest_prompt(tokenizer, task.prompt_of.values()))
    policy = LMPolicy(model, temperature=config.temperature)
    sampler = HFSampler(policy, tokenizer, config.max_completion_length, config.temperature)
    loop = GRPOLoop(policy, sampler, task, config)
    loop.tokenizer = tokenizer
    return loop
