"""Disk guard: refuse a run whose checkpoints will not fit, before it starts.

:func:`guard_disk` runs in :func:`grpo_lab.lm.build.build_loop` once π_θ is
loaded and before α is copied from it (when the caller names the checkpoint, as
:func:`grpo_lab.lm.training.train` does), and before the first step of a loop built
elsewhere (``train(config, loop)``, the live panel's run), where a full disk would
otherwise stop the run at its first checkpoint write. It estimates one checkpoint's
bytes C (:func:`estimate_run_checkpoint` from π_θ and the config, :func:`estimate_checkpoint` from a loop) and
refuses (:class:`~grpo_lab.files.DiskError`) unless ``output_dir`` has room for
what the saves need at once: a save writes C beside the previous checkpoint before
renaming over it, so periodic checkpoints (``checkpoint_every`` > 0) need 2·C,
one final save needs C (the checkpoint already there counts as free).

=============== ============================================== ==========================
part of C       bytes                                          held
=============== ============================================== ==========================
π_θ, α, π_ref   their state dicts, each storage once           π_ref when β > 0
optimiser       2·W_train (AdamW's m and v)                    AdamW (SGD keeps none)
history         RECORD_BYTES per step                          always
rest            TENSOR_BYTES per tensor + CHECKPOINT_REST      always
=============== ============================================== ==========================
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..checks import require_int_at_least
from ..config import GRPOConfig
from ..files import DiskError, free_bytes, size_text, temp_files
from ..loop import GRPOLoop

if TYPE_CHECKING:
    from .train_config import TrainConfig

RECORD_BYTES = 1024
"""A step's record, at most: its line of ``metrics.jsonl``, its entry in the checkpoint's history."""
TENSOR_BYTES = 1024
"""Per tensor in a checkpoint, at most: its zip entry's headers and alignment."""
CHECKPOINT_REST = 2**20
"""The rest of a checkpoint (config, schedules, RNG state) and ``config.json``, with room to spare."""


def estimate_checkpoint(loop: GRPOLoop, steps: int) -> int:
    """Bytes of ``loop``'s checkpoint after ``steps`` steps (the disk table in the module docstring).

    Each storage counts once, as ``torch.save`` writes it (tied weights, α sharing π_θ's tensors);
    AdamW's moments count before its first step creates them.
    """
    tensors = [*loop.policy.state_dict().values(), *loop.sampler.state_dict().values()]
    if loop.reference is not None:
        tensors += loop.reference.state_dict().values()
    trainable = [p for group in loop.optimizer.param_groups for p in group["params"]]
    return _checkpoint_bytes(_storages(tensors), trainable, loop.config.optimizer, steps)


def estimate_run_checkpoint(config: GRPOConfig, model: torch.nn.Module, steps: int) -> int:
    """:func:`estimate_checkpoint` of the run ``config`` would build on ``model`` (π_θ), before α and
    π_ref exist: α and π_ref (β > 0) are copies of ``model``'s tensors, its trainable parameters those
    with ``requires_grad``."""
    per_copy = _storages(model.state_dict().values())
    copies = 2 + (config.beta > 0)
    storages = [size for size in per_copy for _ in range(copies)]
    trainable = [p for p in model.parameters() if p.requires_grad]
    return _checkpoint_bytes(storages, trainable, config.optimizer, steps)


def _storages(tensors: Any) -> list[int]:
    """Bytes of each distinct storage under ``tensors`` (a storage shared by several tensors counts once)."""
    return list({(t.device, t.untyped_storage().data_ptr()): t.untyped_storage().nbytes() for t in tensors}.values())


def _checkpoint_bytes(storages: list[int], trainable: list[torch.Tensor], optimizer: str, steps: int) -> int:
    require_int_at_least("steps", steps, 0)
    moments = 2 if optimizer == "adamw" else 0
    return (sum(storages) + moments * sum(p.numel() * p.element_size() for p in trainable)
            + TENSOR_BYTES * (len(storages) + (moments + 1) * len(trainable))
            + RECORD_BYTES * steps + CHECKPOINT_REST)


LARGE_CHECKPOINT = 2**30
"""A checkpoint at least this large is announced (size, folder, what it holds) before the run writes it."""


def guard_disk(config: TrainConfig, size: int, checkpoint: Path, free: int | None = None) -> None:
    """Return if ``config``'s run, whose checkpoint takes ``size`` bytes (:func:`estimate_checkpoint`,
    or :func:`estimate_run_checkpoint` before the loop exists), has room for its checkpoints at
    ``checkpoint`` (and ``metrics.jsonl``), else raise :class:`~grpo_lab.files.DiskError` naming the
    folder, the bytes needed and free, and the changes that help. A run that fits but whose checkpoint reaches
    :data:`LARGE_CHECKPOINT` is told its size first. ``free``: bytes free (default:
    :func:`~grpo_lab.files.free_bytes` of the folder)."""
    folder = checkpoint.parent
    free = free_bytes(folder) if free is None else require_int_at_least("free", free, 0)
    reclaimed = sum(p.stat().st_size for p in temp_files(checkpoint))  # a killed writer's, removed by the save
    existing = checkpoint.stat().st_size if checkpoint.is_file() else 0  # replaced by the first save
    metrics = 2 * RECORD_BYTES * config.steps  # metrics.jsonl, and its copy while it is rewritten on resume
    one_save = size - reclaimed + metrics
    need = max(2 * size - existing, size) - reclaimed + metrics if config.checkpoint_every else one_save
    parts = ", ".join(["π_θ", "α", *(["π_ref"] if config.beta > 0 else []),
                       *(["AdamW's m and v"] if config.optimizer == "adamw" else [])])
    held = "two on disk at once while a save replaces the last" if config.checkpoint_every else "one, at the end"
    if need <= free:
        if size >= LARGE_CHECKPOINT:   # said before the first save, so a learner is not surprised by the disk
            print(f"disk: each checkpoint of this run holds {parts} in {size_text(size)} under {str(folder)!r} "
                  f"({held}; set checkpoint_every = 0 for one at the end, or choose another output_dir)")
        return
    fixes = ["choose another output_dir",
             *([f"set checkpoint_every = 0 (one checkpoint, at the end: {size_text(one_save)})"]
               if config.checkpoint_every else []), "or use a smaller model or dtype"]
    raise DiskError(f"disk guard: output_dir {str(folder)!r} has {size_text(free)} free, but the run needs "
                    f"{size_text(need)}: each checkpoint holds {parts} in {size_text(size)}, {held}; "
                    f"{', '.join(fixes)}", errno.ENOSPC)
