"""The studies' statistics: Student's t in closed form, means with 95 % confidence intervals over seeds, paired
differences, the verdict rule of issue 24 (equivalent / worse / better / not resolved) and the power to reach it.

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

These statistics know no study. One seed gives a point and no interval, and a comparison over fewer than two
paired seeds stays "not resolved". The lag frontier (:mod:`grpo_lab.study.frontier`) uses them: its comparisons
extend :class:`PairedTest` (the pairing by seed) with their own p-values (from :func:`t_cdf`), Holm-adjusted over
its family, and its intervals over seeds are :func:`mean_ci`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

MARGIN = 0.03
"""The equivalence margin on Pass@1 (issue 24): "trains as well as" means within ±0.03."""
EFFECT = 0.05
"""The difference the power is reported for: the size of the paper's mask effect on GSM8K (45 % → 50 %)."""
VERDICTS = ("equivalent", "worse", "better", "not resolved")


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
    # at 0 and n successes the bound is exactly 0 (1); the float difference of equal terms is not
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    return low, 1.0 if successes == n else min(1.0, centre + half)


def bounded_mean_ci(values: Any, low: float = 0.0, high: float = 1.0,
                    axis: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over seeds (along ``axis``, NaN skipped as in :func:`mean_ci`) of a quantity bounded to
    [low, high] (Pass@1, a reward in [0, 1], a drift ≥ 0), and its 95 % t interval clipped to that
    range: with few seeds the t interval alone runs past the bounds. NaN bounds where fewer than
    two values remain (no interval)."""
    if not low < high:
        raise ValueError(f"low must be below high, got low = {low}, high = {high}")
    mean, half = mean_ci(values, axis=axis)
    return mean, np.clip(mean - half, low, high), np.clip(mean + half, low, high)


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

    @property
    def sd(self) -> float | None:
        """Standard deviation of the paired differences (None below two seeds)."""
        return float(np.std(self.diffs, ddof=1)) if self.n >= 2 else None

    def power(self, effect: float = EFFECT) -> dict[str, Any] | None:
        """What these n seeds can decide at this comparison's paired SD (itself an estimate from the n
        seeds): the difference test's power against a true difference of ±``effect``, the equivalence
        test's when the true difference is 0, and the seeds each needs for 80 %. None below two seeds
        (or with every difference equal)."""
        sd = self.sd
        if not sd:
            return None
        return {"paired_sd": sd, "effect": effect, "power_difference": power(sd, self.n, effect, margin=self.margin),
                "power_equivalence": power(sd, self.n, 0.0, "equivalence", self.margin),
                "seeds_for_80pct_difference": seeds_for_power(sd, effect, margin=self.margin),
                "seeds_for_80pct_equivalence": seeds_for_power(sd, 0.0, kind="equivalence", margin=self.margin)}

    def describe_power(self, effect: float = EFFECT) -> str:
        """One line: the paired SD, the power of both tests at n, and the seeds 80 % would take."""
        report = self.power(effect)
        if report is None:
            return f"{self.comparison}: power needs two seeds with differing differences"

        def seeds(n: int | None) -> str:
            return "over 200" if n is None else str(n)

        return (f"{self.comparison}: paired SD {report['paired_sd']:.3f} over n = {self.n}; power "
                f"{report['power_difference']:.2f} to find a difference of {effect:g} "
                f"({seeds(report['seeds_for_80pct_difference'])} seeds for 0.8), "
                f"{report['power_equivalence']:.2f} to show equivalence (±{self.margin:g}) of equal arms "
                f"({seeds(report['seeds_for_80pct_equivalence'])} seeds for 0.8)")

    def describe(self) -> str:
        """One line: the comparison, n, the mean difference, both intervals and the verdict."""
        if self.n == 0:
            return f"{self.comparison}: no seed that both arms finished: not resolved"
        ci90, ci95 = self.ci(0.90), self.ci(0.95)
        intervals = "one seed, no interval" if ci90 is None or ci95 is None else \
            (f"90 % CI [{ci90[0]:+.3f}, {ci90[1]:+.3f}] (margin ±{self.margin:g}), "
             f"95 % CI [{ci95[0]:+.3f}, {ci95[1]:+.3f}]")
        return f"{self.comparison}: n = {self.n}, mean {self.estimate:+.3f}, {intervals} -> {self.verdict}"

    def entries(self) -> list[dict[str, Any]]:
        """The two rows of a summary's ``tests`` (:func:`study_tests`): the equivalence test (90 % CI, ±margin) and
        the difference test (95 % CI against 0), each with its own verdict and the comparison's ``finding``."""
        ci90, ci95 = self.ci(0.90), self.ci(0.95)
        equivalent = ci90 is not None and -self.margin < ci90[0] and ci90[1] < self.margin
        difference = "not resolved" if ci95 is None else "worse" if ci95[1] < 0 else \
            "better" if ci95[0] > 0 else "not resolved"
        common = {"comparison": self.comparison, "estimate": self.estimate, "n": self.n,
                  "seeds": list(self.seeds), "diffs": list(self.diffs), "finding": self.verdict,
                  "power": self.power()}
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
    """The ``tests`` rows of a summary of ``runs`` (each with ``name``, ``seed`` and ``pass_at_1_after``): for each
    (a, b) of ``comparisons`` whose arms both have a run, the two rows of :meth:`PairedTest.entries`."""
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
    """The fewest paired seeds whose :func:`power` reaches ``target`` (None: not within ``n_max``), by
    doubling then bisection (power grows with n): n reaches it and n − 1 does not."""
    def enough(n: int) -> bool:
        return power(sd, n, effect, kind, margin) >= target

    if enough(2):
        return 2
    low, high = 2, 4                                        # low falls short; high is tried next
    while not enough(min(high, n_max)):
        if high >= n_max:
            return None
        low, high = high, 2 * high
    high = min(high, n_max)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high
