"""Group-sequential tests over seeds: look at the data at a few fixed seed counts, stop a comparison once it is
decided, and keep the overall error at α.

An α-spending function a(t) (:func:`obf_spending`, Lan and DeMets' O'Brien–Fleming type) fixes in advance how
much of the level is spent by the information fraction t; the boundary c_k of look k is the z for which the
chance, under the null, of first crossing at look k is a(t_k) − a(t_{k−1}) (:func:`boundaries`, on a grid).

=========== ===================================================================================
symbol      meaning
=========== ===================================================================================
t_k         information fraction of look k: n_k / n_max (seeds in / the maximum)
a(t)        level spent by t: 2 (1 − Φ(z_{1 − a/2} / √t)), a(1) = a
c_k         look k's z boundary (one-sided: Z_k ≥ c_k; two-sided: |Z_k| ≥ c_k)
c_k^t       the same tail probability on Student's t with n_k − 1 df: t_{n_k − 1}^{-1}(Φ(c_k))
            (:func:`t_boundary`)
d̄, se       the paired differences' mean and standard error over n_k seeds
RCI_k       repeated confidence interval d̄ ± c_k^t · se (two-sided level a): it covers the true
            difference at every look at once with probability ≥ 1 − a
=========== ===================================================================================

An equivalence test (TOST) at level a rejects |d| ≥ m at look k when both one-sided statistics
(d̄ + m)/se and (m − d̄)/se reach the one-sided boundary: equivalently, when the (1 − 2a) RCI lies inside
(−m, m). Why spend α, the boundaries' shape and their computation: docs/internals.md#group-sequential-tests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

import numpy as np

from .intervals import t_quantile

_NORMAL = NormalDist()
_GRID_HALF_WIDTH = 9.0
_GRID_POINTS = 3601


def obf_spending(t: float, alpha: float) -> float:
    """Lan–DeMets O'Brien–Fleming-type spending: the level spent by information fraction ``t`` ∈ (0, 1]."""
    if not 0.0 < t <= 1.0:
        raise ValueError(f"the information fraction t must lie in (0, 1], got {t}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    return 2.0 * (1.0 - _NORMAL.cdf(_NORMAL.inv_cdf(1.0 - alpha / 2.0) / math.sqrt(t)))


_erfc = np.vectorize(math.erfc, otypes=[float])


def _upper_tail(z: np.ndarray) -> np.ndarray:
    """1 − Φ(z), elementwise, accurate far in the tail."""
    return 0.5 * _erfc(z / math.sqrt(2.0))


def _tail(density: np.ndarray, grid: np.ndarray, weights: np.ndarray, variance: float, bound: float,
          two_sided: bool) -> float:
    """P(W_prev + N(0, variance) ≥ bound, and ≤ −bound if two-sided), W_prev continuing with sub-density
    ``density`` on ``grid``."""
    sd = math.sqrt(variance)
    total = float(np.sum(density * weights * _upper_tail((bound - grid) / sd)))
    if two_sided:
        total += float(np.sum(density * weights * _upper_tail((bound + grid) / sd)))
    return total


@lru_cache(maxsize=256)
def boundaries(fractions: tuple[float, ...], alpha: float, two_sided: bool) -> tuple[float, ...]:
    """z boundaries c_1, …, c_K of looks at information ``fractions`` (increasing, the last ≤ 1) for a test at
    level ``alpha`` with O'Brien–Fleming-type spending (:func:`obf_spending`).

    Exact up to the grid: the score W(t_k) = Z_k √t_k is a Brownian motion, so each look's crossing chance is the
    previous look's continuation sub-density convolved with a normal increment (Armitage, McPherson & Rowe)."""
    if not fractions or any(b <= a for a, b in zip(fractions, fractions[1:], strict=False)):
        raise ValueError(f"fractions must be increasing, got {fractions}")
    grid = np.linspace(-_GRID_HALF_WIDTH, _GRID_HALF_WIDTH, _GRID_POINTS)
    step = grid[1] - grid[0]
    weights = np.full(grid.size, step)
    weights[[0, -1]] = step / 2
    out: list[float] = []
    density: np.ndarray | None = None
    spent, previous_t = 0.0, 0.0
    for t in fractions:
        target = obf_spending(t, alpha) - spent
        if density is None:   # first look: W(t_1) ~ N(0, t_1)
            z = _NORMAL.inv_cdf(1.0 - (target / 2.0 if two_sided else target))
        else:
            low, high = 0.0, 12.0
            for _ in range(60):
                mid = (low + high) / 2
                crossing = _tail(density, grid, weights, t - previous_t, mid * math.sqrt(t), two_sided)
                low, high = (mid, high) if crossing > target else (low, mid)
            z = (low + high) / 2
        out.append(z)
        bound = z * math.sqrt(t)
        if density is None:
            density = np.exp(-grid**2 / (2 * t)) / math.sqrt(2 * math.pi * t)
        else:
            sd = math.sqrt(t - previous_t)
            kernel = np.exp(-((grid[:, None] - grid[None, :]) / sd) ** 2 / 2) / (sd * math.sqrt(2 * math.pi))
            density = kernel @ (density * weights)
        keep = np.abs(grid) < bound if two_sided else grid < bound
        density = np.where(keep, density, 0.0)
        spent, previous_t = spent + target, t
    return tuple(out)


def t_boundary(z: float, seeds: int) -> float:
    """The z boundary ``z`` moved to Student's t with ``seeds`` − 1 df at the same one-sided tail."""
    if seeds < 2:
        raise ValueError(f"a t boundary needs at least 2 seeds, got {seeds}")
    return t_quantile(_NORMAL.cdf(z), seeds - 1)


@dataclass(frozen=True)
class Look:
    """One comparison at one look: the paired differences' mean, standard error and seed count."""

    n: int
    mean: float
    se: float

    @classmethod
    def of(cls, diffs: Sequence[float]) -> Look:
        d = np.asarray(diffs, dtype=float)
        if d.size < 2:
            raise ValueError(f"a look needs at least 2 paired differences, got {d.size}")
        return cls(int(d.size), float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size)))


@dataclass(frozen=True)
class SequentialPlan:
    """Looks at fixed seed counts ``looks`` (the last is the maximum) with O'Brien–Fleming-type spending."""

    looks: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.looks) == 0 or self.looks[0] < 2 or list(self.looks) != sorted(set(self.looks)):
            raise ValueError(f"looks must be increasing seed counts of at least 2, got {self.looks}")

    def fractions(self, up_to: int) -> tuple[float, ...]:
        """The information fractions of looks 1 … ``up_to``."""
        return tuple(n / self.looks[-1] for n in self.looks[:up_to])

    def difference_bound(self, look: int, alpha: float) -> float:
        """|t| needed at look index ``look`` (0-based) to reject d = 0, two-sided at ``alpha``."""
        return t_boundary(boundaries(self.fractions(look + 1), alpha, True)[look], self.looks[look])

    def one_sided_bound(self, look: int, alpha: float) -> float:
        """t needed at look index ``look`` for one one-sided test at ``alpha`` (each half of TOST)."""
        return t_boundary(boundaries(self.fractions(look + 1), alpha, False)[look], self.looks[look])

    def rejects_difference(self, look: int, result: Look, alpha: float) -> bool:
        if result.se == 0.0:
            return result.mean != 0.0
        return abs(result.mean) / result.se >= self.difference_bound(look, alpha)

    def rejects_inequivalence(self, look: int, result: Look, alpha: float, margin: float) -> bool:
        """TOST at look ``look``: both (d̄ + m)/se and (m − d̄)/se reach the one-sided boundary."""
        if result.se == 0.0:
            return abs(result.mean) < margin
        bound = self.one_sided_bound(look, alpha)
        return min(result.mean + margin, margin - result.mean) / result.se >= bound

    def rci(self, look: int, result: Look, alpha: float) -> tuple[float, float]:
        """The repeated (1 − ``alpha``) confidence interval of d at look ``look``."""
        half = self.difference_bound(look, alpha) * result.se
        return result.mean - half, result.mean + half
