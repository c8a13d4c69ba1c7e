"""The frontier study's analysis (studies/lag_frontier/frontier.py), on made-up units whose answers are known."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from grpo_lab.stats.intervals import t_cdf
from studies.lag_frontier import frontier


def test_the_design_is_ten_arms_and_fifteen_comparisons() -> None:
    names = [arm.name for arm in frontier.ARMS]
    assert names[0] == "v1" and len(names) == 10 == len(set(names))
    assert len(frontier.COMPARISONS) == 15
    assert {a for a, _ in frontier.COMPARISONS} <= set(names) and {b for _, b in frontier.COMPARISONS} <= set(names)
    order = frontier.unit_order(frontier.ARMS, seeds=2)
    assert [seed for _, seed in order] == [0] * 10 + [1] * 10


def test_holm_matches_the_step_down_rule_by_hand() -> None:
    p = [0.01, 0.04, 0.03, math.nan, 0.005]
    # sorted finite: 0.005 (×4), 0.01 (×3), 0.03 (×2), 0.04 (×1), running maximum
    expected = [0.03, 0.06, 0.06, math.nan, 0.02]
    np.testing.assert_allclose(frontier.holm(p), expected)


def test_sign_flip_p_is_the_share_of_patterns_at_least_as_extreme() -> None:
    d = [0.3, 0.1, 0.2, 0.25, 0.05]
    assert frontier.sign_flip_p(d) == pytest.approx(2 / 32)  # all positive: only ± the observed pattern
    d = [0.3, -0.1, 0.2, 0.25, -0.05]
    extreme = sum(abs(np.dot(s, d)) >= abs(sum(d)) - 1e-12 for s in itertools.product((1, -1), repeat=5))
    assert frontier.sign_flip_p(d) == pytest.approx(extreme / 32)


def test_tost_and_the_t_test_agree_with_their_definitions() -> None:
    d = (0.01, -0.005, 0.002, 0.008, -0.001)
    test = frontier.Comparison("a", "b", 0.02, tuple(range(5)), d)
    p = test.p_values()
    mean, se = np.mean(d), np.std(d, ddof=1) / math.sqrt(5)
    assert p["p_difference"] == pytest.approx(2 * (1 - t_cdf(abs(mean / se), 4)))
    assert p["p_equivalence"] == pytest.approx(max(1 - t_cdf((mean + 0.02) / se, 4), t_cdf((mean - 0.02) / se, 4)))
    assert p["p_equivalence"] < 0.05  # well inside ±0.02


def units(gain_by_arm: dict[str, float], noise: float, seeds: int = 5, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    shared = rng.normal(0, 0.05, seeds)  # the seed-to-seed spread pairing cancels
    return [{"arm": arm, "seed": s, "j_auc": 0.2 + gain + shared[s] + rng.normal(0, noise),
             "j_final": 0.2 + 1.5 * gain + shared[s]} for arm, gain in gain_by_arm.items() for s in range(seeds)]


def test_the_frontier_is_the_largest_v_equivalent_with_every_smaller_one() -> None:
    gains = {"v1": 0.3}
    for v in (4, 16, 32):
        gains[f"v{v}_ratio"] = 0.3 if v <= 16 else 0.1          # equivalent up to 16, worse at 32
        gains[f"v{v}_truncated"] = 0.3                           # equivalent everywhere
        gains[f"v{v}_none"] = 0.3 if v == 16 else 0.15           # a gap at 4: the frontier stops there
    summary = frontier.summarize(units(gains, noise=0.001), untrained_j=0.2, constant_answer_j=0.09,
                                 settings={"task": "made-up"})
    assert summary["margin"] == pytest.approx(0.1 * (summary["arms"]["v1"]["j_auc"]["mean"] - 0.2))
    assert summary["frontier"] == {"ratio": 16, "truncated": 32, "none": "not resolved"}
    verdict = {row["comparison"]: row["verdict"] for row in summary["comparisons"]}
    assert verdict["v32_ratio - v1"] == "worse" and verdict["v4_none - v1"] == "worse"
    assert all(row["holm_p_difference"] >= row["p_difference"] for row in summary["comparisons"])


def all_arms(gain: float = 0.3) -> dict[str, float]:
    return {arm.name: gain for arm in frontier.ARMS}


def test_noise_leaves_comparisons_not_resolved_and_collapses_are_counted() -> None:
    made = units(all_arms(), noise=0.2)
    next(u for u in made if u["arm"] == "v4_ratio" and u["seed"] == 4)["j_final"] = 0.1  # below the untrained J
    summary = frontier.summarize(made, untrained_j=0.2, constant_answer_j=0.09, settings={})
    row = next(r for r in summary["comparisons"] if r["comparison"] == "v4_ratio - v1")
    assert row["verdict"] == "not resolved" and row["n"] == 5
    assert summary["arms"]["v4_ratio"]["collapsed"] == 1
    rows = frontier.compare({"v1": {0: 0.5, 1: 0.6}}, [("v32_none", "v1")], margin=0.03)   # no seed in common
    assert rows[0]["n"] == 0 and math.isnan(rows[0]["p_difference"]) and rows[0]["verdict"] == "not resolved"


def test_nothing_is_read_before_every_unit_of_a_family_is_in() -> None:
    """No interim looks: one missing unit and the summary holds the runs and the count, but no endpoint mean,
    margin, comparison or frontier; the mask family is read only once its own units are in."""
    made = units(all_arms(), noise=0.001)
    late = [u for u in made if not (u["arm"] == "v32_none" and u["seed"] == 4)]
    summary = frontier.summarize(late, untrained_j=0.2, constant_answer_j=0.09, settings={})
    assert summary["design"]["primary"] == {"units": 50, "in": 49, "complete": False, "missing": ["v32_none_s4"]}
    assert len(summary["runs"]) == 49
    assert summary["arms"] == {} and summary["comparisons"] == [] and summary["margin"] is None
    assert summary["frontier"] == {c: "not resolved" for c in frontier.CORRECTIONS}
    complete = frontier.summarize(made, untrained_j=0.2, constant_answer_j=0.09, settings={})
    assert complete["design"]["primary"]["complete"] and len(complete["comparisons"]) == 15
    assert complete["design"]["mask"]["in"] == 0 and complete["mask_comparisons"] == []
    masked = made + units({arm.name: 0.3 for arm in frontier.MASK_ARMS}, noise=0.001)
    one_mask_unit = frontier.summarize(made + masked[-1:], untrained_j=0.2, constant_answer_j=0.09, settings={})
    assert one_mask_unit["design"]["mask"]["in"] == 1 and len(one_mask_unit["runs"]) == 51
    assert set(one_mask_unit["arms"]) == {arm.name for arm in frontier.ARMS}        # no mask arm's mean yet
    assert one_mask_unit["mask_comparisons"] == []
    with_mask = frontier.summarize(masked, untrained_j=0.2, constant_answer_j=0.09, settings={})
    assert [row["comparison"] for row in with_mask["mask_comparisons"]] == [
        "mask - nomask_skip", "mask - nomask", "nomask_skip - nomask"]
    assert {arm.name for arm in frontier.MASK_ARMS} <= set(with_mask["arms"])


def test_a_unit_runs_and_the_summary_is_rebuilt_from_its_file(tmp_path) -> None:
    """The whole path at smoke size on the bundled model: the untrained unit, two arms' units with exact J at
    the evaluation steps and their provenance, then summary.json from the files (one seed: nothing decided)."""
    from grpo_lab.lm.recipes import recipe
    from grpo_lab.lm.tasks import all_questions

    base = recipe("cpu_arith_smollm2", task="addmul1", steps=4, G=2, prompts_per_step=2, max_completion_length=3,
                  micro_batch_size=4, train_problems=20, checkpoint_every=0)
    questions = all_questions("addmul1")[::80]   # 0 * 0, 2 + 2, 6 * 5, 9 + 8 (sorted by question)
    root = Path(__file__).resolve().parents[1]
    untrained = frontier.run_untrained(base, tmp_path, root, questions)
    assert len(untrained["j_per_question"]) == 4 and 0 <= untrained["j"] <= 1
    assert {"git_commit", "torch_threads", "load_start", "load_end"} <= set(untrained)
    assert [q.answer for q in questions] == ["0", "4", "30", "17"]
    assert untrained["constant_answer"]["j"] == pytest.approx(1 / 4)  # no answer is right twice
    for arm in frontier.ARMS[:2]:
        unit = frontier.run_unit(arm, 0, base, tmp_path, root, questions)
        assert sorted(unit["j_curve"]) == [0, 1, 2, 3, 4] and len(unit["records"]) == 4
        assert unit["j_curve"][0] == pytest.approx(untrained["j"], abs=1e-9)  # step 0 is the untrained model
        assert unit["j_auc"] == pytest.approx(np.mean([unit["j_curve"][s] for s in (1, 2, 3, 4)]))
        assert {"git_commit", "torch_threads", "load_start", "load_end", "wall_seconds", "cpu_seconds"} <= set(unit)
        assert frontier.run_unit(arm, 0, base, tmp_path, tmp_path, questions) is None  # its file exists: skipped
    summary = frontier.rebuild_summary(tmp_path, base)
    assert [row["arm"] for row in summary["runs"]] == ["v1", "v4_ratio"]
    assert summary["frontier"] == {"ratio": "not resolved", "truncated": "not resolved", "none": "not resolved"}
    assert summary["design"]["primary"]["in"] == 2 and summary["comparisons"] == []


def test_what_notebook_01_says_of_the_collapses_is_what_the_committed_runs_show() -> None:
    """No run without a correction collapsed, in either study (the frontier's ``v*_none`` arms, the decided study's
    ``v10_none`` in both regimes; nothing collapsed there at all); the runs that did were ``v32_ratio`` and
    ``v32_truncated``, one seed in five each. Notebook 01's takeaway and its try-it 7 say so (they once said a
    collapse without a correction needed sequences)."""
    import json
    from types import SimpleNamespace

    from grpo_lab.exact import bandit_lab

    root = Path(__file__).resolve().parents[1] / "studies"
    frontier_arms = json.loads((root / "lag_frontier" / "results" / "summary.json").read_text())["arms"]
    decided = json.loads((root / "lag_decided" / "summary.json").read_text())
    collapsed = {arm: entry["collapsed"] for arm, entry in frontier_arms.items() if entry["collapsed"]}
    assert collapsed == {"v32_ratio": 1, "v32_truncated": 1}
    assert all(len(frontier_arms[arm]["seeds"]) == 5 for arm in collapsed)
    studies = (frontier_arms, decided["arms"], decided["regime2"]["arms"], decided["corrections"]["arms"])
    nones = [entry["collapsed"] for arms in studies for arm, entry in arms.items() if arm.endswith("_none")]
    assert len(nones) == 5 and not any(nones)
    assert not any(entry["collapsed"] for arms in studies[1:] for entry in arms.values())

    (seven,) = (q for q in bandit_lab.TRY_IT if q.question.startswith("7."))
    text = seven.answer({name: SimpleNamespace(J=np.zeros((1, 1))) for name in seven.tries})
    assert "no run without one collapsed" in text and "(`ratio` and `truncated`, one seed in five each)" in text
    notebook = json.loads((root.parent / "notebooks" / "01_bandit.ipynb").read_text())
    takeaway = " ".join("".join(notebook["cells"][0]["source"]).replace(">", " ").split())
    assert "no run without a correction collapsed; the runs that collapsed, at v = 32, had one" in takeaway
