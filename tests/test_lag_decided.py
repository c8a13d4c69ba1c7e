"""The lag frontier, decided: the committed design file is the design module's, the decision rule agrees with the
power simulation and keeps its error rates, and the summary reads only the looks that are due."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from studies.lag_decided import design
from studies.lag_decided.summary import rebuild_summary

HERE = Path(__file__).resolve().parents[1] / "studies" / "lag_decided"


def test_the_committed_design_file_is_the_design():
    assert json.loads((HERE / "design.json").read_text()) == json.loads(json.dumps(design.design_record()))


def test_held_out_is_every_third_question():
    held = design.held_out(list(range(363)))
    assert sum(held) == 121 and held[:6] == [False, False, True, False, False, True]


def test_decide_agrees_with_the_power_simulation():
    rng = np.random.default_rng(3)
    c1 = -0.05 + 0.06 * rng.standard_normal((60, 20))
    c2 = np.tile([0.5, -0.5], (60, 10))   # mean 0 at every look: never rejected, so C1 stays at α/2
    sim = design.simulate(c1, "C1")
    for row in range(60):
        verdict = design.decide({"C1": c1[row].tolist(), "C2": c2[row].tolist()})
        assert verdict["C2"].look is None
        assert verdict["C1"].differs == sim["differs"][row]
        assert verdict["C1"].equivalent == sim["equivalent"][row]
        assert verdict["C1"].look is None or design.PLAN.looks[verdict["C1"].look] == sim["seeds"][row]


def test_holm_passes_c2s_level_to_c1():
    rng = np.random.default_rng(4)
    c2 = (1.0 + 0.01 * rng.standard_normal(20)).tolist()   # rejected at the first look
    verdict = design.decide({"C1": (-0.05 + 0.06 * rng.standard_normal(20)).tolist(), "C2": c2})
    assert verdict["C2"].differs and verdict["C2"].look == 0
    assert verdict["C1"].level == design.ALPHA


@pytest.mark.parametrize("d, word", [(0.0, "differs"), (design.MARGIN, "equivalent")])
def test_error_rates_at_the_null(d, word):
    power = design.power(d, 0.08, "C1", reps=20_000, seed=5)
    assert power[word] <= design.ALPHA / 2 + 0.006


def _unit(arm: str, seed: int, j_auc: float) -> dict:
    per_question = {str(k): [j_auc] * 363 for k in (0, 32, 64, 96, 128)}
    v = {**design.ARMS, **design.CORRECTION_ARMS}[arm]["v"]
    return {"arm": arm, "v": v, "seed": seed, "j_auc": j_auc, "j_final": j_auc,
            "j_curve": {k: j_auc for k in per_question}, "j_per_question": per_question,
            "records": [{"skipped": False, "lag": 1, "log_ratio_k_abs": 0.1, "drop_frac": 0.0}]}


def test_the_summary_reads_only_the_looks_that_are_due(tmp_path):
    units = tmp_path / "units"
    units.mkdir()
    rng = np.random.default_rng(6)
    for seed in design.SEEDS[:9]:
        for arm in design.ARMS:
            (units / f"{arm}_s{seed}.json").write_text(json.dumps(_unit(arm, seed, float(rng.uniform(0.3, 0.6)))))
    (units / f"v1_s{design.SEEDS[9]}.json").write_text(json.dumps(_unit("v1", design.SEEDS[9], 0.5)))
    summary = rebuild_summary(tmp_path, write=False)
    assert summary["seeds_in"] == 9 and summary["looks_reached"] == [8]
    assert summary["arms"]["v1"]["seeds"] == list(design.SEEDS[:8])
    assert set(summary["comparisons"]) == {"C1", "C2"}
    for seed in design.SEEDS[:9]:
        (units / f"v1_s{seed}.json").unlink()
    assert rebuild_summary(tmp_path, write=False)["arms"] == {}


def test_a_stopped_comparison_needs_no_more_seeds_and_no_arm_is_read_early(tmp_path):
    """C2 stops at the first look (v10_ratio far above v10_none), so v10_none runs no further. C1 is read at 14 and
    then 20 seeds of v1 and v10_ratio, C2 stays where it stopped and v10_none's entry at its 8; while v10_ratio had
    only 14 seeds, v1's entry was read at 14 too, however many v1 had."""
    units = tmp_path / "units"
    units.mkdir()
    rng = np.random.default_rng(7)

    def write(arm, seed, j_auc):
        (units / f"{arm}_s{seed}.json").write_text(json.dumps(_unit(arm, seed, j_auc)))

    for i, seed in enumerate(design.SEEDS):
        write("v1", seed, 0.5 + 0.05 * rng.standard_normal())
        if i < 14:
            write("v10_ratio", seed, 0.5 + 0.05 * rng.standard_normal())
        if i < 8:
            write("v10_none", seed, 0.2 + 0.01 * rng.standard_normal())
    early = rebuild_summary(tmp_path, write=False)
    assert early["comparisons"]["C2"]["stopped_at_seeds"] == 8 and early["comparisons"]["C1"]["looks_reached"] == \
        [8, 14]
    assert [len(early["arms"][arm]["seeds"]) for arm in ("v1", "v10_ratio", "v10_none")] == [14, 14, 8]
    for seed in design.SEEDS[14:]:
        write("v10_ratio", seed, 0.5)
    late = rebuild_summary(tmp_path, write=False)
    assert late["comparisons"]["C1"]["looks_reached"] == [8, 14, 20] and late["looks_reached"] == [8, 14, 20]
    assert late["comparisons"]["C2"] == early["comparisons"]["C2"] | {"level": late["comparisons"]["C2"]["level"]}
    assert [len(late["arms"][arm]["seeds"]) for arm in ("v1", "v10_ratio", "v10_none")] == [20, 20, 8]
    diffs = [json.loads((units / f"v10_ratio_s{s}.json").read_text())["j_auc"]
             - json.loads((units / f"v1_s{s}.json").read_text())["j_auc"] for s in design.SEEDS]
    verdict = design.decide({"C1": diffs, "C2": [1.0] * 8})["C1"]
    assert late["comparisons"]["C1"]["estimate"] == pytest.approx(verdict.estimate)


def test_the_drift_picture_pairs_each_lagged_unit_with_v1_at_its_seed():
    from studies.lag_decided.plots import drift_cost_figure, drift_points

    def unit(arm, seed, j_auc, drift, correction="ratio", beta=0.0):
        return {"arm": arm, "v": 4, "seed": seed, "j_auc": j_auc, "is_correction": correction, "beta": beta,
                "records": [{"skipped": False, "lag": 1, "log_ratio_k_abs": drift},
                            {"skipped": True, "lag": 2, "log_ratio_k_abs": 99.0}]}

    units = [unit("v1", 0, 0.5, 0.0), unit("v1", 1, 0.6, 0.0), unit("v4_ratio", 0, 0.45, 0.1),
             unit("v4_ratio", 1, 0.5, 0.3), unit("v4_none", 2, 0.1, 0.2, "none"), unit("mask", 0, 0.4, 0.0, beta=0.04)]
    points = drift_points(units, "frontier (lr 1e-5)")
    assert [(p["arm"], p["seed"], round(p["cost"], 6), p["drift"]) for p in points] == \
        [("v4_ratio", 0, -0.05, 0.1), ("v4_ratio", 1, -0.1, 0.3)]   # no v1 at seed 2; β > 0 arms left out
    fig = drift_cost_figure(points)
    means = [t for t in fig.data if t.error_y is not None and t.error_y.array is not None]
    assert len(means) == 1 and means[0].x[0] == pytest.approx(0.2) and means[0].y[0] == pytest.approx(-0.075)
    assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text


def test_the_corrections_are_read_only_when_all_their_units_and_the_first_look_are_in(tmp_path):
    from studies.lag_decided.plots import corrections_line

    units, extra = tmp_path / "units", tmp_path / "units_corrections"
    units.mkdir(), extra.mkdir()
    for seed in design.CORRECTION_SEEDS:
        for arm in design.CORRECTION_ARMS:
            records = [{"skipped": False, "lag": 1, "log_ratio_k_abs": 0.1, "drop_frac": 0.1},
                       {"skipped": False, "lag": 9, "log_ratio_k_abs": 0.2, "drop_frac": 0.3},
                       {"skipped": True, "lag": 9, "log_ratio_k_abs": 0.0, "drop_frac": 0.9}]
            unit = _unit(arm, seed, 0.40 + seed / 1000) | {"records": records}
            (extra / f"{arm}_s{seed}.json").write_text(json.dumps(unit))
    assert rebuild_summary(tmp_path, write=False)["corrections"]["arms"] == {}   # first look not due
    for seed in design.SEEDS[:8]:
        for arm in design.ARMS:
            (units / f"{arm}_s{seed}.json").write_text(json.dumps(_unit(arm, seed, 0.30)))
    summary = rebuild_summary(tmp_path, write=False)
    entry = summary["corrections"]
    assert entry["exploratory"] and set(entry["arms"]) == set(design.CORRECTION_ARMS)
    diff = entry["differences"]["v10_mask - v10_ratio"]
    assert diff["mean"] == pytest.approx(0.10 + np.mean(design.CORRECTION_SEEDS) / 1000)
    assert diff["ci"][0] < diff["mean"] < diff["ci"][1]
    assert entry["arms"]["v10_mask"]["dropped"]["mean"] == pytest.approx(0.2)   # the skipped step not counted
    assert entry["arms"]["v10_mask"]["dropped"]["at_last_lag"] == pytest.approx(0.3)
    line = corrections_line(summary)
    assert line.startswith("lr 1e-5, v = 10, 8 seeds, exploratory") and "v10_mask − v10_ratio +0.204" in line
    (extra / f"v10_icepop_s{design.CORRECTION_SEEDS[-1]}.json").unlink()
    pending = rebuild_summary(tmp_path, write=False)
    assert pending["corrections"]["arms"] == {} and corrections_line(pending).startswith("pending")


def test_the_correction_arms_are_the_knob_values_issue_52_names():
    from grpo_lab.lm.recipes import recipe

    seqmask = recipe(design.RECIPE, **design.arm_fields("v10_seqmask"))
    assert (seqmask.is_correction, seqmask.level, seqmask.is_cap, seqmask.is_floor) == ("icepop", "sequence", 3.0, None)
    assert recipe(design.RECIPE, **design.arm_fields("v10_mask")).is_correction == "mask"
    assert set(design.CORRECTION_SEEDS) <= set(design.SEEDS[:8])


def test_no_two_correction_arms_share_a_rule():
    """Every exploratory arm weights π_k/α differently from every other arm, so no arm repeats another's units
    (``mask`` at C is ``icepop`` at [1/C, C]: the design's first IcePop band was ``v10_mask``'s)."""
    from grpo_lab.lm.recipes import recipe
    from grpo_lab.objective import is_correction_terms

    log_rho = torch.linspace(-3.0, 3.0, 601).reshape(1, -1)   # ρ from e^-3 to e^3, 0.01 apart in log ρ
    rules = {}
    for arm in {**design.ARMS, **design.CORRECTION_ARMS}:
        config = recipe(design.RECIPE, **design.arm_fields(arm))
        if config.v == 1:
            continue
        base, weight = is_correction_terms(torch.zeros_like(log_rho), -log_rho, config.is_correction,
                                           config.is_cap, config.is_floor)
        rules[arm] = (config.level, base.tolist(), None if weight is None else weight.tolist())
    for a, b in itertools.combinations(rules, 2):
        assert rules[a] != rules[b], f"{a} and {b} weight every ratio alike"


def test_the_drift_picture_adds_the_corrections_once_they_are_all_in(tmp_path):
    from studies.lag_decided.plots import study_points

    units, extra = tmp_path / "units", tmp_path / "units_corrections"
    units.mkdir(), extra.mkdir()
    for seed in design.SEEDS[:8]:
        for arm, fields in design.ARMS.items():
            unit = _unit(arm, seed, 0.50 if arm == "v1" else 0.40) | {"is_correction": fields.get("is_correction",
                                                                                                  "ratio")}
            (units / f"{arm}_s{seed}.json").write_text(json.dumps(unit))
    for seed in design.CORRECTION_SEEDS:
        for arm, fields in design.CORRECTION_ARMS.items():
            (extra / f"{arm}_s{seed}.json").write_text(json.dumps(_unit(arm, seed, 0.45) | fields))
    frontier = tmp_path / "frontier"
    frontier.mkdir()
    points = study_points(frontier, tmp_path)
    by_arm = {p["arm"]: p for p in points}
    assert set(by_arm) == {"v10_ratio", "v10_none", *design.CORRECTION_ARMS}
    assert by_arm["v10_seqmask"]["correction"] == "icepop (sequence)" and by_arm["v10_icepop"]["correction"] == "icepop"
    assert by_arm["v10_mask"]["cost"] == pytest.approx(-0.05)
    assert sum(p["arm"] == "v10_mask" for p in points) == len(design.CORRECTION_SEEDS)


def test_the_second_regime_is_read_at_the_pilots_lr_once_all_its_seeds_are_in(tmp_path):
    """The pilot at 3e-6 drifts 0.02 at lag 1 (≤ 0.03), so the rule picks 3e-6; its arms and paired differences
    appear only once every arm has every seed, and each difference pairs the two arms' units by seed."""
    from studies.lag_decided.plots import regime2_line
    from studies.readme import lag_decided_table

    folder = tmp_path / "units_lr3e-06"
    folder.mkdir()
    pilot = _unit("v10_ratio", design.REGIME2_PILOT_SEED, 0.3)
    pilot["records"] = [{"skipped": False, "lag": 1, "log_ratio_k_abs": 0.02},
                        {"skipped": False, "lag": 5, "log_ratio_k_abs": 0.2}]
    (folder / f"v10_ratio_s{design.REGIME2_PILOT_SEED}.json").write_text(json.dumps(pilot))
    level = {"v1": 0.50, "v10_ratio": 0.47, "v10_none": 0.40}
    for seed in design.REGIME2_SEEDS:
        for arm in design.ARMS:
            (folder / f"{arm}_s{seed}.json").write_text(json.dumps(_unit(arm, seed, level[arm] + seed / 1e4)))
    summary = rebuild_summary(tmp_path, write=False)
    entry = summary["regime2"]
    assert entry["lr"] == "3e-06" and entry["pilots"]["3e-06"]["drift_lag1"] == pytest.approx(0.02)
    assert entry["exploratory"] and set(entry["arms"]) == set(design.ARMS)
    assert entry["arms"]["v1"]["seeds"] == list(design.REGIME2_SEEDS)     # the pilot's seed is not one of them
    for name, expected in (("v10_ratio - v1", -0.03), ("v10_none - v1", -0.10), ("v10_ratio - v10_none", 0.07)):
        assert entry["differences"][name]["mean"] == pytest.approx(expected)
    assert regime2_line(summary).startswith("lr 3e-6, 6 seeds, exploratory")
    table = lag_decided_table(summary)
    assert "*Second regime, lr 3e-6 (exploratory, no test):*" in table and "| `v10_none − v1` | -0.100 [" in table
    (folder / f"v10_none_s{design.REGIME2_SEEDS[-1]}.json").unlink()
    pending = rebuild_summary(tmp_path, write=False)
    assert pending["regime2"]["arms"] == {} and regime2_line(pending).startswith("pending")


def test_arms_narrows_every_queue_to_the_named_arms():
    from studies.lag_decided.run import arguments, queue

    def units(*argv: str) -> list[tuple[str, int]]:
        return [(arm, seed) for arm, seed, _, _ in queue(arguments().parse_args(argv))]

    assert units("--corrections", "--arms", "v10_icepop") == [("v10_icepop", s) for s in design.CORRECTION_SEEDS]
    assert len(units("--corrections")) == len(design.CORRECTION_ARMS) * len(design.CORRECTION_SEEDS)
    assert units("--arms", "v1")[:2] == [("v1", design.SEEDS[0]), ("v1", design.SEEDS[1])]
    with pytest.raises(SystemExit):
        arguments().parse_args(["--arms", "v10_nonsense"])
