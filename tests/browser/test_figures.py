"""The figures issue 37 named, drawn by Chromium from standalone pages (offline, plotly inlined): notebook
01b's Theorem 1 figure, notebook 01's findings and wall-clock figures, notebook 02's group view and run
dashboard, and its drift figure (on made-up records of two runs). For each, a screenshot in
``outputs/browser/`` and what a test can check of the drawing: every axis has its title, the legend lists
every named series, and no label is cut short with "…". Run with ``make test-browser``."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest

from grpo_lab.exact import bandit_lab
from grpo_lab.exact.digits_lm import ExactStep, bound_figure
from grpo_lab.viz import plots
from grpo_lab.viz.dashboard import dashboard
from grpo_lab.viz.token_ratios import token_ratio_figure
from studies.lag_frontier import plots as frontier_plots

pytestmark = pytest.mark.browser

# What the browser drew: axis titles (plotly's text.xtitle, text.x2title, …), legend entries, and any text
# that ends in an ellipsis.
DRAWING = """() => {
    const texts = [...document.querySelectorAll('.main-svg text')];
    return {
        axisTitles: texts.filter(t => /^[xy]\\d*title$/.test(t.getAttribute('class') || ''))
                         .map(t => t.textContent.trim()),
        legend: [...document.querySelectorAll('.legend .traces .legendtext')].map(t => t.textContent.trim()),
        cut: texts.map(t => t.textContent).filter(s => s.includes('…')),
    };
}"""

DRAWN = """() => { const gd = document.querySelector('.js-plotly-plot');
    return gd && gd._fullData && gd._fullData.length > 0 && gd.querySelector('.trace, .hm'); }"""
"""The page has drawn its figure: a plotted trace (a scatter's or bar's) or a heat map."""


def exact_steps(k: int, lag_every: int) -> list[ExactStep]:
    """A run's worth of :class:`ExactStep` values for two prompts (the figure only draws them)."""
    rng = np.random.default_rng(k)
    return [ExactStep(k=j, lag=j % lag_every, J_k=rng.random(2), J_next=rng.random(2), mu_alpha=rng.random(2),
                      sigma=rng.random(2), L=rng.random(2), tv_next=rng.random(2), tv_k=rng.random(2),
                      bound=-rng.random(2)) for j in range(4)]


def made_unit(arm: str, v: int, correction: str, steps: int = 24) -> dict:
    """A unit's fields the run dashboard and the drift figure draw, for a run synced every ``v`` steps."""
    rng = np.random.default_rng(v)
    records = [{"step": k, "lag": k % v, "synced": k % v == 0, "skipped": k % 7 == 6,
                "num_tokens": 0 if k % 7 == 6 else 60,
                "reward_mean": min(1.0, 0.1 + 0.03 * k + 0.05 * rng.random()), "masked_frac": rng.random(),
                "ratio_k_max": 1 + 0.2 * (k % v), "log_ratio_k_abs": 0.05 * (k % v), "log_ratio_k_p50": 0.0,
                "log_ratio_k_p99": 0.1 * (k % v), "clip_low_frac": 0.01 * (k % v), "kl": 0.0,
                "sample_seconds": 1.0, "train_seconds": 2.0, "sync_seconds": 0.1 * (k % v == 0),
                "ess_token": 1 - 0.02 * (k % v), "ess_token_applied": 1 - 0.01 * (k % v),
                "cap_frac": 0.01 * (k % v) if correction == "truncated" else 0.0} for k in range(steps)]
    return {"arm": arm, "v": v, "is_correction": correction, "seed": 0, "records": records}


def figures() -> dict[str, go.Figure]:
    problem, config = bandit_lab.lab_problem(), bandit_lab.lab_config(steps=40)
    findings = bandit_lab.run_findings(problem, config, runs=2)
    units = [made_unit("v1", 1, "ratio"), made_unit("v4_truncated", 4, "truncated")]
    ratios = np.array([[1.02, 0.97, 1.10, 0.0], [0.95, 1.01, 1.04, 1.08]])          # 0: padding
    return {
        "group_view": token_ratio_figure([["4", "<|im_end|>", "", ""], [" 7", ".", "<|im_end|>", "x"]], ratios,
                                         [1.0, 0.0], [0.71, -0.71], lag=3),
        "run_dashboard": dashboard({u["arm"]: u["records"] for u in units}, title="two made-up runs"),
        "frontier_drift": frontier_plots.drift_figure(units),
        "theorem1_smollm2": bound_figure({"v = 1": exact_steps(0, 1), "v = 3": exact_steps(1, 3)},
                                         ["4 + 0", "0 + 4"]),
        "findings": plots.findings_figure(findings),
        "wall_clock": plots.wall_clock_figure(findings, ["on-policy + mask", "v = 10", "sample reuse i = 10"],
                                              bandit_lab.lab_cost_model()),
    }


def axis_titles(fig: go.Figure) -> list[str]:
    """The title of every x and y axis of ``fig``'s layout ('' where one has none)."""
    layout = fig.to_dict()["layout"]
    return [(layout[key].get("title") or {}).get("text", "") for key in layout if key.startswith(("xaxis", "yaxis"))]


def test_named_figures_have_titled_axes_full_legends_and_no_cut_labels(tmp_path, chromium_page, screenshot_dir,
                                                                       deadline):
    page = chromium_page.page
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
               else route.abort())                      # offline: plotly is inlined in each page
    for name, fig in figures().items():
        titles = axis_titles(fig)
        assert titles and all(titles), f"{name}: an axis without a title: {titles}"
        named = {t.name for t in fig.data if t.showlegend is not False and t.name and t.type != "heatmap"}
        html = tmp_path / f"{name}.html"
        fig.write_html(html, include_plotlyjs=True, full_html=True)
        page.goto(html.as_uri(), timeout=deadline.ms(30))
        page.wait_for_function(DRAWN, timeout=deadline.ms(30))
        drawn = page.evaluate(DRAWING)
        assert sorted(drawn["axisTitles"]) == sorted(titles), name
        assert set(drawn["legend"]) == named, name
        assert not drawn["cut"], f"{name}: labels cut short: {drawn['cut']}"
        page.screenshot(path=screenshot_dir / f"figure_{name}.png", full_page=True)
    assert not chromium_page.errors, chromium_page.errors
