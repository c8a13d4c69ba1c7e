"""Time to accuracy (issue 38): the statistic on made-up times whose answers are worked out by hand, the design,
the clock that takes evaluation off, the summary from made-up units, and a whole sitting on a tiny model (every
kind of arm, TRL's GRPOTrainer included); the committed targets and design."""

import itertools
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from reliability_runs import problems, tiny_model, tokenizer

from grpo_lab.lm.train_config import TrainConfig
from studies.stats import passage
from studies.time_to_accuracy import design as tta
from studies.time_to_accuracy import units as tta_units
from studies.time_to_accuracy.plots import tta_curves_figure, tta_ratio_figure
from studies.time_to_accuracy.summary import ratio_table, rebuild_summary, summarize, targets_from_frontier
from studies.time_to_accuracy.trl_side import skip_empty_batch, trl_config

# ----------------------------------------------------------------------------- the statistic, by hand


def test_first_passage_is_the_first_evaluation_at_or_above_the_target_without_interpolation():
    curve = {0.0: 0.1, 31.2: 0.3, 60.5: 0.5, 92.0: 0.45, 121.0: 0.7}
    assert passage.first_passage(curve, 0.4) == 60.5            # not 45.9, where a line through 0.3 and 0.5 meets it
    assert passage.first_passage(curve, 0.5) == 60.5
    assert passage.first_passage(curve, 0.6) == 121.0           # the dip at 92 s does not matter
    assert passage.first_passage(curve, 0.1) == 0.0
    assert passage.first_passage(curve, 0.71) is None
    assert passage.first_passage({121.0: 0.7, 0.0: 0.1, 60.5: 0.5}, 0.45) == 60.5   # read in time order


def test_kaplan_meier_by_hand():
    # events at 30 (1 of 5 at risk) and 50 (2 of 4): S = 4/5, then 4/5 · 2/4 = 2/5
    times, follow = [50.0, None, 30.0, 50.0, None], [600, 600, 600, 600, 610]
    assert passage.kaplan_meier(times, follow) == [(30.0, pytest.approx(0.8)), (50.0, pytest.approx(0.4))]
    assert passage.km_median(times, follow) == 50.0
    # a seed censored at 80 s leaves the risk set before the first event: S = 2/3 at 100, 1/3 at 200
    early = [None, 100.0, 200.0, 300.0]
    assert passage.kaplan_meier(early, [80, 600, 600, 600]) == [(100.0, pytest.approx(2 / 3)),
                                                               (200.0, pytest.approx(1 / 3)), (300.0, 0.0)]
    assert passage.km_median(early, [80, 600, 600, 600]) == 200.0
    assert passage.km_median([10.0, 20.0, 30.0, 40.0], [600] * 4) == 20.0       # S(20) = 0.5: the lower middle
    assert passage.km_median([100.0, None, None, 200.0, None], [600] * 5) is None   # S falls to 0.6 only
    assert passage.reached_share([100.0, None, None, 200.0, None]) == pytest.approx(0.4)


def test_restricted_times_need_censored_seeds_followed_to_the_budget():
    assert passage.restricted_times([60.0, None, 615.0], [600, 601, 615], 600).tolist() == [60.0, 600.0, 600.0]
    with pytest.raises(ValueError, match="stopped before the budget"):
        passage.restricted_times([60.0, None], [600, 420], 600)


def test_time_ratio_is_the_ratio_of_restricted_means():
    arm, reference = [60.0, 90.0, 120.0, 60.0, 90.0], [300.0, None, 450.0, None, 600.0]
    result = passage.time_ratio(arm, reference, 600.0)
    # arm: mean 84; reference: (300 + 600 + 450 + 600 + 600) / 5 = 510
    assert result["ratio"] == pytest.approx(84 / 510)
    assert result["restricted_mean"] == pytest.approx(84) and result["reference_restricted_mean"] == pytest.approx(510)
    assert (result["reached_share"], result["reference_reached_share"]) == (1.0, pytest.approx(0.6))
    assert result["ci_low"] < result["ratio"] < result["ci_high"] and result["note"] == ""
    assert passage.time_ratio(arm, reference, 600.0) == result                   # the fixed generator


def test_the_bootstrap_interval_matches_the_exact_bootstrap_distribution():
    """With 4 seeds an arm has 4^4 = 256 equally likely resamples: the exact bootstrap distribution of the ratio is
    every pair of them. The Monte Carlo interval's ends lie within its sampling error of the exact quantiles."""
    arm, reference = [60.0, 90.0, 150.0, None], [200.0, 350.0, None, 500.0]
    a = np.array([600.0 if t is None else t for t in arm])
    r = np.array([600.0 if t is None else t for t in reference])
    draws = np.array(list(itertools.product(range(4), repeat=4)))
    ratios = (a[draws].mean(1)[:, None] / r[draws].mean(1)[None, :]).ravel()
    low, high = np.quantile(ratios, [0.025, 0.975])
    result = passage.time_ratio(arm, reference, 600.0)
    assert result["ci_low"] == pytest.approx(low, abs=0.01) and result["ci_high"] == pytest.approx(high, abs=0.02)
    assert result["unresolved_resamples"] == 0.0          # every resample of the reference holds a reached seed


def test_what_censoring_leaves_not_resolved():
    nobody = passage.time_ratio([None] * 5, [None] * 5, 600.0)
    assert nobody["ratio"] is None and nobody["ci_low"] is None and "neither arm reached" in nobody["note"]
    # one reached seed each: (4/5)^5 of an arm's resamples hold none, (4/5)^10 ≈ 10.7 % of pairs neither
    sparse = passage.time_ratio([None, None, None, None, 100.0], [None, None, None, None, 200.0], 600.0)
    assert sparse["ratio"] == pytest.approx((4 * 600 + 100) / (4 * 600 + 200))
    assert sparse["ci_low"] is None and "interval not resolved" in sparse["note"]
    assert sparse["unresolved_resamples"] == pytest.approx(0.8**10, abs=0.01)
    few = passage.time_ratio([60.0, 90.0], [300.0, 400.0], 600.0)
    assert few["ratio"] == pytest.approx(75 / 350) and few["ci_low"] is None and "3 needed" in few["note"]
    at_start = passage.time_ratio([0.0, 30.0, 60.0], [0.0, 0.0, 0.0], 600.0)
    assert at_start["ratio"] is None and "untrained J" in at_start["note"]
    # the reference never reaches it, the arm does: a ratio within the budget, bounded by the budget
    bounded = passage.time_ratio([60.0, 90.0, 120.0], [None, None, None], 600.0)
    assert bounded["ratio"] == pytest.approx(90 / 600) and bounded["ci_high"] <= 120 / 600
    assert bounded["bound"] == "upper"


@pytest.mark.parametrize(("arm", "reference", "bound"), [
    ([60.0, 90.0, 120.0], [300.0, 400.0, 500.0], "exact"),
    ([60.0, 90.0, 120.0], [300.0, None, 500.0], "upper"),
    ([60.0, None, 120.0], [300.0, 400.0, 500.0], "lower"),
    ([60.0, None, 120.0], [300.0, None, 500.0], "neither"),
])
def test_the_bound_censoring_makes_holds_for_every_completion_of_the_censored_times(arm, reference, bound):
    """Censored seeds replaced by any times past the budget: the ratio of mean times lies on the side the
    bound names (both sides for ``neither``, equal for ``exact``)."""
    result = passage.time_ratio(arm, reference, 600.0)
    assert result["bound"] == bound and passage.censoring_bound(arm, reference) == bound
    ratios = []
    for late in (600.0, 900.0, 6000.0):
        for early in (600.0, 650.0):
            a = [late if t is None else t for t in arm]
            r = [early if t is None else t for t in reference]
            ratios += [np.mean(a) / np.mean(r), np.mean([early if t is None else t for t in arm]) /
                       np.mean([late if t is None else t for t in reference])]
    below = [x <= result["ratio"] + 1e-12 for x in ratios]
    above = [x >= result["ratio"] - 1e-12 for x in ratios]
    expected = {"exact": all(below) and all(above), "upper": all(below) and not all(above),
                "lower": all(above) and not all(below), "neither": not all(below) and not all(above)}
    assert expected[bound]


# ----------------------------------------------------------------------------- the design


def test_the_arms_and_the_seeded_interleaved_order():
    names = [arm.name for arm in tta.arms()]
    assert names == ["grpo_lab_v1", "grpo_lab_v1_no_share_prompt", "grpo_lab_v1_empty_backward",
                     "grpo_lab_v4_ratio", "trl", "trl_every_batch"]
    assert tta.arms(16, "truncated")[3].changes == {"v": 16, "is_correction": "truncated"}
    order = tta.unit_order(names, seeds=5)
    assert order == tta.unit_order(names, seeds=5) != tta.unit_order(names, seeds=5, order_seed=1)
    blocks = [order[i:i + 6] for i in range(0, 30, 6)]
    assert all(sorted(a for a, _ in block) == sorted(names) and {s for _, s in block} == {n}
               for n, block in enumerate(blocks))
    assert len({tuple(a for a, _ in block) for block in blocks}) > 1         # interleaved, not one fixed order
    with pytest.raises(ValueError, match="v > 1"):
        tta.arms(1)


def test_arm_configs_change_one_thing_each():
    base = TrainConfig(G=8, prompts_per_step=4, v=1, micro_batch_size=32, scoring="strict")
    configs = {arm.name: tta.arm_config(base, arm, 3) for arm in tta.arms()}
    assert all(c.seed == 3 for c in configs.values())
    changed = {name: {k for k, v in c.to_dict().items() if v != configs["grpo_lab_v1"].to_dict()[k]}
               for name, c in configs.items()}
    assert changed == {"grpo_lab_v1": set(), "grpo_lab_v1_no_share_prompt": {"share_prompt"},
                       "grpo_lab_v1_empty_backward": {"empty_step"}, "grpo_lab_v4_ratio": {"v"}, "trl": set(),
                       "trl_every_batch": set()}
    assert configs["grpo_lab_v1_empty_backward"].empty_step == "skip_after_backward"
    assert [a.skip_empty for a in tta.arms() if a.trainer == "trl"] == [True, False]


def test_the_shared_recipe_is_the_frontiers_at_v1_in_one_micro_batch():
    base = tta.shared_recipe("addsubmul1", 1e-5)
    assert (base.task, base.lr, base.scoring, base.empty_step, base.v, base.i) == ("addsubmul1", 1e-5, "strict",
                                                                                   "skip", 1, 1)
    assert base.micro_batch_size == base.prompts_per_step * base.G and base.checkpoint_every == 0


def targets_file(path, untrained=0.1, levels=None, **extra):
    content = {"evaluation": "exact", "task": "addsubmul1", "lr": 1e-5, "fixed_on": "2026-12-02",
               "untrained_j": untrained, "targets": levels or {"50%": 0.4, "80%": 0.6}, **extra}
    path.write_text(json.dumps(content))
    return path


def test_targets_are_read_from_their_file_and_must_lie_above_the_untrained_j(tmp_path):
    committed = tta.load_targets(tta.committed_dir() / "targets.json")
    assert committed["evaluation"] == "exact" and set(committed["targets"]) == {"50%", "80%"}
    with pytest.raises(ValueError, match="do not lie above"):
        tta.load_targets(targets_file(tmp_path / "t.json", untrained=0.5))
    (tmp_path / "u.json").write_text('{"evaluation": "exact", "targets": {}}')
    with pytest.raises(ValueError, match="fixed_on"):
        tta.load_targets(tmp_path / "u.json")
    every = tta.eval_questions({"task": "addsubmul1", "questions": {"every": 3}})
    assert len(every) == 121 and every[1].question == tta.eval_questions({"task": "addsubmul1"})[3].question


def test_the_design_is_written_once(tmp_path):
    targets = tta.load_targets(targets_file(tmp_path / "t.json"))
    design = tta.make_design(targets, threads=1, eval_threads=2, questions=363)
    assert design["order"] == [list(u) for u in tta.unit_order([a["name"] for a in design["arms"]], 5)]
    assert design["targets"]["targets"] == {"50%": 0.4, "80%": 0.6} and design["targets"]["questions"] == "all"
    assert tta.write_design(tmp_path, design) == design == tta.write_design(tmp_path, design)
    with pytest.raises(ValueError, match="another design"):
        tta.write_design(tmp_path, {**design, "budget_seconds": 300.0})
    with pytest.raises(ValueError, match="reference arm"):
        tta.make_design(targets, arm_names=["grpo_lab_v1"], threads=1, eval_threads=1, questions=363)
    assert tta.design_sha(design) != tta.design_sha({**design, "seeds": 6})


def test_targets_from_the_frontiers_per_question_j(tmp_path):
    units = tmp_path / "units"
    units.mkdir()
    (units / "untrained.json").write_text(json.dumps({"task": "t", "j_per_question": [0.1, 0.2, 0.3, 0.4]}))
    for seed, final in ((0, [0.5, 0.6, 0.7, 0.8]), (1, [0.3, 0.4, 0.5, 0.6])):
        (units / f"v1_s{seed}.json").write_text(json.dumps({"seed": seed, "lr": 1e-5, "steps": 128, "j_per_question": {
            "0": [0.1, 0.2, 0.3, 0.4], "128": final}}))
    (units / "v4_ratio_s0.json").write_text(json.dumps({"seed": 0, "steps": 128, "j_per_question": {"128": [1] * 4}}))
    whole = targets_from_frontier(tmp_path, "2026-12-03")
    # untrained 0.25; v1 0.65 and 0.45 → 0.55; gain 0.3
    assert whole["untrained_j"] == pytest.approx(0.25) and whole["v1_gain"] == pytest.approx(0.3)
    assert whole["targets"] == {"50%": pytest.approx(0.4), "80%": pytest.approx(0.49)}
    half = targets_from_frontier(tmp_path, "2026-12-03", every=2)           # questions 0 and 2
    # untrained 0.2; v1 0.6 and 0.4 → 0.5; gain 0.3
    assert half["targets"] == {"50%": pytest.approx(0.35), "80%": pytest.approx(0.44)}
    assert half["questions"] == {"every": 2} and half["question_count"] == 2 and half["fixed_on"] == "2026-12-03"
    (tmp_path / "half.json").write_text(json.dumps(half))
    assert tta.load_targets(tmp_path / "half.json")["targets"] == half["targets"]


# ----------------------------------------------------------------------------- the clock


def test_the_clock_takes_evaluation_off_evaluates_each_mark_once_and_stops(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(tta_units.time, "perf_counter", lambda: now[0])
    js = iter([0.2, 0.5, 0.7])

    def evaluate():
        now[0] += 50.0                                 # an evaluation: 50 s that the clock must not count
        return next(js), {"pruned_max": 0.0}

    clock = tta_units.MarkClock(30.0, 10.0)
    assert clock.marks == [10.0, 20.0, 30.0]
    clock.start()
    now[0] += 4.0
    assert not clock.after_step(True, evaluate) and clock.points == []
    now[0] += 7.0                                      # 11 s: the 10 s mark
    assert not clock.after_step(False, evaluate)
    assert [(p["marks"], p["training_seconds"], p["steps"], p["optimizer_steps"], p["j"]) for p in clock.points] == \
           [([10.0], 11.0, 2, 1, 0.2)]
    assert clock.seconds == 11.0 and clock.eval_seconds == 50.0
    now[0] += 10.0                                     # 21 s: the 20 s mark
    assert not clock.after_step(True, evaluate)
    now[0] += 12.0                                     # 33 s: the budget's mark, then stop
    assert clock.after_step(True, evaluate) and [p["marks"] for p in clock.points] == [[10.0], [20.0], [30.0]]
    assert [s["optimizer_step"] for s in clock.step_log] == [True, False, True, True]

    early = tta_units.MarkClock(30.0, 10.0, stop_at=0.5)
    js = iter([0.2, 0.55])
    early.start()
    now[0] += 25.0                                     # one step past two marks: evaluated once, for both
    assert not early.after_step(True, evaluate) and early.points[0]["marks"] == [10.0, 20.0]
    now[0] += 2.0
    assert not early.after_step(True, evaluate)        # no mark passed: no evaluation
    now[0] += 4.0
    assert early.after_step(True, evaluate) and early.points[-1]["j"] == 0.55   # J ≥ the top target: stop
    with pytest.raises(ValueError, match="whole number of marks"):
        tta_units.MarkClock(25.0, 10.0)
    with pytest.raises(RuntimeError, match="not started"):
        _ = tta_units.MarkClock(30.0, 10.0).seconds


# ----------------------------------------------------------------------------- the summary from made-up units


def made_unit(arm, seed, curve, sha, budget=120.0, steps_per_point=4):
    points = [{"marks": [t], "training_seconds": t + 0.5, "steps": steps_per_point * (k + 1),
               "optimizer_steps": 2 * (k + 1), "j": j} for k, (t, j) in enumerate(curve)]
    return {"arm": arm, "seed": seed, "design_sha": sha, "git_commit": "abc", "grpo_lab_dirty": False,
            "torch_threads": 1, "load_start": [1, 1, 1], "load_end": [1, 1, 1], "untrained_j": 0.1, "points": points,
            "follow_up_seconds": points[-1]["training_seconds"], "stopped_early": points[-1]["marks"][-1] < budget,
            "steps": points[-1]["steps"], "wall_seconds": 1.0, "cpu_seconds": 1.0, "eval_seconds": 0.5}


def test_the_summary_of_made_up_units(tmp_path):
    targets = tta.load_targets(targets_file(tmp_path / "t.json", untrained=0.1, levels={"50%": 0.4, "80%": 0.6}))
    design = tta.make_design(targets, budget=120.0, every=30.0, seeds=3, arm_names=["grpo_lab_v1", "trl"],
                             threads=1, eval_threads=1, questions=363)
    sha = tta.design_sha(design)
    fast = [[(30, 0.45), (60, 0.65)], [(30, 0.3), (60, 0.5), (90, 0.7)], [(30, 0.42), (60, 0.61)]]
    slow = [[(30, 0.2), (60, 0.3), (90, 0.41), (120, 0.5)], [(30, 0.2), (60, 0.25), (90, 0.3), (120, 0.35)],
            [(30, 0.3), (60, 0.45), (90, 0.5), (120, 0.62)]]
    units = [made_unit("grpo_lab_v1", s, c, sha) for s, c in enumerate(fast)]
    units += [made_unit("trl", s, c, sha) for s, c in enumerate(slow[:2])]
    summary = summarize(design, {"j": 0.1, "design_sha": sha}, units, sha)
    assert summary["evaluation"] == "exact" and summary["targets"]["levels"] == {"50%": 0.4, "80%": 0.6}
    assert summary["targets"]["fixed_on"] == "2026-12-02" and summary["missing"] == ["trl_s2"]
    row = summary["runs"][1]
    assert (row["arm"], row["seed"], row["git_commit"]) == ("grpo_lab_v1", 1, "abc")
    assert row["curve"] == {"0.00": 0.1, "30.50": 0.3, "60.50": 0.5, "90.50": 0.7}
    assert row["optimizer_steps"] == {"0.00": 0, "30.50": 2, "60.50": 4, "90.50": 6}
    assert row["first_passage"] == {"50%": 60.5, "80%": 90.5} and row["stopped_early"]
    assert summary["runs"][4]["first_passage"] == {"50%": None, "80%": None}
    fast_50 = [30.5, 60.5, 30.5]                           # first J ≥ 0.4 per seed
    ratio = summary["time_ratios"]["grpo_lab_v1"]["50%"]
    assert ratio["ratio"] == pytest.approx(np.mean(fast_50) / np.mean([90.5, 120.0]))   # seed 1: censored at 120
    assert ratio["ci_low"] is None and "3 needed" in ratio["note"]                     # two TRL seeds
    assert summary["arms"]["trl"]["50%"] == {"seeds": 2, "reached_share": 0.5, "km_median": 90.5,
                                             "restricted_mean": pytest.approx(105.25)}
    assert summary["arms"]["grpo_lab_v1"]["80%"]["km_median"] == 60.5
    assert "trl" not in summary["time_ratios"]
    to_v1 = summary["time_ratios_to_v1"]["trl"]["50%"]                 # the decomposition's direction
    assert set(summary["time_ratios_to_v1"]) == {"trl"}
    assert to_v1["ratio"] == pytest.approx(np.mean([90.5, 120.0]) / np.mean(fast_50))
    summary = summarize(design, {"j": 0.1, "design_sha": sha}, units + [made_unit("trl", 2, slow[2], sha)], sha)
    ratio = summary["time_ratios"]["grpo_lab_v1"]["80%"]
    assert ratio["ratio"] == pytest.approx(np.mean([60.5, 90.5, 60.5]) / np.mean([120.0, 120.0, 120.0]))
    assert ratio["reference_reached_share"] == pytest.approx(1 / 3) and ratio["ci_high"] is not None
    rows = ratio_table(summary)
    assert [(r["arm"], r["target"][:3]) for r in rows][:2] == [("grpo_lab_v1", "50%"), ("grpo_lab_v1", "80%")]
    assert ratio["bound"] == "upper" and rows[1]["× trl's time"].startswith("≤ ")     # two TRL seeds censored
    assert rows[-1]["× trl's time"] == "reference" and rows[-2]["KM median s"] == "90"
    decomposition = ratio_table(summary, to_v1=True)
    assert decomposition[0]["× grpo_lab_v1's time"] == "reference" and decomposition[2]["seeds"] == 3
    curves = tta_curves_figure(summary)
    assert [t.name for t in curves.data if t.showlegend] == ["grpo_lab_v1", "trl"] and len(curves.data) == 6
    assert list(curves.data[1].x) == [0.0, 30.5, 60.5, 90.5] and list(curves.data[1].y) == [0.1, 0.3, 0.5, 0.7]
    assert list(tta_curves_figure(summary, by="optimizer_steps").data[1].x) == [0, 2, 4, 6]
    ratios = tta_ratio_figure(summary)
    assert [t.name for t in ratios.data] == ["target 50%", "target 80%"]
    assert ratios.data[1].x[0] == pytest.approx(ratio["ratio"]) and list(ratios.data[1].y) == ["grpo_lab_v1"]
    assert list(ratios.data[1].marker.symbol) == ["triangle-left"] and "upper bound" in ratios.data[1].hovertext[0]
    decomposition = tta_ratio_figure(summary, to_v1=True)                 # TRL's time over the loop's
    for fig in (curves, ratios, decomposition):      # every title line fits the figure; no "here" for a study's data
        title = fig.layout.title.text
        assert "not re-run here" in title
        assert max(len(re.sub("<[^>]+>", "", line)) for line in title.split("<br>")) <= 80
    assert list(decomposition.data[1].y) == ["trl"] and "grpo_lab_v1" in decomposition.layout.xaxis.title.text
    assert decomposition.data[1].x[0] == pytest.approx(summary["time_ratios_to_v1"]["trl"]["80%"]["ratio"])
    with pytest.raises(ValueError, match="another design"):
        summarize(design, {"j": 0.1, "design_sha": sha}, [made_unit("trl", 2, slow[2], "other")], sha)
    short = made_unit("trl", 2, slow[2][:2], sha)           # missed the targets yet stopped at 60 s
    with pytest.raises(ValueError, match="stopped before the budget"):
        summarize(design, {"j": 0.1, "design_sha": sha}, units + [short], sha)


# ----------------------------------------------------------------------------- a sitting on a tiny model


def test_a_sitting_on_a_tiny_model_runs_every_kind_of_arm_and_rebuilds_the_summary(tmp_path):
    """Every kind of arm (the loop at v = 1, its empty-backward and no-sharing variants, the lagged loop, TRL
    with and without the empty-batch rule) for a budget of one 0.3 s mark (the clock's marks are tested above;
    an exact J here costs ~2 s, most of it the walk's vocabulary split), exact J on two questions: unit files
    with provenance, curves from the untrained J, J per optimiser step, locks, the summary."""

    from studies.lag_frontier.frontier import exact_j

    torch.manual_seed(0)
    model, tok = tiny_model(), tokenizer()
    questions = list(problems()[:2])
    base = TrainConfig(G=2, prompts_per_step=2, lr=1e-3, max_completion_length=3, train_problems=20,
                       micro_batch_size=4, scoring="strict", temperature=1.0, sync_audit=False)
    untrained = exact_j(model, tok, questions, base).mean
    targets = tta.load_targets(targets_file(tmp_path / "t.json", untrained=untrained,
                                            levels={"50%": untrained + 1e-6, "80%": untrained + 0.5}))
    design = tta.make_design(targets, budget=0.3, every=0.3, seeds=1, threads=1, eval_threads=1, questions=2)
    tta.write_design(tmp_path, design)
    root = Path(__file__).resolve().parents[1]
    kwargs = dict(model=model, tokenizer=tok, questions=questions, problems=lambda config: problems(), base=base,
                  log=lambda line: None)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    first_name, _ = design["order"][0]
    (tmp_path / "units" / f"{design['order'][1][0]}_s0.lock").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "units" / f"{design['order'][1][0]}_s0.lock").touch()   # another process holds the second unit
    done = tta.run_units(tmp_path, root, units=1, **kwargs)
    assert [u["arm"] for u in done] == [first_name]
    done += tta.run_units(tmp_path, root, **kwargs)
    assert sorted(u["arm"] for u in done) == sorted(a["name"] for a in design["arms"] if a["name"] !=
                                                     design["order"][1][0])
    (tmp_path / "units" / f"{design['order'][1][0]}_s0.lock").unlink()
    done += tta.run_units(tmp_path, root, **kwargs)
    assert len(done) == 6 and tta.run_units(tmp_path, root, **kwargs) == []          # nothing left
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())     # every unit trained a copy
    assert not list((tmp_path / "units").glob("*.lock"))
    for unit in done:
        assert {"git_commit", "torch_threads", "load_start", "load_end", "wall_seconds", "cpu_seconds",
                "eval_seconds", "design_sha"} <= set(unit)
        assert unit["points"][-1]["marks"] == [0.3] and unit["follow_up_seconds"] >= 0.3
        assert all(len(p["j_per_question"]) == 2 for p in unit["points"])
        assert 0 <= unit["optimizer_steps"] <= unit["steps"] == len(unit["step_log"])
    by_arm = {u["arm"]: u for u in done}
    assert by_arm["trl_every_batch"]["optimizer_steps"] == by_arm["trl_every_batch"]["steps"]
    # a random tiny model never answers strictly: every batch is empty, so only stock TRL steps AdamW
    assert all(by_arm[a]["optimizer_steps"] == 0 < by_arm[a]["steps"] for a in by_arm if a != "trl_every_batch")
    assert by_arm["grpo_lab_v1_empty_backward"]["config"]["empty_step"] == "skip_after_backward"
    assert by_arm["grpo_lab_v1_no_share_prompt"]["config"]["share_prompt"] is False
    assert len(by_arm["grpo_lab_v1"]["records"]) == by_arm["grpo_lab_v1"]["steps"]
    summary = rebuild_summary(tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text()) == json.loads(json.dumps(summary))
    assert summary["untrained_j"] == pytest.approx(untrained) and summary["missing"] == []
    assert sorted(summary["time_ratios"]) == sorted(a["name"] for a in design["arms"] if a["name"] != "trl")
    for row in summary["runs"]:
        assert row["curve"]["0.00"] == pytest.approx(untrained) and len(row["curve"]) == len(row["optimizer_steps"])
        assert row["first_passage"]["80%"] is None                 # 0.5 above the untrained J: out of reach
    assert all(r["50%"]["ratio"] is None or r["50%"]["ratio"] > 0 for r in summary["time_ratios"].values())
    bad = tta.write_design(tmp_path / "bad", {**design, "targets": {**design["targets"], "untrained_j": 0.9}})
    assert bad["targets"]["untrained_j"] == 0.9
    with pytest.raises(ValueError, match="another model, task or question set"):
        tta.run_units(tmp_path / "bad", root, **kwargs)


# ----------------------------------------------------------------------------- TRL's pieces


def test_trl_config_sets_the_recipe_where_trl_defaults_differ(tmp_path):
    config = TrainConfig(G=8, prompts_per_step=4, lr=2e-5, beta=0.0, temperature=0.7, max_completion_length=8,
                         loss_type="grpo", seed=3)
    args = trl_config(config, str(tmp_path))
    assert (args.num_generations, args.per_device_train_batch_size, args.gradient_accumulation_steps) == (8, 32, 1)
    assert (args.learning_rate, args.lr_scheduler_type, args.beta, args.temperature, args.loss_type) == \
           (2e-5, "constant", 0.0, 0.7, "grpo")
    assert (args.max_completion_length, args.epsilon, args.max_grad_norm, args.num_iterations) == (8, 0.2, 1.0, 1)
    assert args.disable_dropout and not args.gradient_checkpointing and args.seed == 3   # recompute off


def test_skip_empty_batch_leaves_a_zero_gradient_step_undone_and_a_real_one_alone():
    """AdamW after one real step: a zero-gradient step would still move θ by momentum; skipped, it does not."""
    weights = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([weights], lr=0.1)
    weights.grad = torch.tensor([1.0, -2.0, 0.5])
    optimizer.step()
    after_first, state = weights.detach().clone(), {k: v.clone() for k, v in optimizer.state[weights].items()}
    skipper = skip_empty_batch()
    weights.grad = torch.zeros(3)
    skipper.on_pre_optimizer_step(None, None, None, optimizer=optimizer)
    optimizer.step()
    assert skipper.skipped == 1 and weights.grad is None and torch.equal(weights.detach(), after_first)
    assert all(torch.equal(v, state[k]) for k, v in optimizer.state[weights].items())
    weights.grad = torch.zeros(3)                                          # the stock rule: momentum moves θ
    optimizer.step()
    assert not torch.allclose(weights.detach(), after_first)
    weights.grad = torch.tensor([0.0, 1.0, 0.0])                           # a real gradient is kept
    skipper.on_pre_optimizer_step(None, None, None, optimizer=optimizer)
    assert skipper.skipped == 1 and torch.equal(weights.grad, torch.tensor([0.0, 1.0, 0.0]))


# ----------------------------------------------------------------------------- the committed files


def test_the_committed_targets_and_design_agree():
    """Notebook 03 §3c reads the committed results: the targets follow their rule, and the design holds them."""
    out = tta.committed_dir()
    targets = tta.load_targets(out / "targets.json")
    gain = targets["v1_j_at_budget"] - targets["untrained_j"]
    assert all(abs(targets["targets"][f"{share}%"] - (targets["untrained_j"] + share / 100 * gain)) < 1e-12
               for share in (50, 80))
    design = json.loads((out / "design.json").read_text())
    assert design["targets"]["targets"] == targets["targets"] and len(design["order"]) == 30
    assert len(tta.design_questions(design)) == design["targets"]["question_count"] == 121   # what run_units walks
    if (out / "summary.json").exists():
        summary = tta.load_summary(out)
        assert summary["evaluation"] == "exact" and ratio_table(summary)
        assert all(not math.isnan(r["restricted_mean"]) for arm in summary["arms"].values() for r in arm.values())


# ----------------------------------------------------------------------------- the command


def test_the_command_fixes_targets_then_the_design_and_refuses_to_change_them(tmp_path, capsys):
    import importlib.util
    import shutil

    path = Path(__file__).resolve().parents[1] / "studies" / "time_to_accuracy" / "run.py"
    spec = importlib.util.spec_from_file_location("tta_command", path)
    command = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(command)
    out = tmp_path / "study"
    with pytest.raises(SystemExit, match="--design first"):
        command.main(["--out", str(out)])
    out.mkdir()
    shutil.copy(tta.committed_dir() / "targets.json", out / "targets.json")
    command.main(["--out", str(out), "--design", "--threads", "1", "--eval-threads", "2", "--lag-v", "16"])
    design = json.loads((out / "design.json").read_text())
    assert len(design["order"]) == 30 and design["budget_seconds"] == 600.0 and design["eval_every_seconds"] == 30.0
    assert "grpo_lab_v16_ratio" in {a["name"] for a in design["arms"]} and design["stop_when_reached"]
    assert design["targets"]["question_count"] == len(range(0, 363, 3))                 # every 3rd question
    assert (design["threads"], design["eval_threads"]) == (1, 2)
    with pytest.raises(ValueError, match="another design"):
        command.main(["--out", str(out), "--design", "--threads", "1", "--eval-threads", "2", "--budget", "300"])
    with pytest.raises(SystemExit, match="design.json exists"):
        command.main(["--out", str(out), "--fix-targets", str(tmp_path), "--date", "2026-12-03"])
