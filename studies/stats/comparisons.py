"""How two arms compare over seeds: paired seed by seed, or unpaired by Welch's t.

A paired difference takes, seed by seed, arm a's value minus arm b's (same prompts, same questions, same
sampling seeds), then the t interval over those differences (:func:`grpo_lab.stats.intervals.mean_ci`): with few
seeds it is much tighter than comparing two separate intervals, because the seed-to-seed spread the two arms
share cancels.

========================= ============================================================
symbol                    meaning
========================= ============================================================
d_s                       arm a's value − arm b's at seed s (a − reference)
n                         seeds both arms finished
m                         the comparison's equivalence margin (±m)
========================= ============================================================

Two arms that share no randomness seed by seed (two trainers, each drawing its own samples) are compared
unpaired: :func:`welch_tost`, Welch's t (:func:`grpo_lab.stats.intervals.welch_t`) for equivalence within ±m by two
one-sided tests, beside the two-sided difference and the (1 − 2α) interval TOST's verdict reads.

The lag frontier (:mod:`studies.lag_frontier.frontier`) extends :class:`PairedTest` (the pairing by seed) with its
own p-values, Holm-adjusted (:func:`holm`) over its family, beside the exact sign-flip p (:func:`sign_flip_p`);
steps to target (:mod:`studies.steps_to_target.design`) compares J unpaired by :func:`welch_tost`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from grpo_lab.stats.intervals import t_cdf, t_quantile, welch_t


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
