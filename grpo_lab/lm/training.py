"""``train``: run (or resume) an LLM run, writing ``metrics.jsonl``, checkpoints and the chosen loggers.

The loop itself is :class:`~grpo_lab.loop.GRPOLoop` (built by :func:`~grpo_lab.lm.build.build_loop`); this
module drives it: progress bar, one line of ``metrics.jsonl`` per step, periodic checkpoints, and a
clean stop on Ctrl-C (or a stop event set by a notebook's Stop button) that leaves a checkpoint to continue
from. A live figure follows the run through a per-step callback (notebook 02's panel trains through here).
A run directory has one owner at a time (:func:`hold_run_dir`). Every file goes through
:mod:`grpo_lab.files`: a full or read-only disk stops the run with one
:class:`~grpo_lab.files.DiskError`, the last checkpoint and ``metrics.jsonl`` (whole lines) intact.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..files import append_line, atomic_write, disk_error
from ..loop import GRPOLoop, StepRecord
from .build import build_loop
from .checkpoint import load_checkpoint, save_checkpoint
from .disk_guard import estimate_checkpoint, guard_disk
from .train_config import TrainConfig


def train(config: TrainConfig, loop: GRPOLoop | None = None, progress: bool = True, resume: bool = True,
          stop: threading.Event | None = None, on_step: Callable[[GRPOLoop, StepRecord], None] | None = None,
          save: bool = True) -> GRPOLoop:
    """Run (or continue) a training run up to step ``config.steps``: progress bar, ``metrics.jsonl``, checkpoints.

    A given ``loop`` stops at ``config.steps`` even if it was built for more (the study scores
    held-out Pass@1 part-way by training to each scoring step in turn).

    With ``resume`` and a checkpoint in ``output_dir``, continues from it exactly.
    ``on_step(loop, record)`` runs after each step is logged (a live figure redraws there).
    ``save=False`` writes no checkpoint (``checkpoint_every`` included): a run that is drawn and then dropped.
    Interrupting (Ctrl-C), or setting ``stop`` (from another thread: a notebook's Stop button),
    finishes the current step, saves a checkpoint and returns the loop, ready to continue; a ``stop``
    set before the first step runs none. A sitting that ran no step leaves the checkpoint it found.
    Raises :class:`RunDirInUse`
    at once, before any model loads, if another live process is training into ``output_dir``;
    :class:`~grpo_lab.files.DiskError` before α is copied (before the first step, for a given
    ``loop``) if the checkpoints will not fit (:func:`~grpo_lab.lm.disk_guard.guard_disk`), or when a
    write fails anyway (the last checkpoint
    stays the one to resume from).
    """
    out = Path(config.output_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise disk_error(out, exc) from exc
    with hold_run_dir(out):
        if loop is None:  # build_loop's disk guard runs before α is copied
            loop = build_loop(config, checkpoint=out / CHECKPOINT_FILE)
        elif save:
            guard_disk(config, estimate_checkpoint(loop, config.steps), out / CHECKPOINT_FILE)
        return _train(config, loop, out, progress, resume, stop or threading.Event(), on_step, save)


def _train(config: TrainConfig, loop: GRPOLoop, out: Path, progress: bool, resume: bool, stop: threading.Event,
           on_step: Callable[[GRPOLoop, StepRecord], None] | None, save: bool) -> GRPOLoop:
    ckpt = out / CHECKPOINT_FILE
    if resume and ckpt.is_file() and loop.k == 0:
        load_checkpoint(loop, ckpt)
    first = loop.k
    atomic_write(out / "config.json", json.dumps(config.to_dict(), indent=2, default=list), what="the run's config")
    # metrics.jsonl restarts from the history the checkpoint holds: steps logged after it are redone
    _write_metrics(out, loop.history)
    loggers = _open_loggers(config, out)
    bar = _progress(total=config.steps, initial=loop.k, enabled=progress)
    try:
        while loop.k < config.steps and not stop.is_set():  # up to config.steps, whatever the loop's own
            record = loop.step()
            _log(record, out, loggers, bar)
            if save and config.checkpoint_every and loop.k % config.checkpoint_every == 0:
                save_checkpoint(loop, ckpt)
            if on_step is not None:
                on_step(loop, record)
    except KeyboardInterrupt:
        # a step that deferred_interrupt let finish is in the history but was never logged
        _write_metrics(out, loop.history)
        print(f"interrupted: saving a checkpoint at step {loop.k} in {ckpt}" if save and loop.k > first else
              f"interrupted at step {loop.k}: no step finished, the checkpoint stays as it was")
    finally:
        bar.close()
        for logger in loggers:
            logger.close()
    # Not after any other exception: a failed step (e.g. FloatingPointError at pass 2 of i > 1) may
    # have left π_θ half-updated while k stayed, a failed write (DiskError) would fail again; the last
    # checkpoint written stays the one to resume from.
    if save and loop.k > first:
        save_checkpoint(loop, ckpt)
    return loop


# ----------------------------------------------------------------------------- one owner per run directory

CHECKPOINT_FILE = "checkpoint.pt"
LOCK_FILE = "run.lock"


class RunDirInUse(RuntimeError):
    """Another live process is training into this output directory."""


@contextlib.contextmanager
def hold_run_dir(out: Path) -> Iterator[None]:
    """Own ``out`` while the block runs: an exclusive ``flock`` on ``out/run.lock``, which holds the pid.

    Two runs into one directory would interleave their ``metrics.jsonl`` lines and overwrite each
    other's checkpoints, so a second one is refused, naming the holder. The kernel drops the lock
    when its process exits, however it dies; a pid still in the file then marks a stale lock (a
    clean exit empties it), which the next run takes over.
    """
    try:
        fd = os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:  # a read-only output_dir is found here, before any model loads
        raise disk_error(out / LOCK_FILE, exc, "the run lock") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(out, fd) from None
        stale = _lock_pid(fd)
        if stale:
            print(f"output_dir {str(out)!r}: taking over the lock left by pid {stale}, which is no longer running")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):  # a disk turned read-only: the pid left marks a stale lock
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the flock


def _in_use(out: Path, fd: int) -> RunDirInUse:
    return RunDirInUse(f"output_dir {str(out)!r} is in use by another training run (pid {_lock_pid(fd) or 'unknown'}); "
                       "wait for it to finish, stop it, or choose another output_dir")


def _lock_pid(fd: int) -> str:
    return os.pread(fd, 32, 0).decode(errors="replace").strip()


# ----------------------------------------------------------------------------- logging

def _progress(total: int, initial: int, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, desc="GRPO", unit="step")


def _write_metrics(out: Path, history: list[StepRecord]) -> None:
    """``metrics.jsonl`` = exactly ``history``, one record per line."""
    atomic_write(out / "metrics.jsonl", "".join(json.dumps(r.to_dict()) + "\n" for r in history),
                 what=f"the metrics of steps 0-{len(history) - 1}" if history else "the metrics")


def _log(record: StepRecord, out: Path, loggers: list[Any], bar: Any) -> None:
    row = record.to_dict()
    append_line(out / "metrics.jsonl", json.dumps(row), what=f"the metrics of step {record.step}")
    for logger in loggers:
        logger.log(row)
    bar.set_postfix(reward=f"{record.reward_mean:.3f}", lag=record.lag, masked=f"{record.masked_frac:.2f}")
    bar.update(1)


class _TensorBoard:
    def __init__(self, out: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(out / "tensorboard"))

    def log(self, row: dict[str, Any]) -> None:
        for key, value in row.items():
            if isinstance(value, (int, float)) and key != "step":
                self.writer.add_scalar(key, value, row["step"])

    def close(self) -> None:
        self.writer.close()


class _WandB:
    def __init__(self, config: TrainConfig, out: Path) -> None:
        import wandb

        self.run = wandb.init(project="grpo_lab", config=config.to_dict(), dir=str(out))

    def log(self, row: dict[str, Any]) -> None:
        self.run.log(row, step=row["step"])

    def close(self) -> None:
        self.run.finish()


def _open_loggers(config: TrainConfig, out: Path) -> list[Any]:
    """The ``report_to`` loggers that are installed (a missing one is named, not fatal)."""
    loggers = []
    for name in config.report_to:
        try:
            loggers.append(_TensorBoard(out) if name == "tensorboard" else _WandB(config, out))
        except ImportError as exc:
            print(f"report_to {name!r} skipped: {exc}")
    return loggers


def load_metrics(output_dir: str | Path) -> list[dict[str, Any]]:
    """The records a run wrote to ``metrics.jsonl``."""
    path = Path(output_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
