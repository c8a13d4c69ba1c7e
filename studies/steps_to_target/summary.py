"""``summary.json`` of the steps-to-target study, rebuilt from its unit files and its benchmark files, and the lines
``run.py --summary`` prints.

The summary holds ``runs`` (one row per unit: provenance, exact J by optimiser step, how it stopped); ``passages``
(per arm and target, each seed's N, E and whether it reached the target, :func:`~.design.step_passage`, a seed that
missed it censored at the cap, or at its stop if the batch cap stopped it: ``batch_capped`` lists those);
``per_update`` (:func:`~.design.decide_per_update` at the TOST step counts, once both arms have two seeds there,
with each arm's count of seeds) and ``per_update_plan`` (:func:`per_update_plan`: the seeds a decision would take, at
the spreads the units show); ``seconds`` (per benchmark run, a task at a completion length: each group's sides'
c̄ and c̄∅, and :func:`decomposition` joining the groups); and ``time_ratios`` (per target,
:func:`grpo_lab.stats.passage.product_time_ratio` of the loop to TRL with the recipe's group that holds both), with
``time_ratios_reached`` (the same over the seeds that reached the target only, each arm's censored seeds left out:
beside a bound that one stalled seed dominates, the ratio among those that got there); ``missing``, the design's
units without a file, and ``missing_seconds``, its benchmark groups without one; and
``amendments`` (:func:`amendment_entry`, per amendment run) with ``missing_amendments``; an amendment's run that
``replaces`` one of the design's (amendment 5) is read in its place, in ``seconds``; an amendment's sides'
micro-batches are checked where it fixes one (:func:`check_amended`); and ``issue38_check``
(:func:`issue38_check`: the product against the time-to-accuracy study's wall clock). A unit or a benchmark run
under another design, or an amendment's file under another amendment, is refused.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from studies.stats import passage
from studies.steps_to_target import design as std
from studies.time_to_accuracy.design import design_sha

V1 = "grpo_lab_v1"


def unit_passages(unit: Mapping[str, Any], levels: Mapping[str, float], cap: int) -> dict[str, passage.StepPassage]:
    """Per target, the unit's :func:`~.design.step_passage`, or, if it never reached it, censored: at the cap, its
    optimiser steps there and the empty batches by then; at the batch cap (amendment 4), its optimiser steps and
    empty batches at its last batch. A unit that missed a target and stopped otherwise: ValueError."""
    out = {}
    for name, level in levels.items():
        hit = std.step_passage(unit["points"], level)
        if hit is None:
            if unit["stopped_by"] == "cap":
                last = unit["points"][-1]
                hit = passage.StepPassage(cap, last["steps"] - last["optimizer_steps"], False)
            elif unit["stopped_by"] == "batch_cap":
                hit = passage.StepPassage(unit["optimizer_steps"], unit["steps"] - unit["optimizer_steps"], False)
            else:
                raise ValueError(f"{unit['arm']} seed {unit['seed']} missed {name} and stopped by "
                                 f"{unit['stopped_by']}: its passage is not observed")
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


def seconds_drawn(group: Mapping[str, tuple[Sequence[float], Sequence[float]]], share: float, resamples: int,
                  rng: np.random.Generator) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Each side's seconds per optimiser step at ``share`` empty batches a step
    (:func:`~grpo_lab.stats.passage.seconds_per_step`) from a group's rounds (side → (c, c∅) per round), and the
    same in ``resamples`` bootstrap draws of the rounds, drawn once for every side (they ran in the same rounds)."""
    c = {name: (np.asarray(s), np.asarray(e)) for name, (s, e) in group.items()}
    draws = passage.pair_draws(len(next(iter(c.values()))[0]), resamples, rng)
    at = {name: float(passage.seconds_per_step(s.mean(), e.mean(), share)) for name, (s, e) in c.items()}
    drawn = {name: passage.seconds_per_step(s[draws].mean(-1), e[draws].mean(-1), share) for name, (s, e) in c.items()}
    return at, drawn


def halves(group: Mapping[str, tuple[Sequence[float], Sequence[float]]], share: float
           ) -> tuple[dict[str, float], dict[str, float]]:
    """Each side's seconds per optimiser step at ``share`` over the first ⌊n/2⌋ rounds of a group and over the rest:
    the intervals resample rounds within one run, so a drift along the run (a side's step growing slower round by
    round) shows here, not in them."""
    n = len(next(iter(group.values()))[0])
    if n < 2:
        raise ValueError(f"halves of a run need at least 2 rounds, got {n}")
    first, second = ({name: float(passage.seconds_per_step(np.mean(np.asarray(s)[part]), np.mean(np.asarray(e)[part]),
                                                           share))
                      for name, (s, e) in group.items()} for part in (slice(0, n // 2), slice(n // 2, n)))
    return first, second


def ratio_entry(value: float, draws: np.ndarray, level: float = std.LEVEL) -> dict[str, Any]:
    """A ratio and its percentile bootstrap interval."""
    low, high = passage.percentile_interval(draws, level)
    return {"ratio": value, "ci_low": low, "ci_high": high}


def decomposition(groups: Sequence[Mapping[str, tuple[Sequence[float], Sequence[float]]]], share: float,
                  resamples: int = std.RESAMPLES, seed: int = std.BOOTSTRAP_SEED,
                  level: float = std.LEVEL) -> dict[str, Any]:
    """Seconds per optimiser step of every side at ``share`` empty batches per step
    (:func:`~grpo_lab.stats.passage.seconds_per_step`), per group of sides run together (each ``grpo_lab_v1``'s
    among them: :func:`~.design.check_groups`); each side's ratio to its own group's ``grpo_lab_v1``; and where the
    sides are there: the product of :data:`~.design.FACTORS`' ratios, ``interaction`` (``trl_like``'s ratio over
    that product: 1 where the factors multiply) and ``unexplained`` (``trl`` over ``trl_like``, run together: what
    the three leave). Intervals from one bootstrap: a group's rounds resampled jointly for its sides, the groups
    independently (they are separate runs): each interval is within one run. ``halves``: each side's ratio and
    ``unexplained`` over the first and the second half of its group's rounds (:func:`halves`), point values."""
    std.check_groups([list(g) for g in groups])
    rng = np.random.default_rng(seed)
    point: dict[str, float] = {}
    boot: dict[str, np.ndarray] = {}
    per_group: list[dict[str, float]] = []
    split: dict[str, list[float]] = {}
    for group in groups:
        at, drawn = seconds_drawn(group, share, resamples, rng)
        per_group.append(at)
        parts = halves(group, share)
        for name in group:
            if name != V1:
                point[name], boot[name] = at[name] / at[V1], drawn[name] / drawn[V1]
                split[name] = [part[name] / part[V1] for part in parts]
        if {"trl", "trl_like"} <= set(group):
            point["unexplained"], boot["unexplained"] = at["trl"] / at["trl_like"], drawn["trl"] / drawn["trl_like"]
            split["unexplained"] = [part["trl"] / part["trl_like"] for part in parts]

    out: dict[str, Any] = {"share": share, "seconds_per_step": per_group,
                           "to_v1": {name: ratio_entry(point[name], boot[name], level) for name in point
                                     if name != "unexplained"},
                           "halves": split}
    if set(std.FACTORS) <= set(point):
        product = math.prod(point[f] for f in std.FACTORS)
        product_draws = np.prod([boot[f] for f in std.FACTORS], axis=0)
        out["factors_product"] = ratio_entry(product, product_draws, level)
        if "trl_like" in point:
            out["interaction"] = ratio_entry(point["trl_like"] / product, boot["trl_like"] / product_draws, level)
    if "unexplained" in point:
        out["unexplained"] = ratio_entry(point["unexplained"], boot["unexplained"], level)
    return out


def seconds_entry(benches: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The part of the summary of one task and completion length, joined from its groups' benchmark files (in
    group order): each group's settings and provenance with its sides' mean c, c∅ and completion tokens, and
    :func:`decomposition` at a step that trains (share 0) and at the loop's empty share e₀."""
    benches = sorted(benches, key=lambda b: b.get("group", 1))
    seconds = [round_seconds(b) for b in benches]
    keys = ("group", "pairs", "git_commit", "tree_dirty", "cpu_model", "cpu_vector", "torch", "transformers", "trl",
            "torch_threads", "load_start", "load_end", "wall_seconds")

    def sides(bench: Mapping[str, Any], group: Mapping[str, tuple[list[float], list[float]]]) -> dict[str, Any]:
        kept = [r for r in bench["rounds"] if not r["warmup"]]
        return {name: {"c": float(np.mean(s)), "c_empty": float(np.mean(e)),
                       "tokens": float(np.mean([r["sides"][name]["signal"]["tokens"] for r in kept]))}
                for name, (s, e) in group.items()}

    return {"task": benches[0]["task"], "tokens": benches[0]["tokens"],
            "groups": [{**{k: b.get(k) for k in keys}, "sides": sides(b, g)} for b, g in zip(benches, seconds,
                                                                                            strict=True)],
            "at_share": {f"{share:g}": decomposition(seconds, share) for share in (0.0, std.EMPTY_SHARE)}}


def amendment_ratios(bench: Mapping[str, Any], amendment: Mapping[str, Any], share: float, resamples: int,
                     rng: np.random.Generator, recipe: Mapping[str, Any] | None = None
                     ) -> dict[str, tuple[float, np.ndarray]]:
    """An amendment's ``ratios`` (name → [numerator side, denominator side]) in its file at ``share`` empty batches
    a step, each with its bootstrap draws over the rounds (drawn once for every side); and, given ``recipe`` (the
    recipe's benchmark file holding ``trl`` and ``trl_like``) run on the same CPU model, ``rest``: ``trl`` /
    ``trl_like`` there over ``every_position`` here, the two runs' rounds drawn independently."""
    point, drawn = seconds_drawn(round_seconds(bench), share, resamples, rng)
    ratios = {name: (point[a] / point[b], drawn[a] / drawn[b]) for name, (a, b) in amendment["ratios"].items()}
    if recipe is not None and recipe.get("cpu_model") == bench.get("cpu_model") and "every_position" in ratios:
        there, there_drawn = seconds_drawn(round_seconds(recipe), share, resamples, rng)
        every, every_drawn = ratios["every_position"]
        ratios["rest"] = (there["trl"] / there["trl_like"] / every,
                          there_drawn["trl"] / there_drawn["trl_like"] / every_drawn)
    return ratios


def amendment_entry(bench: Mapping[str, Any], amendment: Mapping[str, Any], recipe: Mapping[str, Any] | None = None,
                    resamples: int = std.RESAMPLES, seed: int = std.BOOTSTRAP_SEED,
                    level: float = std.LEVEL) -> dict[str, Any]:
    """An amendment's benchmark file (:data:`~.design.AMENDMENTS`): its provenance, each side's mean c and c∅, and
    :func:`amendment_ratios` at a step that trains and at e₀, each with a 95 % bootstrap interval over the file's
    rounds, and ``halves``: each of the amendment's own ratios over the first and the second half of the rounds
    (:func:`halves`). A file run under another version of the amendment is refused."""
    check_amended(bench, amendment)
    keys = ("pairs", "git_commit", "tree_dirty", "cpu_model", "cpu_vector", "torch", "transformers", "trl",
            "torch_threads", "load_start", "load_end", "wall_seconds")
    shares = (0.0, amendment["empty_share"])
    ratios = {f"{share:g}": amendment_ratios(bench, amendment, share, resamples, np.random.default_rng(seed), recipe)
              for share in shares}
    parts = {f"{share:g}": halves(round_seconds(bench), share) for share in shares}
    return {"task": bench["task"], "tokens": bench["tokens"], **{k: bench.get(k) for k in keys},
            "halves": {share: {name: [part[a] / part[b] for part in split]
                               for name, (a, b) in amendment["ratios"].items()} for share, split in parts.items()},
            "sides": {name: {"c": float(np.mean(c)), "c_empty": float(np.mean(e)),
                             "scoring": bench["sides"][name].get("scoring")}
                      for name, (c, e) in round_seconds(bench).items()},
            "at_share": {share: {name: ratio_entry(value, draws, level) for name, (value, draws) in at.items()}
                         for share, at in ratios.items()}}


def check_micro_batch(bench: Mapping[str, Any], size: int) -> None:
    """ValueError unless every side of ``bench`` ran ``size`` sequences a forward (the loop's micro-batch, as the
    memory guard left it; TRL's per-device batch)."""
    ran = {name: side.get("micro_batch_size", side.get("trl_config", {}).get("per_device_train_batch_size"))
           for name, side in bench["sides"].items()}
    other = {name: m for name, m in ran.items() if m != size}
    if other:
        raise ValueError(f"{bench['task']}_{bench['tokens']}: sides {other} did not run micro-batches of {size}")


def check_amended(bench: Mapping[str, Any], amendment: Mapping[str, Any]) -> None:
    """ValueError unless benchmark file ``bench`` was run under this version of ``amendment`` and, where the
    amendment fixes a micro-batch (amendments 5 and 6), every side ran it."""
    check_amendment(bench, amendment)
    micro_batch = amendment["runs"][0].get("micro_batch_size")
    if micro_batch is not None:
        check_micro_batch(bench, micro_batch)


def check_amendment(record: Mapping[str, Any], amendment: Mapping[str, Any]) -> None:
    """ValueError unless ``record`` (a benchmark file or a unit) was run under this version of ``amendment``."""
    if record.get("amendment_sha") != std.amendment_sha(amendment):
        raise ValueError(f"a file of amendment {amendment['number']} ({record.get('task') or record.get('arm')}) was "
                         f"run under another version of it (amendment_sha differs)")


def joined_amendments(first: Mapping[str, Any], second: Mapping[str, Any], amendments: Mapping[int, Any],
                      resamples: int = std.RESAMPLES, seed: int = std.BOOTSTRAP_SEED,
                      level: float = std.LEVEL) -> dict[str, Any] | None:
    """Amendment 2's join: ``trl`` / ``trl_like`` = ``every_position`` (amendment 1's file ``first``) × ``rest``
    (amendment 2's ``second``), at a step that trains and at e₀, the two runs' rounds drawn independently; None
    where they ran on different CPU models."""
    if first.get("cpu_model") != second.get("cpu_model"):
        return None
    out = {}
    for share in (0.0, amendments[2]["empty_share"]):
        rng = np.random.default_rng(seed)
        every, every_draws = amendment_ratios(first, amendments[1], share, resamples, rng)["every_position"]
        rest, rest_draws = amendment_ratios(second, amendments[2], share, resamples, rng)["rest"]
        out[f"{share:g}"] = {"trl_over_trl_like": ratio_entry(every * rest, every_draws * rest_draws, level)}
    return {"cpu_model": first.get("cpu_model"), "at_share": out}


def agrees(earlier: Mapping[str, Any], product: Mapping[str, Any]) -> bool:
    """Whether a product ratio (``ratio``, ``ci_low``, ``ci_high``; no interval: its point) agrees with an earlier
    wall-clock ratio of the same two arms and its ``bound``: exact, the two intervals overlap; ``lower`` (the earlier
    one is at most the truth: censored seeds in the numerator), the product reaches the earlier interval's low end;
    ``upper``, the product comes down to its high end."""
    low = product["ci_low"] if product["ci_low"] is not None else product["ratio"]
    high = product["ci_high"] if product["ci_high"] is not None else product["ratio"]
    reaches_up, reaches_down = high >= earlier["ci_low"], low <= earlier["ci_high"]
    return {"exact": reaches_up and reaches_down, "lower": reaches_up, "upper": reaches_down}.get(
        earlier["bound"], False)


def issue38_check(earlier: Mapping[str, Any], seconds: Mapping[str, Any], time_ratios: Mapping[str, Any]
                  ) -> dict[str, Any]:
    """The product against the time-to-accuracy study's wall-clock first passages (``earlier``, its summary: 600 s
    budget, 2 threads), for the arms it resolves. Per target: the loop's mean seconds to the target by the product
    (N̄·c + Ē·c∅) and there (its restricted mean, every seed reached); loop ÷ TRL (the product's time ratio, there a
    bound of the budget); and for each of :data:`~.design.ISSUE38_SIDES`, side ÷ loop: the product's per-step ratio at
    e₀ (the side's optimiser steps are the loop's: ``empty_backward`` takes the loop's trajectory exactly,
    ``no_share_prompt`` the same in distribution) against the ratio there. Each with :func:`agrees`."""
    e0 = seconds["at_share"][f"{std.EMPTY_SHARE:g}"]["to_v1"]
    keys = ("ratio", "ci_low", "ci_high")
    out: dict[str, Any] = {}
    for name, ratio in time_ratios.items():
        pairs = {"trl": (earlier["time_ratios"][V1][name], ratio)} | {
            side: (earlier["time_ratios_to_v1"][arm][name], e0[side]) for side, arm in std.ISSUE38_SIDES.items()
            if side in e0}
        out[name] = {
            "loop_seconds": {"product": ratio["steps"] * ratio["seconds_per_step"],
                             "issue38": earlier["arms"][V1][name]["restricted_mean"]},
            "ratios": {side: {"issue38": {k: there[k] for k in (*keys, "bound")},
                              "product": {k: here[k] for k in keys}, "agrees": agrees(there, here)}
                       for side, (there, here) in pairs.items()}}
    return out


PLAN_SEEDS = (5, 10, 15, 20, 30, 40, 60)
"""Seeds an arm (the same in both) that :func:`per_update_plan` gives the power of."""
PLAN_POWER = 0.8


def per_update_plan(j: Mapping[str, Mapping[int, Sequence[float]]], steps: Sequence[int], margin: float,
                    seeds: Mapping[str, int], reps: int = 20_000) -> dict[str, Any]:
    """What the units say a per-update study needs, for the next design (the power analysis from this one's data).
    ``j[arm][n]``: exact J of each seed at n optimiser steps (the seeds that got there), ``steps`` in the fixed
    sequence's order. Each arm's SD of J at each count; the larger of the two taken as both arms' (a plan should not
    count on the smaller); with it, the fixed sequence's power at a true difference of 0 (:func:`~.design.power`) at
    ``seeds`` an arm (the units in hand) and at each of :data:`PLAN_SEEDS` in both arms; and the fewest of those
    that call the first count (``steps[0]``) equivalent in :data:`PLAN_POWER` of studies (None if none does)."""
    spread = {arm: [float(np.std(j[arm][n], ddof=1)) for n in steps] for arm in j}
    planned = [max(sds) for sds in zip(*spread.values(), strict=True)]
    loop, trl = list(j)

    def power_at(n_loop: int, n_trl: int) -> list[float]:
        return std.power(0.0, planned, reps=reps, loop_seeds=n_loop, trl_seeds=n_trl, margin=margin)["equivalent"]

    by_seeds = {str(n): power_at(n, n) for n in PLAN_SEEDS}
    enough = next((int(n) for n, p in by_seeds.items() if p[0] >= PLAN_POWER), None)
    return {"steps": list(steps), "spread": spread, "planned_spread": planned,
            "seeds": dict(seeds), "power_at_seeds": power_at(seeds[loop], seeds[trl]), "power_by_seeds": by_seeds,
            "seeds_for_first_count": enough}


def run_key(bench: Mapping[str, Any]) -> str:
    """A benchmark file's run, ``<task>_<tokens>``: its key in the summary's ``seconds``."""
    return f"{bench['task']}_{bench['tokens']}"


def benchmark_runs(benches: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """The benchmark files by run (:func:`run_key`), each run's groups together."""
    runs: dict[str, list[Mapping[str, Any]]] = {}
    for bench in benches:
        runs.setdefault(run_key(bench), []).append(bench)
    return runs


def run_row(unit: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("arm", "seed", "git_commit", "tree_dirty", "cpu_model", "cpu_vector", "torch", "transformers", "trl",
            "torch_threads", "load_start", "load_end", "optimizer_steps", "steps", "stopped_by", "wall_seconds",
            "eval_seconds")
    return {**{k: unit.get(k) for k in keys},
            "curve": {"0": unit["untrained_j"], **{str(p["optimizer_steps"]): p["j"] for p in unit["points"]}}}


def summarize(design: Mapping[str, Any], units: Sequence[Mapping[str, Any]], benches: Sequence[Mapping[str, Any]],
              amendments: Sequence[Mapping[str, Any]] = std.AMENDMENTS,
              earlier: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The summary (module docstring) of ``units`` and benchmark files ``benches`` run under ``design`` and its
    ``amendments``; given ``earlier`` (the time-to-accuracy study's summary), :func:`issue38_check`."""
    sha = design_sha(design)
    foreign = [f"{u['arm']}_s{u['seed']}" for u in units if u.get("design_sha") != sha]
    unit_amendment = {a["number"]: a for a in amendments}.get(std.UNIT_AMENDMENT["number"])
    if unit_amendment is not None:
        for unit in units:
            if unit["arm"] == unit_amendment["arm"]:
                check_amendment(unit, unit_amendment)
    foreign += [f"{run_key(b)}_g{b.get('group', 1)}" for b in benches if b.get("design_sha") != sha]
    if foreign:
        raise ValueError(f"{foreign} were run under another design (design_sha differs)")
    amendments = {a["number"]: a for a in amendments}
    unknown = sorted({b["amendment"] for b in benches if "amendment" in b}
                     - {n for n, a in amendments.items() if a.get("runs")})
    if unknown:
        raise ValueError(f"benchmark files of amendments {unknown}, which the design has not")
    replaced = std.replaced_runs(amendments.values())
    stale = [f"{run_key(b)}_g{b.get('group', 1)}" for b in benches if "amendment" not in b and run_key(b) in replaced]
    if stale:
        raise ValueError(f"{stale} are design runs that amendments {sorted(replaced.values())} replace")
    replacing = [b for b in benches if b.get("amendment") in replaced.values()]
    for bench in replacing:            # read as the design's run they replace
        check_amended(bench, amendments[bench["amendment"]])
    amended = [b for b in benches if "amendment" in b and b["amendment"] not in replaced.values()]
    benches = [b for b in benches if "amendment" not in b] + replacing
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
        "batch_capped": [f"{u['arm']}_s{u['seed']}" for u in units if u["stopped_by"] == "batch_cap"],
        "per_update": None, "per_update_plan": None, "seconds": {},
        "time_ratios": {}, "time_ratios_reached": {},
        "missing": [f"{a}_s{s}" for a, s in design["order"] if not any(
            u["arm"] == a and u["seed"] == s for u in units)]}
    loop, trl = design["arms"]
    steps = design["per_update"]["steps"]
    j = {arm: {n: [x for x in (j_at(u, n) for u in runs) if x is not None] for n in steps}
         for arm, runs in by_arm.items()}
    if all(len(j[arm][n]) >= 2 for arm in (loop, trl) for n in steps):
        decided = std.decide_per_update(j[loop], j[trl], steps, design["per_update"]["margin"],
                                        design["per_update"]["alpha"])
        summary["per_update"] = {str(n): {**entry, "seeds": {arm: len(j[arm][n]) for arm in (loop, trl)}}
                                 for n, entry in decided.items()}
        summary["per_update_plan"] = per_update_plan({arm: j[arm] for arm in (loop, trl)}, steps,
                                                     design["per_update"]["margin"],
                                                     {arm: len(by_arm[arm]) for arm in (loop, trl)})
    runs = benchmark_runs(benches)
    recipe_bench = next((b for b in benches if b["task"] == design["task"] and {V1, "trl"} <= set(b["sides"])), None)
    recipe = round_seconds(recipe_bench) if recipe_bench is not None else {}
    if recipe and all(passages[arm][next(iter(levels))] for arm in (loop, trl)):
        boot = (design["time_ratio"]["resamples"], design["time_ratio"]["bootstrap_seed"],
                design["time_ratio"]["level"])
        summary["time_ratios"] = {name: passage.product_time_ratio(
            passages[loop][name], passages[trl][name], recipe[V1], recipe["trl"], *boot) for name in levels}
        reached = {arm: {name: [p for p in passages[arm][name] if p.reached] for name in levels} for arm in (loop, trl)}
        summary["time_ratios_reached"] = {name: passage.product_time_ratio(
            reached[loop][name], reached[trl][name], recipe[V1], recipe["trl"], *boot)
            for name in levels if reached[loop][name] and reached[trl][name]}
    summary["seconds"] = {run: seconds_entry(group_files) for run, group_files in runs.items()}
    summary["issue38_check"] = (
        issue38_check(earlier, summary["seconds"][run_key(recipe_bench)], summary["time_ratios"])
        if earlier is not None and summary["time_ratios"] else None)
    by_number = {b["amendment"]: b for b in amended}
    recipe_file = next((b for b in benches if b["task"] == design["task"] and {"trl", "trl_like"} <= set(b["sides"])),
                       None)
    summary["amendments"] = {str(n): amendment_entry(b, amendments[n], recipe_file if n == 1 else None)
                             for n, b in sorted(by_number.items())}
    summary["amendments_joined"] = (joined_amendments(by_number[1], by_number[2], amendments)
                                    if {1, 2} <= set(by_number) else None)
    filed = set(by_number) | {b["amendment"] for b in replacing}
    summary["missing_amendments"] = [f"{run_key(r)}_a{n}" for n, a in amendments.items()
                                     for r in a.get("runs", []) if n not in filed]
    summary["missing_seconds"] = [
        f"{run_key(r)}_g{g}" for r in design.get("benchmark", {}).get("runs", []) if run_key(r) not in replaced
        for g in range(1, len(r["groups"]) + 1) if not any(b.get("group", 1) == g for b in runs.get(run_key(r), []))]
    return summary


def rebuild_summary(out: Path = std.HERE, write: bool = True) -> dict[str, Any]:
    """Read ``<out>/design.json``, the unit files in ``<out>/units`` and the benchmark files in ``<out>/seconds``,
    and write (unless ``write`` is False) and return ``<out>/summary.json``."""
    design = std.load_design(out)
    units = [json.loads(p.read_text()) for p in sorted((out / "units").glob("*_s*.json"))]
    benches = [json.loads(p.read_text()) for p in sorted((out / "seconds").glob("*.json"))]
    summary = summarize(design, units, benches, earlier=json.loads(std.ISSUE38_SUMMARY.read_text()))
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

    def said(r: Mapping[str, Any]) -> str:
        return r["note"] if r["ratio"] is None else (
            f"{BOUND_MARK[r['bound']]}{r['ratio']:.2f}" + (f" [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"
                                                            if r["ci_low"] is not None else f" ({r['note']})"))

    for name, r in summary["time_ratios"].items():
        lines.append(f"time to {name}, loop / TRL: {said(r)}; steps {r['steps_ratio']:.2f}, seconds a step "
                     f"{r['seconds_ratio']:.2f}")
        if name in summary.get("time_ratios_reached", {}):
            only = summary["time_ratios_reached"][name]
            lines.append(f"  among the seeds that reached it ({only['seeds']} of the loop's {r['seeds']}, "
                         f"{only['reference_seeds']} of TRL's {r['reference_seeds']}): {said(only)}")
    for n, entry in (summary["per_update"] or {}).items():
        seeds = "".join(f", {count} {arm} seeds" for arm, count in entry.get("seeds", {}).items())
        lines.append(f"per update at {n} steps: TRL − loop {entry['estimate']:+.3f} [{entry['ci95'][0]:+.3f}, "
                     f"{entry['ci95'][1]:+.3f}], {entry['verdict']} (TOST p {entry['p_equivalence']:.3f}{seeds})")
    plan = summary.get("per_update_plan")
    if plan:
        first = plan["steps"][0]
        spreads = "; ".join(f"{arm} " + ", ".join(f"{x:.3f}" for x in sds) for arm, sds in plan["spread"].items())
        enough = plan["seeds_for_first_count"]
        lines.append(f"per update, J's SD at {', '.join(map(str, plan['steps']))} steps: {spreads}; power to call "
                     f"{first} equivalent at d = 0: {plan['power_at_seeds'][0]:.3f} with these seeds, "
                     + (f"≥ {PLAN_POWER} at {enough} seeds an arm" if enough else
                        f"under {PLAN_POWER} up to {PLAN_SEEDS[-1]} seeds an arm"))
    for run, entry in summary["seconds"].items():
        at = entry["at_share"][f"{std.EMPTY_SHARE:g}"]
        for side, r in {**at["to_v1"], **{k: at[k] for k in ("unexplained",) if k in at}}.items():
            first, second = at["halves"][side]
            lines.append(f"{run}: {side} / {V1 if side != 'unexplained' else 'trl / trl_like'} a step: "
                         f"{r['ratio']:.2f} [{r['ci_low']:.2f}, {r['ci_high']:.2f}] within one run; its halves "
                         f"{first:.2f}, {second:.2f}")
    for number, entry in summary.get("amendments", {}).items():
        split = entry["halves"][f"{std.EMPTY_SHARE:g}"]
        for name, r in entry["at_share"][f"{std.EMPTY_SHARE:g}"].items():
            lines.append(f"amendment {number}, {entry['task']}_{entry['tokens']}: {name} a step: {r['ratio']:.2f} "
                         f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]"
                         + (f"; its halves {split[name][0]:.2f}, {split[name][1]:.2f}" if name in split else ""))
    for name, check in (summary.get("issue38_check") or {}).items():
        lines.append(f"issue 38's wall clock, {name}: the loop's mean {check['loop_seconds']['issue38']:.0f} s there, "
                     f"{check['loop_seconds']['product']:.0f} s by the product")
        for side, r in check["ratios"].items():
            there, here = r["issue38"], r["product"]
            lines.append(f"  {side}: {BOUND_MARK[there['bound']]}{there['ratio']:.2f} [{there['ci_low']:.2f}, "
                         f"{there['ci_high']:.2f}] there, {here['ratio']:.2f} here: "
                         f"{'agrees' if r['agrees'] else 'DISAGREES'}")
    if summary.get("batch_capped"):
        lines.append(f"stopped by the batch cap, censored at their stop (amendment 4): {summary['batch_capped']}")
    lines.append(f"missing units: {len(summary['missing'])}")
    return lines
