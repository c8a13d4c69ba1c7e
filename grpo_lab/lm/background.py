"""A training run a notebook can draw as it trains: :func:`~grpo_lab.lm.training.train` in the caller's thread or
in a background one, stoppable between steps, with a per-step callback, in one run folder that is removed when
the process (the notebook's kernel) ends.

A widget that draws a run should only draw; this module holds the rest. It builds the run's loop from the
untrained model (a copy of one it was given, or one it loads), keeps it while the config stays the same (a
second sitting continues the run), resumes from its own checkpoint when a failed step dropped the loop, and
frees it all on :meth:`BackgroundRun.release`. A SmolLM2-135M checkpoint holds π_θ, α and AdamW's moments
(about 2 GB), so the folder is not left behind: an ``atexit`` hook removes the files the run wrote when the
process exits (a kernel's shutdown or restart); what a killed process left is removed when the next run in that
folder is created.

=======================  ==================================================================================
:class:`BackgroundRun`   one run folder: :meth:`~BackgroundRun.run` (caller's thread), :meth:`~BackgroundRun.start`
                         (background thread), :meth:`~BackgroundRun.stop`, :meth:`~BackgroundRun.release`,
                         :meth:`~BackgroundRun.clean`
:class:`Sitting`         what one call trained: its first and last step, who stopped it, the error that ended it
:func:`hook_interrupt`   Kernel > Interrupt (SIGINT while the kernel is idle) stops every background run
=======================  ==================================================================================
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import fcntl
import os
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files import DiskError
from ..loop import GRPOLoop, StepRecord
from .build import build_loop
from .checkpoint import load_checkpoint
from .train_config import TrainConfig
from .training import CHECKPOINT_FILE, LOCK_FILE, RunDirInUse, train

RUN_FILES = (CHECKPOINT_FILE, "metrics.jsonl", "config.json", LOCK_FILE)
"""What :func:`~grpo_lab.lm.training.train` writes into a run folder (no logger): what :meth:`BackgroundRun.clean`
removes, and nothing else."""

_RUNNING: weakref.WeakSet[BackgroundRun] = weakref.WeakSet()
"""Runs whose background thread is going: what an interrupt stops."""
_CLEAN_AT_EXIT: set[Path] = set()
"""Run folders to empty when the process ends."""


@dataclass
class Sitting:
    """One call of :meth:`BackgroundRun.run`: the loop, the step it started from and the step it was asked to reach,
    the set-up seconds, ``stopped_by`` (who stopped it early, "" if nobody) and ``error`` (the one line of a disk or
    run-folder error that ended it, "" if none)."""

    loop: GRPOLoop
    first: int
    last: int
    setup_seconds: float
    stopped_by: str = ""
    error: str = ""

    @property
    def trained(self) -> int:
        """Steps this sitting trained."""
        return self.loop.k - self.first


def run_key(config: TrainConfig) -> dict[str, Any]:
    """What makes two configs the same run: every field but the length (``steps``)."""
    return {k: v for k, v in config.to_dict().items() if k != "steps"}


def _remove_run_files(folder: Path) -> None:
    for name in RUN_FILES:
        with contextlib.suppress(OSError):
            (folder / name).unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()                                       # only if nothing else is in it


def _in_use(folder: Path) -> bool:
    """Whether a live process is training in ``folder`` (it holds the run lock's flock)."""
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@atexit.register
def _clean_at_exit() -> None:
    for folder in list(_CLEAN_AT_EXIT):
        _remove_run_files(folder)


class BackgroundRun:
    """One run at a time in ``out_dir``, trained on ``problems``.

    ``model`` / ``tokenizer``: the untrained model, of which each new run trains a copy (the caller keeps it);
    None: each new run loads ``config.model`` and trains it (one model in memory, not two). ``save=False``: no
    checkpoint (a run drawn once and dropped; after a failed step the next sitting starts over). ``keep``: leave
    the run folder when the process ends (default: remove its files).

    State: ``loop`` (the current run's :class:`~grpo_lab.loop.GRPOLoop`, None before the first run or after
    :meth:`release`), ``saved`` (the key and step of the checkpoint in ``out_dir``), ``running`` (a thread
    is training)."""

    def __init__(self, out_dir: str | Path, problems: list[Any], model: Any = None, tokenizer: Any = None,
                 save: bool = True, keep: bool = False) -> None:
        self.out_dir, self.problems, self.save = Path(out_dir), problems, save
        self.checkpoint = self.out_dir / CHECKPOINT_FILE
        self._given = model is not None
        self.model, self.tokenizer = model, tokenizer
        self.loop: GRPOLoop | None = None
        self._key: dict[str, Any] | None = None
        self.saved: tuple[dict[str, Any], int] | None = None
        self.stopped_by = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not keep:
            if self.out_dir not in _CLEAN_AT_EXIT and not _in_use(self.out_dir):
                _remove_run_files(self.out_dir)            # left by a process that was killed: never resumed
            _CLEAN_AT_EXIT.add(self.out_dir)

    # ------------------------------------------------------------------------- the loop

    @staticmethod
    def load_untrained(config: TrainConfig) -> tuple[Any, Any]:
        """The untrained model and its tokenizer, as ``config`` names them."""
        from .models import load_policy

        return load_policy(config.model, dtype=config.weights_dtype(), device=config.torch_device())

    def saved_step(self, config: TrainConfig) -> int | None:
        """The step of the checkpoint in ``out_dir`` if it holds this run (None: another run's, or none)."""
        return self.saved[1] if self.saved is not None and self.saved[0] == run_key(config) else None

    def prepare(self, config: TrainConfig) -> tuple[GRPOLoop, bool]:
        """The loop for ``config`` and whether it is new: the current loop if it is this run, else a fresh one from
        the untrained model, resumed from the checkpoint when that holds this run."""
        key = run_key(config)
        if self.loop is not None and self._key == key:
            return self.loop, False
        self.loop = None
        if self.model is None:
            self.model, self.tokenizer = self.load_untrained(config)
        model = copy.deepcopy(self.model) if self._given else self.model
        if not self._given:                      # the loaded model becomes π_θ: one model less while it trains
            self.model = None
        loop = build_loop(config, model, self.tokenizer, self.problems)
        if self.saved_step(config) is not None:
            load_checkpoint(loop, self.checkpoint)
        self.loop, self._key = loop, key
        return loop, True

    # ------------------------------------------------------------------------- training

    def run(self, config: TrainConfig, steps: int | None = None,
            on_step: Callable[[GRPOLoop, StepRecord], None] | None = None,
            on_ready: Callable[[GRPOLoop, bool], bool] | None = None) -> Sitting:
        """Train ``config``'s run in the caller's thread, up to ``steps`` more steps (default: to ``config.steps``),
        after clearing an earlier stop. ``on_ready(loop, new)`` runs once the loop is set up; returning False
        trains nothing. ``on_step(loop, record)`` runs after each step.

        Stops early when :meth:`stop` is called (from another thread, or during the set-up) or on Ctrl-C; a
        sitting that trained leaves a checkpoint of whole steps. A :class:`~grpo_lab.files.DiskError` or a run
        folder in use ends the sitting with its one line in ``error``. Any other error (a failed step, whose π_θ
        may be half-updated) drops the loop and is raised: the next sitting resumes from the last checkpoint."""
        self._clear_stop()
        return self._run(config, steps, on_step, on_ready)

    def _run(self, config: TrainConfig, steps: int | None, on_step: Callable[[GRPOLoop, StepRecord], None] | None,
             on_ready: Callable[[GRPOLoop, bool], bool] | None) -> Sitting:
        start = time.perf_counter()
        loop, new = self.prepare(config)
        last = config.steps if steps is None else min(config.steps, loop.k + steps)
        sitting = Sitting(loop, loop.k, last, time.perf_counter() - start)
        if self._stop.is_set() or (on_ready is not None and on_ready(loop, new) is False) or loop.k >= last:
            sitting.stopped_by = self.stopped_by
            return sitting
        try:
            train(config.replace(steps=last, output_dir=str(self.out_dir), checkpoint_every=0), loop,
                  progress=False, resume=False, stop=self._stop, on_step=on_step, save=self.save)
        except (DiskError, RunDirInUse) as exc:
            sitting.error = str(exc)
            return sitting
        except Exception:
            self.loop = None
            raise
        if self.save and loop.k > sitting.first:
            self.saved = run_key(config), loop.k
        if loop.k < last:
            sitting.stopped_by = self.stopped_by or "an interrupt"
        return sitting

    def start(self, config: TrainConfig, steps: int | None = None,
              on_step: Callable[[GRPOLoop, StepRecord], None] | None = None,
              on_ready: Callable[[GRPOLoop, bool], bool] | None = None,
              on_end: Callable[[Sitting | None, BaseException | None], None] | None = None) -> bool:
        """:meth:`run` in a background thread; ``on_end(sitting, error)`` runs in that thread when it ends (error:
        what it raised). Ignored (False) while a run is going. The stop flag is cleared here, before the run is
        set up, so that a stop during the set-up counts."""
        if self.running:
            return False
        self._clear_stop()
        _RUNNING.add(self)

        def target() -> None:
            sitting, error = None, None
            try:
                sitting = self._run(config, steps, on_step, on_ready)
            except BaseException as exc:          # a thread's error would go nowhere: hand it to on_end
                error = exc
            finally:
                _RUNNING.discard(self)
                if on_end is not None:
                    on_end(sitting, error)

        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()
        return True

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the background run to end."""
        if self._thread is not None:
            self._thread.join(timeout)

    def stop(self, by: str = "Stop") -> None:
        """End the run after the step in progress; ``by`` says who asked."""
        self.stopped_by = by
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _clear_stop(self) -> None:
        self.stopped_by = ""
        self._stop.clear()

    # ------------------------------------------------------------------------- memory and disk

    def release(self) -> None:
        """Stop and wait for a background run, free the loop (π_θ, α, AdamW's state, ~4× the model) and the model
        this run loaded (a model passed in is the caller's), and hand the pages back to the OS. The next sitting
        loads the model again and, with the same config, resumes from the checkpoint."""
        from .memory import return_freed_memory

        self.stop("release")
        self.join()
        self.loop = None
        if not self._given:
            self.model = None
        return_freed_memory()

    def clean(self) -> None:
        """Remove the files a run wrote in ``out_dir`` (the checkpoint among them), and the folder if that leaves it
        empty; the next sitting of a run whose loop was freed starts over."""
        self.join()
        _remove_run_files(self.out_dir)
        self.saved = None


# ----------------------------------------------------------------------------- Kernel > Interrupt

def _stop_running(signum: int, frame: Any) -> None:
    """SIGINT while the kernel is idle: stop every background run (nothing else to stop: an idle ipykernel
    ignores SIGINT)."""
    for run in list(_RUNNING):
        run.stop("Kernel > Interrupt")


def hook_interrupt() -> bool:
    """Let Kernel > Interrupt reach a background run; False where it cannot (not in ipykernel).

    Kernel > Interrupt sends the kernel SIGINT. An idle ipykernel ignores it: around each message it
    handles, it installs Python's default handler (a KeyboardInterrupt in the executing cell) and then
    puts back the handler it found, kept in ``kernel.saved_sigint_handler``. Setting that one to
    :func:`_stop_running` (from a message handler: a button's click or a cell) makes SIGINT between
    messages stop the runs; while a cell executes, Interrupt stops that cell as before."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None or not hasattr(kernel, "saved_sigint_handler"):
        return False
    kernel.saved_sigint_handler = _stop_running
    return True
