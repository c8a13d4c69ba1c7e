"""Steps to target: the product time ratio and Welch TOST on made-up data worked out by hand, censoring at the cap,
the fixed-sequence verdicts, the step clock, the committed design against design.py, the interleaved benchmark's
pieces, and a sitting of the loop and TRL on a tiny model (a unit each, the summary)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from reliability_runs import problems, tiny_model, tokenizer
from script_module import load_script

from grpo_lab.lm.train_config import TrainConfig
from studies.locks import UnitLock
from studies.stats import passage
from studies.stats.comparisons import welch_tost
from studies.steps_to_target import design as std
from studies.steps_to_target.summary import (
    agrees,
    check_micro_batch,
    decomposition,
    halves,
    issue38_check,
    per_update_plan,
    summarize,
    summary_lines,
    unit_passages,
)
from studies.steps_to_target.units import StepClock, run_units
from studies.time_to_accuracy.design import design_sha

ROOT = Path(__file__).resolve().parents[1]
StepPassage = passage.StepPassage


def benchmark_module():
    return load_script("benchmarks/step_seconds.py")


def made_up_design(runs: list[dict] = ()) -> dict:
    """A design for summaries of made-up benchmark files alone: one target, no units, ``runs`` its benchmark."""
    return {"targets": {"targets": {"50%": 0.4}}, "cap": 4, "every": 2, "arms": ["grpo_lab_v1", "trl"],
            "order": [], "task": "addsubmul1", "per_update": {"steps": [2], "margin": 0.05, "alpha": 0.05},
            "benchmark": {"runs": list(runs)}}


def made_up_file(seconds: dict, design: dict, task: str = "addsubmul1", tokens: int = 8, sides: dict | None = None,
                 **fields) -> dict:
    """A benchmark file run under ``design``: a warm-up and two kept rounds in which each side of ``seconds`` takes
    (c, c∅) seconds, with signal and empty, so every ratio is known by hand and its interval is its point."""
    rounds = [{"warmup": w, "sides": {name: {"signal": {"seconds": c, "stepped": True, "tokens": 90},
                                             "empty": {"seconds": e, "stepped": False, "tokens": 90}}
                                      for name, (c, e) in seconds.items()}} for w in (True, False, False)]
    return {"task": task, "tokens": tokens, "pairs": 2, "group": 1, "rounds": rounds,
            "sides": {name: {} for name in seconds} if sides is None else sides, "design_sha": design_sha(design),
            **fields}


def micro_batch_file(number: int, seconds: dict, design: dict, micro: int, **fields) -> dict:
    """A made-up file of amendment ``number``'s run (amendments 5 and 6) whose sides ran ``micro`` sequences a
    forward: the loop's micro-batch, TRL's per-device batch."""
    amendment = std.AMENDMENTS[number - 1]
    (run,) = amendment["runs"]
    sides = {name: ({"trl_config": {"per_device_train_batch_size": micro}} if name == "trl"
                    else {"micro_batch_size": micro}) for name in seconds}
    return made_up_file(seconds, design, run["task"], run["tokens"], sides,
                        **{"amendment": number, "amendment_sha": std.amendment_sha(amendment), **fields})


# ----------------------------------------------------------------------------- the statistics, by hand


def test_the_product_time_ratio_and_its_interval_by_hand():
    """Loop: N = 20, E = 4 in every seed, c = 1 or 3 s in the two rounds, c∅ = 0.5 s; TRL: N = 40, E = 10, 2 s a
    batch either way. Times: loop 20·2 + 4·0.5 = 42 s, TRL 40·2 + 10·2 = 100 s, ratio 0.42 = steps ratio 0.5 ×
    seconds-per-step ratio (2 + 0.2·0.5) / (2 + 0.25·2) = 0.84. Only the rounds vary: a resample's mean c is 1, 2
    or 3 (¼, ½, ¼), so the ratio is 0.22, 0.42 or 0.62, and the 95 % interval is [0.22, 0.62] exactly."""
    loop, trl = [StepPassage(20, 4, True)] * 3, [StepPassage(40, 10, True)] * 3
    result = passage.product_time_ratio(loop, trl, ([1.0, 3.0], [0.5, 0.5]), ([2.0, 2.0], [2.0, 2.0]))
    assert result["ratio"] == pytest.approx(0.42) and result["steps_ratio"] == pytest.approx(0.5)
    assert result["seconds_ratio"] == pytest.approx(2.1 / 2.5)
    assert [result["seconds_per_step"], result["reference_seconds_per_step"]] == pytest.approx([2.1, 2.5])
    assert (result["ci_low"], result["ci_high"]) == (pytest.approx(0.22), pytest.approx(0.62))
    assert result["bound"] == "exact" and result["pairs"] == 2 and result["note"] == ""


def test_the_product_interval_matches_the_exact_bootstrap_over_seeds_and_rounds():
    """3 loop seeds (27 resamples) × 2 rounds (4 resamples), TRL constant: the exact bootstrap distribution of the
    ratio is every combination, equally likely; the Monte Carlo interval lies within its sampling error."""
    import itertools

    loop = [StepPassage(n, 0, True) for n in (10, 20, 30)]
    trl = [StepPassage(40, 0, True)] * 3
    result = passage.product_time_ratio(loop, trl, ([1.0, 3.0], [0.0, 0.0]), ([2.0, 2.0], [0.0, 0.0]))
    means_n = [np.mean(draw) for draw in itertools.product((10, 20, 30), repeat=3)]
    means_c = [np.mean(draw) for draw in itertools.product((1.0, 3.0), repeat=2)]
    exact = np.array([n * c / 80 for n in means_n for c in means_c])
    low, high = np.quantile(exact, [0.025, 0.975])
    assert result["ratio"] == pytest.approx(20 * 2 / 80)
    assert result["ci_low"] == pytest.approx(low, abs=0.01) and result["ci_high"] == pytest.approx(high, abs=0.01)


def test_seeds_censored_at_the_cap_make_the_ratio_a_bound_or_leave_it_unresolved():
    seconds = ([1.0, 1.0], [0.5, 0.5])
    censored = [StepPassage(142, 40, False), StepPassage(60, 10, True), StepPassage(142, 50, False)]
    bound = passage.product_time_ratio([StepPassage(30, 5, True)] * 3, censored, seconds, seconds)
    assert bound["bound"] == "upper" and bound["reference_reached_share"] == pytest.approx(1 / 3)
    assert bound["ratio"] == pytest.approx((30 + 2.5) / ((142 + 60 + 142) / 3 + 0.5 * 100 / 3))
    none = passage.product_time_ratio([StepPassage(142, 3, False)] * 3, [StepPassage(142, 9, False)] * 3, seconds,
                                      seconds)
    assert none["ratio"] is None and "neither arm reached" in none["note"]
    few = passage.product_time_ratio([StepPassage(30, 5, True)] * 2, censored, seconds, seconds)
    assert few["ci_low"] is None and "3 needed" in few["note"]
    with pytest.raises(ValueError, match="one value per pair"):
        passage.product_time_ratio(censored, censored, ([1.0], [1.0]), seconds)


def test_a_unit_that_missed_a_target_is_censored_at_the_cap_or_at_its_stop():
    """At the cap: N the cap, E the empty batches by its last evaluation. Stopped by the batch cap (amendment 4):
    N and E at its last batch, past its last evaluation. Stopped otherwise: refused."""
    points = [{"optimizer_steps": n, "steps": b, "j": j} for n, b, j in ((2, 3, 0.2), (4, 6, 0.45), (6, 8, 0.5))]
    unit = {"arm": "trl", "seed": 1, "points": points, "stopped_by": "cap", "optimizer_steps": 6, "steps": 8}
    got = unit_passages(unit, {"50%": 0.4, "80%": 0.6}, cap=6)
    assert got == {"50%": StepPassage(4, 2, True), "80%": StepPassage(6, 2, False)}
    stalled = {**unit, "stopped_by": "batch_cap", "optimizer_steps": 7, "steps": 24}
    assert unit_passages(stalled, {"50%": 0.4, "80%": 0.6}, cap=8) == {"50%": StepPassage(4, 2, True),
                                                                      "80%": StepPassage(7, 17, False)}
    with pytest.raises(ValueError, match="passage is not observed"):
        unit_passages({**unit, "stopped_by": "interrupted"}, {"80%": 0.6}, cap=6)


def test_a_stalled_trl_seed_makes_the_time_ratio_an_upper_bound_and_leaves_the_tost_its_seeds():
    """Three seeds an arm with constant seconds (c = 2, c∅ = 1 for both): the loop's passages (10, 2) each, TRL's
    (10, 2), (10, 2) and a unit stopped by the batch cap at 4 optimiser steps and 40 batches: (4, 36), not reached.
    Mean times 22 and (22 + 22 + 44) / 3, so loop / TRL = 0.75, an upper bound. At 10 steps the TOST has 3 loop
    seeds and TRL's 2 that got there."""
    def unit(arm, seed, curve, stopped_by, n, b):
        points = [{"optimizer_steps": k, "steps": k + e, "j": j} for k, e, j in curve]
        return {"arm": arm, "seed": seed, "points": points, "stopped_by": stopped_by, "optimizer_steps": n,
                "steps": b, "untrained_j": 0.1, "design_sha": design_sha(design)}

    def bench():
        rounds = [{"warmup": w, "sides": {name: {"signal": {"seconds": 2.0, "stepped": True, "tokens": 9},
                                                 "empty": {"seconds": 1.0, "stepped": False, "tokens": 9}}
                                          for name in ("grpo_lab_v1", "trl")}} for w in (True, False, False)]
        return {"task": "addsubmul1", "tokens": 8, "pairs": 2, "group": 1, "rounds": rounds,
                "sides": {"grpo_lab_v1": {}, "trl": {}}, "design_sha": design_sha(design)}

    design = {"targets": {"targets": {"50%": 0.4}}, "cap": 20, "every": 2, "arms": ["grpo_lab_v1", "trl"],
              "order": [], "task": "addsubmul1", "per_update": {"steps": [10], "margin": 0.05, "alpha": 0.05},
              "benchmark": {"runs": []}, "time_ratio": {"resamples": 200, "bootstrap_seed": 0, "level": 0.95}}
    reached = [(2, 0, 0.2), (10, 2, 0.5)]
    units = [unit("grpo_lab_v1", s, [(2, 0, 0.2), (10, 2, 0.5 + 0.01 * s)], "targets", 10, 12) for s in range(3)]
    units += [unit("trl", s, reached, "targets", 10, 12) for s in range(2)]
    units.append(unit("trl", 2, [(2, 0, 0.2), (4, 6, 0.1)], "batch_cap", 4, 40))
    amendment_3 = std.AMENDMENTS[2]
    units = [{**u, "amendment_sha": std.amendment_sha(amendment_3)} if u["arm"] == "trl" else u for u in units]
    summary = summarize(design, units, [bench()])
    assert summary["batch_capped"] == ["trl_s2"]
    assert summary["passages"]["trl"]["50%"][2] == [4, 36, False]
    ratio = summary["time_ratios"]["50%"]
    assert ratio["ratio"] == pytest.approx(22 / ((22 + 22 + 44) / 3)) and ratio["bound"] == "upper"
    reached = summary["time_ratios_reached"]["50%"]   # the stalled seed left out: 22 s against 22 s
    assert reached["ratio"] == pytest.approx(1.0) and (reached["seeds"], reached["reference_seeds"]) == (3, 2)
    assert reached["bound"] == "exact" and any("among the seeds that reached it (3 of the loop's 3, 2 of TRL's 3): "
                                               "1.00 (no interval" in line for line in summary_lines(summary))
    assert summary["per_update"]["10"]["seeds"] == {"grpo_lab_v1": 3, "trl": 2}
    assert any("batch cap" in line and "trl_s2" in line for line in summary_lines(summary))


def test_the_per_update_plan_takes_the_larger_spread_and_finds_the_seeds_it_needs():
    """TRL's J at 60 steps spreads (0.4, 0.6: SD √0.02), the loop's not at all: the plan takes TRL's SD at 60 and
    the loop's at 40, where the loop spreads more. Seeds that agree to 0.001 are called equivalent in every
    simulated study from 5 seeds an arm; seeds spread by 1 of J never are, up to the largest count tried."""
    j = {"grpo_lab_v1": {60: [0.5, 0.5, 0.5], 40: [0.3, 0.5, 0.4]}, "trl": {60: [0.4, 0.6], 40: [0.4, 0.4, 0.4]}}
    plan = per_update_plan(j, [60, 40], margin=0.051, seeds={"grpo_lab_v1": 3, "trl": 2}, reps=500)
    assert plan["spread"]["trl"][0] == pytest.approx(math.sqrt(0.02)) and plan["spread"]["grpo_lab_v1"][0] == 0.0
    assert plan["planned_spread"] == pytest.approx([math.sqrt(0.02), 0.1])
    three = {"grpo_lab_v1": 3, "trl": 3}
    tight = {arm: {60: [0.5, 0.501, 0.499], 40: [0.5, 0.501, 0.499]} for arm in j}
    assert per_update_plan(tight, [60, 40], 0.051, three, reps=500)["seeds_for_first_count"] == 5
    wide = {arm: {60: [0.0, 1.0, 2.0], 40: [0.0, 1.0, 2.0]} for arm in j}
    assert per_update_plan(wide, [60, 40], 0.051, three, reps=500)["seeds_for_first_count"] is None
    lines = summary_lines({"time_ratios": {}, "per_update": None, "per_update_plan": plan, "seconds": {},
                           "missing": []})
    assert lines[0].startswith("per update, J's SD at 60, 40 steps: grpo_lab_v1 0.000, 0.100; trl 0.141, 0.000")


def test_welch_tost_by_hand():
    """a = (1, 3), b = (2, 2, 2): d = 0, se = √(2/2) = 1, df = 1 (b has no spread), Student's t with 1 df is the
    Cauchy: P(T ≤ 1) = ¾, so each one-sided p at m = 1 is ¼; the 90 % interval ±tan(0.45π) = ±6.314."""
    result = welch_tost([1.0, 3.0], [2.0, 2.0, 2.0], margin=1.0)
    assert (result["estimate"], result["se"], result["df"]) == (0.0, pytest.approx(1.0), 1)
    assert result["p_equivalence"] == pytest.approx(0.25, abs=1e-9) and result["p_difference"] == pytest.approx(1.0)
    assert result["ci"] == pytest.approx([-math.tan(0.45 * math.pi), math.tan(0.45 * math.pi)], abs=1e-6)
    # no spread anywhere: decided by where the estimate lies
    assert welch_tost([1.0, 1.0], [1.02, 1.02], 0.051)["p_equivalence"] == 0.0
    assert welch_tost([1.0, 1.0], [1.1, 1.1], 0.051)["p_equivalence"] == 1.0


def test_the_fixed_sequence_stops_testing_at_the_first_count_not_resolved():
    assert std.per_update_verdicts([0.01, 0.2, 0.001]) == ["equivalent", "not resolved", "not tested"]
    assert std.per_update_verdicts([0.04, 0.049, 0.01]) == ["equivalent"] * 3      # each at the full α
    assert std.per_update_verdicts([0.5, 0.0, 0.0]) == ["not resolved", "not tested", "not tested"]


def test_the_fixed_sequence_keeps_its_error_at_alpha_on_the_margin():
    """TRL's J exactly a margin off the loop's at every count (the null at its edge): the share of simulated studies
    that call any count equivalent stays at α = 0.05 (within Monte Carlo error), though each test runs at the full
    α; half a margin off, the first count is called equivalent more often than not."""
    spreads = [0.014, 0.030, 0.048]
    edge = std.power(std.MARGIN, spreads, reps=6000, seed=3)
    assert edge["equivalent"][0] <= std.ALPHA + 0.01 and edge["equivalent"][-1] <= edge["equivalent"][0]
    assert std.power(std.MARGIN / 2, spreads, reps=2000, seed=3)["equivalent"][0] > 0.5


def test_the_per_update_decision_on_made_up_curves():
    """At 60 steps TRL's J is the loop's to within 0.005 (tight seeds): equivalent; at 40 it trails by 0.1: not
    resolved (its interval lies below −m), so 20 is not tested."""
    rng = np.random.default_rng(0)
    loop = {60: 0.6 + 0.01 * rng.standard_normal(10), 40: 0.5 + 0.01 * rng.standard_normal(10),
            20: 0.3 + 0.05 * rng.standard_normal(10)}
    trl = {60: 0.6 + 0.01 * rng.standard_normal(5), 40: 0.4 + 0.01 * rng.standard_normal(5),
           20: 0.3 + 0.05 * rng.standard_normal(5)}
    decided = std.decide_per_update(loop, trl)
    assert [decided[n]["verdict"] for n in (60, 40, 20)] == ["equivalent", "not resolved", "not tested"]
    assert decided[40]["ci95"][1] < -std.MARGIN and decided[40]["p_difference"] < 0.001
    assert decided[60]["ci"][0] > -std.MARGIN and decided[60]["ci"][1] < std.MARGIN
    lines = summary_lines({"time_ratios": {}, "per_update": {str(n): e for n, e in decided.items()}, "seconds": {},
                           "missing": []})
    assert lines[0].startswith("per update at 60 steps: TRL − loop") and "equivalent (TOST p" in lines[0]


def test_the_decomposition_by_hand():
    """Constant seconds, so every interval is its point: at e = 0.5, v1 1 + 0.5·0.4 = 1.2 s a step; the factors
    1.5, 1.25 and 2 times that; trl_like 4.8 (interaction 4.8/1.2 / 3.75 = 16/15); TRL 9.6 (unexplained 2). Each
    group's ratios are to its own v1: the second group's v1 runs twice as slow, and so do its sides."""
    def const(c, e):
        return ([c, c, c], [e, e, e])

    first = {"grpo_lab_v1": const(1.0, 0.4), "trl": const(8.0, 3.2), "generate_sampler": const(2.0, 0.8),
             "trl_like": const(4.0, 1.6)}
    second = {"grpo_lab_v1": const(2.0, 0.8), "no_share_prompt": const(3.2, 0.8), "empty_backward": const(2.0, 2.0)}
    out = decomposition([first, second], 0.5)
    ratios = {name: r["ratio"] for name, r in out["to_v1"].items()}
    assert ratios == pytest.approx({"no_share_prompt": 1.5, "empty_backward": 1.25, "generate_sampler": 2.0,
                                    "trl_like": 4.0, "trl": 8.0})
    assert out["seconds_per_step"][1]["grpo_lab_v1"] == pytest.approx(2.4)
    assert out["factors_product"]["ratio"] == pytest.approx(3.75)
    assert out["interaction"]["ratio"] == pytest.approx(4.0 / 3.75) and out["unexplained"]["ratio"] == pytest.approx(2)
    assert out["unexplained"]["ci_low"] == pytest.approx(2) == out["unexplained"]["ci_high"]


def test_the_halves_show_a_side_that_slows_along_its_run():
    """The intervals resample rounds within one run, so a step that grows slower round by round stays inside them;
    the halves show it. TRL's step 8, 8, 10, 10 s against the loop's 1 s (empty batches at half that, share 0.5):
    the ratio 9 over the run, 8 and 10 over its halves; a side that keeps its pace has equal halves."""
    group = {"grpo_lab_v1": ([1.0] * 4, [0.5] * 4), "trl": ([8.0, 8.0, 10.0, 10.0], [4.0, 4.0, 5.0, 5.0]),
             "generate_sampler": ([2.0] * 4, [1.0] * 4), "trl_like": ([4.0] * 4, [2.0] * 4)}
    out = decomposition([group], 0.5)
    assert out["to_v1"]["trl"]["ratio"] == pytest.approx(9.0)
    assert out["halves"]["trl"] == pytest.approx([8.0, 10.0]) and out["halves"]["trl_like"] == pytest.approx([4.0, 4.0])
    assert out["halves"]["unexplained"] == pytest.approx([2.0, 2.5])
    with pytest.raises(ValueError, match="at least 2 rounds"):
        halves({name: ([c[0]], [e[0]]) for name, (c, e) in group.items()}, 0.5)


def test_the_groups_resample_independently_and_must_be_joinable():
    """Two groups of noisy rounds: the product's interval is that of independent draws per group (by hand, the same
    generator order), and groups that cannot be joined are refused by name."""
    rng = np.random.default_rng(3)
    first = {"grpo_lab_v1": (list(1 + 0.1 * rng.random(5)), [0.5] * 5),
             "generate_sampler": (list(2 + 0.3 * rng.random(5)), [0.5] * 5)}
    second = {"grpo_lab_v1": (list(1 + 0.1 * rng.random(4)), [0.5] * 4),
              "no_share_prompt": (list(1.5 + 0.2 * rng.random(4)), [0.5] * 4)}
    out = decomposition([first, second], 0.0, resamples=400, seed=9, level=0.9)
    draws = np.random.default_rng(9)
    a, b = draws.integers(0, 5, (400, 5)), draws.integers(0, 4, (400, 4))
    ratio_a = np.asarray(first["generate_sampler"][0])[a].mean(-1) / np.asarray(first["grpo_lab_v1"][0])[a].mean(-1)
    ratio_b = np.asarray(second["no_share_prompt"][0])[b].mean(-1) / np.asarray(second["grpo_lab_v1"][0])[b].mean(-1)
    assert [out["to_v1"]["no_share_prompt"]["ci_low"], out["to_v1"]["no_share_prompt"]["ci_high"]] == pytest.approx(
        np.quantile(ratio_b, [0.05, 0.95]))
    assert out["to_v1"]["generate_sampler"]["ci_low"] == pytest.approx(np.quantile(ratio_a, 0.05))
    assert "factors_product" not in out                      # empty_backward was not run
    with pytest.raises(ValueError, match="lack grpo_lab_v1"):
        std.check_groups([["grpo_lab_v1", "trl"], ["no_share_prompt"]])
    with pytest.raises(ValueError, match=r"\['trl'\] are in more than one group"):
        std.check_groups([["grpo_lab_v1", "trl"], ["grpo_lab_v1", "trl"]])
    with pytest.raises(ValueError, match="different groups"):
        std.check_groups([["grpo_lab_v1", "trl"], ["grpo_lab_v1", "trl_like"]])
    with pytest.raises(ValueError, match="unknown sides"):
        std.check_groups([["grpo_lab_v1", "vllm"]])
    for _, _, _, groups in std.SECONDS_TASKS:
        std.check_groups(groups)


def test_the_amendments_read_their_own_ratios_join_one_machine_only_and_refuse_another_version():
    """Amendments 1 and 2's files and the recipe's first group, made up with constant seconds: at e₀ a side's seconds
    a step are c + e₀·c∅, so each ratio is known by hand and its interval is its point. Amendment 1's ``rest``
    (through the recipe's group) and the join of 1 and 2 are read only where the runs share a CPU model. The files
    are kept apart from the design's runs (the recipe's decomposition does not see them); a file of another version
    of an amendment, or of one the design has not, is refused."""
    def bench_of(c, cpu="A", **extra):
        return made_up_file(c, design, cpu_model=cpu, **extra)

    def amended(number, c, cpu="A"):
        amendment = std.AMENDMENTS[number - 1]
        return bench_of(c, cpu, amendment=number, amendment_sha=std.amendment_sha(amendment))

    design = made_up_design()
    first = {"trl": (16.0, 15.0), "trl_completions": (11.0, 11.5)}
    second = {"trl_like": (10.0, 10.0), "trl_completions": (12.0, 11.0)}
    recipe = {"grpo_lab_v1": (2.0, 1.0), "trl": (18.0, 16.0), "trl_like": (10.0, 10.0)}
    e0 = f"{std.EMPTY_SHARE:g}"

    def per_step(seconds, name):
        return seconds[name][0] + std.EMPTY_SHARE * seconds[name][1]

    alone = summarize(design, [], [amended(1, first)])
    ratios = alone["amendments"]["1"]["at_share"][e0]
    assert ratios.keys() == {"every_position"} and ratios["every_position"]["ratio"] == pytest.approx(
        per_step(first, "trl") / per_step(first, "trl_completions"))
    assert alone["seconds"] == {} and alone["time_ratios"] == {}          # not read as the recipe's run
    assert alone["amendments_joined"] is None
    assert alone["missing_amendments"] == ["addsubmul1_8_a2", "gsm_symbolic_128_a5", "addsubmul1_8_a6"]
    two_machines = summarize(design, [], [amended(1, first), bench_of(recipe, cpu="B")])
    assert "rest" not in two_machines["amendments"]["1"]["at_share"][e0]
    one_machine = summarize(design, [], [amended(1, first), bench_of(recipe)])
    rest = one_machine["amendments"]["1"]["at_share"][e0]["rest"]
    assert rest["ratio"] == pytest.approx(per_step(first, "trl_completions") / per_step(first, "trl")
                                          * per_step(recipe, "trl") / per_step(recipe, "trl_like"))
    assert rest["ci_low"] == pytest.approx(rest["ci_high"])
    both = summarize(design, [], [amended(1, first), amended(2, second)])
    assert both["amendments"]["2"]["at_share"][e0]["rest"]["ratio"] == pytest.approx(
        per_step(second, "trl_completions") / per_step(second, "trl_like"))
    assert both["amendments_joined"]["at_share"][e0]["trl_over_trl_like"]["ratio"] == pytest.approx(
        per_step(first, "trl") / per_step(first, "trl_completions")
        * per_step(second, "trl_completions") / per_step(second, "trl_like"))
    assert both["missing_amendments"] == ["gsm_symbolic_128_a5", "addsubmul1_8_a6"]
    assert summarize(design, [], [amended(1, first), amended(2, second, cpu="B")])["amendments_joined"] is None
    with pytest.raises(ValueError, match="another version"):
        summarize(design, [], [{**amended(1, first), "amendment_sha": "other"}])
    with pytest.raises(ValueError, match=r"amendments \[3\]"):          # amendment 3 has units, no benchmark
        summarize(design, [], [{**amended(1, first), "amendment": 3}])


def test_agreement_with_an_earlier_ratio_respects_its_bound():
    """Exact: the intervals overlap; a lower bound: the product reaches its interval's low end; an upper bound: it
    comes down to the high end. A product without an interval counts as its point."""
    def earlier(bound):
        return {"ratio": 1.0, "ci_low": 0.8, "ci_high": 1.2, "bound": bound}

    def product(ratio, low=None, high=None):
        return {"ratio": ratio, "ci_low": low, "ci_high": high}

    assert agrees(earlier("exact"), product(1.3, 1.15, 1.4)) and not agrees(earlier("exact"), product(1.3, 1.25, 1.4))
    assert not agrees(earlier("exact"), product(0.7, 0.6, 0.75))
    assert agrees(earlier("lower"), product(5.0)) and agrees(earlier("lower"), product(0.7, 0.6, 0.85))
    assert not agrees(earlier("lower"), product(0.7, 0.6, 0.75))
    assert agrees(earlier("upper"), product(0.1)) and not agrees(earlier("upper"), product(1.5, 1.3, 1.7))
    assert not agrees(earlier("neither"), product(1.0, 0.9, 1.1))


def test_the_issue38_check_pairs_each_arm_with_its_product():
    """The loop's mean seconds by the product are N̄ × its seconds a step; TRL's pair is the time ratio against the
    earlier loop ÷ TRL, each side's its per-step ratio at e₀ against the earlier side ÷ loop, matched by name."""
    def entry(ratio, low, high, bound="exact"):
        return {"ratio": ratio, "ci_low": low, "ci_high": high, "bound": bound}

    earlier = {"arms": {"grpo_lab_v1": {"50%": {"restricted_mean": 140.0}}},
               "time_ratios": {"grpo_lab_v1": {"50%": entry(0.23, 0.16, 0.30, "upper")}},
               "time_ratios_to_v1": {"grpo_lab_v1_empty_backward": {"50%": entry(0.96, 0.64, 1.44)},
                                     "grpo_lab_v1_no_share_prompt": {"50%": entry(3.4, 3.2, 5.0, "lower")}}}
    e0 = f"{std.EMPTY_SHARE:g}"
    seconds = {"at_share": {e0: {"to_v1": {"empty_backward": entry(1.08, 1.07, 1.09),
                                           "no_share_prompt": entry(2.96, 2.90, 3.05), "trl": entry(5.6, 5.3, 5.8)}}}}
    time_ratios = {"50%": {"ratio": 0.15, "ci_low": 0.12, "ci_high": 0.19, "steps": 30.0, "seconds_per_step": 4.5}}
    check = issue38_check(earlier, seconds, time_ratios)["50%"]
    assert check["loop_seconds"] == {"product": 135.0, "issue38": 140.0}
    assert check["ratios"].keys() == {"trl", "empty_backward", "no_share_prompt"}
    assert check["ratios"]["trl"]["product"] == {"ratio": 0.15, "ci_low": 0.12, "ci_high": 0.19}
    assert check["ratios"]["trl"]["issue38"]["bound"] == "upper" and check["ratios"]["trl"]["agrees"]
    assert check["ratios"]["empty_backward"]["agrees"]
    assert not check["ratios"]["no_share_prompt"]["agrees"]       # 3.05 falls short of a lower bound's 3.2


def test_completion_scoring_scores_the_completions_only_and_gives_the_same_log_probs():
    """TRL's fused LM head on a tiny model, the prompt's labels masked as TRL masks them: off a Triton device it
    scores every position; under ``completion_scoring`` only the completion positions, with the same
    log-probabilities there (to 1e-6) and gradients (to 1e-5 of each one's largest entry at one or two threads: the
    tiles hold other rows). The switch is undone after the block."""
    import trl.trainer.utils as trl_utils

    from studies.time_to_accuracy.trl_side import completion_scoring

    model = tiny_model()
    trl_utils.add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    torch.manual_seed(0)
    ids = torch.randint(3, 100, (3, 9))
    labels = ids.clone()
    labels[:, :6] = -100                               # prompt of 6, completions of 3 (TRL keeps the last 3 logits)
    scored = []
    apply = trl_utils._ChunkedLogProbFunction.apply

    def counted(hidden, *args):
        scored.append(hidden.shape[0])
        return apply(hidden, *args)

    def run():
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels, fused_lm_head=True)
        out.log_probs[:, -3:].sum().backward()
        return out.log_probs[:, -3:].detach(), [p.grad.clone() for p in model.parameters()]

    trl_utils._ChunkedLogProbFunction.apply = counted
    try:
        every, every_grads = run()
        with completion_scoring():
            completions, completion_grads = run()
        again, _ = run()
    finally:
        trl_utils._ChunkedLogProbFunction.apply = apply
    assert scored == [3 * 8, 3 * 3, 3 * 8]           # shifted: 8 positions a row, 3 of them completion tokens'
    assert torch.allclose(completions, every, atol=1e-6) and torch.equal(again, every)
    worst = max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(completion_grads, every_grads, strict=True))
    assert worst < 1e-5, worst          # of each gradient's largest entry: the tiles sum in another order


def test_trl_units_train_scoring_completions_only_and_record_amendment_3(tmp_path, one_thread):
    """A TRL unit (the study's ``trl`` arm) on a tiny model: every fused LM head call in its training runs with the
    scoring switch on (a spy reads it at each call), the unit records amendment 3, the switch is off afterwards, and
    the summary refuses a TRL unit without the amendment."""
    import trl.trainer.utils as trl_utils

    from studies.steps_to_target.summary import summarize as summarize_units

    model, tok, questions = tiny_model(), tokenizer(), list(problems()[:2])
    base = TrainConfig(G=2, prompts_per_step=2, lr=1e-3, max_completion_length=3, train_problems=20,
                       micro_batch_size=4, scoring="strict", temperature=1.0, sync_audit=False)
    design = {"task": "add1", "lr": 1e-3, "targets": {"targets": {"50%": 2.0}, "untrained_j": None,
                                                      "questions": "all", "question_count": 2, "fixed_on": "made up"},
              "arms": ["grpo_lab_v1", "trl"], "order": [["trl", 7]], "every": 2, "min_steps": 2, "cap": 2,
              "batch_cap": 4, "threads": 1, "eval_threads": 1,
              "per_update": {"steps": [2], "margin": 0.051, "alpha": 0.05},
              "time_ratio": {"resamples": 200, "bootstrap_seed": 1, "level": 0.95}, "benchmark": {"runs": []}}
    from studies.lag_frontier.frontier import exact_j

    design["targets"]["untrained_j"] = exact_j(model, tok, questions, base).mean
    (tmp_path / "design.json").write_text(json.dumps(design))
    switched = []
    apply = trl_utils._ChunkedLogProbFunction.apply

    def spy(*args):
        switched.append(trl_utils._use_triton(torch.device("cpu")))
        return apply(*args)

    trl_utils._ChunkedLogProbFunction.apply = spy
    try:
        (unit,) = run_units(tmp_path, ROOT, model=model, tokenizer=tok, questions=questions,
                            problems=lambda config: problems(), base=base, log=lambda line: None)
    finally:
        trl_utils._ChunkedLogProbFunction.apply = apply
    assert switched and all(switched) and not trl_utils._use_triton(torch.device("cpu"))
    assert unit["amendment"] == 3 and unit["scoring"] == "completion positions"
    assert unit["amendment_sha"] == std.amendment_sha(std.AMENDMENT_3)
    with pytest.raises(ValueError, match="another version of it"):
        summarize_units(design, [{k: v for k, v in unit.items() if k != "amendment_sha"}], [])


# ----------------------------------------------------------------------------- the step clock


def test_the_step_clock_evaluates_every_k_optimiser_steps_and_stops_by_its_rules():
    def run(stepped, js, **kwargs):
        clock = StepClock(**{"every": 2, "cap": 8, "min_steps": 4, "stop_at": 0.6, "batch_cap": 12, **kwargs})
        clock.start()
        values = iter(js)
        for s in stepped:
            if clock.after_step(s, lambda: (next(values), {})):
                break
        return clock

    # passes 0.6 at 2 optimiser steps, but trains on to min_steps = 4
    clock = run([True, False, True, True, True, True], [0.7, 0.5])
    assert [(p["optimizer_steps"], p["steps"]) for p in clock.points] == [(2, 3), (4, 5)]
    assert clock.stopped_by == "targets" and len(clock.step_log) == 5
    clock = run([True] * 20, [0.1, 0.2, 0.3, 0.4, 0.5])
    assert clock.stopped_by == "cap" and clock.optimizer_steps == 8 and len(clock.points) == 4
    clock = run([False] * 20, [])
    assert clock.stopped_by == "batch_cap" and clock.points == [] and len(clock.step_log) == 12
    with pytest.raises(ValueError, match="multiples of every"):
        StepClock(every=2, cap=7, min_steps=4, stop_at=0.6, batch_cap=12)


# ----------------------------------------------------------------------------- the committed design


def test_the_committed_design_is_design_py_and_its_numbers_follow_from_the_data():
    committed = json.loads((std.HERE / "design.json").read_text())
    assert committed == json.loads(json.dumps(std.design_record()))
    passages = std.issue38_passages()
    slowest = max(p.steps for seeds in passages.values() for p in seeds)
    assert slowest == 71 and std.CAP == std.cap_from(passages) >= 2 * slowest and std.CAP % std.EVERY == 0
    assert std.EMPTY_SHARE == pytest.approx(std.empty_share(passages["80%"]))
    assert [p.steps for p in passages["50%"]] == [29, 39, 38, 24, 34]
    assert std.EVERY <= 5 and all(n % std.EVERY == 0 for n in std.TOST_STEPS) and std.MIN_STEPS <= std.CAP
    assert min(len(std.LOOP_SEEDS), len(std.TRL_SEEDS)) >= 5 and std.PAIRS >= 10
    assert all(pairs >= 10 for _, _, pairs, _ in std.SECONDS_TASKS)
    assert {name for group in std.RECIPE_GROUPS for name in group} == set(std.SIDES)         # every side, in groups
    assert all(len(group) <= 4 for _, _, _, groups in std.SECONDS_TASKS for group in groups)  # 4 sides fit in 23 GiB
    assert sorted(committed["order"]) == sorted([[std.LOOP, s] for s in std.LOOP_SEEDS]
                                                + [[std.REFERENCE, s] for s in std.TRL_SEEDS])
    assert committed["targets"]["targets"] == json.loads((std.TARGETS).read_text())["targets"]


# ----------------------------------------------------------------------------- the benchmark's pieces


def test_forced_rewards_give_every_group_signal_or_none():
    bench = benchmark_module()
    loop = bench.forced_rewards(torch.rand(3, 4), "signal", 4, per_completion=False)
    assert loop.tolist() == [[1.0, 0.0, 0.0, 0.0]] * 3
    trl = bench.forced_rewards(torch.rand(8, 1, dtype=torch.float64), "signal", 4, per_completion=True)
    assert trl.dtype == torch.float64 and trl[:, 0].tolist() == [1, 0, 0, 0, 1, 0, 0, 0]
    assert not bench.forced_rewards(torch.rand(8, 2), "empty", 4, per_completion=True).any()
    with pytest.raises(ValueError, match="mode"):
        bench.forced_rewards(torch.rand(2, 2), "half", 2, per_completion=False)


def test_turns_run_a_trainer_one_step_per_turn_and_stop_it():
    bench = benchmark_module()
    done = []

    def trainer(between):
        between()                    # built, before the first step
        while True:
            done.append(len(done))
            if between():
                return

    turns = bench.Turns(trainer)
    assert done == []
    turns.turn()
    turns.turn()
    assert done == [0, 1]
    turns.close()
    assert done == [0, 1] and not turns._thread.is_alive()      # told to stop between steps: no step more

    def failing(between):
        between()
        raise KeyError("boom")

    turns = bench.Turns(failing)
    with pytest.raises(RuntimeError, match="failed"):
        turns.turn()


def test_the_benchmark_refuses_a_group_the_task_does_not_have(capsys):
    with pytest.raises(SystemExit):
        benchmark_module().main(["--group", "3"])
    assert "--group [3]: addsubmul1 has groups 1 to 2" in capsys.readouterr().err


def test_the_benchmark_runs_each_group_in_a_process_of_its_own(monkeypatch, tmp_path):
    bench = benchmark_module()
    calls = []
    monkeypatch.setattr(bench.subprocess, "run", lambda command, check: calls.append(command))
    bench.main(["--threads", "2", "--out", str(tmp_path)])
    assert [c[c.index("--group") + 1] for c in calls] == ["1", "2"]
    assert all(c[1].endswith("step_seconds.py") and c[c.index("--out") + 1] == str(tmp_path) for c in calls)


def test_interleave_draws_an_order_per_round_and_checks_the_steps():
    bench = benchmark_module()

    class Fake:
        def __init__(self, honest=True):
            self.honest, self.calls = honest, []

        def step(self, mode):
            self.calls.append(mode)
            return {"seconds": 1.0, "stepped": (mode == "signal") == self.honest, "tokens": 3}

    sides = {"a": Fake(), "b": Fake(), "c": Fake()}
    rounds = bench.interleave(sides, rounds=3, warmup=1, order_seed=5)
    assert [r["warmup"] for r in rounds] == [True, False, False, False]
    assert all(s.calls == ["signal", "empty"] * 4 for s in sides.values())
    assert len({tuple(r["order"]["signal"]) for r in rounds}) > 1          # the order changes between rounds
    with pytest.raises(RuntimeError, match="did not step"):
        bench.interleave({"a": Fake(honest=False)}, rounds=1, warmup=0, order_seed=5)


def test_each_side_takes_the_forced_step_on_a_tiny_model(one_thread):
    """The loop's sides (the defaults and the TRL-like one) and TRL's, one signal and one empty step each: the
    forced rewards reach every trainer (the signal step steps, the empty one does not), TRL in its own thread, and
    every side's π_θ is back at its starting weights after its steps."""
    bench = benchmark_module()
    base = TrainConfig(G=2, prompts_per_step=2, lr=1e-3, max_completion_length=3, train_problems=20,
                       micro_batch_size=4, scoring="strict", temperature=1.0, sync_audit=False, seed=0)
    model = tiny_model()
    sides = bench.build_sides(["grpo_lab_v1", "trl_like", "trl", "trl_completions"], base, model, tokenizer(),
                              problems())
    try:
        rounds = bench.interleave(sides, rounds=1, warmup=0, order_seed=0)
    finally:
        sides["trl"].turns.close()
        sides["trl_completions"].turns.close()
    steps = rounds[0]["sides"]
    assert all(steps[name]["signal"]["stepped"] and not steps[name]["empty"]["stepped"] for name in sides)
    assert steps["trl"]["signal"]["tokens"] == steps["grpo_lab_v1"]["signal"]["tokens"] == 4 * 3   # P·G rows, 3 each
    assert sides["trl_like"].described()["sampler"] == "GenerateSampler"
    assert sides["trl"].described()["trl_config"]["num_generations"] == 2
    assert [sides[name].described()["scoring"] for name in ("trl", "trl_completions")] == [
        "every position", "completion positions"]
    assert {name for a in std.AMENDMENTS for name in a.get("sides", {})} <= set(bench.TRL_VARIANTS)  # a builder each
    for side in sides.values():      # AdamW stepped, then π_θ went back to its starting weights
        trained = side.untrained.model.state_dict()
        assert all(torch.equal(trained[name], value) for name, value in model.state_dict().items())


def test_micro_batches_of_two_step_every_side_trl_accumulating_over_them(one_thread):
    """Amendment 5's setting on a tiny model: P·G = 4 rows at 2 sequences a forward. The loop's side runs two
    micro-batches, TRL's side a per-device batch of 2 with 2 accumulation steps, one optimiser step on the 4
    completions of one generation; each side's file says what it ran, which the summary checks."""
    bench = benchmark_module()
    base = TrainConfig(G=2, prompts_per_step=2, lr=1e-3, max_completion_length=3, train_problems=20,
                       micro_batch_size=4, scoring="strict", temperature=1.0, sync_audit=False, seed=0)
    sides = bench.build_sides(["grpo_lab_v1", "trl"], base, tiny_model(), tokenizer(), problems(),
                              micro_batch_size=2)
    try:
        rounds = bench.interleave(sides, rounds=1, warmup=0, order_seed=0)
    finally:
        sides["trl"].turns.close()
    steps = rounds[0]["sides"]
    assert all(steps[name]["signal"]["stepped"] and not steps[name]["empty"]["stepped"] for name in sides)
    assert steps["trl"]["signal"]["tokens"] == 4 * 3                       # one generation of P·G rows a step
    trl = sides["trl"].described()["trl_config"]
    assert (trl["per_device_train_batch_size"], trl["gradient_accumulation_steps"], trl["steps_per_generation"]) \
        == (2, 2, 2)
    described = {"task": "gsm_symbolic", "tokens": 3, "sides": {n: s.described() for n, s in sides.items()}}
    check_micro_batch(described, 2)
    with pytest.raises(ValueError, match=r"sides \{'grpo_lab_v1': 2, 'trl': 2\} did not run micro-batches of 8"):
        check_micro_batch(described, 8)


def test_amendment_5_is_read_as_the_128_token_run_it_replaces():
    """A made-up file of amendment 5 (constant seconds, every side at its micro-batch) is read in the design's
    128-token run's place: its decomposition in ``seconds``, neither it nor that run missing. A side at another
    micro-batch, a file of another version of the amendment, or a design file of the replaced run is refused; the
    benchmark refuses to run the replaced run."""
    amendment = std.AMENDMENTS[4]
    (run,) = amendment["runs"]
    seconds = {"grpo_lab_v1": (2.0, 1.0), "generate_sampler": (3.0, 1.5), "trl_like": (5.0, 2.0), "trl": (8.0, 6.0)}

    def file_of(micro=run["micro_batch_size"], **extra):
        return micro_batch_file(5, seconds, design, micro, **extra)

    design = made_up_design([{"task": "gsm_symbolic", "tokens": 128, "groups": [list(seconds)]}])
    summary = summarize(design, [], [file_of()])
    at = summary["seconds"]["gsm_symbolic_128"]["at_share"]["0"]
    assert at["to_v1"]["trl"]["ratio"] == pytest.approx(4.0) and at["unexplained"]["ratio"] == pytest.approx(1.6)
    assert summary["missing_seconds"] == []
    assert summary["missing_amendments"] == ["addsubmul1_8_a1", "addsubmul1_8_a2", "addsubmul1_8_a6"]
    with pytest.raises(ValueError, match=f"did not run micro-batches of {run['micro_batch_size']}"):
        summarize(design, [], [file_of(micro=16)])
    with pytest.raises(ValueError, match="another version"):
        summarize(design, [], [file_of(amendment_sha="0" * 64)])
    stale = {k: v for k, v in file_of().items() if k not in ("amendment", "amendment_sha")}
    with pytest.raises(ValueError, match="replace"):
        summarize(design, [], [file_of(), stale])
    with pytest.raises(SystemExit):
        benchmark_module().main(["--task", "gsm_symbolic", "--tokens", "128"])


def test_amendment_6_reads_the_8_token_group_at_amendment_5s_micro_batch_beside_the_recipe():
    """A made-up file of amendment 6 (constant seconds): its four ratios, known by hand at e₀, sit in ``amendments``
    and not in the recipe's decomposition; a side at another micro-batch is refused."""
    amendment = std.AMENDMENTS[5]
    (run,) = amendment["runs"]
    assert (run["task"], run["tokens"], run["micro_batch_size"]) == ("addsubmul1", 8, 4)
    assert run["groups"] == std.AMENDMENTS[4]["runs"][0]["groups"]            # amendment 5's four sides
    seconds = {"grpo_lab_v1": (2.0, 1.0), "generate_sampler": (3.0, 1.5), "trl_like": (5.0, 2.0), "trl": (8.0, 6.0)}

    def file_of(micro=4):
        return micro_batch_file(6, seconds, design, micro, cpu_model="A")

    design = made_up_design()
    summary = summarize(design, [], [file_of()])
    at = summary["amendments"]["6"]["at_share"][f"{std.EMPTY_SHARE:g}"]
    step = {name: c + std.EMPTY_SHARE * e for name, (c, e) in seconds.items()}
    for name, (a, b) in {"trl": ("trl", "grpo_lab_v1"), "trl_like": ("trl_like", "grpo_lab_v1"),
                         "generate_sampler": ("generate_sampler", "grpo_lab_v1"),
                         "unexplained": ("trl", "trl_like")}.items():
        assert at[name]["ratio"] == pytest.approx(step[a] / step[b]), name
    assert summary["seconds"] == {} and "addsubmul1_8_a6" not in summary["missing_amendments"]
    with pytest.raises(ValueError, match="did not run micro-batches of 4"):
        summarize(design, [], [file_of(micro=32)])


# ----------------------------------------------------------------------------- a sitting on a tiny model


def test_a_sitting_of_the_loop_and_trl_on_a_tiny_model(tmp_path, one_thread):
    """A unit of the loop and one of TRL (stock, so that a tiny model's empty batches still step AdamW), exact J
    every 2 optimiser steps to a cap of 4 (the targets are out of reach: both are censored there), one held by
    another process first; then the summary with a made-up benchmark file."""
    from studies.lag_frontier.frontier import exact_j

    model, tok, questions = tiny_model(), tokenizer(), list(problems()[:2])
    base = TrainConfig(G=2, prompts_per_step=2, lr=1e-3, max_completion_length=3, train_problems=20,
                       micro_batch_size=4, scoring="strict", temperature=1.0, sync_audit=False,
                       empty_step="optimizer_step")
    untrained = exact_j(model, tok, questions, base).mean
    design = {"task": "add1", "lr": 1e-3, "targets": {"targets": {"50%": untrained + 0.3, "80%": untrained + 0.5},
                                                      "untrained_j": untrained, "questions": "all",
                                                      "question_count": 2, "fixed_on": "made up"},
              "arms": ["grpo_lab_v1", "trl_every_batch"], "order": [["trl_every_batch", 7], ["grpo_lab_v1", 7]],
              "every": 2, "min_steps": 2, "cap": 4, "batch_cap": 6, "threads": 1, "eval_threads": 1,
              "per_update": {"steps": [4, 2], "margin": 0.051, "alpha": 0.05},
              "time_ratio": {"resamples": 200, "bootstrap_seed": 1, "level": 0.95},
              "benchmark": {"runs": [{"task": "add1", "tokens": 3, "groups": [["grpo_lab_v1", "trl"],
                                                                              ["grpo_lab_v1", "empty_backward"]]}]}}
    (tmp_path / "design.json").write_text(json.dumps(design))
    kwargs = dict(model=model, tokenizer=tok, questions=questions, problems=lambda config: problems(), base=base,
                  log=lambda line: None)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with UnitLock(tmp_path / "units" / "trl_every_batch_s7.json") as held:   # another process runs TRL's unit
        assert held
        done = run_units(tmp_path, ROOT, **kwargs)
    assert [u["arm"] for u in done] == ["grpo_lab_v1"]
    done += run_units(tmp_path, ROOT, arms=["trl_every_batch"], **kwargs)
    assert [u["arm"] for u in done] == ["grpo_lab_v1", "trl_every_batch"] and run_units(tmp_path, ROOT, **kwargs) == []
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())     # each unit trained a copy
    assert not list((tmp_path / "units").glob("*.lock"))
    for unit in done:
        assert {"git_commit", "tree_dirty", "cpu_model", "cpu_vector", "torch", "transformers", "trl",
                "torch_threads", "load_start", "load_end", "wall_seconds", "eval_seconds"} <= set(unit)
        assert unit["design_sha"] == design_sha(design) and unit["stopped_by"] == "cap"
        assert [p["optimizer_steps"] for p in unit["points"]] == [2, 4] and unit["optimizer_steps"] == 4
        assert all(len(p["j_per_question"]) == 2 for p in unit["points"])
    trl = next(u for u in done if u["arm"] == "trl_every_batch")
    assert trl["trl_config"]["num_generations"] == 2 and trl["trl_config"]["beta"] == 0.0    # TRL's resolved args
    assert "records" in next(u for u in done if u["arm"] == "grpo_lab_v1")

    rounds = [{"warmup": w, "sides": {s: {m: {"seconds": c, "stepped": m == "signal", "tokens": 4}
                                          for m, c in (("signal", 1.0 + i), ("empty", 0.5))}
                                      for s in ("grpo_lab_v1", "trl")}} for i, w in enumerate((True, False, False))]
    bench = {"task": "add1", "tokens": 3, "group": 1, "design_sha": design_sha(design),
             "sides": {"grpo_lab_v1": {}, "trl": {}}, "rounds": rounds}
    summary = summarize(design, done, [bench])
    assert summary["passages"]["grpo_lab_v1"]["80%"] == [[4, 0, False]] and summary["missing"] == []
    assert summary["per_update"] is None                                 # one seed an arm: no test yet
    assert summary["time_ratios"]["50%"]["ratio"] is None                # both censored at the cap
    assert summary["seconds"]["add1_3"]["groups"][0]["sides"]["trl"] == {"c": 2.5, "c_empty": 0.5, "tokens": 4.0}
    assert summary["missing_seconds"] == ["add1_3_g2"]
    assert summary["runs"][0]["curve"].keys() == {"0", "2", "4"} and summary_lines(summary)
    with pytest.raises(ValueError, match="another design"):
        summarize(design, done, [{**bench, "design_sha": "other"}])
