"""TRL's ``GRPOTrainer`` on the time-to-accuracy recipe: its config, the recipe's empty-batch
rule as a callback, the trainer, and a run driven by the study's clock.

``trl_config`` is the recipe's stock TRL config (built once, in :func:`grpo_lab.scale.launch.stock_trl_config`),
gradient checkpointing off (memory does not bind here, and on it recomputes the forward), one batch of P·G
completions per step. Stock TRL takes an AdamW step on every batch, also on a zero gradient; the
``trl`` arm drops the step of a batch with no signal (:func:`skip_empty_batch`), the loop's ``empty_step="skip"``
rule, after TRL has run that batch's forward and backward; ``trl_every_batch`` is stock TRL.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from grpo_lab.lm.train_config import TrainConfig


def trl_config(config: TrainConfig, output_dir: str) -> Any:
    """``trl.GRPOConfig`` for the recipe in ``config`` (:func:`~grpo_lab.scale.launch.stock_trl_config`, the one
    builder of stock TRL's config): one micro-batch of P·G completions a step, on the CPU, until the study's clock
    stops it, with no checkpoint and gradient checkpointing off."""
    from grpo_lab.scale.launch import stock_trl_config

    return stock_trl_config(config.replace(micro_batch_size=None), extras=dict(
        output_dir=output_dir, use_cpu=True, max_steps=10**6, save_strategy="no", activation_checkpointing=False,
        disable_tqdm=True))


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
    """``trl.GRPOTrainer`` on the recipe (:func:`trl_config`), strict reward
    (:func:`~grpo_lab.scale.launch.stock_trl_trainer`)."""
    from grpo_lab.scale.launch import stock_trl_trainer

    return stock_trl_trainer(config, model, tokenizer, problems, trl_config(config, output_dir), callbacks)


def run_trl(config: TrainConfig, model: Any, tokenizer: Any, problems: Sequence[Any],
            on_start: Callable[[], None], after_step: Callable[[bool, Any], bool],
            skip_empty: bool = True, on_trainer: Callable[[Any], None] | None = None) -> list[bool]:
    """Train ``trl.GRPOTrainer`` until ``after_step`` says stop; returns whether each step took an optimiser step.

    ``on_start()`` runs at the first step (the trainer's construction is off the clock); ``after_step(stepped,
    model)`` after each, told whether AdamW stepped and given the model being trained, returns True to stop.
    With ``skip_empty`` a batch with no signal takes no optimiser step (:func:`skip_empty_batch`, β = 0 only).
    ``on_trainer(trainer)``, if given, sees the trainer once it is built and before it trains (a unit reads its
    resolved ``args``; a benchmark wraps its reward or generation calls)."""
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
        trainer = trl_trainer(config, model, tokenizer, problems, output_dir,
                              callbacks=[Clocked(), *([skipper] if skip_empty else [])])
        if on_trainer is not None:
            on_trainer(trainer)
        trainer.train()
    return stepped
