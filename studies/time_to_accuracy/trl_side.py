"""TRL's ``GRPOTrainer`` on the time-to-accuracy recipe: its config, the recipe's empty-batch
rule as a callback, the trainer, and a run driven by the study's clock.

``trl_config`` is the recipe's stock TRL config (built once, in :func:`grpo_lab.scale.launch.stock_trl_config`),
gradient checkpointing off (memory does not bind here, and on it recomputes the forward), one batch of P·G
completions per step. Stock TRL takes an AdamW step on every batch, also on a zero gradient; the
``trl`` arm drops the step of a batch with no signal (:func:`skip_empty_batch`), the loop's ``empty_step="skip"``
rule, after TRL has run that batch's forward and backward; ``trl_every_batch`` is stock TRL. A run given a unit's
checkpoint resumes from Hugging Face's own checkpoint and saves one at the evaluation points the unit says are due.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_lab.lm.train_config import TrainConfig

if TYPE_CHECKING:
    from studies.clock import Checkpoint


def trl_config(config: TrainConfig, output_dir: str, micro_batch_size: int | None = None) -> Any:
    """``trl.GRPOConfig`` for the recipe in ``config`` (:func:`~grpo_lab.scale.launch.stock_trl_config`, the one
    builder of stock TRL's config): one micro-batch of P·G completions a step (or, given ``micro_batch_size``, that
    many a forward, accumulated over one generation into one optimiser step), on the CPU, until the study's clock
    stops it, with no checkpoint of its own (a resumable unit asks for one at its evaluation points, :func:`clocked`)
    and gradient checkpointing off."""
    from grpo_lab.scale.launch import stock_trl_config

    return stock_trl_config(config.replace(micro_batch_size=micro_batch_size), extras=dict(
        output_dir=output_dir, use_cpu=True, max_steps=10**6, save_strategy="no", activation_checkpointing=False,
        disable_tqdm=True))


@contextlib.contextmanager
def completion_scoring() -> Iterator[None]:
    """TRL's fused LM head scoring the completion positions only, as TRL does where Triton runs. Elsewhere (here:
    the CPU) TRL scores every position, prompt included, and masks the prompt's afterwards; one name in
    ``trl.trainer.utils``, ``_use_triton``, decides which, and it is switched here for the block. The tiles' kernel
    (``trl.kernels.chunked_logprob``'s own ``_use_triton``) stays torch's."""
    import trl.trainer.utils as trl_utils

    if not callable(getattr(trl_utils, "_use_triton", None)):
        raise RuntimeError(f"trl {importlib.metadata.version('trl')}: trl.trainer.utils has no _use_triton; the "
                           "fused LM head's scoring switch has moved")
    original = trl_utils._use_triton
    trl_utils._use_triton = lambda device: True
    try:
        yield
    finally:
        trl_utils._use_triton = original


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
                callbacks: Sequence[Any] = (), micro_batch_size: int | None = None) -> Any:
    """``trl.GRPOTrainer`` on the recipe (:func:`trl_config`), strict reward
    (:func:`~grpo_lab.scale.launch.stock_trl_trainer`)."""
    from grpo_lab.scale.launch import stock_trl_trainer

    return stock_trl_trainer(config, model, tokenizer, problems, trl_config(config, output_dir, micro_batch_size),
                             callbacks)


def run_trl(config: TrainConfig, model: Any, tokenizer: Any, problems: Sequence[Any],
            on_start: Callable[[], None], after_step: Callable[[bool, Any], bool],
            skip_empty: bool = True, on_trainer: Callable[[Any], None] | None = None,
            checkpoint: Checkpoint | None = None, micro_batch_size: int | None = None) -> list[bool]:
    """Train ``trl.GRPOTrainer`` until ``after_step`` says stop; returns whether each step took an optimiser step.

    ``on_start()`` runs at the first step (the trainer's construction is off the clock); ``after_step(stepped,
    model)`` after each, told whether AdamW stepped and given the model being trained, returns True to stop.
    With ``skip_empty`` a batch with no signal takes no optimiser step (:func:`skip_empty_batch`, β = 0 only).
    ``on_trainer(trainer)``, if given, sees the trainer once it is built and before it trains (a unit reads its
    resolved ``args``; a benchmark wraps its reward or generation calls). With ``checkpoint`` the run resumes
    from Hugging Face's checkpoint there and saves one when an evaluation point is due (:func:`clocked`).
    ``micro_batch_size``: :func:`trl_config`'s."""
    if skip_empty and config.beta != 0:
        raise ValueError(f"skipping empty batches by their zero gradient needs beta = 0, got {config.beta}")
    skipper = skip_empty_batch()
    saved = checkpoint.trainer_state if checkpoint is not None else {}
    stepped: list[bool] = list(saved.get("stepped", []))
    skipper.skipped = int(saved.get("skipped", 0))
    callbacks = [clocked(on_start, after_step, stepped, skipper, checkpoint), *([skipper] if skip_empty else [])]
    resume = None if checkpoint is None or checkpoint.resume_from is None else str(checkpoint.resume_from)
    folder = tempfile.TemporaryDirectory() if checkpoint is None else contextlib.nullcontext(str(checkpoint.staging))
    with folder as output_dir:
        trainer = trl_trainer(config, model, tokenizer, problems, output_dir, callbacks, micro_batch_size)
        if checkpoint is not None and trainer.args.steps_per_generation * trainer.args.num_iterations != 1:
            raise ValueError("a checkpoint keeps no generation buffer: resuming needs one generation per optimiser "
                             f"step, got steps_per_generation = {trainer.args.steps_per_generation}, num_iterations = "
                             f"{trainer.args.num_iterations}")
        if on_trainer is not None:
            on_trainer(trainer)
        # Hugging Face's resume (transformers 5.25) reads no arbitrary pickle: the weights from model.safetensors,
        # optimizer.pt, scheduler.pt and rng_state.pth by torch.load(weights_only=True) (the RNG file under
        # transformers' safe_globals, which allows only numpy's array and dtype types, for numpy's RNG state),
        # trainer_state.json as JSON; training_args.bin, a pickle of the arguments, is written but never read.
        trainer.train(resume_from_checkpoint=resume)
    return stepped


def clocked(on_start: Callable[[], None], after_step: Callable[[bool, Any], bool], stepped: list[bool],
            skipper: Any, checkpoint: Checkpoint | None) -> Any:
    """The callback that runs TRL by the study's clock: ``on_start()`` at the first step (after a resume, once the
    trainer has restored its state), ``after_step`` after each step, ``stepped`` extended by whether it stepped
    (``skipper`` counted no skip during it). With ``checkpoint``, a step after which an evaluation point is due
    asks for Hugging Face's own checkpoint (``control.should_save``: model, optimiser, scheduler, trainer state
    and RNG states, written to ``<output_dir>/checkpoint-<step>`` just after this callback), which ``on_save``
    seals with ``stepped`` and ``skipper``'s count."""
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    class Clocked(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, train_dataloader: Any = None,
                           **kwargs: Any) -> None:
            if state.global_step:
                replay_shuffles(train_dataloader, state.global_step, args.gradient_accumulation_steps)
            on_start()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            skipped_before = len(stepped) - sum(stepped)
            stepped.append(skipper.skipped == skipped_before)   # the skipper counted no skip during this step
            control.should_training_stop = after_step(stepped[-1], kwargs["model"])
            if checkpoint is not None and not control.should_training_stop and checkpoint.due():
                checkpoint.begin()
                control.should_save = True

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            checkpoint.commit(folder, {"stepped": stepped, "skipped": skipper.skipped})

    return Clocked()


def replay_shuffles(dataloader: Any, global_step: int, accumulation: int) -> None:
    """Draw from a resumed trainer's fresh data sampler the shuffles of the epochs before its checkpoint's epoch.
    TRL's ``RepeatSampler`` shuffles each epoch with one generator seeded once, so epoch e's order is its draw
    e + 1; Hugging Face's Trainer resumes in the checkpoint's epoch (redrawing its shuffle to skip the batches
    seen) but never iterates the epochs before, so without this a run resumed past its first epoch would take the
    first epoch's order again (transformers 5.25, TRL 1.16)."""
    import torch
    from trl.trainer.utils import RepeatSampler

    sampler = dataloader.batch_sampler.sampler
    if not isinstance(sampler, RepeatSampler):
        raise TypeError(f"expected TRL's RepeatSampler behind the training data, got {type(sampler).__name__}")
    per_epoch = max(-(-len(dataloader) // accumulation), 1)        # the Trainer's update steps per epoch
    for _ in range(global_step // per_epoch if sampler.shuffle else 0):
        torch.randperm(sampler.num_samples, generator=sampler.generator)
