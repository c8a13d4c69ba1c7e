"""``summary.json`` of the lag frontier, decided, rebuilt from its unit files.

Nothing is read before its look is due: each comparison is read over the seeds of the last look that both its arms
have reached (seeds in the design's order, a seed counting once both arms have it; a stopped comparison's arms
need no more), an arm over its longest comparison's seeds, once every comparison has its first look; the second
regime's arms and the exploratory corrections' once all their seeds are in (the corrections' paired
baselines once the first look is due as well). The drift pilot is read as soon as it exists: it chooses the second
regime's lr by the rule fixed in ``design.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from grpo_lab.stats.intervals import mean_ci
from studies.lag_decided import design

REGIME2_DIFFERENCES = (("v10_ratio", "v1"), ("v10_none", "v1"), ("v10_ratio", "v10_none"))
"""The second regime's paired differences (C1's, the lag's cost without the correction, C2's), each with an
unadjusted t interval: exploratory, no test."""


def load(folder: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """(arm, seed) → unit, for the unit files in ``folder`` (none if it does not exist; a file that is no arm's
    unit, such as the frontier's ``untrained.json``, is not one)."""
    units = (json.loads(p.read_text()) for p in sorted(folder.glob("*.json")))
    return {(u["arm"], u["seed"]): u for u in units if "arm" in u}


def held_out_auc(unit: Mapping[str, Any]) -> float:
    """J_auc over the held-out questions: at each evaluation step after 0, the mean J over the held-out third."""
    steps = sorted(unit["j_per_question"], key=int)[1:]
    mask = np.array(design.held_out(unit["j_per_question"][steps[0]]))
    return float(np.mean([np.asarray(unit["j_per_question"][s])[mask].mean() for s in steps]))


def drift(unit: Mapping[str, Any], lag: int | None = None) -> float:
    """Mean |log r′| per token over the unit's steps that trained (at one ``lag`` if given): how far π_k had
    moved from α while the server waited."""
    return trained_mean(unit, "log_ratio_k_abs", lag)


def dropped(unit: Mapping[str, Any], lag: int | None = None) -> float:
    """Mean share of sampled tokens a mask dropped (``drop_frac``: weight 0) over the unit's steps that trained (at
    one ``lag`` if given): what a masking correction threw away."""
    return trained_mean(unit, "drop_frac", lag)


def trained_mean(unit: Mapping[str, Any], key: str, lag: int | None = None) -> float:
    """Mean of the records' ``key`` over the unit's steps that trained (at one ``lag`` if given); NaN if none."""
    values = [r[key] for r in unit["records"] if not r["skipped"] and (lag is None or r["lag"] == lag)]
    return float(np.mean(values)) if values else float("nan")


def mean_and_ci(values: Sequence[float]) -> dict[str, Any]:
    """``{"mean", "ci"}``: the mean and its 95 % t interval over seeds (None with one value)."""
    mean, half = mean_ci(values)
    return {"mean": float(mean), "ci": None if np.isnan(half) else [float(mean - half), float(mean + half)]}


def arm_entry(units: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """An arm's endpoints (mean and 95 % t CI over its seeds), collapses (final J below the untrained model's,
    its own J at step 0) and window drift."""
    entry: dict[str, Any] = {"seeds": [u["seed"] for u in units]}
    for key, values in (("j_auc", [u["j_auc"] for u in units]), ("j_final", [u["j_final"] for u in units]),
                        ("held_out_j_auc", [held_out_auc(u) for u in units]),
                        ("drift", [drift(u) for u in units])):
        entry[key] = mean_and_ci(values)
    entry["j_curve"] = {s: float(np.mean([u["j_curve"][s] for u in units])) for s in units[0]["j_curve"]}
    entry["collapsed"] = sum(u["j_final"] < u["j_curve"]["0"] for u in units)
    return entry


def provenance_rows(units: Mapping[tuple[str, int], Mapping[str, Any]]) -> list[dict[str, Any]]:
    keys = ("arm", "seed", "lr", "git_commit", "tree_dirty", "cpu_model", "cpu_vector", "torch", "transformers",
            "torch_threads", "load_start", "load_end", "wall_seconds", "cpu_seconds", "eval_seconds")
    return [{k: unit.get(k) for k in keys} for unit in units.values()]


def seed_prefix(units: Mapping[tuple[str, int], Any], arms: Sequence[str],
                seeds: Sequence[int] = design.SEEDS) -> list[int]:
    """The design's ``seeds`` (this study's confirmatory ones unless given), in order, up to the first that one of
    ``arms`` lacks."""
    prefix = []
    for seed in seeds:
        if not all((arm, seed) in units for arm in arms):
            break
        prefix.append(seed)
    return prefix


def looked(units: Mapping[tuple[str, int], Any], arms: Sequence[str]) -> list[int]:
    """The seeds of the last look that ``arms``' units reach together (none before the first look): what a
    comparison of these arms is read on (and an arm's entry, on its longest comparison's)."""
    prefix = seed_prefix(units, arms)
    return prefix[:max((n for n in design.PLAN.looks if n <= len(prefix)), default=0)]


def rebuild_summary(out: Path, write: bool = True) -> dict[str, Any]:
    """Read the units under ``out`` and write (unless ``write`` is False) and return ``out/summary.json``."""
    units = load(out / "units")
    due = {name: looked(units, arms) for name, arms in design.COMPARISONS.items()}
    reached = [n for n in design.PLAN.looks if n <= max(len(seeds) for seeds in due.values())]
    summary: dict[str, Any] = {"design": design.design_record() | {"power": "design.json"},
                               "seeds_in": len(seed_prefix(units, design.ARMS)), "looks_reached": reached,
                               "arms": {}, "comparisons": {}, "provenance": provenance_rows(units)}
    if all(due.values()):
        arm_seeds = {arm: max((due[name] for name, pair in design.COMPARISONS.items() if arm in pair), key=len)
                     for arm in design.ARMS}
        summary["arms"] = {arm: arm_entry([units[(arm, s)] for s in seeds]) for arm, seeds in arm_seeds.items()}
        diffs = {name: [units[(a, s)]["j_auc"] - units[(b, s)]["j_auc"] for s in due[name]]
                 for name, (a, b) in design.COMPARISONS.items()}
        for name, verdict in design.decide(diffs).items():
            a, b = design.COMPARISONS[name]
            summary["comparisons"][name] = {
                "comparison": f"{a} - {b}", "verdict": verdict.word, "estimate": verdict.estimate,
                "rci": list(verdict.rci), "level": verdict.level,
                "stopped_at_seeds": None if verdict.look is None else design.PLAN.looks[verdict.look],
                "looks_reached": [n for n in design.PLAN.looks if n <= len(due[name])]}
    summary["regime2"] = regime2(out)
    summary["corrections"] = corrections(out, units, reached)
    if write:
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def regime2(out: Path) -> dict[str, Any]:
    """The drift pilots (lag-1 drift of each lr tried, and the lr the rule picks) and, once all its seeds are in,
    the second regime's arms."""
    pilots = {}
    for lr in design.REGIME2_LRS:
        unit = load(out / f"units_lr{lr:g}").get(("v10_ratio", design.REGIME2_PILOT_SEED))
        if unit is not None:
            pilots[f"{lr:g}"] = {"drift_lag1": drift(unit, lag=1), "drift": drift(unit), "j_auc": unit["j_auc"]}
    chosen = next((lr for lr in pilots if pilots[lr]["drift_lag1"] <= design.REGIME2_DRIFT_LIMIT), None)
    entry: dict[str, Any] = {"pilots": pilots, "lr": chosen, "exploratory": True, "arms": {}, "differences": {}}
    if chosen is not None:
        units = load(out / f"units_lr{chosen}")
        if all((arm, s) in units for arm in design.ARMS for s in design.REGIME2_SEEDS):
            entry["arms"] = {arm: arm_entry([units[(arm, s)] for s in design.REGIME2_SEEDS])
                             for arm in design.ARMS}
            entry["differences"] = paired_differences(units, units, REGIME2_DIFFERENCES, design.REGIME2_SEEDS)
        entry["provenance"] = provenance_rows(units)
    return entry


def corrections(out: Path, units: Mapping[tuple[str, int], Mapping[str, Any]],
                looks_reached: Sequence[int]) -> dict[str, Any]:
    """The field's corrections (exploratory), once all their units are in and the first look is due: each arm's
    entry with the share of tokens its mask dropped (over the window and at its last lag), and its paired J_auc
    difference from each of :data:`design.CORRECTION_BASELINES` at the same seeds (mean and unadjusted 95 % t CI)."""
    mine = load(out / "units_corrections")
    seeds = design.CORRECTION_SEEDS
    entry: dict[str, Any] = {"seeds": list(seeds), "exploratory": True, "arms": {}, "differences": {}}
    if not looks_reached or not all((arm, s) in mine for arm in design.CORRECTION_ARMS for s in seeds):
        return entry
    entry["provenance"] = provenance_rows(mine)
    for arm in design.CORRECTION_ARMS:
        arm_units = [mine[(arm, s)] for s in seeds]
        last_lag = design.arm_fields(arm)["v"] - 1
        entry["arms"][arm] = arm_entry(arm_units) | {"dropped": mean_and_ci([dropped(u) for u in arm_units]) | {
            "last_lag": last_lag, "at_last_lag": float(np.mean([dropped(u, lag=last_lag) for u in arm_units]))}}
    pairs = [(arm, base) for arm in design.CORRECTION_ARMS for base in design.CORRECTION_BASELINES]
    entry["differences"] = paired_differences(mine, units, pairs, seeds)
    return entry


def paired_differences(a_units: Mapping[tuple[str, int], Mapping[str, Any]],
                       b_units: Mapping[tuple[str, int], Mapping[str, Any]],
                       pairs: Sequence[tuple[str, str]], seeds: Sequence[int]) -> dict[str, dict[str, Any]]:
    """"a - b" → the mean of a's J_auc minus b's over ``seeds``, paired by seed, with its unadjusted 95 % t CI
    (exploratory: no test); arm a's units from ``a_units``, b's from ``b_units``."""
    out = {}
    for a, b in pairs:
        out[f"{a} - {b}"] = mean_and_ci([a_units[(a, s)]["j_auc"] - b_units[(b, s)]["j_auc"] for s in seeds])
    return out
