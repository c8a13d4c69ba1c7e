"""``summary.json`` of "when is lag free?", rebuilt from its unit files with the decided study's readers
(``studies/lag_decided/summary.py``).

Nothing is read before it is due: part 1 only at the looks its pairs of units reach (seeds in the design's order, a
seed counting once both arms have it), at the look it stopped at once it stopped; part 2 once all its units are in
and part 1's first look is due (its ``v1``); part 3 once its budget is fixed and all its units are in. Part 3's
budget is read (the number a later commit fixes) once part 1 has stopped or reached its last look and part 2 is in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_lab.stats.sequential import Look
from studies.lag_decided import summary as decided
from studies.lag_decided.summary import load, mean_and_ci
from studies.lag_free import design

UNITS = {"confirmatory": "units", "drift": "units_drift", "adaptive": "units_adaptive"}
"""Each part's unit folder under the study's folder."""


def confirmatory(out: Path) -> dict[str, Any]:
    """Part 1: the looks reached, and once one is due the verdict with its repeated CI (and TOST's interval), the
    held-out difference with its repeated CI at the same look (no test), and the arms over that look's seeds."""
    units = load(out / UNITS["confirmatory"])
    prefix = decided.seed_prefix(units, list(design.ARMS), design.SEEDS)
    reached = [n for n in design.PLAN.looks if n <= len(prefix)]
    entry: dict[str, Any] = {"comparison": " - ".join(design.COMPARISON), "margin": design.MARGIN,
                             "seeds_in": len(prefix), "looks_reached": reached, "verdict": None, "arms": {},
                             "provenance": decided.provenance_rows(units)}
    a, b = design.COMPARISON
    verdict = design.decide([units[(a, s)]["j_auc"] - units[(b, s)]["j_auc"] for s in prefix])
    if verdict is None:
        return entry
    look = len(reached) - 1 if verdict.look is None else verdict.look
    seeds = prefix[:design.PLAN.looks[look]]
    diffs = [units[(a, s)]["j_auc"] - units[(b, s)]["j_auc"] for s in seeds]
    held = Look.of([decided.held_out_auc(units[(a, s)]) - decided.held_out_auc(units[(b, s)]) for s in seeds])
    entry.update(verdict=verdict.word, estimate=verdict.estimate, rci=list(verdict.rci),
                 tost_interval=list(design.tost_interval(diffs, look)), level=verdict.level,
                 stopped_at_seeds=None if verdict.look is None else len(seeds), seeds=seeds,
                 held_out={"estimate": held.mean, "rci": list(design.PLAN.rci(look, held, design.ALPHA))},
                 arms={arm: decided.arm_entry([units[(arm, s)] for s in seeds]) for arm in design.ARMS})
    return entry


def is_open(out: Path) -> bool:
    """Whether part 1 still needs seeds: not stopped at a look (the runner asks before each of its units)."""
    return confirmatory(out).get("stopped_at_seeds") is None


def drift_part(out: Path, first_look_due: bool) -> dict[str, Any]:
    """Part 2 (exploratory), once all its units are in and part 1's first look is due: each arm's entry, and its
    J_auc and held-out J_auc minus part 1's ``v1`` at the same seeds, with unadjusted 95 % t intervals."""
    mine = load(out / UNITS["drift"])
    entry: dict[str, Any] = {"seeds": list(design.DRIFT_SEEDS), "exploratory": True, "arms": {}, "differences": {}}
    if not first_look_due or not all((arm, s) in mine for arm in design.DRIFT_ARMS for s in design.DRIFT_SEEDS):
        return entry
    v1 = load(out / UNITS["confirmatory"])
    entry["provenance"] = decided.provenance_rows(mine)
    entry["arms"] = {arm: decided.arm_entry([mine[(arm, s)] for s in design.DRIFT_SEEDS])
                     for arm in design.DRIFT_ARMS}
    entry["differences"] = decided.paired_differences(mine, v1, [(arm, "v1") for arm in design.DRIFT_ARMS],
                                              design.DRIFT_SEEDS)
    entry["held_out_differences"] = {
        f"{arm} - v1": mean_and_ci([decided.held_out_auc(mine[(arm, s)]) - decided.held_out_auc(v1[("v1", s)])
                                   for s in design.DRIFT_SEEDS]) for arm in design.DRIFT_ARMS}
    return entry


def steps_per_sync(unit: Mapping[str, Any]) -> float:
    """The unit's steps over the syncs it made (its records' ``synced``)."""
    return len(unit["records"]) / sum(bool(r["synced"]) for r in unit["records"])


def adaptive_part(out: Path) -> dict[str, Any]:
    """Part 3 (exploratory), once its budget is fixed and all its units are in: its entry, its J_auc minus the
    decided study's ``v1`` and ``v10_ratio`` at the same seeds, and steps per sync against ``v10_ratio``'s."""
    mine = load(out / UNITS["adaptive"])
    entry: dict[str, Any] = {"seeds": list(design.ADAPTIVE_SEEDS), "budget": design.DRIFT_BUDGET,
                             "exploratory": True, "arms": {}, "differences": {}}
    seeds = design.ADAPTIVE_SEEDS
    if design.DRIFT_BUDGET is None or not all((design.ADAPTIVE_ARM, s) in mine for s in seeds):
        return entry
    baseline = load(design.DECIDED / "units")
    entry["provenance"] = decided.provenance_rows(mine)
    entry["arms"] = {design.ADAPTIVE_ARM: decided.arm_entry([mine[(design.ADAPTIVE_ARM, s)] for s in seeds])}
    pairs = [(design.ADAPTIVE_ARM, b) for b in design.ADAPTIVE_BASELINES]
    entry["differences"] = decided.paired_differences(mine, baseline, pairs, seeds)
    entry["steps_per_sync"] = {design.ADAPTIVE_ARM: mean_and_ci([steps_per_sync(mine[(design.ADAPTIVE_ARM, s)])
                                                                 for s in seeds]),
                               "v10_ratio": mean_and_ci([steps_per_sync(baseline[("v10_ratio", s)]) for s in seeds])}
    return entry


def free_arms(part1: Mapping[str, Any], part2: Mapping[str, Any]) -> list[str]:
    """The arms at lr 3e-6 whose cost interval lies inside (−m, m): ``v10_ratio`` if part 1 called it equivalent
    (its TOST interval inside), part 2's by their t intervals."""
    confirmed = part1["verdict"] is not None and -design.MARGIN < part1["tost_interval"][0] \
        and part1["tost_interval"][1] < design.MARGIN
    return ["v10_ratio"] * confirmed + [name.split(" - ")[0] for name, d in part2["differences"].items()
                                        if -design.MARGIN < d["ci"][0] and d["ci"][1] < design.MARGIN]


def budget(out: Path, part1: Mapping[str, Any], part2: Mapping[str, Any]) -> dict[str, Any] | None:
    """Part 3's budget by :func:`design.drift_budget`, once part 1 has stopped or reached its last look and part 2
    is in (None before): the number a later commit fixes as ``DRIFT_BUDGET``."""
    if part1["verdict"] is None or (part1["stopped_at_seeds"] is None and
                                    part1["looks_reached"][-1] < design.PLAN.looks[-1]) or not part2["arms"]:
        return None
    free = free_arms(part1, part2)
    units = load(out / UNITS["confirmatory"]) | load(out / UNITS["drift"])
    seeds: dict[str, Sequence[int]] = {"v10_ratio": part1["seeds"]} | {a: design.DRIFT_SEEDS for a in design.DRIFT_ARMS}
    return {"free": free, "shown_free": bool(free), "value": design.drift_budget(units, free, seeds)}


def rebuild_summary(out: Path = design.HERE, write: bool = True) -> dict[str, Any]:
    """Read the units under ``out`` and write (unless ``write`` is False) and return ``out/summary.json``."""
    part1 = confirmatory(out)
    part2 = drift_part(out, bool(part1["looks_reached"]))
    summary = {"design": "design.json", "confirmatory": part1, "drift": part2, "budget": budget(out, part1, part2),
               "adaptive": adaptive_part(out)}
    if write:
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary

