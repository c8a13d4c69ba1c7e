"""``summary.json`` of the time-to-accuracy study (issue 38 §4), rebuilt from its unit files, a table of it, and
the targets derived from the frontier study's ``v1`` arm.

The summary holds ``evaluation: "exact"``; ``targets`` (the levels, the date they were fixed, the untrained J and
the question set); ``runs``, one row per unit: ``{arm, seed, git_commit, curve: {training_seconds: J},
optimizer_steps: {training_seconds: n}, first_passage: {target: seconds or null}, …}`` (so J per second and J per
optimiser step are both there); ``arms``: per arm and target the seeds, the share reached, the Kaplan–Meier
median and the restricted mean; ``time_ratios``: ``{arm: {target: {ratio, ci_low, ci_high, reached_share, …}}}``
against the reference arm (TRL), by the rule of :mod:`grpo_lab.stats.passage`; ``time_ratios_to_v1``, the same
against ``grpo_lab_v1`` (the decomposition: what switching off one cause costs the loop); and ``missing``, the
design's units without a file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from studies.stats import passage

V1 = "grpo_lab_v1"
"""The arm the decomposition divides by: each cause's arm against the loop's defaults (``time_ratios_to_v1``)."""


def unit_curve(unit: Mapping[str, Any]) -> dict[float, float]:
    """A unit's training seconds → exact J, from (0, the untrained J)."""
    return {0.0: unit["untrained_j"], **{p["training_seconds"]: p["j"] for p in unit["points"]}}


def _keyed(values: Mapping[float, Any]) -> dict[str, Any]:
    return {f"{seconds:.2f}": value for seconds, value in sorted(values.items())}


def run_row(unit: Mapping[str, Any], levels: Mapping[str, float]) -> dict[str, Any]:
    """One unit's row of ``runs``: its provenance, curve, optimiser steps at each evaluation and first passages."""
    curve = unit_curve(unit)
    steps = {0.0: 0, **{p["training_seconds"]: p["optimizer_steps"] for p in unit["points"]}}
    return {"arm": unit["arm"], "seed": unit["seed"], "git_commit": unit["git_commit"],
            "grpo_lab_dirty": unit.get("grpo_lab_dirty"), "torch_threads": unit["torch_threads"],
            "load_start": unit["load_start"], "load_end": unit["load_end"], "curve": _keyed(curve),
            "optimizer_steps": _keyed(steps), "first_passage": {name: passage.first_passage(curve, level)
                                                                for name, level in levels.items()},
            "follow_up_seconds": unit["follow_up_seconds"], "stopped_early": unit["stopped_early"],
            "steps": unit["steps"], "wall_seconds": unit["wall_seconds"], "cpu_seconds": unit["cpu_seconds"],
            "eval_seconds": unit["eval_seconds"]}


def summarize(design: Mapping[str, Any], untrained: Mapping[str, Any], units: Sequence[Mapping[str, Any]],
              sha: str) -> dict[str, Any]:
    """The summary (module docstring) of ``units`` run under ``design`` (whose SHA-256 is ``sha``; a unit of
    another design is a ValueError)."""
    foreign = [f"{u['arm']}_s{u['seed']}" for u in units if u.get("design_sha") != sha]
    foreign += ["untrained"] if untrained.get("design_sha") != sha else []
    if foreign:
        raise ValueError(f"units {foreign} were run under another design (design_sha differs)")
    levels, budget = design["targets"]["targets"], design["budget_seconds"]
    rows = [run_row(u, levels) for u in sorted(units, key=lambda u: (u["arm"], u["seed"]))]
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_arm.setdefault(row["arm"], []).append(row)
    arms: dict[str, dict[str, Any]] = {}
    for arm, runs in by_arm.items():
        follow = [r["follow_up_seconds"] for r in runs]
        arms[arm] = {}
        for name in levels:
            times = [r["first_passage"][name] for r in runs]
            arms[arm][name] = {"seeds": len(runs), "reached_share": passage.reached_share(times),
                               "km_median": passage.km_median(times, follow),
                               "restricted_mean": float(passage.restricted_times(times, follow, budget).mean())}
    def ratios_to(denominator: str) -> dict[str, dict[str, Any]]:
        against = by_arm.get(denominator, [])
        return {arm: {name: passage.time_ratio([r["first_passage"][name] for r in runs],
                                               [r["first_passage"][name] for r in against], budget)
                      for name in levels}
                for arm, runs in by_arm.items() if arm != denominator and against}

    done = {(r["arm"], r["seed"]) for r in rows}
    return {"evaluation": "exact", "task": design["task"], "lr": design["lr"], "design_sha": sha,
            "targets": {"levels": levels, **{k: v for k, v in design["targets"].items() if k != "targets"}},
            "untrained_j": untrained["j"], "budget_seconds": budget, "eval_every_seconds": design["eval_every_seconds"],
            "reference": design["reference"], "statistic": design["statistic"], "runs": rows, "arms": arms,
            "time_ratios": ratios_to(design["reference"]), "time_ratios_to_v1": ratios_to(V1),
            "missing": [f"{a}_s{s}" for a, s in design["order"] if (a, s) not in done]}


def rebuild_summary(out_dir: str | Path) -> dict[str, Any]:
    """``<out_dir>/summary.json`` rebuilt from ``design.json`` and the unit files (the untrained one first)."""
    from studies.time_to_accuracy.design import design_sha

    out = Path(out_dir)
    design = json.loads((out / "design.json").read_text())
    untrained = json.loads((out / "units" / "untrained.json").read_text())
    units = [json.loads(p.read_text()) for p in sorted((out / "units").glob("*_s*.json"))]
    summary = summarize(design, untrained, units, design_sha(design))
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1) + "\n")
    tmp.replace(out / "summary.json")
    return summary


BOUND_MARK = {"upper": "≤ ", "lower": "≥ ", "neither": "~ "}
"""How the table marks a ratio that bounds the ratio of mean times (:func:`~grpo_lab.stats.passage.censoring_bound`;
``~``: both arms have censored seeds, so it bounds neither way)."""


def _seconds(value: float | None, budget: float) -> str:
    return f"> {budget:.0f}" if value is None else f"{value:.0f}"


def ratio_table(summary: Mapping[str, Any], to_v1: bool = False) -> list[dict[str, Any]]:
    """A row per arm and target: seeds, share reached, Kaplan–Meier median and restricted mean (s), and the
    time ratio to the reference (``to_v1``: to ``grpo_lab_v1``, the decomposition) with its interval, marked
    by :data:`BOUND_MARK` where censoring makes it a bound, or why it is not resolved."""
    rows, budget = [], summary["budget_seconds"]
    denominator, key = (V1, "time_ratios_to_v1") if to_v1 else (summary["reference"], "time_ratios")
    for arm, targets in summary["arms"].items():
        for name, entry in targets.items():
            ratio = summary[key].get(arm, {}).get(name)
            if ratio is None:
                said = "reference" if arm == denominator else f"no {denominator} runs"
            elif ratio["ratio"] is None:
                said = ratio["note"]
            else:
                interval = (f" [{ratio['ci_low']:.2f}, {ratio['ci_high']:.2f}]" if ratio["ci_low"] is not None
                            else f" ({ratio['note']})")
                said = f"{BOUND_MARK.get(ratio['bound'], '')}{ratio['ratio']:.2f}{interval}"
            rows.append({"arm": arm, "target": f"{name} (J {summary['targets']['levels'][name]:.3f})",
                         "seeds": entry["seeds"], "reached": f"{entry['reached_share']:.0%}",
                         "KM median s": _seconds(entry["km_median"], budget),
                         "restricted mean s": f"{entry['restricted_mean']:.0f}",
                         f"× {denominator}'s time": said})
    return rows


def targets_from_frontier(frontier_dir: str | Path, fixed_on: str, every: int = 1,
                          shares: Mapping[str, float] | None = None, arm: str = "v1") -> dict[str, Any]:
    """``targets.json`` from the frontier study's units (issue 38 §1): on the question set of every ``every``-th
    question (1: all), the untrained J plus each share of ``arm``'s mean gain at the frontier's budget (its last
    evaluation step), from the per-question J the units hold, so a subset's targets follow the same rule as the
    whole set's. ``fixed_on``: the date, recorded."""
    shares = {"50%": 0.5, "80%": 0.8} if shares is None else shares
    units_dir = Path(frontier_dir) / "units"
    untrained = json.loads((units_dir / "untrained.json").read_text())
    runs = [json.loads(p.read_text()) for p in sorted(units_dir.glob(f"{arm}_s*.json"))]
    if not runs:
        raise FileNotFoundError(f"no {arm} units in {units_dir}")

    def mean(values: Sequence[float]) -> float:
        chosen = list(values)[::every]
        return sum(chosen) / len(chosen)

    start = mean(untrained["j_per_question"])
    finals = [mean(r["j_per_question"][str(r["steps"])]) for r in runs]
    gain = sum(finals) / len(finals) - start
    return {"evaluation": "exact", "task": untrained["task"], "lr": runs[0]["lr"], "fixed_on": fixed_on,
            "source": f"{frontier_dir}: {arm} at the frontier's budget ({runs[0]['steps']} steps), mean of seeds "
                      f"{[r['seed'] for r in runs]}", "questions": {"every": every},
            "question_count": len(untrained["j_per_question"][::every]), "untrained_j": start,
            "v1_j_at_budget": start + gain, "v1_gain": gain,
            "targets": {name: start + share * gain for name, share in shares.items()}}
