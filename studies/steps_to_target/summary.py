"""``summary.json`` of the steps-to-target study, rebuilt from its unit files and its benchmark files, and the lines
``run.py --summary`` prints.

The summary holds ``runs`` (one row per unit: provenance, exact J by optimiser step, how it stopped); ``passages``
(per arm and target, each seed's N, E and whether it reached the target, :func:`~.design.step_passage`, a seed that
did not censored at the cap); ``per_update`` (:func:`~.design.decide_per_update` at the TOST step counts, once
both arms have two seeds); ``seconds`` (per benchmark file: each side's c̄ and c̄∅, and :func:`decomposition`); and
``time_ratios`` (per target, :func:`grpo_lab.stats.passage.product_time_ratio` of the loop to TRL with the recipe's
benchmark), with ``missing``, the design's units without a file. A unit or a benchmark run under another design is
refused.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from grpo_lab.stats import passage
from studies.steps_to_target import design as std
from studies.time_to_accuracy.design import design_sha

V1 = "grpo_lab_v1"


def unit_passages(unit: Mapping[str, Any], levels: Mapping[str, float], cap: int) -> dict[str, passage.StepPassage]:
    """Per target, the unit's :func:`~.design.step_passage`, or, if it never reached it, the cap's (censored): its
    optimiser steps at the cap and the empty batches by then. A unit that missed a target and stopped short of the
    cap (the batch cap) has no restricted steps: ValueError."""
    out = {}
    for name, level in levels.items():
        hit = std.step_passage(unit["points"], level)
        if hit is None:
            if unit["stopped_by"] != "cap":
                raise ValueError(f"{unit['arm']} seed {unit['seed']} missed {name} and stopped by "
                                 f"{unit['stopped_by']}, short of the cap {cap}: its restricted steps are not observed")
            last = unit["points"][-1]
            hit = passage.StepPassage(cap, last["steps"] - last["optimizer_steps"], False)
        out[name] = hit
    return out


def j_at(unit: Mapping[str, Any], steps: int) -> float | None:
    """Exact J of the unit's evaluation at ``steps`` optimiser steps (None if it has none)."""
    return next((p["j"] for p in unit["points"] if p["optimizer_steps"] == steps), None)


def round_seconds(bench: Mapping[str, Any]) -> dict[str, tuple[list[float], list[float]]]:
    """Side → (c, c∅) per kept round of a benchmark file: the seconds of its ``signal`` and ``empty`` steps."""
    kept = [r for r in bench["rounds"] if not r["warmup"]]
    return {name: ([r["sides"][name]["signal"]["seconds"] for r in kept],
                   [r["sides"][name]["empty"]["seconds"] for r in kept]) for name in bench["sides"]}


def decomposition(seconds: Mapping[str, tuple[Sequence[float], Sequence[float]]], share: float,
                  resamples: int = std.RESAMPLES, seed: int = std.BOOTSTRAP_SEED,
                  level: float = std.LEVEL) -> dict[str, Any]:
    """Seconds per optimiser step of every side at ``share`` empty batches per step
    (:func:`~grpo_lab.stats.passage.seconds_per_step`), each side's ratio to ``grpo_lab_v1``, and where the sides
    are there: the product of :data:`~.design.FACTORS`' ratios, ``interaction`` (``trl_like``'s ratio over that
    product: 1 where the factors multiply) and ``unexplained`` (``trl`` over ``trl_like``: what the three leave).
    Every interval from one bootstrap over the rounds, resampled jointly for every side."""
    c = {name: (np.asarray(s), np.asarray(e)) for name, (s, e) in seconds.items()}
    draws = passage.pair_draws(len(next(iter(c.values()))[0]), resamples, np.random.default_rng(seed))
    point = {name: float(passage.seconds_per_step(s.mean(), e.mean(), share)) for name, (s, e) in c.items()}
    boot = {name: passage.seconds_per_step(s[draws].mean(-1), e[draws].mean(-1), share) for name, (s, e) in c.items()}

    def entry(value: float, draws_: np.ndarray) -> dict[str, Any]:
        low, high = passage.percentile_interval(draws_, level)
        return {"ratio": value, "ci_low": low, "ci_high": high}

    out: dict[str, Any] = {"share": share, "seconds_per_step": point}
    if V1 in c:
        out["to_v1"] = {name: entry(point[name] / point[V1], boot[name] / boot[V1]) for name in c if name != V1}
        if set(std.FACTORS) <= set(c):
            product = math.prod(point[f] / point[V1] for f in std.FACTORS)
            product_draws = np.prod([boot[f] / boot[V1] for f in std.FACTORS], axis=0)
            out["factors_product"] = entry(product, product_draws)
            if "trl_like" in c:
                out["interaction"] = entry(point["trl_like"] / point[V1] / product,
                                           boot["trl_like"] / boot[V1] / product_draws)
    if {"trl", "trl_like"} <= set(c):
        out["unexplained"] = entry(point["trl"] / point["trl_like"], boot["trl"] / boot["trl_like"])
    return out


def seconds_entry(bench: Mapping[str, Any]) -> dict[str, Any]:
    """A benchmark file's part of the summary: its settings and provenance, each side's mean c and c∅ and completion
    tokens, and :func:`decomposition` at a step that trains (share 0) and at the loop's empty share e₀."""
    seconds = round_seconds(bench)
    kept = [r for r in bench["rounds"] if not r["warmup"]]
    keys = ("task", "tokens", "pairs", "git_commit", "tree_dirty", "cpu_model", "cpu_vector", "torch", "transformers",
            "trl", "torch_threads", "load_start", "load_end", "wall_seconds")
    return {**{k: bench.get(k) for k in keys},
            "sides": {name: {"c": float(np.mean(s)), "c_empty": float(np.mean(e)),
                             "tokens": float(np.mean([r["sides"][name]["signal"]["tokens"] for r in kept]))}
                      for name, (s, e) in seconds.items()},
            "at_share": {f"{share:g}": decomposition(seconds, share) for share in (0.0, std.EMPTY_SHARE)}}


def run_row(unit: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("arm", "seed", "git_commit", "tree_dirty", "cpu_model", "cpu_vector", "torch", "transformers", "trl",
            "torch_threads", "load_start", "load_end", "optimizer_steps", "steps", "stopped_by", "wall_seconds",
            "eval_seconds")
    return {**{k: unit.get(k) for k in keys},
            "curve": {"0": unit["untrained_j"], **{str(p["optimizer_steps"]): p["j"] for p in unit["points"]}}}


def summarize(design: Mapping[str, Any], units: Sequence[Mapping[str, Any]],
              benches: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The summary (module docstring) of ``units`` and benchmark files ``benches`` run under ``design``."""
    sha = design_sha(design)
    foreign = [f"{u['arm']}_s{u['seed']}" for u in units if u.get("design_sha") != sha]
    foreign += [f"{b['task']}_{b['tokens']}" for b in benches if b.get("design_sha") != sha]
    if foreign:
        raise ValueError(f"{foreign} were run under another design (design_sha differs)")
    levels, cap = design["targets"]["targets"], design["cap"]
    units = sorted(units, key=lambda u: (u["arm"], u["seed"]))
    by_arm = {arm: [u for u in units if u["arm"] == arm] for arm in design["arms"]}
    passages = {arm: {name: [unit_passages(u, levels, cap)[name] for u in runs] for name in levels}
                for arm, runs in by_arm.items()}
    summary: dict[str, Any] = {
        "design_sha": sha, "targets": levels, "cap": cap, "every": design["every"],
        "runs": [run_row(u) for u in units],
        "passages": {arm: {name: [[p.steps, p.empty, p.reached] for p in seeds] for name, seeds in targets.items()}
                     for arm, targets in passages.items()},
        "per_update": None, "seconds": {f"{b['task']}_{b['tokens']}": seconds_entry(b) for b in benches},
        "time_ratios": {},
        "missing": [f"{a}_s{s}" for a, s in design["order"] if not any(
            u["arm"] == a and u["seed"] == s for u in units)]}
    loop, trl = design["arms"]
    steps = design["per_update"]["steps"]
    j = {arm: {n: [x for x in (j_at(u, n) for u in runs) if x is not None] for n in steps}
         for arm, runs in by_arm.items()}
    if all(len(j[arm][n]) >= 2 for arm in (loop, trl) for n in steps):
        decided = std.decide_per_update(j[loop], j[trl], steps, design["per_update"]["margin"],
                                        design["per_update"]["alpha"])
        summary["per_update"] = {str(n): entry for n, entry in decided.items()}
    recipe = next((b for b in benches if b["task"] == design["task"]), None)
    seconds = round_seconds(recipe) if recipe is not None else {}
    if {V1, "trl"} <= set(seconds) and all(passages[arm][next(iter(levels))] for arm in (loop, trl)):
        summary["time_ratios"] = {name: passage.product_time_ratio(
            passages[loop][name], passages[trl][name], seconds[V1], seconds["trl"],
            design["time_ratio"]["resamples"], design["time_ratio"]["bootstrap_seed"], design["time_ratio"]["level"])
            for name in levels}
    return summary


def rebuild_summary(out: Path = std.HERE, write: bool = True) -> dict[str, Any]:
    """Read ``<out>/design.json``, the unit files in ``<out>/units`` and the benchmark files in ``<out>/seconds``,
    and write (unless ``write`` is False) and return ``<out>/summary.json``."""
    design = std.load_design(out)
    units = [json.loads(p.read_text()) for p in sorted((out / "units").glob("*_s*.json"))]
    benches = [json.loads(p.read_text()) for p in sorted((out / "seconds").glob("*.json"))]
    summary = summarize(design, units, benches)
    if write:
        tmp = out / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=1) + "\n")
        tmp.replace(out / "summary.json")
    return summary


BOUND_MARK = {"exact": "", "upper": "≤ ", "lower": "≥ ", "neither": "~ "}
"""How a time ratio is marked where a seed censored at the cap makes it a bound."""


def summary_lines(summary: Mapping[str, Any]) -> list[str]:
    """What ``run.py --summary`` prints: the time ratios, the per-update verdicts, the decomposition at e₀."""
    lines = []
    for name, r in summary["time_ratios"].items():
        said = r["note"] if r["ratio"] is None else (
            f"{BOUND_MARK[r['bound']]}{r['ratio']:.2f}" + (f" [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"
                                                            if r["ci_low"] is not None else f" ({r['note']})"))
        lines.append(f"time to {name}, loop / TRL: {said}; steps {r['steps_ratio']:.2f}, seconds a step "
                     f"{r['seconds_ratio']:.2f}")
    for n, entry in (summary["per_update"] or {}).items():
        lines.append(f"per update at {n} steps: TRL − loop {entry['estimate']:+.3f} [{entry['ci95'][0]:+.3f}, "
                     f"{entry['ci95'][1]:+.3f}], {entry['verdict']} (Holm p {entry['p_equivalence_holm']:.3f})")
    for run, entry in summary["seconds"].items():
        for side, r in entry["at_share"][f"{std.EMPTY_SHARE:g}"].get("to_v1", {}).items():
            lines.append(f"{run}: {side} / {V1} a step: {r['ratio']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}]")
    lines.append(f"missing units: {len(summary['missing'])}")
    return lines
