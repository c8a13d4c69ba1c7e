"""First-passage times to a target, and how two arms' times compare. Pure functions, no I/O.

A unit's curve maps training seconds to J at its evaluations (exact J, :mod:`grpo_lab.exact.strict_j`, in the
study that uses it). A unit that misses a target trains on to the budget B, so the censoring is administrative:
min(T, B) is observed for every seed, reached or not. Per target level:

=============== ===========================================================================================
symbol          meaning
=============== ===========================================================================================
T               first passage (:func:`first_passage`): the training seconds of the first evaluation with
                J ≥ the target, no interpolation; None (censored) if none reaches it
min(T, B)       restricted time (:func:`restricted_times`): a miss counts as B
ratio           :func:`time_ratio`: mean min(T, B) over the arm's seeds / the same over the reference's
bound           what the ratio is against the ratio of mean times (:func:`censoring_bound`): ``exact`` (no
                seed censored), ``upper`` (only the reference has censored seeds), ``lower`` (only the
                arm), ``neither`` (both)
interval        percentile bootstrap over seeds, each arm resampled on its own: :data:`RESAMPLES` draws
                seeded by :data:`BOOTSTRAP_SEED`, at least :data:`MIN_SEEDS` seeds an arm, level :data:`LEVEL`
S(t), median    Kaplan–Meier survival and median (:func:`kaplan_meier`, :func:`km_median`), reported per arm
                beside the ratio with :func:`reached_share`
=============== ===========================================================================================

The ratio is not resolved (None) when neither arm reached the target in any seed, or when the reference's
restricted mean is 0; its interval, with fewer than :data:`MIN_SEEDS` seeds in an arm or when at least
(1 − level)/2 of the resamples drew no reached seed in either arm. Why the restricted mean and not the mean or
the median, and what the interval is and is not: docs/internals.md#first-passage.

**Time as optimiser steps × seconds per step** (:func:`product_time_ratio`), where a wall-clock budget cannot hold
the slower arm, or the units share a machine: each half is measured where it is clean.

=============== ===========================================================================================
symbol          meaning
=============== ===========================================================================================
N, E            a seed's optimiser steps at its first evaluation with J ≥ the target (evaluations every k
                optimiser steps; censored at a cap N_max, then N = N_max) and the empty batches by then
                (batches that took no optimiser step: they cost time, not updates) (:class:`StepPassage`)
c, c∅           from a benchmark run alone, per pair (one round in which every side took its steps in turn):
                the seconds of a batch that takes an optimiser step, and of one that does not
s(e)            seconds per optimiser step with e empty batches charged to each: c̄ + e · c̄∅
                (:func:`seconds_per_step`)
ratio           mean time (N·c̄ + E·c̄∅) of the arm's seeds over the reference's = N̄_a/N̄_r · s_a(Ē_a/N̄_a) /
                s_r(Ē_r/N̄_r): the steps ratio times the seconds-per-step ratio, each at its arm's own share
interval        one percentile bootstrap over both sources: each arm's seeds resampled on its own, the
                benchmark's pairs resampled once for both sides (:func:`pair_draws`), keeping the pairing
=============== ===========================================================================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

RESAMPLES = 10_000
"""Bootstrap resamples per ratio."""
BOOTSTRAP_SEED = 38
"""The bootstrap generator's seed, fixed before any unit ran: the same stream for every comparison."""
LEVEL = 0.95
MIN_SEEDS = 3
"""Seeds each arm needs for an interval."""


def first_passage(curve: Mapping[float, float], target: float) -> float | None:
    """The training seconds of the first evaluation of ``curve`` (training seconds → J) with J ≥ ``target``;
    None if none reaches it. No interpolation (docs/internals.md#first-passage)."""
    for seconds in sorted(curve):
        if curve[seconds] >= target:
            return float(seconds)
    return None


def restricted_times(times: Sequence[float | None], follow_up: Sequence[float], budget: float) -> np.ndarray:
    """min(T, B) per seed: T if reached, B if not. A seed that did not reach the target must have been followed
    to the budget (its last evaluation at ≥ B), else min(T, B) is not observed: ValueError."""
    if len(times) != len(follow_up):
        raise ValueError(f"{len(times)} first-passage times but {len(follow_up)} follow-up times")
    short = [i for i, (t, f) in enumerate(zip(times, follow_up, strict=True)) if t is None and f < budget]
    if short:
        raise ValueError(f"seeds at positions {short} missed the target but stopped before the budget {budget} s: "
                         "their restricted time is not observed")
    return np.array([budget if t is None else min(float(t), budget) for t in times], dtype=float)


def reached_share(times: Sequence[float | None]) -> float | None:
    """The share of seeds that reached the target (None with no seeds)."""
    return sum(t is not None for t in times) / len(times) if times else None


def kaplan_meier(times: Sequence[float | None], follow_up: Sequence[float]) -> list[tuple[float, float]]:
    """The Kaplan–Meier survival curve S(t) = P(not yet reached at t) as [(t, S(t))] at each distinct
    first-passage time; a seed with None is censored at its ``follow_up`` (and counts as at risk at an event
    time equal to it). S(t) = Π over event times t_j ≤ t of (1 − d_j / n_j)."""
    if len(times) != len(follow_up):
        raise ValueError(f"{len(times)} first-passage times but {len(follow_up)} follow-up times")
    exits = [(float(t), True) if t is not None else (float(f), False) for t, f in zip(times, follow_up, strict=True)]
    survival, curve = 1.0, []
    for t in sorted({t for t, event in exits if event}):
        at_risk = sum(exit_time >= t for exit_time, _ in exits)
        events = sum(exit_time == t and event for exit_time, event in exits)
        survival *= 1.0 - events / at_risk
        curve.append((t, survival))
    return curve


def km_median(times: Sequence[float | None], follow_up: Sequence[float]) -> float | None:
    """The Kaplan–Meier median: the first event time at which S(t) ≤ 0.5 (with no censoring and an even count,
    the lower of the two middle times); None if S never falls to 0.5 (half the seeds or more were not seen to
    reach the target)."""
    for t, survival in kaplan_meier(times, follow_up):
        if survival <= 0.5 + 1e-12:
            return t
    return None


def censoring_bound(arm: Sequence[float | None], reference: Sequence[float | None]) -> str:
    """What the restricted-mean ratio of ``arm`` to ``reference`` is against the ratio of mean first-passage
    times: ``exact``, ``upper``, ``lower`` or ``neither``, by which arm has censored seeds (module docstring)."""
    arm_censored, reference_censored = None in arm, None in reference
    if arm_censored and reference_censored:
        return "neither"
    return "lower" if arm_censored else "upper" if reference_censored else "exact"


def _ratio(arm: np.ndarray, reference: np.ndarray, budget: float) -> np.ndarray:
    """Restricted-mean ratios of resampled rows ([R, n] each); NaN where not resolved."""
    a, r = arm.mean(axis=-1), reference.mean(axis=-1)
    neither = (arm >= budget).all(axis=-1) & (reference >= budget).all(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(neither | (r <= 0), math.nan, a / np.where(r > 0, r, 1.0))


def time_ratio(arm: Sequence[float | None], reference: Sequence[float | None], budget: float,
               resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED, level: float = LEVEL,
               min_seeds: int = MIN_SEEDS) -> dict[str, Any]:
    """The restricted-mean time ratio arm / reference with its percentile bootstrap interval (module docstring).

    ``arm``, ``reference``: first-passage times per seed, None where the seed did not reach the target by the
    budget (check the follow-up first: :func:`restricted_times`). Returns ``ratio``, ``ci_low``, ``ci_high``
    (None where not resolved), ``note`` (why not, or ""), ``reached_share`` (the arm's),
    ``reference_reached_share``, ``restricted_mean`` and ``reference_restricted_mean`` (seconds), ``seeds`` and
    ``reference_seeds``, ``bound`` (``exact`` / ``upper`` / ``lower`` / ``neither``: module docstring) and
    ``unresolved_resamples`` (the share of resamples with no reached seed in either arm)."""
    if not arm or not reference:
        raise ValueError("time_ratio needs at least one seed in each arm")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    a = np.array([budget if t is None else min(float(t), budget) for t in arm])
    r = np.array([budget if t is None else min(float(t), budget) for t in reference])
    point = float(_ratio(a, r, budget))
    out: dict[str, Any] = {
        "ratio": None if math.isnan(point) else point, "ci_low": None, "ci_high": None, "note": "",
        "reached_share": reached_share(arm), "reference_reached_share": reached_share(reference),
        "restricted_mean": float(a.mean()), "reference_restricted_mean": float(r.mean()),
        "seeds": len(arm), "reference_seeds": len(reference), "bound": censoring_bound(arm, reference),
        "unresolved_resamples": None}
    if out["ratio"] is None:
        out["note"] = ("not resolved: neither arm reached the target in any seed" if r.mean() > 0 else
                       "not resolved: the reference's restricted mean is 0 (target at or below the untrained J)")
        return out
    if min(len(a), len(r)) < min_seeds:
        out["note"] = f"no interval: {len(a)} and {len(r)} seeds, {min_seeds} needed in each arm"
        return out
    rng = np.random.default_rng(seed)
    draws_a = a[rng.integers(0, len(a), size=(resamples, len(a)))]
    draws_r = r[rng.integers(0, len(r), size=(resamples, len(r)))]
    ratios = _ratio(draws_a, draws_r, budget)
    unresolved = float(np.isnan(ratios).mean())
    out["unresolved_resamples"] = unresolved
    tail = (1.0 - level) / 2.0
    if unresolved >= tail:
        out["note"] = (f"interval not resolved: {unresolved:.1%} of resamples drew no reached seed in either arm "
                       f"(at most {tail:.1%} allowed)")
        return out
    # Unresolved resamples (fewer than the tail) are resamples where the restricted ratio is 1 by construction.
    out["ci_low"], out["ci_high"] = percentile_interval(np.where(np.isnan(ratios), 1.0, ratios), level)
    return out


# ----------------------------------------------------------------------------- optimiser steps × seconds per step


@dataclass(frozen=True)
class StepPassage:
    """One seed's way to a target in optimiser steps (module docstring): ``steps`` (N) at the first evaluation
    with J ≥ the target, or the cap's if none reached it (``reached`` False: censored at the cap), and ``empty``
    (E), the batches by then that took no optimiser step."""

    steps: int
    empty: int
    reached: bool


def seconds_per_step(step_seconds: Any, empty_seconds: Any, empty_share: Any) -> Any:
    """s(e) = c̄ + e · c̄∅: the seconds an optimiser step costs with ``empty_share`` empty batches charged to it,
    from the mean seconds of a batch that steps and of one that does not (arrays broadcast: resamples)."""
    return np.asarray(step_seconds) + np.asarray(empty_share) * np.asarray(empty_seconds)


def pair_draws(pairs: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """Indices ``[resamples, pairs]`` of a bootstrap over a benchmark's pairs, the same rows for every side."""
    if pairs < 2:
        raise ValueError(f"a bootstrap over pairs needs at least 2 pairs, got {pairs}")
    return rng.integers(0, pairs, size=(resamples, pairs))


def percentile_interval(draws: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The central ``level`` percentile interval of bootstrap ``draws``."""
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(draws, [tail, 1.0 - tail])
    return float(low), float(high)


def _mean_time(steps: np.ndarray, empty: np.ndarray, step_seconds: np.ndarray,
               empty_seconds: np.ndarray) -> np.ndarray:
    """Mean N·c̄ + E·c̄∅ over the last axis of ``steps``/``empty`` (seeds), the seconds' means given."""
    return steps.mean(axis=-1) * step_seconds + empty.mean(axis=-1) * empty_seconds


def product_time_ratio(arm: Sequence[StepPassage], reference: Sequence[StepPassage],
                       arm_seconds: tuple[Sequence[float], Sequence[float]],
                       reference_seconds: tuple[Sequence[float], Sequence[float]], resamples: int = RESAMPLES,
                       seed: int = BOOTSTRAP_SEED, level: float = LEVEL, min_seeds: int = MIN_SEEDS) -> dict[str, Any]:
    """The time ratio arm / reference as optimiser steps × seconds per step (module docstring), with a percentile
    bootstrap interval over seeds and pairs.

    ``arm``, ``reference``: each seed's :class:`StepPassage`; ``arm_seconds``, ``reference_seconds``: (c, c∅) per
    pair of the benchmark, the same pairs on both sides. Returns ``ratio``, ``ci_low``, ``ci_high`` (None where not
    resolved), ``note``, ``steps_ratio`` (N̄_a / N̄_r), ``seconds_ratio`` (s_a / s_r at each arm's own empty share),
    each arm's ``steps``, ``empty``, ``seconds_per_step`` and ``reached_share``, ``seeds``, ``pairs`` and ``bound``
    (:func:`censoring_bound`: a seed censored at the cap makes the ratio a bound). One generator seeded with
    ``seed`` draws the arm's seeds, then the reference's, then the pairs. Not resolved when neither arm reached the
    target in any seed; no interval with fewer than ``min_seeds`` seeds in an arm."""
    if not arm or not reference:
        raise ValueError("product_time_ratio needs at least one seed in each arm")
    seconds = [np.asarray(s, dtype=float) for s in (*arm_seconds, *reference_seconds)]
    if len({s.size for s in seconds}) != 1:
        raise ValueError(f"every side needs one value per pair, got {[s.size for s in seconds]}")
    a_step, a_empty, r_step, r_empty = seconds
    a_n, a_e = (np.array([getattr(p, k) for p in arm], dtype=float) for k in ("steps", "empty"))
    r_n, r_e = (np.array([getattr(p, k) for p in reference], dtype=float) for k in ("steps", "empty"))
    a_time = _mean_time(a_n, a_e, a_step.mean(), a_empty.mean())
    r_time = _mean_time(r_n, r_e, r_step.mean(), r_empty.mean())
    a_spp = float(seconds_per_step(a_step.mean(), a_empty.mean(), a_e.mean() / a_n.mean()))
    r_spp = float(seconds_per_step(r_step.mean(), r_empty.mean(), r_e.mean() / r_n.mean()))
    times = [[p.steps if p.reached else None for p in side] for side in (arm, reference)]
    out: dict[str, Any] = {
        "ratio": float(a_time / r_time), "ci_low": None, "ci_high": None, "note": "",
        "steps_ratio": float(a_n.mean() / r_n.mean()), "seconds_ratio": a_spp / r_spp,
        "steps": float(a_n.mean()), "reference_steps": float(r_n.mean()),
        "empty": float(a_e.mean()), "reference_empty": float(r_e.mean()),
        "seconds_per_step": a_spp, "reference_seconds_per_step": r_spp,
        "reached_share": reached_share(times[0]), "reference_reached_share": reached_share(times[1]),
        "seeds": len(arm), "reference_seeds": len(reference), "pairs": int(a_step.size),
        "bound": censoring_bound(*times)}
    if not any(p.reached for p in (*arm, *reference)):
        out.update(ratio=None, note="not resolved: neither arm reached the target in any seed")
        return out
    if min(len(arm), len(reference)) < min_seeds:
        out["note"] = f"no interval: {len(arm)} and {len(reference)} seeds, {min_seeds} needed in each arm"
        return out
    rng = np.random.default_rng(seed)
    seeds_a = rng.integers(0, len(arm), size=(resamples, len(arm)))
    seeds_r = rng.integers(0, len(reference), size=(resamples, len(reference)))
    pairs = pair_draws(a_step.size, resamples, rng)
    ratios = (_mean_time(a_n[seeds_a], a_e[seeds_a], a_step[pairs].mean(-1), a_empty[pairs].mean(-1))
              / _mean_time(r_n[seeds_r], r_e[seeds_r], r_step[pairs].mean(-1), r_empty[pairs].mean(-1)))
    out["ci_low"], out["ci_high"] = percentile_interval(ratios, level)
    return out
