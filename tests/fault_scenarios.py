"""Fault scenarios: each injects one fault into a run (SIGKILL mid-checkpoint, NaN gradient, non-finite
loss, a poisoned step inside ``train``, KeyboardInterrupt/SIGINT while sampling, training, syncing)
and returns an :class:`Outcome`: the checks that must hold and the steps lost (must be 0).

``tests/test_faults.py`` runs the fast ones; ``tests/reliability_report.py`` runs all on both kinds.
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import select
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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

from grpo_lab.lm.sampling import HFSampler
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.lm.training import load_metrics, train


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
        if loop.k == 3 and not sent:
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


SCENARIOS: dict[str, Callable[[Path, str], Outcome]] = {
    "crash_mid_checkpoint": crash_mid_checkpoint, "nan_gradient": nan_gradient,
    "nan_gradient_unclipped": lambda tmp, kind: nan_gradient(tmp, kind, max_grad_norm=None),
    "nan_loss": nan_loss, "poisoned_step_in_train": poisoned_step_in_train,
    "interrupt_in_sampling": interrupt_in_sampling, "interrupt_in_training": interrupt_in_training,
    "interrupt_in_sync": interrupt_in_sync,
}
