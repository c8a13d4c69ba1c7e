"""TRL's ``GRPOTrainer`` on the time-to-accuracy recipe (issues 25 §5 and 38): its config, the recipe's empty-batch
rule as a callback, the trainer, and a run driven by the study's clock.

``trl_config`` sets every default of TRL that differs from the recipe (loss type, constant lr, temperature,
dropout off, gradient checkpointing off: memory does not bind here, and on it recomputes the forward), one
batch of P·G completions per step. Stock TRL takes an AdamW step on every batch, also on a zero gradient; the
``trl`` arm drops the step of a batch with no signal (:func:`skip_empty_batch`), the loop's ``empty_step="skip"``
rule, after TRL has run that batch's forward and backward; ``trl_every_batch`` is stock TRL.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from grpo_lab.lm.train_config import TrainConfig


def trl_config(config: TrainConfig, output_dir: str) -> Any:
    """``trl.GRPOConfig`` for the recipe in ``config``: every default of TRL that differs is set."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir, per_device_train_batch_size=config.prompts_per_step * config.G,
        gradient_accumulation_steps=1, num_generations=config.G, max_completion_length=config.max_completion_length,
        learning_rate=config.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm, beta=config.beta, epsilon=config.eps_low, loss_type=config.loss_type,
        num_iterations=config.i, temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
        scale_rewards="group", disable_dropout=True, activation_checkpointing=False, use_cpu=True, bf16=False,
        seed=config.seed, data_seed=config.seed, max_steps=10**6, report_to="none", save_strategy="no",
        disable_tqdm=True)


def skip_empty_batch() -> Any:
    """A ``TrainerCallback`` for a stock ``trl.GRPOTrainer`` with β = 0: before each optimiser step, if every
    gradient is zero (every advantage 0: the batch has no signal) it sets them to ``None``, so AdamW skips
    the step and leaves its moments as they were (the loop's ``empty_step="skip"``). ``skipped`` counts them."""
    from transformers import TrainerCallback

    class SkipEmptyBatch(TrainerCallback):
        skipped = 0

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, optimizer: Any = None,
                                  **kwargs: Any) -> None:
            grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            if not any(bool(g.any()) for g in grads):
                optimizer.zero_grad(set_to_none=True)
                self.skipped += 1

    return SkipEmptyBatch()


def trl_trainer(config: TrainConfig, model: Any, tokenizer: Any, problems: Sequence[Any], output_dir: str,
                callbacks: Sequence[Any] = ()) -> Any:
    """``trl.GRPOTrainer`` on the recipe (:func:`trl_config`): ``problems`` as text prompts and the strict reward,
    where a completion has finished if it ends in one of the trainer's EOS ids."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from grpo_lab.lm.rewards import strict_reward
    from grpo_lab.lm.tasks import build_prompt

    if config.scoring != "strict":
        raise ValueError(f"the TRL arm scores strictly, so the recipe must too, got scoring={config.scoring!r}")
    stop_ids: set[int] = set()

    def reward(completions: list[str], completion_ids: list[list[int]], answer: list[str],
               answer_format: list[str], **kwargs: Any) -> list[float]:
        return [strict_reward(text, bool(ids) and ids[-1] in stop_ids, gold, form)
                for text, ids, gold, form in zip(completions, completion_ids, answer, answer_format, strict=True)]

    data = Dataset.from_dict({"prompt": [build_prompt(p, tokenizer, config.system_prompt) for p in problems],
                              "answer": [p.answer for p in problems],
                              "answer_format": [p.answer_format for p in problems]})
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=trl_config(config, output_dir), train_dataset=data,
                          processing_class=tokenizer, callbacks=list(callbacks))
    stop_ids.update(trainer.eos_token_ids)
    return trainer


def run_trl(config: TrainConfig, model: Any, tokenizer: Any, problems: Sequence[Any],
            on_start: Callable[[], None], after_step: Callable[[bool, Any], bool],
            skip_empty: bool = True) -> list[bool]:
    """Train ``trl.GRPOTrainer`` until ``after_step`` says stop; returns whether each step took an optimiser step.

    ``on_start()`` runs at the first step (the trainer's construction is off the clock); ``after_step(stepped,
    model)`` after each, told whether AdamW stepped and given the model being trained, returns True to stop.
    With ``skip_empty`` a batch with no signal takes no optimiser step (:func:`skip_empty_batch`, β = 0 only)."""
    from transformers import TrainerCallback

    if skip_empty and config.beta != 0:
        raise ValueError(f"skipping empty batches by their zero gradient needs beta = 0, got {config.beta}")
    skipper = skip_empty_batch()
    stepped: list[bool] = []

    class Clocked(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            on_start()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            skipped_before = len(stepped) - sum(stepped)
            stepped.append(skipper.skipped == skipped_before)   # the skipper counted no skip during this step
            control.should_training_stop = after_step(stepped[-1], kwargs["model"])

    with tempfile.TemporaryDirectory() as output_dir:
        trl_trainer(config, model, tokenizer, problems, output_dir,
                    callbacks=[Clocked(), *([skipper] if skip_empty else [])]).train()
    return stepped
