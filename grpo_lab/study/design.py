"""The CPU study's design and its folder (issue 24 §3): the arms, the comparisons, the paper's table they
stand in for, the unit files, and the reader of a study folder as it stands.

The arms and why each is there: :mod:`grpo_lab.study.cpu_study`, which runs them. The statistics the reader
applies (intervals, paired tests, power) know no study: :mod:`grpo_lab.study.results`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .results import MARGIN, PairedTest, bounded_mean_ci, paired_test, wilson_interval

if TYPE_CHECKING:
    from ..lm.train_config import TrainConfig

UNTRAINED = "untrained"
"""The untrained model's unit: ``units/untrained_e<eval_seed>.json``."""


@dataclass(frozen=True)
class Arm:
    """One configuration of the study."""

    name: str
    v: int = 1
    i: int = 1
    is_correction: str = "ratio"
    mask: bool = True
    beta: float = 0.0
    step_factor: int = 1
    """Steps × this (``v1_steps4``: the optimiser passes of i = 4 on fresh samples)."""
    primary: bool = True

    def config(self, base: TrainConfig, seed: int) -> TrainConfig:
        return base.replace(v=self.v, i=self.i, is_correction=self.is_correction, mask_zero_variance=self.mask,
                            beta=self.beta, steps=base.steps * self.step_factor, mask_normalize="batch",
                            empty_step="skip", seed=seed)

    def row(self) -> dict[str, Any]:
        return {"name": self.name, "v": self.v, "i": self.i, "mask": self.mask, "beta": self.beta,
                "is_correction": self.is_correction}


PRIMARY = (Arm("v1"), Arm("v8_ratio", v=8), Arm("v32_ratio", v=32),
           Arm("v8_none", v=8, is_correction="none"), Arm("v32_none", v=32, is_correction="none"))
SECONDARY = (Arm("v1_i4", i=4, primary=False), Arm("v1_steps4", step_factor=4, primary=False),
             Arm("mask_b04", beta=0.04, primary=False), Arm("nomask_b04", mask=False, beta=0.04, primary=False))
ARMS = PRIMARY + SECONDARY
ARM_BY_NAME = {a.name: a for a in ARMS}
COMPARISONS = (("v8_ratio", "v1"), ("v32_ratio", "v1"), ("v8_none", "v1"), ("v32_none", "v1"),
               ("v1_i4", "v1"), ("v1_i4", "v1_steps4"), ("mask_b04", "nomask_b04"))
"""(a, reference b): the primary question, then the secondary ones; tested as a − b."""


def unit_key(arm: str, seed: int) -> str:
    return f"{arm}_s{seed}"


def load_units(out_dir: str | Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The untrained unit (None if not yet scored) and every finished run unit in ``out_dir/units``,
    checked to share one study's settings."""
    units = Path(out_dir) / "units"
    untrained, runs = None, []
    for path in sorted(units.glob("*.json")) if units.is_dir() else []:
        unit = json.loads(path.read_text())
        if path.name.startswith(UNTRAINED):
            untrained = unit
        else:
            runs.append(unit)
    for unit in runs:
        if untrained is not None and unit["study"] != untrained["study"]:
            key = unit_key(unit["run"]["name"], unit["run"]["seed"])
            raise ValueError(f"unit {key} in {units} was made with {unit['study']}, the untrained unit with "
                             f"{untrained['study']}: one folder holds one study")
    return untrained, runs


PILOT_LAGS = (1, 8, 31)
"""Lags whose drift the pilot reports: 1, 8 and the largest lag of v = 32 (lags run 0…v−1)."""


def drift_by_lag(units: Iterable[dict[str, Any]], lags: Sequence[int] = PILOT_LAGS) -> dict[int, float | None]:
    """Mean |log r′| = ``log_ratio_k_abs`` over the trained steps at each lag, pooled over ``units``
    (None where no step had that lag)."""
    values: dict[int, list[float]] = {lag: [] for lag in lags}
    for unit in units:
        for m in unit["metrics"]:
            if m["lag"] in values and not m["skipped"]:
                values[m["lag"]].append(m["log_ratio_k_abs"])
    return {lag: (sum(v) / len(v) if v else None) for lag, v in values.items()}


PAPER_GSM8K = (
    ("on-policy (v = 1, i = 1), no mask", "45 % (unstable)", ("nomask_b04",)),
    ("on-policy + zero-variance mask", "50 %", ("mask_b04", "v1")),
    ("lagged server (v = 10, i = 1)", "50 % (stable)", ("v8_ratio", "v32_ratio")),
    ("sample reuse (v = 1, i = 10)", "slower; 10× the training", ("v1_i4",)),
    ("not in the paper: a lagged server without the correction", "-", ("v8_none", "v32_none")),
)
"""The paper's GSM8K table (Qwen2.5-0.5B-Instruct, β = 0.04; ``docs/theory.md`` §6): each row, its Pass@1,
and the arms of the CPU study that play its role."""


@dataclass(frozen=True)
class Study:
    """The finished units of one study folder, as they stand (:func:`load_study`).

    ``units``: arm → seed → unit file (``study``, ``run``, ``eval``, ``metrics``: see
    :mod:`grpo_lab.study.cpu_study`); ``untrained``: the untrained model's evaluation, step 0 of
    every run (None before it was scored); ``settings``: what every unit shares ({} with none).
    """

    folder: Path
    settings: dict[str, Any]
    untrained: dict[str, Any] | None
    units: dict[str, dict[int, dict[str, Any]]]

    @property
    def arms(self) -> list[str]:
        """Arms with at least one finished unit, in the study's order (an arm it does not know last)."""
        order = {arm.name: k for k, arm in enumerate(ARMS)}
        return sorted(self.units, key=lambda name: (order.get(name, len(order)), name))

    def n(self, arm: str) -> int:
        """Seeds ``arm`` has finished (0 for an arm without a unit)."""
        return len(self.units.get(arm, {}))

    def seeds(self, arm: str) -> list[int]:
        return sorted(self.units.get(arm, {}))

    def _units(self, arm: str) -> list[dict[str, Any]]:
        if arm not in self.units:
            raise ValueError(f"arm must be one with a finished unit in {self.folder}, one of {self.arms}; got {arm!r}")
        return [self.units[arm][seed] for seed in self.seeds(arm)]

    def runs(self, arm: str) -> list[dict[str, Any]]:
        """The summary rows of ``arm``'s units, by seed."""
        return [unit["run"] for unit in self._units(arm)]

    def after(self, arm: str) -> dict[int, float]:
        """Seed → held-out Pass@1 (strict) at the last step."""
        return {run["seed"]: run["pass_at_1_after"] for run in self.runs(arm)}

    def pass_curve(self, arm: str) -> tuple[np.ndarray, np.ndarray]:
        """Scoring steps (0 = untrained) and ``[steps, seeds]`` held-out Pass@1; NaN where a seed was not
        scored at that step."""
        curves = [run["pass_at_1_curve"] for run in self.runs(arm)]
        steps = sorted({int(s) for curve in curves for s in curve})
        return np.array(steps), np.array([[curve.get(str(s), math.nan) for curve in curves] for s in steps])

    def metric(self, arm: str, key: str) -> np.ndarray:
        """``[steps, seeds]`` of a per-step field (``reward_mean``, ``lag``, …: ``METRIC_FIELDS``); NaN
        past a seed's last step or where a step did not log the field."""
        rows = [unit["metrics"] for unit in self._units(arm)]
        if not any(key in m for metrics in rows for m in metrics):
            raise ValueError(f"key must be a per-step field of arm {arm!r}'s units, got {key!r}")
        out = np.full((max(len(metrics) for metrics in rows), len(rows)), math.nan)
        for seed, metrics in enumerate(rows):
            out[:len(metrics), seed] = [float(m.get(key, math.nan)) for m in metrics]
        return out

    def drift_by_lag(self, arm: str) -> tuple[np.ndarray, np.ndarray]:
        """The lags of 0…v−1 that a trained step reached, and ``[lags, seeds]``: each seed's mean |log r′|
        (``log_ratio_k_abs``) over its trained steps at that lag (:func:`drift_by_lag`
        of one unit); NaN where that seed trained no step at that lag."""
        units = self._units(arm)
        means = [drift_by_lag([unit], range(max(u["run"]["v"] for u in units))) for unit in units]
        lags = [lag for lag in means[0] if any(m[lag] is not None for m in means)]
        return np.array(lags), np.array([[math.nan if m[lag] is None else m[lag] for m in means] for lag in lags])

    def tests(self, margin: float = MARGIN) -> list[PairedTest]:
        """The paired test of each comparison of :data:`COMPARISONS` whose two
        arms have a unit (the ``tests`` of ``summary.json`` come from the same :func:`paired_test`)."""
        return [paired_test(self.after(a), self.after(b), a, b, margin) for a, b in COMPARISONS
                if a in self.units and b in self.units]

    def row(self, arm: str) -> dict[str, Any]:
        """What ``arm``'s seeds ended at: Pass@1 strict (mean and 95 % t interval over seeds, clipped
        to [0, 1]; with one seed, that run's Wilson interval over its evaluation samples, ``interval``
        saying which), lenient Pass@1, truncated share, optimiser passes, skipped steps, unit seconds."""
        runs = self.runs(arm)
        mean, low, high = (float(x) for x in bounded_mean_ci([r["pass_at_1_after"] for r in runs]))
        interval = "t over seeds"
        if len(runs) == 1:
            final = self.units[arm][runs[0]["seed"]]["eval"][str(runs[0]["steps"])]
            (low, high), interval = wilson_interval(final["correct"], final["completions"]), "Wilson, one run's samples"
        average = {key: float(np.mean([r[key] for r in runs])) for key in
                   ("pass_at_1_lenient_after", "truncated_frac_after", "train_passes", "skipped_steps", "unit_seconds")}
        return {"arm": arm, "n": len(runs), "seeds": [r["seed"] for r in runs], "steps": runs[0]["steps"],
                "pass_at_1_after": mean, "low": low, "high": high, "interval": interval, **average}


def load_study(out_dir: str | Path) -> Study:
    """The finished units in ``out_dir/units`` (none yet, or no folder: a study without arms)."""
    untrained, runs = load_units(out_dir)
    units: dict[str, dict[int, dict[str, Any]]] = {}
    for unit in runs:
        units.setdefault(unit["run"]["name"], {})[unit["run"]["seed"]] = unit
    settings = untrained["study"] if untrained else runs[0]["study"] if runs else {}
    return Study(Path(out_dir), dict(settings), None if untrained is None else untrained["eval"], units)


def format_rows(rows: Sequence[Mapping[str, Any]]) -> str:
    """:meth:`Study.row` of several arms as aligned text (what notebook 02 prints)."""
    lines = [f"{'arm':11} {'n':>2} {'steps':>5} {'Pass@1 strict [95 % interval]':>30} {'lenient':>7} "
             f"{'truncated':>9} {'passes':>6} {'unit s':>6}"]
    for r in rows:
        strict = f"{r['pass_at_1_after']:.3f} [{r['low']:.3f}, {r['high']:.3f}]{'*' if r['n'] == 1 else ' '}"
        lines.append(f"{r['arm']:11} {r['n']:2d} {r['steps']:5d} {strict:>30} {r['pass_at_1_lenient_after']:7.3f} "
                     f"{r['truncated_frac_after']:9.3f} {r['train_passes']:6.0f} {r['unit_seconds']:6.0f}")
    if any(r["n"] == 1 for r in rows):
        lines.append("* one seed: no interval over seeds; the run's Wilson interval over its evaluation samples")
    return "\n".join(lines)
