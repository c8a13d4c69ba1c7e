"""Student's t in closed form and the intervals it gives: a mean over seeds with its 95 % confidence interval, and
Welch's difference of two means.

A confidence interval over seeds is Student's t: mean ± t_{q, n−1} · s / √n over the n seeds
(s the sample standard deviation); one seed gives a point and no interval (NaN half-width). Two samples that
share no randomness seed by seed are compared by Welch's t: each its own variance, Welch–Satterthwaite degrees
of freedom rounded down, so a test on them errs on the safe side.

The throughput repeats (:mod:`grpo_lab.scale.repeats`) read their intervals here; so do the group-sequential
looks (:mod:`grpo_lab.stats.sequential`) and the studies' comparisons.
"""

from __future__ import annotations

import math
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
