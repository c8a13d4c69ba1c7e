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

Two arms that share no randomness seed by seed (two trainers, each drawing its own samples) are compared
unpaired: :func:`welch_tost`, Welch's t (each arm's own variance, Welch–Satterthwaite degrees of freedom rounded
down, so the test errs on the safe side) for equivalence within ±m by two one-sided tests, beside the two-sided
difference and the (1 − 2α) interval TOST's verdict reads.

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


def welch_t(a: Any, b: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean a − mean b along the last axis, its standard error √(s_a²/n_a + s_b²/n_b) and Welch–Satterthwaite's
    degrees of freedom rounded down (at least 1; n_a + n_b − 2 where neither arm spreads). Rows of arrays are
    comparisons of their own (a power simulation)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if min(x.shape[-1], y.shape[-1]) < 2:
        raise ValueError(f"a Welch t needs at least 2 values an arm, got {x.shape[-1]} and {y.shape[-1]}")
    va, vb = x.var(axis=-1, ddof=1) / x.shape[-1], y.var(axis=-1, ddof=1) / y.shape[-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        df = (va + vb) ** 2 / (va**2 / (x.shape[-1] - 1) + vb**2 / (y.shape[-1] - 1))
    df = np.where(np.isfinite(df), np.maximum(np.floor(df), 1), x.shape[-1] + y.shape[-1] - 2)
    return x.mean(axis=-1) - y.mean(axis=-1), np.sqrt(va + vb), df.astype(int)


_t_cdf = np.vectorize(t_cdf, otypes=[float])


def tost_p(estimate: Any, se: Any, df: Any, margin: float) -> np.ndarray:
    """TOST's p of |d| ≥ ``margin``: the larger of the one-sided p-values for d ≤ −m and d ≥ m (elementwise); with
    se = 0, 0 inside the margin and 1 outside."""
    d, s = np.asarray(estimate, dtype=float), np.asarray(se, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.maximum(1.0 - _t_cdf((d + margin) / s, df), 1.0 - _t_cdf((margin - d) / s, df))
    return np.where(s > 0, p, np.where(np.abs(d) < margin, 0.0, 1.0))


def welch_tost(a: Sequence[float], b: Sequence[float], margin: float, alpha: float = 0.05) -> dict[str, Any]:
    """Arm a − arm b, unpaired (module docstring; :func:`welch_t`): ``estimate``, ``se``, ``df``, ``p_equivalence``
    (:func:`tost_p`), ``p_difference`` (two-sided, d = 0) and ``ci``, the (1 − 2·``alpha``) interval: TOST rejects
    at ``alpha`` exactly when it lies inside (−m, m). Each arm needs at least 2 values."""
    d, se, df = (x.item() for x in welch_t(a, b))
    half = t_quantile(1.0 - alpha, df) * se
    p_difference = min(1.0, 2.0 * (1.0 - t_cdf(abs(d) / se, df))) if se > 0 else float(d == 0)
    return {"estimate": d, "se": se, "df": df, "p_equivalence": float(tost_p(d, se, df, margin)),
            "p_difference": p_difference, "ci": [d - half, d + half]}
