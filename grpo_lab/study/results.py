"""Reading the CPU study (``results/cpu_study``): means with 95 % confidence intervals over
seeds, paired differences between configurations, curves per step and per second.

A confidence interval here is Student's t: mean ± t_{0.975, n−1} · s / √n over the n seeds
(s the sample standard deviation). A paired difference takes, seed by seed, arm a's value
minus arm b's (same prompts, same held-out questions, same sampling seeds), then the same
interval over those differences: with few seeds it is much tighter than comparing two
separate intervals, because the seed-to-seed spread the two arms share cancels.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)
"""t_{0.975, df} for df = 1…30 (beyond: 1.96, the normal quantile, within 4 %)."""


def t_975(df: int) -> float:
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    return T_975[df - 1] if df <= len(T_975) else 1.96


def mean_ci(values: Any, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mean and 95 % CI half-width along ``axis``, over the values that are not NaN (a point some
    seeds did not measure); NaN half-width where fewer than two values remain."""
    x = np.asarray(values, dtype=float)
    if x.shape[axis] == 0:
        raise ValueError("mean_ci needs at least one value")
    n = (~np.isnan(x)).sum(axis=axis)
    if np.any(n == 0):
        raise ValueError("mean_ci needs at least one value that is not NaN at every point")
    mean = np.nanmean(x, axis=axis)
    deviation = np.where(np.isnan(x), 0.0, x - np.expand_dims(mean, axis)) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        std = np.sqrt(deviation.sum(axis=axis) / (n - 1))
        t = np.vectorize(lambda df: t_975(int(df)) if df >= 1 else math.nan, otypes=[float])(n - 1)
        half = np.where(n >= 2, t * std / np.sqrt(n), math.nan)
    return mean, half


@dataclass
class Study:
    """``summary.json`` and the per-step metrics of every finished run."""

    summary: dict[str, Any]
    metrics: dict[str, list[dict[str, Any]]]   # "<arm>_s<seed>" → one dict per step

    @property
    def arms(self) -> list[str]:
        """Configurations with at least one finished run, in running order."""
        return list(dict.fromkeys(r["name"] for r in self.summary["runs"]))

    def runs(self, arm: str) -> list[dict[str, Any]]:
        """Finished runs of ``arm``, by seed."""
        runs = sorted((r for r in self.summary["runs"] if r["name"] == arm), key=lambda r: r["seed"])
        if not runs:
            raise ValueError(f"arm must be one of {self.arms}, got {arm!r}")
        return runs

    def steps_matrix(self, arm: str, key: str) -> np.ndarray:
        """``[steps, seeds]`` of a per-step metric (``reward_mean``, ``masked_frac``, …)."""
        return np.array([[row[key] for row in self.metrics[f"{arm}_s{r['seed']}"]] for r in self.runs(arm)]).T

    def seconds_matrix(self, arm: str) -> np.ndarray:
        """``[steps, seeds]`` training wall clock (sample + train + sync) at the end of each step."""
        parts = sum(self.steps_matrix(arm, k) for k in ("sample_seconds", "train_seconds", "sync_seconds"))
        return np.cumsum(parts, axis=0)

    def pass_curve(self, arm: str) -> tuple[np.ndarray, np.ndarray]:
        """Steps (0 = untrained) and ``[points, seeds]`` held-out Pass@1 along training; NaN where a
        run was not scored at that step (every run is scored at the last step)."""
        runs = self.runs(arm)
        steps = sorted({int(s) for r in runs for s in r["pass_at_1_curve"]})
        values = [[self.summary["before"]["pass_at_1"]] * len(runs)]
        values += [[r["pass_at_1_curve"].get(str(s), math.nan) for r in runs] for s in steps]
        return np.array([0, *steps]), np.array(values)

    def after(self, arm: str) -> dict[int, float]:
        return {r["seed"]: r["pass_at_1_after"] for r in self.runs(arm)}


def load_study(out_dir: str | Path) -> Study:
    """The study in ``out_dir`` (``summary.json`` + ``metrics/``), finished runs only."""
    out = Path(out_dir)
    path = out / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"no study at {str(out)!r}: run experiments/cpu_study.py first")
    summary = json.loads(path.read_text())
    metrics = {}
    for run in summary["runs"]:
        key = f"{run['name']}_s{run['seed']}"
        lines = (out / "metrics" / f"{key}.jsonl").read_text().splitlines()
        metrics[key] = [json.loads(line) for line in lines if line.strip()]
    return Study(summary=summary, metrics=metrics)


@dataclass(frozen=True)
class Paired:
    """Arm a − arm b over the seeds both finished: mean, 95 % CI half-width, n and the differences."""

    a: str
    b: str
    mean: float
    half: float
    n: int
    diffs: tuple[float, ...]

    @property
    def low(self) -> float:
        return self.mean - self.half

    @property
    def high(self) -> float:
        return self.mean + self.half


def paired(study: Study, a: str, b: str) -> Paired:
    """Held-out Pass@1 after training, arm a minus arm b, seed by seed."""
    after_a, after_b = study.after(a), study.after(b)
    seeds = sorted(set(after_a) & set(after_b))
    if not seeds:
        raise ValueError(f"arms {a!r} and {b!r} share no finished seed")
    diffs = [after_a[s] - after_b[s] for s in seeds]
    mean, half = mean_ci(diffs)
    return Paired(a, b, float(mean), float(half), len(seeds), tuple(diffs))


def table(study: Study, paper: dict[str, float | None] | None = None) -> list[dict[str, Any]]:
    """One row per arm: seeds, Pass@1 before / after (mean ± CI), gain, training seconds,
    optimiser passes, gain per training minute, and the paper's figure for that role."""
    rows = []
    before = study.summary["before"]["pass_at_1"]
    for arm in study.arms:
        runs = study.runs(arm)
        after, after_half = mean_ci([r["pass_at_1_after"] for r in runs])
        seconds = float(np.mean([r["wall_seconds"] for r in runs]))
        rows.append({"arm": arm, "v": runs[0]["v"], "i": runs[0]["i"], "mask": runs[0]["mask"],
                     "seeds": len(runs), "before": before, "after": float(after), "after_ci": float(after_half),
                     "gain": float(after) - before, "train_seconds": seconds,
                     "passes": float(np.mean([r["train_passes"] for r in runs])),
                     "gain_per_minute": (float(after) - before) / (seconds / 60),
                     "paper": (paper or {}).get(arm)})
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The table as aligned text (what the notebook prints)."""
    head = f"{'arm':11} {'v':>2} {'i':>2} {'mask':>5} {'seeds':>5} {'before':>6} {'after (95% CI)':>16} " \
           f"{'gain':>6} {'train s':>7} {'gain/min':>8} {'paper':>6}"
    lines = [head]
    for r in rows:
        paper = "-" if r["paper"] is None else f"{r['paper']:.2f}"
        lines.append(f"{r['arm']:11} {r['v']:2d} {r['i']:2d} {str(r['mask']):>5} {r['seeds']:5d} {r['before']:6.3f} "
                     f"{r['after']:7.3f} ± {r['after_ci']:6.3f} {r['gain']:+6.3f} {r['train_seconds']:7.0f} "
                     f"{r['gain_per_minute']:+8.3f} {paper:>6}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Finding:
    """One claim of the paper checked on the study: the paired difference and what it says."""

    claim: str
    diff: Paired
    verdict: str      # "reproduces", "contradicted", "not resolved"


def findings(study: Study, tolerance: float = 0.10) -> list[Finding]:
    """The paper's claims on the arms the study has, each decided by a 95 % CI:

    * the mask helps: masked − onpolicy > 0 (CI above 0 reproduces, below 0 contradicts);
    * a lagged server trains as well: lagged_v8 − masked inside ±``tolerance``;
    * sample reuse is no better per step: reuse_i4 − masked ≤ ``tolerance`` (its cost is separate).
    An interval that decides neither way is "not resolved" (too few seeds or too close). The
    ``lr_matched`` arm is a control of ours, not a claim of the paper, and under gradient clipping
    it does not isolate the mask (:mod:`grpo_lab.study.cpu_study`): read it with :func:`paired`.
    """
    have = set(study.arms)
    out = []

    def add(claim: str, a: str, b: str, kind: str) -> None:
        if not {a, b} <= have:
            return
        d = paired(study, a, b)
        if d.n < 2:
            out.append(Finding(claim, d, "not resolved"))
            return
        if kind == "better":
            verdict = "reproduces" if d.low > 0 else "contradicted" if d.high < 0 else "not resolved"
        elif kind == "same":
            verdict = "reproduces" if -tolerance < d.low and d.high < tolerance else \
                      "contradicted" if d.low >= tolerance or d.high <= -tolerance else "not resolved"
        else:  # "not better"
            verdict = "reproduces" if d.high < tolerance else "contradicted" if d.low >= tolerance else "not resolved"
        out.append(Finding(claim, d, verdict))

    add("the zero-variance mask helps (paper: 45 → 50 %)", "masked", "onpolicy", "better")
    add(f"a lagged server (v = 8) trains as well as v = 1 (within ±{tolerance:.2f})", "lagged_v8", "masked", "same")
    add(f"sample reuse (i = 4) gains no more per step (by < {tolerance:.2f})", "reuse_i4", "masked", "not better")
    return out
