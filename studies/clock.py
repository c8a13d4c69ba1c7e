"""The studies' training clock: seconds of training with evaluations and checkpoint writes taken out, the step log,
and the evaluation points, behind the one interface a unit's trainer calls (``start()``, then
``after_step(stepped, evaluate)`` after every batch, True meaning stop).

When to evaluate and when to stop is the study's: :class:`MarkClock` evaluates at marks of training seconds and
stops at a budget (the time-to-accuracy study); :class:`StepClock` evaluates every k optimiser steps and stops past
the targets or at a cap (the steps-to-target study). :class:`Checkpoint` is what a resumable unit saves through.

:class:`grpo_lab.scale.launch.TrainingClock` is not this clock: it is a TRL callback that times a launched run from
its first optimiser step to its last, with nothing taken out and no say in when training stops.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

Evaluate = Callable[[], tuple[float, dict[str, Any]]]
"""``evaluate()`` → (J, extras), run with the clock paused."""


class EvaluationClock:
    """Training seconds less the time held (:meth:`hold`/:meth:`release`: an evaluation, a checkpoint's writing),
    the step log (per batch: the training seconds at its end and whether AdamW stepped), the evaluation points and
    the optimiser steps so far. A subclass says when to evaluate and when to stop in :meth:`after_step`;
    :meth:`state_dict` and :meth:`load_state_dict` carry the clock across processes (a resumed unit's training
    seconds go on from its checkpoint's)."""

    def __init__(self) -> None:
        self.points: list[dict[str, Any]] = []
        self.step_log: list[dict[str, Any]] = []
        self.eval_seconds = 0.0
        self.optimizer_steps = 0
        self._started: float | None = None
        self._paused = 0.0
        self._held: float | None = None
        self._before = 0.0   # training seconds of the processes before this one (a resumed unit)

    def start(self) -> None:
        self._started, self._paused = time.perf_counter(), 0.0

    @property
    def seconds(self) -> float:
        """Training seconds so far: this process's since ``start()``, less the time held, plus those before it."""
        if self._started is None:
            raise RuntimeError("the clock was not started")
        now = time.perf_counter() if self._held is None else self._held
        return now - self._started - self._paused + self._before

    def hold(self) -> None:
        """Stop the clock until :meth:`release`."""
        self._held = time.perf_counter()

    def release(self) -> float:
        """Start the clock again; the seconds it was held."""
        if self._held is None:
            raise RuntimeError("the clock was not held")
        spent, self._held = time.perf_counter() - self._held, None
        self._paused += spent
        return spent

    def log_step(self, stepped: bool) -> float:
        """Count a batch (and its optimiser step if it ``stepped``); the training seconds at its end."""
        now = self.seconds
        self.optimizer_steps += bool(stepped)
        self.step_log.append({"training_seconds": now, "optimizer_step": bool(stepped)})
        return now

    def evaluate_point(self, evaluate: Evaluate, now: float, **fields: Any) -> float:
        """Run ``evaluate`` off the clock and record its point (``fields``, the clock's position at ``now``, J and
        the extras); its J."""
        self.hold()
        j, extras = evaluate()
        self.points.append({**fields, "training_seconds": now, "steps": len(self.step_log),
                            "optimizer_steps": self.optimizer_steps, "j": j, **extras})
        self.eval_seconds += self.release()
        return j

    def after_step(self, stepped: bool, evaluate: Evaluate) -> bool:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """What a resumed unit's clock needs (plain JSON values): points, step log, counters, training seconds."""
        return {"points": self.points, "step_log": self.step_log, "eval_seconds": self.eval_seconds,
                "optimizer_steps": self.optimizer_steps, "training_seconds": self.seconds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict` (before :meth:`start`)."""
        self.points, self.step_log = list(state["points"]), list(state["step_log"])
        self.eval_seconds, self.optimizer_steps = float(state["eval_seconds"]), int(state["optimizer_steps"])
        self._before = float(state["training_seconds"])


class MarkClock(EvaluationClock):
    """An evaluation at every mark of training seconds, and a stop at the budget.

    Once one or more marks have passed, ``after_step`` evaluates once for them (the point's ``marks``). It returns
    True to stop: after the evaluation of the last mark (the budget), or, with ``stop_at``, once an evaluation's J
    is at least ``stop_at`` (every target reached, so every first passage is known)."""

    def __init__(self, budget_seconds: float, every_seconds: float, stop_at: float | None = None) -> None:
        if not budget_seconds > 0 or not every_seconds > 0:
            raise ValueError(f"budget and mark spacing must be > 0, got {budget_seconds} and {every_seconds}")
        count = int(round(budget_seconds / every_seconds))
        if abs(count * every_seconds - budget_seconds) > 1e-9 * budget_seconds:
            raise ValueError(f"the budget {budget_seconds} s must be a whole number of marks of {every_seconds} s")
        super().__init__()
        self.budget_seconds, self.stop_at = budget_seconds, stop_at
        self.marks = [every_seconds * k for k in range(1, count + 1)]
        self._next = 0

    def after_step(self, stepped: bool, evaluate: Evaluate) -> bool:
        now = self.log_step(stepped)
        due = [m for m in self.marks[self._next:] if m <= now]
        if not due:
            return False
        self._next += len(due)
        j = self.evaluate_point(evaluate, now, marks=due)
        return self._next == len(self.marks) or (self.stop_at is not None and j >= self.stop_at)


class StepClock(EvaluationClock):
    """An evaluation every ``every`` optimiser steps, and a stop past the targets or at a cap.

    After a batch that stepped and brought the optimiser steps to a multiple of ``every``, ``after_step``
    evaluates and records one point. It returns True to stop: once an evaluation has found J ≥ ``stop_at`` (every
    target passed) and at least ``min_steps`` optimiser steps are done (``stopped_by = "targets"``); at ``cap``
    optimiser steps, reached or not (``"cap"``); at ``batch_cap`` batches short of the cap (``"batch_cap"``: the
    unit stalled on empty batches)."""

    def __init__(self, every: int, cap: int, min_steps: int, stop_at: float, batch_cap: int) -> None:
        if not 0 < every <= min_steps <= cap or cap % every or min_steps % every:
            raise ValueError(f"need 0 < every ≤ min_steps ≤ cap, both multiples of every; got {every}, {min_steps}, "
                             f"{cap}")
        if batch_cap < cap:
            raise ValueError(f"the batch cap {batch_cap} lies below the cap {cap}")
        super().__init__()
        self.every, self.cap, self.min_steps, self.stop_at, self.batch_cap = every, cap, min_steps, stop_at, batch_cap
        self.stopped_by: str | None = None
        self._reached = False

    def after_step(self, stepped: bool, evaluate: Evaluate) -> bool:
        now = self.log_step(stepped)
        if stepped and self.optimizer_steps % self.every == 0:
            self._reached |= self.evaluate_point(evaluate, now) >= self.stop_at
        if self._reached and self.optimizer_steps >= self.min_steps:
            self.stopped_by = "targets"
        elif self.optimizer_steps >= self.cap:
            self.stopped_by = "cap"
        elif len(self.step_log) >= self.batch_cap:
            self.stopped_by = "batch_cap"
        return self.stopped_by is not None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "reached": self._reached}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._reached = bool(state["reached"])


class Checkpoint(Protocol):
    """Where a resumable unit keeps its state (:class:`studies.steps_to_target.resume.UnitCheckpoint`). A trainer
    resumes from ``resume_from`` (its own files, None on a fresh start) with its extras ``trainer_state``; after a
    step it saves when ``due()`` (an evaluation point, and the spacing, passed since the last save): ``begin()``
    (off the clock), its files in a folder under ``staging``, then ``commit(folder, extras)``, which seals them with
    the unit's state."""

    resume_from: Path | None
    trainer_state: dict[str, Any]
    staging: Path

    def due(self) -> bool: ...

    def begin(self) -> None: ...

    def commit(self, folder: Path, trainer_state: dict[str, Any]) -> None: ...
