"""Reading the CPU study: means with 95 % confidence intervals over seeds, paired differences,
the verdict rule of issue 24 (equivalent / worse / not resolved) and the power to reach it.

A confidence interval over seeds is Student's t: mean ± t_{q, n−1} · s / √n over the n seeds
(s the sample standard deviation). A paired difference takes, seed by seed, arm a's value
minus arm b's (same prompts, same held-out questions, same sampling seeds), then the same
interval over those differences: with few seeds it is much tighter than comparing two
separate intervals, because the seed-to-seed spread the two arms share cancels.

========================= ============================================================
symbol                    meaning
========================= ============================================================
d_s                       Pass@1 of arm a − Pass@1 of arm b at seed s (a − reference)
n                         seeds both arms finished
m                         equivalence margin (±0.03 by default)
TOST                      two one-sided t-tests at 5 % each ⇔ the 90 % CI of mean d lies in (−m, m)
"worse"                   the 95 % CI of mean d lies below 0
========================= ============================================================

The first study (:data:`~grpo_lab.study.cpu_study.STUDY_V1_DIR`, old layout: ``summary.json`` +
``metrics/``) is read by :func:`load_study`; the unit-based study of :mod:`grpo_lab.study.cpu_study`
gets its ``tests`` from :func:`study_tests`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MARGIN = 0.03
"""The equivalence margin on Pass@1 (issue 24): "trains as well as" means within ±0.03."""
VERDICTS = ("equivalent", "worse", "not resolved")


def t_cdf(t: float, df: int) -> float:
    """P(T ≤ t) for Student's t with integer ``df`` degrees of freedom, in closed form
    (Abramowitz & Stegun 26.7.3–26.7.4: finite sums in θ = atan(t/√df))."""
    df = int(df)
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    theta = math.atan2(t, math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2:       # odd: A = (2/π)(θ + sin θ cos θ (1 + 2/3 cos²θ + … + (2·4…(df−3))/(1·3…(df−2)) cos^{df−3}θ))
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= 2 * k / (2 * k + 1) * c2
            total += term
        a = 2 / math.pi * (theta + s * math.cos(theta) * total)
    else:            # even: A = sin θ (1 + 1/2 cos²θ + … + (1·3…(df−3))/(2·4…(df−2)) cos^{df−2}θ)
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= (2 * k - 1) / (2 * k) * c2
            total += term
        a = s * total
    return 0.5 + a / 2   # A(t|df) = P(|T| ≤ t) signed by t


def t_quantile(p: float, df: int) -> float:
    """The t with P(T ≤ t) = ``p`` for Student's t with ``df`` degrees of freedom (bisection on :func:`t_cdf`)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie strictly between 0 and 1, got {p}")
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    low, high = -1e4, 1e4
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
        if high - low < 1e-10:
            break
    return (low + high) / 2


def t_975(df: int) -> float:
    """t_{0.975, df}: the two-sided 95 % quantile."""
    return t_quantile(0.975, df)


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


# ----------------------------------------------------------------------------- bounded intervals

def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a proportion ``successes / n``: it stays inside [0, 1], where
    p̂ ± z·SE runs outside near 0 and 1. For one run's Pass@1 over its Q·n evaluation samples
    (the samples of a question are correlated, so it is a little narrow)."""
    from statistics import NormalDist

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if isinstance(successes, bool) or not isinstance(successes, int) or not 0 <= successes <= n:
        raise ValueError(f"successes must be an integer in [0, n = {n}], got {successes!r}")
    z = NormalDist().inv_cdf((1 + level) / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def bounded_mean_ci(values: Sequence[float], low: float = 0.0, high: float = 1.0) -> tuple[float, float, float]:
    """Mean over seeds of a quantity bounded to [low, high] (Pass@1), and its 95 % t interval
    clipped to that range: with few seeds the t interval alone runs past the bounds."""
    mean, half = mean_ci(values)
    mean, half = float(mean), float(half)
    return mean, max(low, mean - half), min(high, mean + half)


# ----------------------------------------------------------------------------- the verdict rule

def _intervals(diffs: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and t interval (low, high) at ``level`` of ``diffs`` [..., n] along its last axis (n ≥ 2)."""
    n = diffs.shape[-1]
    mean = diffs.mean(axis=-1)
    half = t_quantile((1 + level) / 2, n - 1) * diffs.std(axis=-1, ddof=1) / math.sqrt(n)
    return mean, mean - half, mean + half


def _rule(diffs: np.ndarray, margin: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(equivalent, worse, better) of paired differences ``diffs`` [..., n]: TOST at 5 % (90 % CI inside
    ±margin), and the 95 % CI below / above 0."""
    _, low90, high90 = _intervals(diffs, 0.90)
    _, low95, high95 = _intervals(diffs, 0.95)
    return (low90 > -margin) & (high90 < margin), high95 < 0, low95 > 0


@dataclass(frozen=True)
class PairedTest:
    """Arm a − reference arm b over the seeds both finished, and the verdict by rule.

    ``verdict``: ``equivalent`` when the 90 % CI lies inside ±``margin`` (TOST); else ``worse`` /
    ``better`` when the 95 % CI excludes 0 on that side; else ``not resolved``. Fewer than two
    seeds: ``not resolved``, no interval.
    """

    a: str
    b: str
    margin: float
    seeds: tuple[int, ...]
    diffs: tuple[float, ...]

    @property
    def comparison(self) -> str:
        return f"{self.a} - {self.b}"

    @property
    def n(self) -> int:
        return len(self.diffs)

    @property
    def estimate(self) -> float | None:
        return float(np.mean(self.diffs)) if self.diffs else None

    def ci(self, level: float) -> tuple[float, float] | None:
        if self.n < 2:
            return None
        _, low, high = _intervals(np.asarray(self.diffs), level)
        return float(low), float(high)

    @property
    def verdict(self) -> str:
        if self.n < 2:
            return "not resolved"
        equivalent, worse, better = (bool(x) for x in _rule(np.asarray(self.diffs), self.margin))
        return "equivalent" if equivalent else "worse" if worse else "better" if better else "not resolved"

    def entries(self) -> list[dict[str, Any]]:
        """The two rows of ``summary.json``'s ``tests``: the equivalence test (90 % CI, ±margin) and the
        difference test (95 % CI against 0), each with its own verdict and the comparison's ``finding``."""
        ci90, ci95 = self.ci(0.90), self.ci(0.95)
        equivalent = ci90 is not None and -self.margin < ci90[0] and ci90[1] < self.margin
        difference = "not resolved" if ci95 is None else "worse" if ci95[1] < 0 else \
            "better" if ci95[0] > 0 else "not resolved"
        common = {"comparison": self.comparison, "estimate": self.estimate, "n": self.n,
                  "seeds": list(self.seeds), "diffs": list(self.diffs), "finding": self.verdict}
        return [{**common, "kind": "equivalence", "margin": self.margin, "level": 0.90,
                 "ci": list(ci90) if ci90 else None, "verdict": "equivalent" if equivalent else "not resolved"},
                {**common, "kind": "difference", "margin": 0.0, "level": 0.95,
                 "ci": list(ci95) if ci95 else None, "verdict": difference}]


def paired_test(after_a: Mapping[int, float], after_b: Mapping[int, float], a: str, b: str,
                margin: float = MARGIN) -> PairedTest:
    """Pass@1 of arm ``a`` minus reference ``b``, seed by seed (``after_*``: seed → Pass@1)."""
    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    seeds = tuple(sorted(set(after_a) & set(after_b)))
    return PairedTest(a, b, margin, seeds, tuple(after_a[s] - after_b[s] for s in seeds))


def study_tests(runs: Sequence[Mapping[str, Any]], comparisons: Sequence[tuple[str, str]],
                margin: float = MARGIN) -> list[dict[str, Any]]:
    """``summary.json``'s ``tests``: for each (a, b) of ``comparisons`` whose arms both have a run,
    the two rows of :meth:`PairedTest.entries` on ``pass_at_1_after``."""
    by_arm: dict[str, dict[int, float]] = {}
    for run in runs:
        by_arm.setdefault(run["name"], {})[run["seed"]] = run["pass_at_1_after"]
    return [row for a, b in comparisons if a in by_arm and b in by_arm
            for row in paired_test(by_arm[a], by_arm[b], a, b, margin).entries()]


# ----------------------------------------------------------------------------- power

POWER_KINDS = ("difference", "equivalence")


def power(sd: float, n: int, effect: float = 0.0, kind: str = "difference", margin: float = MARGIN,
          sims: int = 20_000, seed: int = 0) -> float:
    """Chance that a study of ``n`` paired seeds reaches the rule's verdict, by simulation of the rule
    itself: paired differences d_s ~ N(``effect``, ``sd``²). ``difference``: the 95 % CI excludes 0;
    ``equivalence``: the 90 % CI lies inside ±``margin`` (TOST power; ``effect`` = the true difference,
    0 for arms that are the same). Monte Carlo error ≈ 0.5/√sims."""
    if kind not in POWER_KINDS:
        raise ValueError(f"kind must be one of {POWER_KINDS}, got {kind!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an integer >= 2 (a paired CI needs two seeds), got {n!r}")
    if not sd > 0:
        raise ValueError(f"sd must be > 0, got {sd}")
    diffs = np.random.default_rng(seed).normal(effect, sd, size=(sims, n))
    equivalent, worse, better = _rule(diffs, margin)
    return float((equivalent if kind == "equivalence" else worse | better).mean())


def seeds_for_power(sd: float, effect: float = 0.05, target: float = 0.8, kind: str = "difference",
                    margin: float = MARGIN, n_max: int = 200) -> int | None:
    """The fewest paired seeds whose :func:`power` reaches ``target`` (None: not within ``n_max``)."""
    for n in range(2, n_max + 1):
        if power(sd, n, effect, kind, margin) >= target:
            return n
    return None
