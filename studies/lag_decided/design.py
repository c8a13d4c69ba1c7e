"""The lag frontier, decided: at the lr a user would pick on-policy, does v = 10 with the paper's correction
train as well as v = 1, and how much of the lag's cost does the correction buy back?

Everything here is fixed before the first unit runs (the commit order shows it); the units only fill it in.

**Recipe.** SmolLM2-135M-Instruct on ``addsubmul1`` (363 one-digit sums, differences and products), the recipe
``cpu_arith_smollm2`` at lr 1e-5 (the pilot's choice), 128 steps, strict scoring, empty steps skipped, one
thread. A third of the questions is held out of training by rule (:func:`held_out`: every 3rd in sorted
order); each step logs the questions it drew.

**Arms** (fresh seeds 100–119, used by no earlier unit): ``v1``; ``v10_ratio`` (the paper: r′ = π_k/α);
``v10_none`` (no correction).

**Endpoint.** Primary: J_auc, the mean of exact J over all 363 questions at ¼, ½, ¾ and the end of the budget
(computed, not sampled). Secondary: the same over the 121 held-out questions.

**Confirmatory family** (α = 0.05 over the two comparisons; paired by seed):

==== ======================= =========================================================================
C1   v10_ratio − v1          equivalence by TOST at the margin m, and difference (two-sided)
C2   v10_ratio − v10_none    difference (two-sided)
==== ======================= =========================================================================

m = 0.051 of J_auc, fixed now: 10 % of ``v1``'s mean gain over the untrained model in the earlier frontier
(0.508), the margin that study used.

**Looks and spending.** Looks at 8, 14 and 20 seeds (20 the maximum; every arm at seed s before any at s + 1).
Each test spends its level by Lan–DeMets O'Brien–Fleming (:mod:`grpo_lab.stats.sequential`), with t boundaries
on n − 1 df; a comparison stops at the first look where one of its nulls is rejected. Holm over C1 and C2 in
its closed-testing form (C1's two nulls, |d| ≥ m and d = 0, cannot both be true, so they share C1's level):

- C1's tests run at α/2, and at α once C2 is rejected;
- C2 runs at α/2, and at α once both of C1's nulls are rejected (d ≠ 0 and |d| < m);
- a level raised at a later look is applied to the earlier looks too (Maurer & Bretz's graphical
  group-sequential rule), which keeps the family's error at α.

A comparison open at the maximum is "not resolved". Every comparison reports its estimate and its repeated
confidence interval at the look it stopped at, whatever the verdict.

**After a stop** (written at the second look, before any later unit, when C2 stopped): a stopped comparison needs
no more seeds, so an arm runs on only while an open comparison uses it; ``v10_none`` is in C2 alone. Each
comparison looks at the seeds both its arms have; the verdicts, levels and looks above are unchanged.

**Power** (:func:`power`, 20,000 simulated studies a scenario, seed 0; the table is ``design.json``'s). The
paired SDs come from the earlier frontier's five seeds: ``v4_ratio − v1`` 0.046, ``v16_ratio − v1`` 0.117,
``v4_ratio − v4_none`` 0.136, ``v16_ratio − v16_none`` 0.177. v = 10 lies between: the mean differences
interpolated linearly in v are −0.087 (C1) and +0.13 (C2), the SD 0.082 (C1). Each simulated study draws
its SD from the uncertainty of a 5-seed estimate (σ² = s² · 4/χ²₄); comparisons at α/2 (Holm's passing
ignored, so the power is a lower bound).

====== ======== ======== =========== ========= ============= ============
test   true d   s        equivalent  differs   not resolved  mean seeds
====== ======== ======== =========== ========= ============= ============
C1     0        0.046    0.83        0.02      0.16          16.3
C1     0        0.082    0.39        0.02      0.58          19.3
C1     −0.030   0.046    0.36        0.52      0.23          17.5
C1     −0.087   0.082    0.00        0.85      0.15          15.9
C1     −0.087   0.117    0.00        0.66      0.34          17.7
C1     −0.141   0.117    0.00        0.90      0.10          15.2
C2     +0.13    0.136    —           0.80      0.20          16.4
C2     +0.13    0.177    —           0.66      0.34          17.7
C2     0        0.136    —           0.02      0.98          20.0
====== ======== ======== =========== ========= ============= ============

(A study can reject both of C1's nulls, "worse, within the margin", so a row's shares may sum past 1.) The
t boundaries at α/2 are 6.33, 3.18, 2.49 (difference) and 5.63, 2.82, 2.14 (each half of TOST): the first
look stops only a very clear comparison. What this design can decide: a cost of J_auc near the interpolated
0.087 (power 0.66–0.85), and a correction worth +0.13 (0.66–0.80). What it likely cannot: equivalence unless
v = 10's spread is as small as v = 4's (0.83 at s = 0.046, 0.39 at 0.082); a cost of 0.03 at v = 4's spread
is called worse about half the time (0.52). Budget at the maximum: 60 units of about 1,200 s on one
thread (20 CPU-hours), within the 30 the question may cost.

**Second regime (exploratory).** Where π_θ moves little per step: the lr is the first of (3e-6, 1e-6) whose
pilot unit (``v10_ratio``, seed 900, the same recipe) has mean |log r′| per token at lag 1 ≤ 0.03; its budget
is 128 steps if ``v1`` at that lr gained ≥ 0.25 of exact J by then in the earlier pilot (lr 3e-6: +0.49 and
+0.61 in its seeds 0 and 1, reused and said so), else 256. Arms ``v1``, ``v10_ratio``, ``v10_none`` at seeds
200–205, each estimate with its t interval, no test.

**The field's corrections (exploratory).** Fixed before any of their units, run after the
confirmatory units of the first look. At lr 1e-5 and v = 10, three more corrections of π_k/α:

================ =========================================================================================
``v10_mask``     token mask: the ratio's weight kept inside [1/C, C], C = 2, else 0
``v10_seqmask``  TRL's default (``vllm_importance_sampling_mode="sequence_mask"``): the whole sequence's
                 ratio kept if ≤ C = 3, no lower bound (``icepop`` at ``level="sequence"``)
``v10_icepop``   IcePop at verl's default band (``"0.5_5.0"``): token weight kept inside [a, C] = [0.5, 5],
                 else 0 (amended; below)
================ =========================================================================================

Seeds 100–107: fresh for these arms, and the same as the first look's, so each arm pairs by seed with
``v10_ratio`` and ``v10_none``. Reported once all 24 units are in: each arm's J_auc, held-out J_auc and window
drift with t intervals, and its paired differences from ``v10_ratio`` and ``v10_none`` with unadjusted 95 % t
intervals, labelled exploratory (no test, not in the confirmatory family).

*Amendment (after 18 of the 24 units).* ``v10_icepop`` was first fixed at [0.5, 2]: that band is
[1/C, C] at C = 2, ``v10_mask``'s rule exactly, and its six units (seeds 100–105) were ``v10_mask``'s bit for bit
(J_auc equal in every digit; they are in git history, not read). So the arm was re-fixed to
IcePop's own band [0.5, 5] (verl's ``"0.5_5.0"``) before any unit at it ran, all eight seeds run anew, and
``tests/test_lag_decided.py::test_no_two_correction_arms_share_a_rule`` now guards the design. Nothing else
changed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from grpo_lab.stats.sequential import Look, SequentialPlan

TASK = "addsubmul1"
LR = 1e-5
STEPS = 128
RECIPE = "cpu_arith_smollm2"
ARMS = {"v1": {"v": 1}, "v10_ratio": {"v": 10, "is_correction": "ratio"},
        "v10_none": {"v": 10, "is_correction": "none"}}
"""Arm name → the config fields it sets on the recipe."""
SEEDS = tuple(range(100, 120))
PLAN = SequentialPlan(looks=(8, 14, 20))
MARGIN = 0.051
ALPHA = 0.05
COMPARISONS = {"C1": ("v10_ratio", "v1"), "C2": ("v10_ratio", "v10_none")}
"""Comparison → (a, b): a − b on J_auc, paired by seed. C1 also has the equivalence test."""

REGIME2_LRS = (3e-6, 1e-6)
REGIME2_DRIFT_LIMIT = 0.03
"""The second regime's lr: the first of :data:`REGIME2_LRS` whose pilot's mean |log r′| per token at lag 1 is at
most this."""
REGIME2_PILOT_SEED = 900
REGIME2_SEEDS = tuple(range(200, 206))

CORRECTION_ARMS = {"v10_mask": {"v": 10, "is_correction": "mask", "is_cap": 2.0},
                   "v10_seqmask": {"v": 10, "is_correction": "icepop", "level": "sequence", "is_cap": 3.0,
                                   "is_floor": None},
                   "v10_icepop": {"v": 10, "is_correction": "icepop", "is_cap": 5.0, "is_floor": 0.5}}
"""The exploratory corrections: arm name → the config fields it sets on the recipe."""
CORRECTION_SEEDS = tuple(range(100, 108))
CORRECTION_BASELINES = ("v10_ratio", "v10_none")
"""The confirmatory arms each correction arm is paired with, by seed."""


def lr_label(lr: float | str) -> str:
    """The lr as the docs write it: 3e-06 (or the summary's "3e-06") as "3e-6"."""
    return f"{float(lr):.0e}".replace("e-0", "e-")


def arm_fields(arm: str) -> dict[str, Any]:
    """The config fields an arm sets, confirmatory or exploratory."""
    return (ARMS | CORRECTION_ARMS)[arm]

POWER_SCENARIOS = (
    ("C1", 0.0, 0.046), ("C1", 0.0, 0.082), ("C1", -0.030, 0.046), ("C1", -0.087, 0.082),
    ("C1", -0.087, 0.117), ("C1", -0.141, 0.117),
    ("C2", 0.13, 0.136), ("C2", 0.13, 0.177), ("C2", 0.0, 0.136))
"""(comparison, true paired difference, 5-seed SD estimate) for :func:`power`."""


def held_out(questions: Sequence[Any]) -> list[bool]:
    """Which questions are held out of training: every 3rd of the task's questions in sorted order
    (index % 3 == 2), a fixed third decided by rule and not by the data."""
    return [index % 3 == 2 for index in range(len(questions))]


def unit_order(arms: Sequence[str], seeds: Sequence[int]) -> list[tuple[str, int]]:
    """Every arm at seed s before any arm at the next seed."""
    return [(arm, seed) for seed in seeds for arm in arms]


# ----------------------------------------------------------------------------- the decision rule


@dataclass
class Verdict:
    """One comparison's state: the nulls rejected so far, the look it stopped at (index into the plan's looks;
    None while open), and the estimate and repeated CI there."""

    name: str
    differs: bool = False
    equivalent: bool = False
    look: int | None = None
    estimate: float | None = None
    rci: tuple[float, float] | None = None
    level: float = ALPHA / 2

    @property
    def word(self) -> str:
        if self.equivalent and self.differs:
            return "worse, within the margin" if self.estimate < 0 else "better, within the margin"
        if self.equivalent:
            return "equivalent"
        if self.differs:
            return "worse" if self.estimate < 0 else "better"
        return "not resolved"


def decide(diffs: Mapping[str, Sequence[float]], plan: SequentialPlan = PLAN, margin: float = MARGIN,
           alpha: float = ALPHA) -> dict[str, Verdict]:
    """Each comparison's verdict from its paired differences in seed order (``diffs["C1"]``, ``diffs["C2"]``),
    looking only at the plan's looks that its own data reach (a stopped comparison's arms need no further seeds),
    with the closed-testing Holm levels of the module docstring. A comparison's estimate and RCI are those of its
    stopping look, else of the last look reached."""
    verdicts = {name: Verdict(name) for name in COMPARISONS}
    looks = {name: [k for k, n in enumerate(plan.looks) if len(diffs[name]) >= n] for name in COMPARISONS}
    while True:   # levels only rise; re-run the looks until nothing changes
        levels = {"C1": alpha if verdicts["C2"].differs else alpha / 2,
                  "C2": alpha if verdicts["C1"].differs and verdicts["C1"].equivalent else alpha / 2}
        changed = False
        for name, verdict in verdicts.items():
            verdict.level = levels[name]
            for k in looks[name]:
                if verdict.look is not None and k > verdict.look:
                    break
                result = Look.of(diffs[name][:plan.looks[k]])
                differs = plan.rejects_difference(k, result, verdict.level)
                equivalent = name == "C1" and plan.rejects_inequivalence(k, result, verdict.level, margin)
                if differs or equivalent or k == looks[name][-1]:
                    decided = differs or equivalent
                    new = (differs or verdict.differs, equivalent or verdict.equivalent,
                           k if decided else None, result.mean, plan.rci(k, result, verdict.level))
                    if new != (verdict.differs, verdict.equivalent, verdict.look, verdict.estimate, verdict.rci):
                        changed = True
                    (verdict.differs, verdict.equivalent, verdict.look, verdict.estimate, verdict.rci) = new
                    if decided:
                        break
        if not changed:
            return verdicts


# ----------------------------------------------------------------------------- power


def simulate(x: np.ndarray, comparison: str, plan: SequentialPlan = PLAN, margin: float = MARGIN,
             alpha: float = ALPHA / 2) -> dict[str, np.ndarray]:
    """One comparison of each row of ``x`` (studies × seeds of paired differences) at a fixed level ``alpha``,
    looked at as :func:`decide` does: per study, whether it stopped as equivalent, as different, and the seeds
    it used (the maximum if it never stopped)."""
    open_ = np.ones(x.shape[0], dtype=bool)
    equivalent, differs = np.zeros_like(open_), np.zeros_like(open_)
    seeds_used = np.full(x.shape[0], plan.looks[-1])
    for k, n in enumerate(plan.looks):
        mean = x[:, :n].mean(axis=1)
        se = x[:, :n].std(axis=1, ddof=1) / math.sqrt(n)
        hit_difference = np.abs(mean) / se >= plan.difference_bound(k, alpha)
        hit_equivalence = (comparison == "C1") & (
            np.minimum(mean + margin, margin - mean) / se >= plan.one_sided_bound(k, alpha))
        stop = open_ & (hit_difference | hit_equivalence)
        differs |= stop & hit_difference
        equivalent |= stop & hit_equivalence
        seeds_used[stop] = n
        open_ &= ~stop
    return {"equivalent": equivalent, "differs": differs, "open": open_, "seeds": seeds_used}


def power(d: float, s: float, comparison: str, reps: int = 20_000, seed: int = 0,
          plan: SequentialPlan = PLAN) -> dict[str, float]:
    """Monte Carlo power of one comparison at α/2 (:func:`simulate`): ``reps`` studies of normal paired
    differences with mean ``d`` and an SD drawn from a 5-seed estimate ``s`` (σ² = s² · 4/χ²₄). The shares decided
    equivalent / different / not resolved and the mean seeds used."""
    rng = np.random.default_rng(seed)
    sigma = s * np.sqrt(4.0 / rng.chisquare(4, size=reps))
    out = simulate(d + sigma[:, None] * rng.standard_normal((reps, plan.looks[-1])), comparison, plan)
    return {"equivalent": float(out["equivalent"].mean()), "differs": float(out["differs"].mean()),
            "not_resolved": float(out["open"].mean()), "mean_seeds": float(out["seeds"].mean())}


def power_table() -> list[dict[str, Any]]:
    """:func:`power` for each of :data:`POWER_SCENARIOS` (the table of the module docstring)."""
    return [{"comparison": c, "d": d, "s": s, **power(d, s, c)} for c, d, s in POWER_SCENARIOS]


def design_record() -> dict[str, Any]:
    """``design.json``: every fixed choice of this module and the power table, as data."""
    return {"task": TASK, "lr": LR, "steps": STEPS, "recipe": RECIPE, "arms": ARMS, "seeds": list(SEEDS),
            "looks": list(PLAN.looks), "margin": MARGIN, "alpha": ALPHA,
            "comparisons": {k: list(v) for k, v in COMPARISONS.items()},
            "spending": "Lan-DeMets O'Brien-Fleming, t boundaries on n - 1 df; Holm over C1, C2 (closed testing)",
            "endpoint": "j_auc over all questions; secondary: j_auc over the held-out third",
            "held_out": "every 3rd question of all_questions(task) in sorted order (index % 3 == 2)",
            "regime2": {"lrs": list(REGIME2_LRS), "drift_limit_lag1": REGIME2_DRIFT_LIMIT,
                        "pilot_seed": REGIME2_PILOT_SEED, "seeds": list(REGIME2_SEEDS)},
            "corrections": {"arms": CORRECTION_ARMS, "seeds": list(CORRECTION_SEEDS),
                            "paired_with": list(CORRECTION_BASELINES),
                            "report": "estimates with unadjusted 95 % t intervals; exploratory, no test"},
            "power": power_table()}
