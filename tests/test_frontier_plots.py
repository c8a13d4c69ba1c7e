"""Notebook 02's frontier figures (studies/lag_frontier/plots.py) on made-up units: what each draws, and that
nothing of the analysis is drawn before every unit of its family is in."""

from __future__ import annotations

import numpy as np
import pytest

from studies.lag_frontier import frontier
from studies.lag_frontier import plots as frontier_plots

QUESTIONS, GOLDS = ["1 + 1", "2 * 0", "3 - 3", "4 + 5"], ["2", "0", "0", "9"]


def record(step: int, v: int, correction: str) -> dict:
    lag = step % v
    return {"step": step, "lag": lag, "skipped": step % 5 == 4, "log_ratio_k_abs": 0.05 * lag,
            "log_ratio_k_p50": 0.0, "log_ratio_k_p99": 0.1 * lag, "ess_token": 1.0 - 0.01 * lag,
            "ess_token_applied": 1.0 - 0.005 * lag if correction == "truncated" else 1.0 - 0.01 * lag,
            "cap_frac": 0.02 * lag if correction == "truncated" else 0.0}


def made_units(arms=frontier.ARMS, seeds: int = 5) -> list[dict]:
    rng = np.random.default_rng(0)
    out = []
    for arm in arms:
        for seed in range(seeds):
            final = np.clip(0.6 - 0.004 * arm.v + rng.normal(0, 0.01, 4), 0, 1)
            out.append({"arm": arm.name, "v": arm.v, "is_correction": arm.is_correction, "beta": arm.beta,
                        "seed": seed, "j_auc": float(final.mean()) - 0.1, "j_final": float(final.mean()),
                        "j_per_question": {"0": [0.1] * 4, "32": list(final)},
                        "records": [record(k, arm.v, arm.is_correction) for k in range(32)]})
    return out


UNTRAINED = {"questions": QUESTIONS, "j_per_question": [0.3, 0.1, 0.2, 0.05], "constant_answer": {"answer": "0"}}


def summary_of(units: list[dict]) -> dict:
    return frontier.summarize(units, untrained_j=0.16, constant_answer_j=0.5, settings={"task": "made-up"})


def test_the_frontier_figure_draws_each_correction_from_v1_with_its_interval() -> None:
    summary = summary_of(made_units())
    fig = frontier_plots.frontier_figure(summary)
    lines = [t for t in fig.data if t.name in frontier.CORRECTIONS]
    assert len(lines) == 6 and sorted({t.name for t in lines}) == sorted(frontier.CORRECTIONS)  # 2 panels
    ratio = next(t for t in lines if t.name == "ratio")
    assert list(ratio.x) == [1, 4, 16, 32]
    assert ratio.y[0] == pytest.approx(summary["arms"]["v1"]["j_auc"]["mean"])
    assert ratio.y[3] == pytest.approx(summary["arms"]["v32_ratio"]["j_auc"]["mean"])
    high = summary["arms"]["v32_ratio"]["j_auc"]["ci"][1]
    assert ratio.error_y.array[3] == pytest.approx(high - ratio.y[3])
    assert {t.line.dash for t in lines} == {"solid", "dash", "dot"}                    # one style per correction
    assert all(fig.layout[a].title.text for a in ("xaxis", "xaxis2", "yaxis", "yaxis2"))


def test_before_every_unit_is_in_the_endpoint_figures_and_findings_say_so() -> None:
    late = [u for u in made_units() if not (u["arm"] == "v16_none" and u["seed"] == 4)]
    summary = summary_of(late)
    for fig in (frontier_plots.frontier_figure(summary), frontier_plots.question_figure(late, UNTRAINED, summary),
                frontier_plots.mask_figure(summary)):
        assert not fig.data and "49 of 50 units" in fig.layout.annotations[0].text
    assert frontier_plots.findings(summary) == [frontier_plots.not_read(summary)]
    assert "v16_none_s4" in frontier_plots.findings(summary)[0]


def test_findings_follow_the_rule_and_name_the_frontier() -> None:
    summary = summary_of(made_units())
    lines = frontier_plots.findings(summary)
    for correction, v in summary["frontier"].items():
        assert any(line.startswith(f"frontier, {correction}:") and (str(v) in line) for line in lines)
    decided = [row for row in summary["comparisons"] if row["verdict"] != "not resolved"]
    assert len(lines) == 3 + len(decided) + 1


def test_the_drift_figure_averages_trained_steps_by_lag() -> None:
    units = made_units(arms=[frontier.ARMS[0], frontier.FrontierArm(4, "truncated")], seeds=2)
    fig = frontier_plots.drift_figure(units)
    drift = next(t for t in fig.data if t.name == "v4_truncated (2 seeds)")
    assert list(drift.x) == [0, 1, 2, 3] and drift.y[3] == pytest.approx(0.15)
    bar = next(t for t in fig.data if t.type == "bar")                 # one bar per arm, in one trace
    at = list(bar.x).index("v4_truncated")
    trained = [record(k, 4, "truncated") for k in range(32) if k % 5 != 4]
    assert bar.y[at] == pytest.approx(np.mean([r["ess_token"] for r in trained]))
    assert bar.text[at] == f"{np.mean([r['cap_frac'] for r in trained]):.1%} capped"
    assert bar.text[list(bar.x).index("v1")] == ""


def test_the_question_view_orders_by_untrained_j_and_marks_the_constant_answer() -> None:
    units = made_units()
    fig = frontier_plots.question_figure(units, UNTRAINED, summary_of(units), GOLDS)
    heat = fig.data[0]
    assert list(heat.x) == ["4 + 5", "2 * 0", "3 - 3", "1 + 1"]                          # untrained J ascending
    assert list(heat.y[:2]) == ["untrained", "always '0'"] and list(heat.z[1]) == [0, 1, 1, 0]
    v1 = np.mean([u["j_per_question"]["32"] for u in units if u["arm"] == "v1"], axis=0)
    np.testing.assert_allclose(heat.z[2], v1[[3, 1, 2, 0]])
    one_mask_unit = units + made_units(frontier.MASK_ARMS[:1], seeds=1)   # its family not complete: not drawn
    rows = frontier_plots.question_figure(one_mask_unit, UNTRAINED, summary_of(one_mask_unit), GOLDS).data[0].y
    assert "mask" not in rows and len(rows) == 2 + len(frontier.ARMS)


def test_the_mask_figure_waits_for_its_own_family_then_draws_its_three_arms() -> None:
    units = made_units()
    waiting = frontier_plots.mask_figure(summary_of(units))
    assert "0 of 15 units of the mask family" in waiting.layout.annotations[0].text
    with_mask = units + made_units(arms=frontier.MASK_ARMS)
    fig = frontier_plots.mask_figure(summary_of(with_mask))
    assert list(fig.data[0].x) == ["mask", "nomask", "nomask_skip"]


def test_the_paper_table_puts_each_row_beside_its_arms_once_they_are_read() -> None:
    late = summary_of(made_units()[:-1])
    assert all("not read yet" in line or "not an arm" in line for line in frontier_plots.paper_table(late)[1:])
    summary = summary_of(made_units())
    lines = frontier_plots.paper_table(summary)
    assert len(lines) == 1 + len(frontier.PAPER_GSM8K)
    v4 = summary["arms"]["v4_ratio"]["j_auc"]
    assert f"v4_ratio {v4['mean']:.3f} [{v4['ci'][0]:.3f}, {v4['ci'][1]:.3f}] n = 5" in lines[3]
    assert "not an arm of this study" in lines[4] and "nomask: not read yet" in lines[1]
