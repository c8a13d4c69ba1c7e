"""grpo_lab.viz: the exercise checks catch wrong answers, the display switch, the live panel (its knobs' labels, its
title clear of the toolbar, the restart hint), the run dashboard's gaps, the lab."""

import json
import math

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from grpo_lab.config import smoke_mode
from grpo_lab.exact import bandit_lab as lab
from grpo_lab.exact.bandit import BanditProblem, bandit_config, build_bandit_loop, run_bandit
from grpo_lab.scale.costmodel import StepCostModel
from grpo_lab.viz import BanditPanel, check, display, display_mode, new_figure, plots, show_solution
from grpo_lab.viz.dashboard import OVER_COUNTED_TOKENS, PANELS, dashboard
from grpo_lab.viz.display import TITLE_LINE_PX, TOOLBAR_PX
from grpo_lab.viz.exercises import SOLUTIONS, ExerciseMismatch, answer_tries, check_prediction

# ----------------------------------------------------------------------------- exercises


def stub(*args):
    raise NotImplementedError


@pytest.mark.parametrize("name", sorted(SOLUTIONS))
def test_reference_solutions_pass_and_a_stub_checks_the_reference(name, capsys):
    assert check(name, SOLUTIONS[name]) == "yours"
    assert "✓" in capsys.readouterr().out
    assert check(name, stub) == "reference"
    out = capsys.readouterr().out
    assert "hint" in out and "✓" not in out                     # a stub never earns the tick
    show_solution(name)
    assert f"def solution_{name}" in capsys.readouterr().out


def sample_variance_whiten(rewards, eps_std):
    return (rewards - rewards.mean(1, keepdim=True)) / (rewards.var(1, unbiased=True, keepdim=True) + eps_std).sqrt()


def eps_added_to_std_whiten(rewards, eps_std):
    return (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, unbiased=False, keepdim=True) + eps_std)


def uncentred_whiten(rewards, eps_std):
    return rewards / (rewards.var(1, unbiased=False, keepdim=True) + eps_std).sqrt()


def on_policy_clip_f_eps(r, r_prime, A, eps):
    return torch.minimum(r * A, torch.clamp(r, 1 - eps, 1 + eps) * A)


def optimistic_f_eps(r, r_prime, A, eps):
    return torch.maximum(r * A, torch.clamp(r, r_prime - eps, r_prime + eps) * A)


def multiplicative_f_eps(r, r_prime, A, eps):
    return torch.minimum(r * A, torch.clamp(r, r_prime * (1 - eps), r_prime * (1 + eps)) * A)


def half_lag_bound(pi, pi_k, alpha, p, eps_std):
    return SOLUTIONS["bound"](pi, pi_k, alpha, p, eps_std) + (pi_k - alpha).abs().sum(-1) * 0.5


def no_eps_bound(pi, pi_k, alpha, p, eps_std):
    return SOLUTIONS["bound"](pi, pi_k, alpha, p, 0.0)


def summed_bound(pi, pi_k, alpha, p, eps_std):
    return SOLUTIONS["bound"](pi, pi_k, alpha, p, eps_std).sum()


def unmasked_r_prime(logp_k, logp_alpha, mask):
    return torch.exp(logp_k - logp_alpha)


def token_level_tv(logp_k, logp_alpha, mask):
    return 0.5 * ((torch.exp(logp_k - logp_alpha) - 1).abs() * mask).sum() / mask.sum()


def padded_tv(logp_k, logp_alpha, mask):
    return 0.5 * (torch.exp((logp_k - logp_alpha).sum(1)) - 1).abs().mean()


def lag_from_one(steps, v):
    return torch.tensor([k % v + 1 for k in range(steps)]) % v


@pytest.mark.parametrize("name, wrong", [
    ("r_prime", unmasked_r_prime), ("tv", token_level_tv), ("tv", padded_tv), ("sync_schedule", lag_from_one),
    ("whiten", sample_variance_whiten), ("whiten", eps_added_to_std_whiten), ("whiten", uncentred_whiten),
    ("f_eps", on_policy_clip_f_eps), ("f_eps", optimistic_f_eps), ("f_eps", multiplicative_f_eps),
    ("bound", half_lag_bound), ("bound", no_eps_bound), ("bound", summed_bound)])
def test_wrong_implementations_fail(name, wrong):
    with pytest.raises(AssertionError, match=name):
        check(name, wrong)


def test_a_wrong_answer_shows_one_line_not_a_traceback():
    """IPython renders ``_render_traceback_`` in place of the traceback: one line with the expected value, the
    value that came and the hint."""
    with pytest.raises(ExerciseMismatch) as caught:
        check("whiten", sample_variance_whiten)
    lines = caught.value._render_traceback_()
    assert len(lines) == 1 and "\n" not in lines[0]
    assert all(word in lines[0] for word in ("expected", "got", "hint: per row"))


def test_check_prediction_scores_against_the_observed_value(capsys):
    assert check_prediction("q", 4.2, 4.0) == "✓" and "4" in capsys.readouterr().out
    assert check_prediction("q", 6.0, 4.0) == "✗"
    assert check_prediction("q", None, 4.0) == "no prediction"
    assert "4" not in capsys.readouterr().out.split("✗")[-1]          # no value shown before a prediction
    with pytest.raises(ValueError, match="rel_tol"):
        check_prediction("q", 1.0, 1.0, rel_tol=0.0)



def test_a_try_it_answer_comes_only_after_its_guess(capsys):
    """Notebook 01 §6: with no guess nothing of any run's J is printed; a guess of a question's first try prints
    that question's answer (with the runs' numbers) and no other; every question's tries were trained."""
    problem = lab.lab_problem()
    config = lab.lab_config(steps=4)
    names = {name for q in lab.TRY_IT for name in q.tries}
    assert names <= set(lab.TRIES)
    tried = {name: lab.train_runs(problem, config.replace(**lab.TRIES[name]), runs=2) for name in names}
    assert answer_tries({}, tried) == 0
    silent = capsys.readouterr().out
    assert all(f"{lab.final_j(tried, name):.3f}" not in silent for name in names)
    first = lab.TRY_IT[0]
    assert answer_tries({first.tries[0]: 0.5}, tried) == 1
    shown = capsys.readouterr().out
    assert first.answer(tried) in shown and lab.TRY_IT[1].answer(tried) not in shown
    with pytest.raises(ValueError, match="no try is named"):
        answer_tries({"v = 99": 0.5}, tried)

def test_unknown_exercise_is_rejected():
    with pytest.raises(ValueError, match="name"):
        check("softmax", stub)


# ----------------------------------------------------------------------------- display switch


def test_display_mode_resolution(monkeypatch):
    monkeypatch.delenv("GRPO_LAB_DISPLAY", raising=False)
    assert display_mode() == "none"                                   # auto, outside a kernel
    monkeypatch.setenv("GRPO_LAB_DISPLAY", "static")
    assert display_mode() == "static" and display_mode("widget") == "widget"
    monkeypatch.setenv("GRPO_LAB_DISPLAY", "fancy")
    with pytest.raises(ValueError, match="GRPO_LAB_DISPLAY"):
        display_mode()
    with pytest.raises(ValueError, match="mode"):
        display_mode("fancy")
    assert type(new_figure("static")) is go.Figure
    assert isinstance(new_figure("widget"), go.FigureWidget)


# ----------------------------------------------------------------------------- live panel


def test_panel_reruns_when_a_knob_changes():
    problem = BanditProblem.random(contexts=4, arms=3, seed=0)
    panel = BanditPanel(problem, bandit_config(steps=20, lr=1.0), runs=2, mode="none")
    before = np.array(panel.figure.data[3].y)
    assert np.allclose(before, panel.last.J.mean(1)) and np.allclose(before, panel.figure.data[1].y)
    panel.controls["i"].value = 4                                      # fires the observer
    assert panel.last.config.i == 4 and panel.last.optimizer_passes[-1] > 20
    assert not np.allclose(panel.figure.data[3].y, before)
    panel.controls["ref_period"].value = 10                            # β = 0: ignored, not an error
    assert panel.last.config.ref_period == 0 and "ignored" in panel.status.value
    panel.controls["beta"].value = 0.5
    assert panel.last.config.ref_period == 10 and panel.last.config.beta == 0.5
    panel.controls["runs"].value = 3
    assert panel.last.J.shape == (21, 3)
    panel.controls["mask_normalize"].value = "unmasked"
    assert panel.last.config.mask_normalize == "unmasked"
    assert panel.figure not in panel.widget.children                   # a plain go.Figure is not a widget


def test_panel_offers_every_correction_and_its_bounds():
    """The correction dropdown lists every value of the knob; each trains the runs with it, and the cap and floor
    sliders reach the config (under lag, icepop's floor 0.9 and mask's 1/C = 0.8 give different curves)."""
    from grpo_lab.objective import IS_CORRECTIONS
    panel = BanditPanel(BanditProblem.random(contexts=4, arms=3, seed=0), bandit_config(steps=20, lr=1.0, v=8),
                        runs=2, mode="none")
    assert tuple(panel.controls["is_correction"].options) == IS_CORRECTIONS
    panel.controls["is_cap"].value = 1.25
    panel.controls["is_floor"].value = 0.9
    curves = {}
    for value in IS_CORRECTIONS:
        panel.controls["is_correction"].value = value
        assert (panel.last.config.is_correction, panel.last.config.is_cap, panel.last.config.is_floor) == (
            value, 1.25, 0.9)
        curves[value] = panel.last.J.copy()
    assert np.abs(curves["mask"] - curves["icepop"]).max() > 1e-6


def test_panel_optimiser_switch_brings_its_learning_rate_and_clip():
    panel = BanditPanel(lab.lab_problem(), lab.lab_config(steps=30), runs=2, mode="none")
    panel.controls["optimizer"].value = "AdamW, clipped"
    adamw = lab.OPTIMIZER_SETTINGS["AdamW, clipped"]
    assert (panel.last.config.optimizer, panel.last.config.lr, panel.last.config.max_grad_norm) == \
        (adamw["optimizer"], adamw["lr"], adamw["max_grad_norm"])
    batch = panel.last.J.copy()
    panel.controls["mask_normalize"].value = "unmasked"          # clipped: the factor 1/(1 − m) is cut away
    assert np.abs(panel.last.J - batch).max() < 1e-5
    panel.controls["optimizer"].value = "SGD, no clipping"
    assert (panel.last.config.optimizer, panel.last.config.lr, panel.last.config.max_grad_norm) == ("sgd", 1.0, None)
    with pytest.raises(ValueError, match="the panel offers"):
        BanditPanel(lab.lab_problem(), lab.lab_config(steps=5, optimizer="adamw", max_grad_norm=3.0),
                    mode="none")


def view_state(figure: go.FigureWidget) -> tuple[list[dict], dict]:
    """The traces (x and y as arrays) and the layout that a view opened now draws (a reloaded page, the notebook
    reopened): the widget's synced state, as the kernel sends it to a new front end."""
    def values(v):
        if isinstance(v, dict) and "buffer" in v:
            return np.frombuffer(v["buffer"], dtype=v["dtype"]).reshape(v["shape"])
        return np.asarray(v if v is not None else [], dtype=float)

    state = figure.get_state()
    return [{"x": values(t.get("x")), "y": values(t.get("y"))} for t in state["_widget_data"]], state["_widget_layout"]


def same_traces(figure: go.FigureWidget) -> bool:
    """Whether a new view would draw the figure's traces as they are now."""
    traces, _ = view_state(figure)
    return len(traces) == len(figure.data) and all(
        np.array_equal(t["x"], np.asarray(d.x if d.x is not None else [], dtype=float)) and
        np.array_equal(t["y"], np.asarray(d.y if d.y is not None else [], dtype=float))
        for t, d in zip(traces, figure.data, strict=True))


def test_widget_mode_panel_holds_a_figure_widget_that_a_reloaded_page_draws_as_it_is():
    panel = BanditPanel(BanditProblem.random(contexts=3, arms=2), bandit_config(steps=5), runs=1, mode="widget")
    assert isinstance(panel.figure, go.FigureWidget) and panel.widget.children[1] is panel.figure
    assert same_traces(panel.figure) and len(panel.figure.data) == 4            # the traces added after it was built
    assert view_state(panel.figure)[1]["title"]["text"].startswith("Live bandit")
    before = view_state(panel.figure)[0][3]["y"].copy()
    panel.controls["v"].value = 2
    assert panel.last.config.v == 2 and np.allclose(panel.figure.data[3].y, panel.last.J.mean(1))
    assert same_traces(panel.figure) and not np.array_equal(view_state(panel.figure)[0][3]["y"], before)


# ----------------------------------------------------------------------------- studies


def test_smoke_switch_shrinks_the_lab(monkeypatch):
    monkeypatch.setenv("GRPO_LAB_SMOKE", "1")
    assert smoke_mode() and lab.lab_size() == lab.SMOKE and lab.lab_config().steps == lab.SMOKE.steps
    monkeypatch.setenv("GRPO_LAB_SMOKE", "0")
    assert not smoke_mode() and lab.lab_size() == lab.FULL


def test_band_gaps_hand_computed():
    rows = lab.band_gaps([1.0, 3.0], 0.2, torch.linspace(0.01, 5, 500, dtype=torch.float64))
    assert rows[0]["max_gap_A+"] == pytest.approx(0.0) and rows[0]["max_gap_A-"] == pytest.approx(0.0)
    # r′ = 3: additive [2.8, 3.2], multiplicative [2.4, 3.6]; the largest gap is ε·|r′ − 1| = 0.4
    assert (rows[1]["additive_low"], rows[1]["additive_high"]) == pytest.approx((2.8, 3.2))
    assert (rows[1]["multiplicative_low"], rows[1]["multiplicative_high"]) == pytest.approx((2.4, 3.6))
    assert rows[1]["max_gap_A+"] == pytest.approx(0.4, abs=0.01)
    assert rows[1]["max_gap_A-"] == pytest.approx(0.4, abs=0.01)


def test_kl_study_on_policy_unbiased_lagged_biased():
    problem = BanditProblem.random(contexts=4, arms=5, seed=1)
    trajectory = lab.policy_trajectory(problem, bandit_config(steps=40, lr=2.0))
    assert trajectory.shape == (41, 4, 5)
    study = lab.kl_study(trajectory, [0, 30], ref_lag=20)
    for kind in ("k1", "k3"):
        assert study.mean[kind][0] == pytest.approx(study.exact, rel=1e-9)     # on-policy: unbiased
        assert study.iw_mean[kind] == pytest.approx(study.exact, rel=1e-9)     # × π/α: unbiased at any lag
        assert abs(study.mean[kind][1] - study.exact) > 1e-3 * study.exact     # lagged: biased
    with pytest.raises(ValueError, match="ref_lag"):
        lab.kl_study(trajectory, [0], ref_lag=41)


def test_example_batch_has_a_masked_group():
    batch = lab.example_batch(lab.lab_problem(), lab.lab_config())
    masked = ~batch.keep
    assert masked.any()
    assert (batch.rewards[masked] == batch.rewards[masked][:, :1]).all()
    assert (batch.advantages[masked] == 0).all()


def test_wall_clock_follows_the_cost_model():
    model = StepCostModel(gen=2.0, train=3.0, sync=10.0)
    problem = BanditProblem.random(contexts=4, arms=3, seed=0)
    run = run_bandit(problem, bandit_config(steps=20, v=10, i=2), runs=1)
    seconds = lab.wall_clock(run, model)
    assert seconds.shape == (21,)
    assert seconds[-1] == pytest.approx(20 * 2.0 + 3.0 * run.optimizer_passes[-1] + 2 * 10.0)
    paper = lab.lab_cost_model(0.4)
    assert paper.gen + paper.train + paper.sync == pytest.approx(1 / 0.02828, rel=1e-6)
    assert paper.gen + paper.train + paper.sync / 10 == pytest.approx(1 / 0.03828, rel=1e-6)


def test_timelines_map_the_kits_knobs_onto_trls():
    def schedule(steps):
        return [(s.t, s.sampler, s.centre, s.clip_can_act, s.sync) for s in steps]

    assert schedule(lab.kit_timeline(1, 4, 3)) == schedule(lab.trl_timeline(1, 4, 3))      # i = μ, S = 1
    kit, trl = lab.kit_timeline(4, 1, 8), lab.trl_timeline(4, 1, 2)
    assert [s.lag for s in kit] == [s.lag for s in trl] == [0, 1, 2, 3] * 2                         # v = S: staleness
    assert not any(s.clip_can_act for s in kit) and [s.clip_can_act for s in trl] == [False, True, True, True] * 2
    assert [s.sync for s in lab.kit_timeline(2, 2, 4)] == [True, False, False, False] * 2
    assert schedule(lab.trl_timeline(8, 1, 2, gradient_accumulation_steps=2)) == schedule(trl)
    with pytest.raises(ValueError, match="multiple of gradient_accumulation_steps"):
        lab.trl_timeline(3, 1, 1, gradient_accumulation_steps=2)


def test_tight_constants_bound_holds_and_certifies_gains_the_stated_one_cannot():
    study = lab.bound_constants_study(lab.lab_problem(), lab.lab_config(steps=60), runs=2)
    assert (study.improvement >= study.tight - 1e-12).all() and (study.tight >= study.paper - 1e-12).all()
    assert (study.tight <= study.ceiling + 1e-12).all()
    assert study.paper.max() <= 0 < study.tight.max()
    assert np.array_equal(study.paper, run_bandit(lab.lab_problem(), lab.lab_config(steps=60), runs=2,
                                                  track_bound=True).bound)


def test_mask_knobs_under_sgd_and_under_clipped_adamw():
    study = lab.mask_optimizer_study(lab.lab_problem(), lab.lab_config(steps=60, prompts_per_step=2), 2)
    sgd, adamw = "SGD, no clipping", "AdamW, clipped"
    assert study.max_gap(sgd, "no mask", "mask, batch") == 0 == study.max_gap(sgd, "no mask, empty steps taken",
                                                                                "mask, batch")
    assert study.max_gap(sgd, "mask, unmasked", "mask, batch") > 1e-3
    assert study.max_gap(adamw, "mask, unmasked", "mask, batch") < 1e-5
    assert study.max_gap(adamw, "no mask", "mask, batch") == 0 < study.max_gap(adamw, "no mask, empty steps taken",
                                                                               "mask, batch")
    alone = lab.train_runs(lab.lab_problem(), lab.lab_config(steps=20, optimizer="adamw"), runs=3)
    assert alone.J.shape == (21, 3) and alone.masked_frac.shape == (20,)


def test_reward_at_passes():
    run = run_bandit(BanditProblem.random(contexts=4, arms=3), bandit_config(steps=10, i=3), runs=2)
    assert np.array_equal(lab.reward_at_passes(run, run.optimizer_passes[4]), run.J[5])
    with pytest.raises(ValueError, match="passes"):
        lab.reward_at_passes(run, 10_000)


def test_figures_build(monkeypatch):
    monkeypatch.setenv("GRPO_LAB_SMOKE", "1")
    problem, config = BanditProblem.random(contexts=4, arms=3, seed=0), bandit_config(steps=12, lr=1.0)
    results = lab.run_findings(problem, config, runs=2)
    assert set(results) == set(lab.FINDINGS) | {lab.LONG_ON_POLICY, lab.MATCHED_LR}
    figures = [plots.findings_figure(results),
               plots.wall_clock_figure(results, ["on-policy + mask", "v = 10"], lab.lab_cost_model()),
               plots.lag_figure(lab.lag_study(problem, config, [1, 3], runs=2)),
               plots.bound_weight_figure([1e-4, 0.1]),
               plots.surrogate_figure(torch.linspace(0.1, 3, 30, dtype=torch.float64), [0.5, 2.0], 0.2),
               plots.whitening_figure(lab.example_batch(lab.lab_problem(), lab.lab_config())),
               plots.tv_figure(run_bandit(problem, config.replace(v=3), runs=2, track_bound=True)),
               plots.kl_gradient_figure(
                   lab.kl_gradient_study(lab.policy_trajectory(problem, config), [0, 3], 6)),
               plots.bound_constants_figure(lab.bound_constants_study(problem, config, runs=2)),
               plots.timeline_figure({"kit": lab.kit_timeline(2, 2, 4), "TRL": lab.trl_timeline(2, 2, 2)}),
               plots.mask_optimizer_figure(lab.mask_optimizer_study(problem, config, runs=2))]
    assert all(isinstance(f, go.Figure) and len(f.data) > 0 for f in figures)
    assert len(figures[0].data) == 2 * 12                       # 12 curves over four panels, line + band each


# ----------------------------------------------------------------------------- what a reader sees of a panel


def title_clears_toolbar(fig) -> bool:
    """The title starts below plotly's toolbar (which covers the figure's top right corner on hover) and
    ends above the plot area: the top margin holds the toolbar and every line of the title."""
    title, height = fig.layout.title, fig.layout.height
    lines = title.text.count("<br>") + 1
    return (title.yref == "container" and title.yanchor == "top" and (1 - title.y) * height >= TOOLBAR_PX - 1e-9
            and fig.layout.margin.t >= TOOLBAR_PX + lines * TITLE_LINE_PX)


def test_every_knob_shows_its_whole_label_and_a_tooltip():
    """Both panels' knobs come from one table; no label is cut to "…": each fits its label width at 10 px a
    character (the widest label, "mask norm.", is 77 px in JupyterLab's 13 px DejaVu Sans, 7.7 px a character)."""
    from grpo_lab.lm.train_config import TrainConfig
    from grpo_lab.viz.live_panel import make_knobs
    from grpo_lab.viz.widgets import KNOBS, LABEL_PX, make_controls

    panels = [make_controls(lab.lab_config(), runs=2), make_knobs(TrainConfig())]
    assert set(panels[1]) < set(panels[0]) == set(KNOBS)                 # the LM panel's knobs are the bandit's
    for knobs in panels:
        for name, widget in knobs.items():
            assert (widget.description, widget.tooltip) == KNOBS[name] and name in widget.tooltip.split(":")[0]
    labelled = [w for knobs in panels for w in knobs.values() if not isinstance(w, W.Checkbox)]
    assert {w.style.description_width for w in labelled} == {f"{LABEL_PX}px"}
    assert max(len(w.description) for w in labelled) * 10 <= LABEL_PX
    assert "…" not in "".join(w.description for w in labelled)
    assert {w.description for w in labelled} >= {"mask norm.", "empty step"}   # the names notebook 01's exercise 6 uses


def test_live_figures_keep_their_title_below_the_toolbar():
    panel = BanditPanel(BanditProblem.random(contexts=3, arms=2), bandit_config(steps=5), runs=1, mode="none")
    assert title_clears_toolbar(panel.figure)
    assert title_clears_toolbar(dashboard({"v=1": []}, title="two runs<br>in smoke mode"))


def test_a_panel_in_a_kernel_prints_the_restart_hint_above_its_widget(monkeypatch, capsys):
    shown = []
    monkeypatch.setattr(display, "in_kernel", lambda: True)
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append((obj, capsys.readouterr().out)))
    display.show_panel("widget", lambda: "the panel", None, "")
    assert shown == [("the panel", display.RESTART_HINT + "\n")]           # printed before the widget
    assert "re-run this cell" in display.RESTART_HINT and "model not found" in display.RESTART_HINT


def test_dashboard_leaves_a_gap_where_a_step_counted_no_token():
    """A ratio cannot be 0: on a step whose groups were all masked the r′, clip and KL panels show nothing. The gap
    is None, not NaN (a NaN is out of range for the JSON a widget sends); two panels a row, each half the width."""
    loop = build_bandit_loop(BanditProblem.random(contexts=4, arms=3, seed=0),
                             bandit_config(steps=12, G=2, prompts_per_step=1, beta=0.1), runs=1)
    records = list(loop.run())
    empty = [r.step for r in records if r.num_tokens == 0]
    assert empty and len(empty) < len(records)                          # G = 2: some steps fully masked, not all
    fig = dashboard({"G = 2": records, "G = 2 again": [r.to_dict() for r in records]}, title="a bandit")
    assert [t.name for t in fig.data if t.showlegend] == ["G = 2", "G = 2 again"]
    assert [a.text for a in fig.layout.annotations] == [title for _, title in PANELS]
    gap = np.isin(np.arange(len(records)), empty)
    for trace, (key, _) in zip(fig.data, PANELS * 2, strict=True):
        expected = gap if key in OVER_COUNTED_TOKENS else np.zeros_like(gap)
        assert np.array_equal(np.isnan(np.asarray(trace.y, dtype=float)), expected), key
    assert {"ratio_k_max", "clip_low_frac", "kl"} <= OVER_COUNTED_TOKENS
    ratio_max = np.asarray(fig.data[3].y, dtype=float)
    assert np.nanmin(ratio_max) > 0                                      # no 0 plotted for max r′
    assert all(y is None or math.isfinite(y) for trace in fig.data for y in trace.y)
    json.dumps(fig.to_plotly_json()["data"], allow_nan=False, default=list)     # raises on a NaN
    assert all(axis.domain[1] - axis.domain[0] > 0.35 for axis in (fig.layout.xaxis, fig.layout.xaxis2))


def line_styles(fig: go.Figure) -> dict[str, set[tuple]]:
    """Each legend group's drawn line styles (colour, dash, width, opacity) over its lines (bands excluded)."""
    styles: dict[str, set[tuple]] = {}
    for t in fig.data:
        if t.fill is None:
            styles.setdefault(t.legendgroup, set()).add((t.line.color, t.line.dash, t.line.width, t.opacity))
    return styles


def test_findings_and_wall_clock_draw_each_run_in_one_style_and_name_curves_that_coincide():
    problem, config = BanditProblem.random(contexts=4, arms=3, seed=0), bandit_config(steps=12, lr=1.0)
    results = lab.run_findings(problem, config, runs=2)
    findings = plots.findings_figure(results)
    wall = plots.wall_clock_figure(results, ["on-policy + mask", "v = 10"], lab.lab_cost_model())
    styles = line_styles(findings)
    assert all(len(s) == 1 for s in styles.values()), styles   # the legend's style is the style in every panel
    assert line_styles(wall) == {name: styles[name] for name in ("on-policy + mask", "v = 10")}
    # a curve that lies on another is named in its panel's title, computed from the runs
    pairs = plots.coinciding(results, ["on-policy + mask", "v = 10", "sample reuse i = 10"])
    gap = np.abs(results["v = 10"].J.mean(1) - results["on-policy + mask"].J.mean(1)).max()
    same = gap < plots.COINCIDE_ATOL
    assert (("v = 10", "on-policy + mask") in pairs) == same
    subtitles = [a.text for a in findings.layout.annotations]
    assert ("v = 10<br>lies on on-policy + mask" in subtitles[1]) == same
    assert plots.coinciding(results, ["on-policy, no mask", "sample reuse i = 10"]) == []
    v10 = next(t for t in findings.data if t.name == "v = 10" and t.fill is None)
    assert v10.line.width > 2 and v10.opacity < 1            # wide and translucent: v = 1's dashes show through it


def test_theorem1_lm_figure_gives_every_series_its_own_style_titles_and_integer_steps():
    from grpo_lab.exact.digits_lm import ExactStep, bound_figure

    rng = np.random.default_rng(0)
    steps = [ExactStep(k=k, lag=k % 3, **{f: rng.random(2) for f in ("J_k", "J_next", "mu_alpha", "sigma", "L",
                                                                       "tv_next", "tv_k", "bound")})
             for k in range(4)]
    fig = bound_figure({"v = 1": steps, "v = 3": steps}, ["4 + 0", "0 + 4"])
    drawn = [(t.line.color, t.line.dash, t.marker.symbol) for t in fig.data]
    assert len(set(drawn)) == 2 * 4 == len(drawn) // 2           # 2 prompts × 4 series, the same in both columns
    assert len({t.name for t in fig.data if t.showlegend}) == 8
    layout = fig.to_dict()["layout"]
    axes = [layout[key] for key in layout if key.startswith(("xaxis", "yaxis"))]
    assert len(axes) == 8 and all(axis["title"]["text"] for axis in axes)
    assert all(layout[key]["dtick"] == 1 for key in layout if key.startswith("xaxis"))
    assert len(fig.layout.annotations) == 4 and all(a.text for a in fig.layout.annotations)   # a title per panel
