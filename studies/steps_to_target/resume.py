"""Checkpoints of a steps-to-target unit: a unit killed with its process (a work session ends after a few hours; a
TRL unit takes longer) resumes from its last checkpoint, taken at an evaluation point, instead of starting over.

At the first evaluation point after :data:`SPACING_SECONDS` of wall time since the last save,
``units/<arm>_s<seed>.ckpt/`` gets one sealed folder ``point-<n>/`` (n: the optimiser steps of the evaluation
point): the trainer's own state (the loop's ``loop.pt``, :func:`grpo_lab.lm.checkpoint.save_checkpoint`; TRL's:
Hugging Face's checkpoint of the model, optimiser, scheduler, trainer state and RNG states) and ``unit.json``, the
study's state as JSON (the unit's record so far, with the provenance at its first start and at each resume; the
clock's points, step log and counters; the trainer's extras; wall, CPU and checkpoint seconds so far). A folder is
written under ``staging/``, its files flushed to disk, then renamed to ``point-<n>/`` in one atomic rename before the
one it replaces is removed, so a kill at any moment leaves the last sealed folder whole. The unit removes the
checkpoint once its unit file is written.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from grpo_lab.files import atomic_write
from studies.clock import StepClock

POINT = "point-"
STATE = "unit.json"
SPACING_SECONDS = 600.0
"""Wall seconds at least between two checkpoints: a save writes ~2 GB (several seconds on this disk), so a loop unit
(~20 min, an evaluation point every ~30 s) saves about twice and a TRL unit loses at most ~10 min to a kill."""
IDENTITY = ("arm", "seed", "design_sha", "config")
"""What a checkpoint must share with the unit that resumes it; the rest of a fresh unit's record is provenance."""


class UnitCheckpoint:
    """The checkpoint of the unit whose file is ``unit_path``, driven by its ``clock`` (the interface
    :class:`studies.clock.Checkpoint`). :meth:`open` resumes the clock and the unit's record from
    the last sealed point (or starts them fresh); the trainer saves through :meth:`due`, :meth:`begin` and
    :meth:`commit`; :meth:`totals` adds the seconds of the processes before; :meth:`remove` once the unit is done."""

    def __init__(self, unit_path: Path, clock: StepClock, spacing: float | None = None) -> None:
        self.folder = unit_path.with_suffix(".ckpt")
        self.spacing = SPACING_SECONDS if spacing is None else spacing
        self.staging = self.folder / "staging"
        self.clock = clock
        self.unit: dict[str, Any] = {}
        self.resume_from: Path | None = None
        self.trainer_state: dict[str, Any] = {}
        self.before = {"wall_seconds": 0.0, "cpu_seconds": 0.0, "checkpoint_seconds": 0.0}
        self._start = (time.perf_counter(), time.process_time())
        self._spent = 0.0               # this process's seconds writing checkpoints
        self._began: float | None = None
        self._saved = 0                 # the clock's points when the last checkpoint was sealed
        self._sealed = time.perf_counter()  # when it was sealed (or this process started)

    def points(self) -> list[Path]:
        """The sealed point folders, oldest first (more than one only after a kill mid-replacement)."""
        found = [p for p in self.folder.glob(f"{POINT}*") if p.is_dir() and p.name[len(POINT):].isdigit()]
        return sorted(found, key=lambda p: int(p.name[len(POINT):]))

    def open(self, fresh: dict[str, Any]) -> dict[str, Any]:
        """The unit's record: ``fresh`` (identity and provenance) with no resumes, or the last point's record with
        this resume appended (``fresh``'s provenance, the time, the steps it resumes from); the clock and the
        trainer's extras are restored from that point. A point of another design or config is refused."""
        shutil.rmtree(self.staging, ignore_errors=True)          # a save killed before its rename
        points = self.points()
        if not points:
            self.unit = {**fresh, "resumes": []}
            return self.unit
        for stale in points[:-1]:
            shutil.rmtree(stale)
        state = json.loads((points[-1] / STATE).read_text())
        differs = [key for key in IDENTITY if state["unit"][key] != json.loads(json.dumps(fresh[key]))]
        if differs:
            raise ValueError(f"{points[-1]} was saved with another {', '.join(differs)}; remove {self.folder} to "
                             "start the unit over")
        self.clock.load_state_dict(state["clock"])
        self.trainer_state, self.before, self.resume_from = state["trainer"], state["seconds"], points[-1]
        self._saved = len(self.clock.points)
        resume = {key: value for key, value in fresh.items() if key not in IDENTITY}
        resume |= {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   "optimizer_steps": self.clock.optimizer_steps, "steps": len(self.clock.step_log)}
        self.unit = {**state["unit"], "resumes": [*state["unit"]["resumes"], resume]}
        return self.unit

    def due(self) -> bool:
        """Whether the clock recorded an evaluation point since the last checkpoint and :attr:`spacing` wall
        seconds have passed since it (or since this process started)."""
        return len(self.clock.points) > self._saved and time.perf_counter() - self._sealed >= self.spacing

    def begin(self) -> None:
        """A checkpoint starts: the clock holds until :meth:`commit` (saving is off the clock, as evaluating)."""
        self._began = time.perf_counter()
        self.clock.hold()

    def commit(self, folder: Path, trainer_state: dict[str, Any]) -> None:
        """Seal ``folder`` (the trainer's files, under :attr:`staging`) with the unit's state and ``trainer_state``
        (the trainer's extras, plain JSON values) as ``point-<n>/``, remove the point before it, release the clock."""
        self._spent += time.perf_counter() - self._began
        atomic_write(folder / STATE, json.dumps(self._state(trainer_state)) + "\n", what="a unit's checkpoint")
        flush(folder)
        target = self.folder / f"{POINT}{self.clock.optimizer_steps}"
        shutil.rmtree(target, ignore_errors=True)
        os.replace(folder, target)
        flush(self.folder)
        for old in self.points():
            if old != target:
                shutil.rmtree(old)
        self._saved, self._sealed = len(self.clock.points), time.perf_counter()
        self.clock.release()

    def _state(self, trainer_state: dict[str, Any]) -> dict[str, Any]:
        """What ``unit.json`` holds (the module docstring)."""
        wall, cpu = self._start
        seconds = {"wall_seconds": self.before["wall_seconds"] + time.perf_counter() - wall,
                   "cpu_seconds": self.before["cpu_seconds"] + time.process_time() - cpu,
                   "checkpoint_seconds": self.before["checkpoint_seconds"] + self._spent}
        return {"unit": self.unit, "clock": self.clock.state_dict(), "trainer": trainer_state, "seconds": seconds}

    def totals(self, trained: dict[str, Any]) -> dict[str, float]:
        """The unit's wall and CPU seconds (``trained``'s, this process's, plus those of the processes before it,
        each counted to the checkpoint it left) and its seconds writing checkpoints."""
        return {"wall_seconds": self.before["wall_seconds"] + trained["wall_seconds"],
                "cpu_seconds": self.before["cpu_seconds"] + trained["cpu_seconds"],
                "checkpoint_seconds": self.before["checkpoint_seconds"] + self._spent}

    def remove(self) -> None:
        """Delete the checkpoint (the unit's file is written)."""
        shutil.rmtree(self.folder, ignore_errors=True)


def flush(folder: Path) -> None:
    """fsync every file under ``folder`` and the folder itself, so that what a rename seals is on disk (across a
    power loss too, not only a killed process)."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
