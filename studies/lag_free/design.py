"""When is lag free? A confirmatory answer where π_θ moves slowly, the cost of lag against the drift, and a sync
that spends a drift budget.

Everything here is fixed before the first unit of its part runs (the commit order shows it:
``tests/test_lag_free.py`` checks that every unit's commit descends from the commit that fixed its part of
``design.json``); the units only fill it in. The numbers below are computed by this module's functions from
committed units and written to ``design.json``; the test recomputes them.

**Recipe.** The decided study's (``studies/lag_decided/design.py``): SmolLM2-135M-Instruct on ``addsubmul1``,
``cpu_arith_smollm2``, 128 steps, strict scoring, empty steps skipped, one thread, the held-out third (every 3rd
question) never trained on. Its runner trains every unit (``studies/lag_decided/run.py``'s ``run_unit``).

**Part 1, confirmatory.** At lr 3e-6 (the decided study's second regime), ``v1`` against ``v10_ratio`` (v = 10,
the paper's r′ = π_k/α) on fresh seeds 300–315 (no unit of any study has used a seed from 300 to 399).
Endpoint J_auc (exact J over all 363 questions at ¼, ½, ¾ and the end); d = J_auc(v10_ratio) − J_auc(v1),
paired by seed. Secondary: the same over the 121 held-out questions, reported with its repeated CI at the look
the primary stops at, no test.

- *Margin* (:func:`margin_of`): m = 10 % of ``v1``'s mean J_auc gain over the untrained model (its own J at
  step 0) at this lr, over the second regime's six ``v1`` units (``studies/lag_decided/units_lr3e-06``, seeds
  200–205), rounded to 3 decimals: gain 0.316, **m = 0.032**.
- *Tests*, both at α = 0.05 (the nulls |d| ≥ m and d = 0 cannot both be true, so each takes the whole level):
  TOST of |d| ≥ m (equivalence) and two-sided d = 0 (difference); the comparison stops at the first look where
  either is rejected (:func:`decide`; its word is the decided study's: "equivalent", "worse", "worse, within the
  margin", …, "not resolved" if open at the last look).
- *Looks and spending*: looks at 8, 12 and 16 seeds (the first at the 8 seeds part 2 pairs with, the last at the
  sized maximum, one halfway: :func:`looks_for`); each test spends α by Lan–DeMets O'Brien–Fleming
  (:mod:`grpo_lab.stats.sequential`), t boundaries on n − 1 df; the estimate is reported with its repeated
  (1 − α) CI and TOST's interval d̄ ± c_k^t(one-sided) · se at the stopping look. Every pair of arms at seed s
  before any at s + 1; once the comparison stops, no further seed runs.
- *Power* (:func:`power`, :func:`size`): the paired SD of ``v10_ratio − v1`` over the second regime's six seeds
  (:func:`paired_sd`) is **0.040**. The rule uses t boundaries and each look's own SD, so its power is no
  Gaussian integral: it is simulated, 20,000 studies a scenario at seed 0, the rule exactly as :func:`decide`
  applies it (``studies.lag_decided.design.simulate``), each share with its Monte-Carlo SE. n_max is the smallest
  n ≥ 10 whose power to call "equivalent" at a true d = 0 and σ = 0.040 is ≥ 0.8 by the lower end of its 95 %
  Monte-Carlo interval: **n_max = 16** (power 0.809 ± 0.003; at 14, 0.72). The table in ``design.json``
  (``confirmatory.power``) also gives: σ drawn from the uncertainty of a 6-seed estimate (σ² = s² · 5/χ²₅:
  the assurance, lower), the error at the margin's edge (d = ±m: "equivalent" at most α), a cost of half and of
  twice the margin. Cost at the maximum: 32 units of about 700 s alone.

**Part 2, the cost of lag against drift (exploratory).** At lr 3e-6, ``v20_ratio`` and ``v40_ratio`` at seeds
300–307, each paired by seed with part 1's ``v1`` (read once part 1's first look is due). Per arm: J_auc − ``v1``
with its unadjusted 95 % t interval, its held-out difference, and its window drift (mean |log r′| per token over
its trained steps). No test. *Reading fixed now*: on one figure of every arm of every lag study in the kit (the
frontier, the decided study, its second regime, this study), cost against window drift, one colour per lr, the
reading is **the largest arm-mean window drift whose cost interval lies inside (−m, m)** (the confirmatory arm by
its repeated CI, every other by its t interval), and the smallest whose interval lies wholly below −m; between
them, the data do not say.

**Part 3, a sync that spends a drift budget (exploratory).** At lr 1e-5 (the decided study's confirmatory lr),
the adaptive schedule (:class:`grpo_lab.schedules.AdaptiveSyncSchedule`) with the paper's correction: sync
before a step when the last step's measured drift |log π_k − log α| (``log_ratio_k_abs``) passed the budget b,
and at least every 10 steps (so it never lags more than ``v10_ratio``). Seeds 100–107, paired by seed with the
decided study's ``v1`` and ``v10_ratio`` there. Reported: J_auc − ``v1`` and − ``v10_ratio`` with unadjusted
95 % t intervals, and steps per sync (steps / syncs) against ``v10_ratio``'s. No test.

- *The budget* (:func:`drift_budget`, rule fixed now; **its number is fixed by a later commit, before any of
  part 3's units**, because it reads part 1's and part 2's units): b = the mean, over that arm's seeds, of the
  drift at its last lag (v − 1) of the largest-v arm at lr 3e-6 whose cost interval lies inside (−m, m) (the
  confirmatory arm if part 1 calls it equivalent, ``v20_ratio`` and ``v40_ratio`` by their t intervals):
  the largest drift π_k reached from α before a sync in a regime shown free, to 3 decimals. If no arm's interval
  lies inside,
  b is ``v10_ratio``'s all the same, and part 3 is reported as spending a budget not shown free.
  :data:`DRIFT_BUDGET` is None until then, and the runner refuses part 3's units while it is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from grpo_lab.stats.sequential import Look, SequentialPlan
from studies.lag_decided import design as decided
from studies.lag_decided.design import Verdict, simulate

HERE = Path(__file__).resolve().parent
DECIDED = HERE.parent / "lag_decided"

TASK, RECIPE, STEPS = decided.TASK, decided.RECIPE, decided.STEPS
ALPHA = 0.05

LR = 3e-6
ARMS = {"v1": {"v": 1}, "v10_ratio": {"v": 10, "is_correction": "ratio"}}
"""Part 1's arms: arm name → the config fields it sets on the recipe (the decided study's arms of the same name)."""
COMPARISON = ("v10_ratio", "v1")
"""a − b on J_auc, paired by seed."""
FRESH_SEEDS_FROM = 300
REGIME2_UNITS = DECIDED / "units_lr3e-06"
"""The decided study's second regime at lr 3e-6: where the margin and the paired SD are read."""
MARGIN_SHARE = 0.10
N_MIN = 10
TARGET_POWER = 0.8
REPS, POWER_SEED = 20_000, 0

MARGIN = 0.032
""":func:`margin_of` on :data:`REGIME2_UNITS` (the test recomputes it)."""
N_MAX = 16
""":func:`size` (the test recomputes it)."""
SEEDS = tuple(range(FRESH_SEEDS_FROM, FRESH_SEEDS_FROM + N_MAX))


def looks_for(n_max: int) -> tuple[int, ...]:
    """The looks of a design of ``n_max`` seeds: at 8 (part 2's seeds), halfway to the maximum, and the maximum."""
    if n_max < N_MIN:
        raise ValueError(f"n_max must be at least {N_MIN}, got {n_max}")
    return (8, (8 + n_max) // 2, n_max)


PLAN = SequentialPlan(looks=looks_for(N_MAX))

DRIFT_ARMS = {"v20_ratio": {"v": 20, "is_correction": "ratio"}, "v40_ratio": {"v": 40, "is_correction": "ratio"}}
"""Part 2's arms at :data:`LR`: a larger v moves the drift without moving the lr."""
DRIFT_SEEDS = SEEDS[:8]

ADAPTIVE_LR = decided.LR
ADAPTIVE_ARM = "adaptive_ratio"
ADAPTIVE_SEEDS = decided.SEEDS[:8]
ADAPTIVE_BASELINES = ("v1", "v10_ratio")
"""The decided study's arms at :data:`ADAPTIVE_SEEDS` (its ``units/``) part 3 is paired with."""
DRIFT_BUDGET: float | None = None
"""Part 3's budget b (:func:`drift_budget`): fixed by a later commit, before any of part 3's units."""


def adaptive_fields(budget: float) -> dict[str, Any]:
    """Part 3's arm: the paper's correction, sync when the last step's drift passed ``budget``, at least every 10."""
    return {"v": 10, "is_correction": "ratio", "sync": "adaptive", "sync_threshold": budget}


def arm_fields(arm: str) -> dict[str, Any]:
    """The config fields an arm of any part sets; part 3's only once its budget is fixed."""
    if arm == ADAPTIVE_ARM:
        if DRIFT_BUDGET is None:
            raise ValueError(f"{ADAPTIVE_ARM}'s drift budget is not fixed yet (DRIFT_BUDGET is None): a commit "
                             "must fix it by drift_budget() before part 3's units")
        return adaptive_fields(DRIFT_BUDGET)
    return (ARMS | DRIFT_ARMS)[arm]


# ----------------------------------------------------------------------------- margin and spread, from units


def margin_of(units: Mapping[tuple[str, int], Mapping[str, Any]], seeds: Sequence[int] = decided.REGIME2_SEEDS,
              share: float = MARGIN_SHARE) -> float:
    """``share`` of ``v1``'s mean J_auc gain over the untrained model (its J at step 0) at ``seeds``, to 3 decimals."""
    gain = float(np.mean([units[("v1", s)]["j_auc"] - units[("v1", s)]["j_curve"]["0"] for s in seeds]))
    return round(share * gain, 3)


def paired_sd(units: Mapping[tuple[str, int], Mapping[str, Any]],
              seeds: Sequence[int] = decided.REGIME2_SEEDS) -> float:
    """The SD over ``seeds`` of the paired J_auc difference of :data:`COMPARISON`."""
    a, b = COMPARISON
    return float(np.std([units[(a, s)]["j_auc"] - units[(b, s)]["j_auc"] for s in seeds], ddof=1))


def regime2_units() -> dict[tuple[str, int], dict[str, Any]]:
    from studies.lag_decided.summary import load

    return load(REGIME2_UNITS)


# ----------------------------------------------------------------------------- the decision rule


def decide(diffs: Sequence[float], plan: SequentialPlan = PLAN, margin: float = MARGIN,
           alpha: float = ALPHA) -> Verdict | None:
    """Part 1's verdict from the paired differences in seed order, read only at the looks they reach (None before
    the first): TOST and the difference test each at ``alpha``, stopping at the first look where either rejects;
    estimate and repeated CI at the stopping look, else at the last look reached."""
    reached = [k for k, n in enumerate(plan.looks) if len(diffs) >= n]
    if not reached:
        return None
    verdict = Verdict("C", level=alpha)
    for k in reached:
        result = Look.of(diffs[:plan.looks[k]])
        verdict.differs = plan.rejects_difference(k, result, alpha)
        verdict.equivalent = plan.rejects_inequivalence(k, result, alpha, margin)
        verdict.estimate, verdict.rci = result.mean, plan.rci(k, result, alpha)
        if verdict.differs or verdict.equivalent:
            verdict.look = k
            break
    return verdict


def tost_interval(diffs: Sequence[float], look: int, plan: SequentialPlan = PLAN,
                  alpha: float = ALPHA) -> tuple[float, float]:
    """d̄ ± c^t · se with c^t look ``look``'s one-sided boundary: TOST rejects |d| ≥ m exactly when it lies inside
    (−m, m)."""
    result = Look.of(diffs[:plan.looks[look]])
    half = plan.one_sided_bound(look, alpha) * result.se
    return result.mean - half, result.mean + half


# ----------------------------------------------------------------------------- power


def power(d: float, sigma: float, n_max: int, margin: float = MARGIN, sigma_df: int | None = None,
          reps: int = REPS, seed: int = POWER_SEED) -> dict[str, float]:
    """Simulated shares of ``reps`` studies of normal paired differences (mean ``d``, SD ``sigma``; with
    ``sigma_df``, σ² = sigma² · df/χ²_df per study, the uncertainty of an estimate on that many df) decided
    "equivalent" / "differs" / open at the last look by the rule of :func:`decide` at :func:`looks_for`'s looks,
    the mean seeds used, and the Monte-Carlo SE of the "equivalent" share."""
    rng = np.random.default_rng(seed)
    scale = np.full(reps, sigma) if sigma_df is None else sigma * np.sqrt(sigma_df / rng.chisquare(sigma_df, reps))
    x = d + scale[:, None] * rng.standard_normal((reps, n_max))
    out = simulate(x, "C1", SequentialPlan(looks_for(n_max)), margin, ALPHA)   # "C1": the comparison with TOST
    equivalent = float(out["equivalent"].mean())
    return {"equivalent": equivalent, "differs": float(out["differs"].mean()),
            "not_resolved": float(out["open"].mean()), "mean_seeds": float(out["seeds"].mean()),
            "mc_se": math.sqrt(equivalent * (1 - equivalent) / reps)}


def size(sigma: float, margin: float = MARGIN) -> dict[str, Any]:
    """The smallest n_max ≥ :data:`N_MIN` whose power to call "equivalent" at d = 0 and ``sigma`` is at least
    :data:`TARGET_POWER` by the lower end of its 95 % Monte-Carlo interval, and the power at each n tried."""
    tried = {}
    for n in range(N_MIN, 61):
        p = power(0.0, sigma, n, margin)
        tried[n] = p["equivalent"]
        if p["equivalent"] - 1.96 * p["mc_se"] >= TARGET_POWER:
            return {"n_max": n, "power_by_n": tried}
    raise ValueError(f"no n_max up to 60 reaches power {TARGET_POWER} at sigma = {sigma}")


def power_scenarios(sigma: float, margin: float = MARGIN) -> list[tuple[str, float, int | None]]:
    """(what, true d, df of σ's uncertainty or None) of the power table."""
    return [("sizing: d = 0, sigma as estimated", 0.0, None),
            ("assurance: d = 0, sigma uncertain (6-seed estimate)", 0.0, len(decided.REGIME2_SEEDS) - 1),
            ("error at the margin: d = +m", margin, None), ("error at the margin: d = -m", -margin, None),
            ("a cost of half the margin: d = -m/2", -margin / 2, None),
            ("a cost of twice the margin: d = -2m", -2 * margin, None)]


def power_table(sigma: float, n_max: int = N_MAX, margin: float = MARGIN) -> list[dict[str, Any]]:
    return [{"scenario": what, "d": d, "sigma": sigma, "sigma_df": df, **power(d, sigma, n_max, margin, df)}
            for what, d, df in power_scenarios(sigma, margin)]


# ----------------------------------------------------------------------------- part 3's budget


def drift_budget(units: Mapping[tuple[str, int], Mapping[str, Any]], free: Sequence[str],
                 seeds: Mapping[str, Sequence[int]]) -> float:
    """b: the mean over ``seeds[arm]`` of the drift at lag v − 1 of the largest-v arm of ``free`` (the arms at
    :data:`LR` whose cost interval lies inside (−m, m)), or of ``v10_ratio`` if none is; to 3 decimals."""
    from studies.lag_decided.summary import drift

    arm = max(free, key=lambda a: arm_fields(a)["v"], default="v10_ratio")
    last_lag = arm_fields(arm)["v"] - 1
    return round(float(np.mean([drift(units[(arm, s)], lag=last_lag) for s in seeds[arm]])), 3)


# ----------------------------------------------------------------------------- the record


def design_record() -> dict[str, Any]:
    """``design.json``: each part's fixed choices and computed numbers, as data. A part's record holds everything
    its units depend on (the recipe included), so the commit that last changed it is the part's design commit."""
    units = regime2_units()
    sigma = paired_sd(units)
    sizing = size(sigma, margin_of(units))
    recipe = {"task": TASK, "recipe": RECIPE, "steps": STEPS, "runner": "studies/lag_decided/run.py run_unit",
              "held_out": "every 3rd question of all_questions(task) in sorted order (index % 3 == 2)"}
    return {
        "confirmatory": {
            "recipe": recipe, "lr": LR, "arms": ARMS, "comparison": list(COMPARISON), "seeds": list(SEEDS),
            "endpoint": "j_auc over all questions; secondary: j_auc over the held-out third (repeated CI, no test)",
            "margin": {"value": MARGIN, "rule": f"{MARGIN_SHARE} x mean(v1 j_auc - j at step 0) over "
                       f"{REGIME2_UNITS.relative_to(HERE.parents[1])} seeds {list(decided.REGIME2_SEEDS)}, to 3 "
                       "decimals", "computed": margin_of(units),
                       "v1_gain": float(np.mean([units[("v1", s)]["j_auc"] - units[("v1", s)]["j_curve"]["0"]
                                                 for s in decided.REGIME2_SEEDS]))},
            "alpha": ALPHA, "looks": list(PLAN.looks),
            "tests": "TOST of |d| >= m and two-sided d = 0, each at alpha; stop at the first look either rejects",
            "spending": "Lan-DeMets O'Brien-Fleming, t boundaries on n - 1 df",
            "boundaries_t": {"difference": [PLAN.difference_bound(k, ALPHA) for k in range(len(PLAN.looks))],
                             "one_sided": [PLAN.one_sided_bound(k, ALPHA) for k in range(len(PLAN.looks))]},
            "paired_sd": sigma,
            "sizing": {"rule": f"smallest n_max >= {N_MIN} with P(equivalent | d = 0, sigma) - 1.96 mc_se >= "
                       f"{TARGET_POWER}; {REPS} simulated studies at seed {POWER_SEED}", **sizing},
            "power": power_table(sigma, N_MAX, MARGIN)},
        "drift": {"recipe": recipe, "lr": LR, "arms": DRIFT_ARMS, "seeds": list(DRIFT_SEEDS), "paired_with": "v1",
                  "margin": MARGIN, "report": "J_auc - v1 with unadjusted 95 % t intervals, held-out likewise, "
                  "window drift; exploratory, no test",
                  "reading": "the largest arm-mean window drift whose cost interval lies inside (-m, m), and the "
                  "smallest whose interval lies wholly below -m, over every arm of every lag study"},
        "adaptive": {"recipe": recipe, "lr": ADAPTIVE_LR, "arm": ADAPTIVE_ARM,
                     "fields": {k: v for k, v in adaptive_fields(0.0).items() if k != "sync_threshold"},
                     "budget": DRIFT_BUDGET, "seeds": list(ADAPTIVE_SEEDS),
                     "paired_with": {"units": str((DECIDED / "units").relative_to(HERE.parents[1])),
                                     "arms": list(ADAPTIVE_BASELINES)},
                     "budget_rule": "mean drift at lag v - 1 of the largest-v arm at lr 3e-6 whose cost interval "
                     "lies inside (-m, m) (v10_ratio if part 1 calls it equivalent, v20/v40 by t intervals), to 3 "
                     "decimals; v10_ratio's if none; fixed by a later commit before part 3's units",
                     "report": "J_auc - v1 and - v10_ratio with unadjusted 95 % t intervals, steps per sync "
                     "against v10_ratio's; exploratory, no test"}}


if __name__ == "__main__":   # rewrite design.json from this module
    (HERE / "design.json").write_text(json.dumps(design_record(), indent=1) + "\n")
