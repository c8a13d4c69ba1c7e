"""The studies' statistics: Student's t in closed form, means with 95 % confidence intervals over seeds, and
the pairing of two arms by seed.

A confidence interval over seeds is Student's t: mean ± t_{q, n−1} · s / √n over the n seeds
(s the sample standard deviation). A paired difference takes, seed by seed, arm a's value
minus arm b's (same prompts, same questions, same sampling seeds), then the same
interval over those differences: with few seeds it is much tighter than comparing two
separate intervals, because the seed-to-seed spread the two arms share cancels.

========================= ============================================================
symbol                    meaning
========================= ============================================================
d_s                       arm a's value − arm b's at seed s (a − reference)
n                         seeds both arms finished
m                         the comparison's equivalence margin (±m)
========================= ============================================================

These statistics know no study. One seed gives a point and no interval (NaN half-width). The lag frontier
(:mod:`studies.lag_frontier.frontier`) uses them: its comparisons extend :class:`PairedTest` (the pairing by seed) with
their own p-values (from :func:`t_cdf`), Holm-adjusted over its family, and its intervals over seeds are
:func:`mean_ci`'s.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


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


@dataclass(frozen=True)
class PairedTest:
    """Arm a − reference arm b, seed by seed: ``diffs[j]`` is a's value minus b's at ``seeds[j]``, over the seeds
    both finished; ``margin`` is the comparison's equivalence margin (±)."""

    a: str
    b: str
    margin: float
    seeds: tuple[int, ...]
    diffs: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.diffs)


def sign_flip_p(diffs: Sequence[float]) -> float:
    """Exact two-sided sign-flip p of mean d = 0: the share of the 2^n sign patterns whose |mean| is at least
    the observed one (the observed pattern included)."""
    d = np.asarray(diffs, dtype=float)
    if d.size == 0:
        raise ValueError("sign_flip_p needs at least one difference")
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))
    means = np.abs(signs @ d) / d.size
    return float(np.mean(means >= abs(d.mean()) - 1e-12))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order (NaN stays NaN and is not counted)."""
    p = np.asarray(p_values, dtype=float)
    finite = np.flatnonzero(~np.isnan(p))
    adjusted = np.full(p.shape, math.nan)
    running = 0.0
    for rank, index in enumerate(finite[np.argsort(p[finite], kind="stable")]):
        running = max(running, min(1.0, (finite.size - rank) * p[index]))
        adjusted[index] = running
    return adjusted.tolist()
