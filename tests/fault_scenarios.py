"""Fault scenarios: each injects one fault into a run (SIGKILL mid-checkpoint, NaN gradient, non-finite
loss, a poisoned step inside ``train``, KeyboardInterrupt/SIGINT while sampling, training, syncing; a
disk too full before the run, a disk that fills in the middle of a checkpoint or of a metrics line, a
read-only output_dir from the start or from the middle of the run) and returns an :class:`Outcome`:
the checks that must hold and the steps lost (must be 0).

``tests/test_faults.py`` and ``tests/test_disk.py`` run the fast ones; ``tests/reliability_report.py``
runs all on both kinds.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import itertools
import json
import math
import os
import re
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from reliability_runs import (
    REPO,
    make_loop,
    reference_run,
    rows_of,
    same_tensors,
    tensors_of,
    train_config,
)
from sync_faults import FAULTS, pushed

from grpo_lab.files import DiskError
from grpo_lab.lm.disk_guard import estimate_checkpoint
from grpo_lab.lm.sampling import HFSampler
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.lm.training import CHECKPOINT_FILE, LOCK_FILE, load_metrics, train
from grpo_lab.sync_audit import SyncError


@dataclass
class Outcome:
    """What a fault did: each check must hold; ``lost`` counts completed steps that are neither in
    the checkpoint nor redone identically (must be 0)."""

    fault: str
    checks: dict[str, bool] = field(default_factory=dict)
    lost: int = 0
    resumed: bool = False
    note: str = ""

    @property
    def ok(self) -> bool:
        return all(self.checks.values()) and self.lost == 0

    def failed(self) -> list[str]:
        return [name for name, ok in self.checks.items() if not ok] + ([f"lost {self.lost}"] if self.lost else [])


def resume_and_compare(kind: str, config: TrainConfig, outcome: Outcome, logged: list[dict[str, Any]]) -> None:
    """Resume ``config``'s run from its checkpoint with a fresh loop; compare with the uninterrupted run.

    ``logged``: rows written before the fault; each must be in the final metrics unchanged.
    """
    rows, tensors = reference_run(kind)
    loop = train(config, make_loop(kind, config), progress=False)
    final = rows_of(load_metrics(config.output_dir))
    outcome.resumed = True
    outcome.checks["resumed run = uninterrupted run (metrics, bit for bit)"] = final == rows
    outcome.checks["resumed run = uninterrupted run (π_θ, α, π_ref)"] = same_tensors(tensors_of(loop), tensors)
    outcome.lost += sum(row not in final for row in rows_of(logged))


CRASH_CHILD = r"""
import io, json, sys, time
import torch
spec = json.loads(sys.argv[1])
torch.set_num_threads(1)
sys.path.insert(0, spec["tests"])
import reliability_runs as runs
from grpo_lab.lm.training import train
real_save = torch.save

def save(obj, f, *args, **kwargs):
    if isinstance(obj, dict) and obj.get("k") == spec["kill_at"]:
        buffer = io.BytesIO()
        real_save(obj, buffer)
        f.write(buffer.getvalue()[: buffer.tell() // 2])
        f.flush()
        print("mid-save", flush=True)
        time.sleep(600)
    return real_save(obj, f, *args, **kwargs)

torch.save = save
config = runs.train_config(spec["kind"], spec["out"])
train(config, runs.make_loop(spec["kind"], config), progress=False)
print("finished", flush=True)
"""


def crash_mid_checkpoint(tmp: Path, kind: str) -> Outcome:
    """SIGKILL a training process while it writes the checkpoint after step 4 (half the bytes written)."""
    outcome = Outcome(f"SIGKILL while writing a checkpoint ({kind})")
    config = train_config(kind, tmp / "run")
    spec = {"tests": str(Path(__file__).parent), "kind": kind, "out": config.output_dir, "kill_at": 4}
    child = subprocess.Popen([sys.executable, "-c", CRASH_CHILD, json.dumps(spec)], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([child.stdout], [], [], 300)
        line = child.stdout.readline() if ready else ""
        partial = list(Path(config.output_dir).glob(".checkpoint.pt.*.tmp"))
    finally:
        os.kill(child.pid, signal.SIGKILL)
        _, err = child.communicate()
    outcome.checks["killed in the middle of the write"] = line == "mid-save\n" and len(partial) == 1
    if line != "mid-save\n":
        outcome.note = err[-2000:]
        return outcome
    logged = load_metrics(config.output_dir)
    try:
        previous = torch.load(Path(config.output_dir) / "checkpoint.pt", weights_only=True)["k"]
    except Exception:  # noqa: BLE001 - an unreadable checkpoint is the failure being measured
        previous = None
    outcome.checks["the previous checkpoint (k = 2) still loads"] = previous == 2
    outcome.note = f"{len(partial)} partial temp file left beside it until the next save"
    resume_and_compare(kind, config, outcome, logged)
    outcome.checks["the next save removed the partial temp file"] = not list(
        Path(config.output_dir).glob(".checkpoint.pt.*.tmp"))
    return outcome


def poison_gradients(loop: Any, step: int, pass_index: int) -> None:
    """NaN in the gradient of π_θ's first parameter at (step, pass_index): one chunk per pass."""
    calls = itertools.count()
    parameter = next(loop.policy.parameters())

    def hook(grad: torch.Tensor) -> torch.Tensor:
        return grad * math.nan if loop.k == step and next(calls) == pass_index else grad

    parameter.register_hook(hook)


def snapshot(loop: Any) -> tuple[dict[str, torch.Tensor], bytes]:
    """π_θ, α, π_ref (cloned), and the optimiser state, k and history (serialised)."""
    state = loop.state_dict()
    other = io.BytesIO()
    torch.save({"optimizer": state["optimizer"], "k": state["k"], "history": state["history"]}, other)
    return {k: v.clone() for k, v in tensors_of(loop).items()}, other.getvalue()


def unchanged(before: tuple[dict[str, torch.Tensor], bytes], after: tuple[dict[str, torch.Tensor], bytes],
              skip: str = "~") -> bool:
    """Same tensors (except those whose name starts with ``skip``), same optimiser state, k and history."""
    keep = [k for k in before[0] if not k.startswith(skip)]
    return same_tensors({k: before[0][k] for k in keep}, {k: after[0][k] for k in keep}) and before[1] == after[1]


def nan_gradient(tmp: Path, kind: str, max_grad_norm: float | None = 1.0) -> Outcome:
    """NaN gradient in pass 0 of step 3: stops naming the step and the parameter, before the optimiser moves."""
    outcome = Outcome(f"NaN gradient, max_grad_norm = {max_grad_norm} ({kind})")
    config = train_config(kind, tmp / "run", max_grad_norm=max_grad_norm)
    loop = make_loop(kind, config)
    list(loop.run(3))
    before = snapshot(loop)
    poison_gradients(loop, step=3, pass_index=0)
    name = next(n for n, _ in loop.policy.named_parameters())
    try:
        loop.step()
        message = ""
    except FloatingPointError as exc:
        message = str(exc)
    outcome.checks["FloatingPointError naming step 3 and the parameter"] = (
        "non-finite gradient norm nan at step 3" in message and repr(name) in message)
    # on a sync step α ← π_θ is committed once sampling succeeded (consistent: π_θ did not move)
    outcome.checks["π_θ, π_ref, optimiser state, k and history untouched"] = unchanged(
        before, snapshot(loop), skip="sampler.")
    return outcome


def nan_loss(tmp: Path, kind: str) -> Outcome:
    """log π_θ turns inf at step 2: the loss is non-finite; stops naming step and pass, nothing applied."""
    outcome = Outcome(f"inf in log π_θ → non-finite loss ({kind})")
    loop = make_loop(kind, train_config(kind, tmp / "run"))
    list(loop.run(2))
    before = snapshot(loop)
    real = loop.policy.logprobs
    loop.policy.logprobs = lambda rollout, rows: real(rollout, rows) + (math.inf if loop.k == 2 else 0.0)
    try:
        loop.step()
        message = ""
    except FloatingPointError as exc:
        message = str(exc)
    outcome.checks["FloatingPointError naming the loss, step 2, pass 0"] = (
        message.startswith("non-finite loss") and "at step 2, pass 0" in message)
    # step 2 is a sync step (v = 2): α ← π_θ is committed once sampling succeeded, and π_θ is unchanged
    outcome.checks["π_θ, π_ref, optimiser state, k and history untouched"] = unchanged(
        before, snapshot(loop), skip="sampler.")
    return outcome


def poisoned_step_in_train(tmp: Path, kind: str) -> Outcome:
    """NaN gradient in the LAST pass of step 3 inside ``train`` (the bandit has i = 2, so pass 0 was
    applied): train stops, writes no checkpoint from that state, and the run resumes exactly."""
    outcome = Outcome(f"NaN gradient mid-step inside train ({kind})")
    config = train_config(kind, tmp / "run")
    loop = make_loop(kind, config)
    poison_gradients(loop, step=3, pass_index=config.i - 1)
    try:
        train(config, loop, progress=False)
        message = ""
    except FloatingPointError as exc:
        message = str(exc)
    outcome.checks["train raised FloatingPointError at step 3"] = "at step 3" in message
    if config.i > 1:  # pass 0 had moved π_θ: the state train must not save
        clean = make_loop(kind, config)
        list(clean.run(3))
        outcome.checks["π_θ in memory was half-updated"] = not same_tensors(clean.policy.state_dict(),
                                                                            loop.policy.state_dict())
    state = torch.load(Path(config.output_dir) / "checkpoint.pt", weights_only=True)
    outcome.checks["the checkpoint is the last good one (k = 2)"] = state["k"] == 2
    outcome.checks["no temp file left"] = not list(Path(config.output_dir).glob(".*.tmp"))
    resume_and_compare(kind, config, outcome, load_metrics(config.output_dir))
    return outcome


def interrupt_in_sampling(tmp: Path, kind: str) -> Outcome:
    """KeyboardInterrupt inside sampler.sample at a sync step: nothing of the step is kept."""
    outcome = Outcome(f"KeyboardInterrupt while sampling ({kind})")
    config = train_config(kind, tmp / "run")
    loop = make_loop(kind, config)
    step, real_sample, real_step = 2 * config.v, loop.sampler.sample, loop.step
    rng: list[torch.Tensor] = []

    def sample(*args: Any) -> Any:
        if loop.k == step and "interrupted" not in outcome.checks:
            outcome.checks["interrupted"] = True
            raise KeyboardInterrupt
        return real_sample(*args)

    def step_fn() -> Any:
        rng.append(loop.generator.get_state())
        return real_step()

    loop.sampler.sample, loop.step = sample, step_fn
    train(config, loop, progress=False)
    outcome.checks["stopped at the step, sync not committed"] = (
        loop.k == step and len(loop.history) == step and loop.schedule.last_sync == config.v)
    state = torch.load(Path(config.output_dir) / "checkpoint.pt", weights_only=True)
    outcome.checks["checkpoint holds k and the RNG from before the step"] = (
        state["k"] == step and torch.equal(state["generator"], rng[-1]))
    resume_and_compare(kind, config, outcome, load_metrics(config.output_dir))
    return outcome


def interrupt_in_training(tmp: Path, kind: str) -> Outcome:
    """SIGINT to this process during the optimiser passes of step 3: the step finishes, is recorded
    (history, metrics.jsonl, checkpoint), then the run stops."""
    outcome = Outcome(f"SIGINT during the optimiser passes ({kind})")
    config = train_config(kind, tmp / "run")
    loop = make_loop(kind, config)
    real, sent = loop.policy.logprobs, []

    def logprobs(rollout: Any, rows: slice) -> torch.Tensor:
        if loop.k == 3 and not sent and torch.is_grad_enabled():  # an optimiser pass (the sync audit scores without)
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)
        return real(rollout, rows)

    loop.policy.logprobs = logprobs
    train(config, loop, progress=False)
    rows, tensors = reference_run(kind)
    outcome.checks["signal sent"] = bool(sent)
    outcome.checks["step 3 fully applied and recorded"] = loop.k == 4 and rows_of(loop.history) == rows[:4]
    outcome.checks["metrics.jsonl has step 3"] = rows_of(load_metrics(config.output_dir)) == rows[:4]
    state = torch.load(Path(config.output_dir) / "checkpoint.pt", weights_only=True)
    outcome.checks["checkpoint at k = 4"] = state["k"] == 4
    resume_and_compare(kind, config, outcome, load_metrics(config.output_dir))
    return outcome


def alpha_and_theta(loop: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """α's tensors and π_θ's, in the same order (the pairs a sync copies)."""
    if isinstance(loop.sampler, HFSampler):
        model = loop.policy.model
        return list(loop.sampler._targets), [t for _, t in [*model.named_parameters(), *model.named_buffers()]]
    return [loop.sampler.logits], [loop.policy.logits.detach()]


def half_sync(loop: Any) -> None:
    """Copy only the first half of π_θ into α (an interrupted sync)."""
    alpha, theta = alpha_and_theta(loop)
    if len(alpha) == 1:
        alpha, theta = [alpha[0][:, : alpha[0].shape[1] // 2]], [theta[0][:, : theta[0].shape[1] // 2]]
    else:
        alpha, theta = alpha[: len(alpha) // 2], theta[: len(theta) // 2]
    torch._foreach_copy_(alpha, theta)


def interrupt_in_sync(tmp: Path, kind: str) -> Outcome:
    """KeyboardInterrupt halfway through α ← π_θ: the checkpoint holds a half-copied α, but the sync
    is not committed, so the resumed step syncs again and α is consistent."""
    outcome = Outcome(f"KeyboardInterrupt halfway through a sync ({kind})")
    config = train_config(kind, tmp / "run")
    loop = make_loop(kind, config)
    step, real = 2 * config.v, loop.sampler.sync

    def sync(policy: Any) -> int:
        if loop.k == step and "half copied" not in outcome.checks:
            old = [t.clone() for t in alpha_and_theta(loop)[0]]
            half_sync(loop)
            alpha, theta = alpha_and_theta(loop)
            outcome.checks["half copied"] = (not all(map(torch.equal, alpha, old))
                                             and not all(map(torch.equal, alpha, theta)))
            raise KeyboardInterrupt
        return real(policy)

    loop.sampler.sync = sync
    train(config, loop, progress=False)
    outcome.checks["stopped at the sync step, last_sync not updated"] = (
        loop.k == step and loop.schedule.last_sync == config.v)
    logged = load_metrics(config.output_dir)
    resume_and_compare(kind, config, outcome, logged)
    resumed_rows = rows_of(load_metrics(config.output_dir))
    outcome.checks["the resumed step synced (lag 0)"] = resumed_rows[step]["synced"] and resumed_rows[step]["lag"] == 0
    return outcome


# ----------------------------------------------------------------------------- a full or read-only disk

class FillingFile:
    """A file with ``room`` bytes left on its disk: writes beyond them stop part-way with ENOSPC,
    as a full disk does (``torch.save`` turns that into a RuntimeError "unexpected pos …")."""

    def __init__(self, f: Any, room: int) -> None:
        self.f, self.room = f, room

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if len(view) > self.room:
            self.f.write(view[: self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(view)
        return self.f.write(view)

    def flush(self) -> None:
        self.f.flush()


def lock_released(out: Path) -> bool:
    """Whether ``out``'s run lock can be taken now (a lock still held by a leaked descriptor cannot)."""
    fd = os.open(out / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def whole_lines(out: Path) -> list[dict[str, Any]] | None:
    """The rows of ``out/metrics.jsonl`` if every line is whole JSON ending in a newline, else None."""
    text = (out / "metrics.jsonl").read_text()
    try:
        return [json.loads(line) for line in text.splitlines()] if text.endswith("\n") or not text else None
    except json.JSONDecodeError:
        return None


def checkpoint_step(out: Path) -> int | None:
    """k of the checkpoint in ``out``, or None when it is missing or unreadable."""
    try:
        return torch.load(out / CHECKPOINT_FILE, weights_only=True)["k"]
    except Exception:  # noqa: BLE001 - an unreadable checkpoint is the failure being measured
        return None


def stopped_clearly(outcome: Outcome, run: Callable[[], Any], *words: str) -> str:
    """Run ``run``; check it raised one DiskError, a one-line message containing each of ``words``."""
    try:
        run()
        error: Exception | None = None
    except Exception as exc:  # noqa: BLE001 - any other error is the failure being measured
        error = exc
    message = str(error) if error is not None else ""
    outcome.checks[f"one DiskError, one line, naming {', '.join(words)}"] = (
        isinstance(error, DiskError) and "\n" not in message and all(w in message for w in words))
    outcome.note = f"{type(error).__name__}: {message}"[:400] if error is not None else "no error"
    return message


def kept_last_checkpoint(outcome: Outcome, kind: str, out: Path, k: int, logged: int) -> None:
    """The checks every failed write must pass: checkpoint k intact, metrics.jsonl = the first ``logged``
    rows of the uninterrupted run in whole lines (those past k are redone on resume), no temporary
    file, the run lock released."""
    outcome.checks[f"the checkpoint (k = {k}) still loads"] = checkpoint_step(out) == k
    lines = whole_lines(out)
    outcome.checks[f"metrics.jsonl: whole lines, steps 0-{logged - 1}"] = (
        lines is not None and rows_of(lines) == reference_run(kind)[0][:logged])
    outcome.checks["no temporary file left"] = not list(out.glob(".*.tmp"))
    outcome.checks["the run lock released"] = lock_released(out)


def disk_full_before_the_run(tmp: Path, kind: str) -> Outcome:
    """output_dir's disk has room for one checkpoint, the run needs two at once (``checkpoint_every`` > 0):
    refused before step 0 naming the folder, the bytes needed and free; then, with room, the run is exact."""
    outcome = Outcome(f"disk too full for the checkpoints, before the run ({kind})")
    config = train_config(kind, tmp / "run")
    out, loop = Path(config.output_dir), make_loop(kind, config)
    free = estimate_checkpoint(loop, config.steps)
    usage = shutil.disk_usage(tmp)
    with mock.patch.object(shutil, "disk_usage", lambda path: usage._replace(free=free)):
        stopped_clearly(outcome, lambda: train(config, loop, progress=False),
                        repr(str(out)), f"{free} bytes", "free", "needs", "checkpoint_every = 0")
    outcome.checks["stopped before step 0: no step, no checkpoint, no metrics"] = (
        loop.k == 0 and not (out / CHECKPOINT_FILE).exists() and not (out / "metrics.jsonl").exists())
    outcome.checks["the run lock released"] = lock_released(out)
    resume_and_compare(kind, config, outcome, [])
    outcome.note = f"checkpoint estimated {free} bytes, written {(out / CHECKPOINT_FILE).stat().st_size}"
    return outcome


def disk_full_mid_checkpoint(tmp: Path, kind: str) -> Outcome:
    """The disk fills halfway through writing the checkpoint after step 4 (ENOSPC from the file's write)."""
    outcome = Outcome(f"disk full in the middle of a checkpoint ({kind})")
    config = train_config(kind, tmp / "run")
    out, real_save = Path(config.output_dir), torch.save

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(obj, dict) and obj.get("k") == 4:
            f = FillingFile(f, room=(out / CHECKPOINT_FILE).stat().st_size // 2)
        real_save(obj, f, *args, **kwargs)

    with mock.patch.object(torch, "save", save):
        stopped_clearly(outcome, lambda: train(config, make_loop(kind, config), progress=False),
                        repr(str(out / CHECKPOINT_FILE)), "step 4", "no space left on device")
    logged = load_metrics(out)
    kept_last_checkpoint(outcome, kind, out, k=2, logged=4)
    resume_and_compare(kind, config, outcome, logged)
    return outcome


def disk_full_mid_metrics_line(tmp: Path, kind: str) -> Outcome:
    """The disk fills in the middle of step 3's line of metrics.jsonl (half written, then ENOSPC)."""
    outcome = Outcome(f"disk full in the middle of a metrics line ({kind})")
    config = train_config(kind, tmp / "run")
    out, loop, real_write, cut = Path(config.output_dir), make_loop(kind, config), os.write, []

    def write(fd: int, data: Any) -> int:
        metrics = out / "metrics.jsonl"
        if loop.k == 4 and metrics.exists() and os.fstat(fd).st_ino == metrics.stat().st_ino:
            if not cut:
                cut.append(True)
                return real_write(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    with mock.patch.object(os, "write", write):
        stopped_clearly(outcome, lambda: train(config, loop, progress=False),
                        repr(str(out / "metrics.jsonl")), "step 3", "no space left on device")
    outcome.checks["half a line was written, then cut back"] = bool(cut)
    logged = load_metrics(out)
    kept_last_checkpoint(outcome, kind, out, k=2, logged=3)
    resume_and_compare(kind, config, outcome, logged)
    return outcome


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[str]:
    """``folder`` unwritable while the block runs; yields how. ``chmod``: the folder 0o555, its files
    0o444, where that stops this process. As root (or with CAP_DAC_OVERRIDE) permissions stop nothing,
    and a read-only mount needs privileges a test lacks, so ``EROFS``: ``os.open`` of a path inside it
    for writing raises EROFS, as a read-only file system does (``tempfile``, the metrics writer and the
    run lock all open files through ``os.open``)."""
    modes = {p: p.stat().st_mode for p in [folder, *folder.iterdir()]}
    for p in modes:
        p.chmod(0o555 if p.is_dir() else 0o444)
    probe = folder / ".probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT, 0o644))
        probe.unlink()
        writable = True
    except PermissionError:
        writable = False
    try:
        if not writable:
            yield "chmod"
            return
        for p, mode in modes.items():
            p.chmod(mode)
        real_open, inside = os.open, str(folder.resolve())
        writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

        def open_(path: Any, flags: int, mode: int = 0o777, *args: Any, **kwargs: Any) -> int:
            if flags & writing and os.path.abspath(path).startswith(inside + os.sep):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return real_open(path, flags, mode, *args, **kwargs)

        with mock.patch.object(os, "open", open_):
            yield "EROFS"
    finally:
        for p, mode in modes.items():
            p.chmod(mode)


def read_only_output_dir(tmp: Path, kind: str) -> Outcome:
    """output_dir is read-only from the start: refused at the run lock, before any step; then, writable,
    the run is exact."""
    outcome = Outcome(f"read-only output_dir from the start ({kind})")
    config = train_config(kind, tmp / "run")
    out, loop = Path(config.output_dir), make_loop(kind, config)
    out.mkdir()
    with read_only(out) as how:
        stopped_clearly(outcome, lambda: train(config, loop, progress=False), repr(str(out / LOCK_FILE)))
    outcome.checks["the cause named: read-only or permission denied"] = any(
        w in outcome.note for w in ("read-only file system", "permission denied"))
    outcome.checks["stopped before step 0, nothing written"] = loop.k == 0 and not list(out.iterdir())
    resume_and_compare(kind, config, outcome, [])
    outcome.note = f"made read-only by {how}: {outcome.note}"
    return outcome


def read_only_mid_run(tmp: Path, kind: str) -> Outcome:
    """output_dir turns read-only as step 3 starts (a disk remounted read-only after an I/O error):
    step 3's metrics line cannot be written; the checkpoint of step 2 stays, the lock is released."""
    outcome = Outcome(f"output_dir turns read-only mid-run ({kind})")
    config = train_config(kind, tmp / "run")
    out, loop = Path(config.output_dir), make_loop(kind, config)
    real_step, how = loop.step, []
    with contextlib.ExitStack() as stack:
        def step() -> Any:
            if loop.k == 3 and not how:
                how.append(stack.enter_context(read_only(out)))
            return real_step()

        loop.step = step
        stopped_clearly(outcome, lambda: train(config, loop, progress=False),
                        repr(str(out / "metrics.jsonl")), "step 3")
    outcome.checks["the cause named: read-only or permission denied"] = any(
        w in outcome.note for w in ("read-only file system", "permission denied"))
    logged = load_metrics(out)
    kept_last_checkpoint(outcome, kind, out, k=2, logged=3)
    resume_and_compare(kind, config, outcome, logged)
    outcome.note = f"made read-only by {how[0] if how else '-'}: {outcome.note}"
    return outcome


def sync_fault(tmp: Path, kind: str, fault: str) -> Outcome:
    """A sync with one of tests/sync_faults.py's faults, on the tiny LM at v = 1: the run stops with a SyncError
    naming the tensor, at the first sync after π_θ moved, before that step's batch (the sync not committed)."""
    outcome = Outcome(f"a sync that {fault} ({kind})")
    loop = make_loop(kind, train_config(kind, tmp / "run", v=1, steps=6), layers=2)  # two down_proj to swap
    sampler = loop.sampler
    if fault == "leaves a tied LM head behind":
        head = sampler.model.lm_head
        head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)

    def faulty(policy: Any) -> int:
        targets = dict(sampler.model.named_parameters())
        with torch.no_grad():
            for name, tensor in pushed(policy.model.named_parameters(), fault):
                targets[name].copy_(tensor)
        return 0

    sampler.sync = faulty
    try:
        list(loop.run())
        outcome.checks["raised SyncError"] = False
    except SyncError as error:
        outcome.checks["raised SyncError naming the tensor"] = re.search(FAULTS[fault], str(error)) is not None
        outcome.checks["at a sync step, before its batch"] = (f"step {loop.k} " in str(error)
                                                             and len(loop.history) == loop.k)
        outcome.checks["the failed sync not committed"] = loop.schedule.last_sync == loop.k - 1
        outcome.checks["every earlier sync proved"] = all(r.weights_audit == "proved" for r in loop.history)
    return outcome


SYNC_SCENARIOS: dict[str, Callable[[Path, str], Outcome]] = {
    f"sync_{fault.replace(' ', '_')}": (lambda tmp, kind, fault=fault: sync_fault(tmp, kind, fault))
    for fault in FAULTS}
"""The sync faults, on the tiny LM only: the bandit's tabular α has no weights to fingerprint."""

SCENARIOS: dict[str, Callable[[Path, str], Outcome]] = {
    "crash_mid_checkpoint": crash_mid_checkpoint, "nan_gradient": nan_gradient,
    "nan_gradient_unclipped": lambda tmp, kind: nan_gradient(tmp, kind, max_grad_norm=None),
    "nan_loss": nan_loss, "poisoned_step_in_train": poisoned_step_in_train,
    "interrupt_in_sampling": interrupt_in_sampling, "interrupt_in_training": interrupt_in_training,
    "interrupt_in_sync": interrupt_in_sync, "disk_full_before_the_run": disk_full_before_the_run,
    "disk_full_mid_checkpoint": disk_full_mid_checkpoint, "disk_full_mid_metrics_line": disk_full_mid_metrics_line,
    "read_only_output_dir": read_only_output_dir, "read_only_mid_run": read_only_mid_run,
}
