"""Figures of notebook 02's CPU study: Pass@1 against steps with the drift by lag beside it, the
paired differences against v = 1 with their equivalence margin, the secondary arms, and one
group's tokens.

Everything drawn comes from :mod:`grpo_lab.study.design`'s reader (or a live loop); nothing here computes
more than a mean and an interval. Every band is a 95 % t interval over seeds clipped to the range
of its quantity (Pass@1 and reward in [0, 1], drift ≥ 0, :func:`~grpo_lab.study.results.bounded_mean_ci`);
an arm with one seed is drawn as a line without a band.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..study.design import ARM_BY_NAME, ARMS, PRIMARY, Study
from ..study.results import PairedTest, bounded_mean_ci
from .plots import COLORS, HEIGHT

ARM_LABELS = {"v1": "v = 1", "v8_ratio": "v = 8, ratio", "v32_ratio": "v = 32, ratio", "v8_none": "v = 8, none",
              "v32_none": "v = 32, none", "v1_i4": "v = 1, i = 4", "v1_steps4": "v = 1, 4× steps",
              "mask_b04": "mask, β = 0.04", "nomask_b04": "no mask, β = 0.04"}
"""Short names: v, then ``is_correction`` (ratio: the paper's r′ = π_k/α; none: A·∇log π, no correction)."""
PASS_BOUNDS = (0.0, 1.0)
DRIFT_BOUNDS = (0.0, math.inf)


def arm_label(arm: str) -> str:
    return ARM_LABELS.get(arm, arm)


def arm_color(arm: str) -> str:
    """One colour per arm of the study, the same in every figure whichever arms have finished."""
    names = [a.name for a in ARMS]
    return COLORS[names.index(arm) % len(COLORS)] if arm in names else "grey"


def ci_traces(x: np.ndarray, Y: np.ndarray, name: str, color: str, bounds: tuple[float, float],
              showlegend: bool = True, dash: str | None = None) -> list[go.Scatter]:
    """Mean over seeds as a line and its 95 % t interval clipped to ``bounds`` as a band; ``Y [len(x), seeds]``,
    NaN where a seed has no value (no band with one seed; the band narrows to the line at a point only
    one seed measured)."""
    mean, low, high = bounded_mean_ci(Y, *bounds, axis=1)
    line = go.Scatter(x=x, y=mean, name=name, legendgroup=name, showlegend=showlegend,
                      line=dict(color=color, dash=dash), mode="lines+markers" if len(x) < 8 else "lines")
    if Y.shape[1] < 2:
        return [line]
    low, high = np.where(np.isnan(low), mean, low), np.where(np.isnan(high), mean, high)
    band = go.Scatter(x=np.concatenate([x, x[::-1]]), y=np.concatenate([high, low[::-1]]), fill="toself",
                      fillcolor=color, opacity=0.18, line=dict(width=0), hoverinfo="skip", showlegend=False,
                      legendgroup=name)
    return [band, line]


def _no_data(fig: go.Figure, text: str, col: int) -> None:
    """``text`` in the middle of subplot ``col`` of a one-row figure that has nothing to draw there."""
    axis = "" if col == 1 else str(col)          # in paper coordinates: plotly draws no axis without a trace
    x, y = fig.layout[f"xaxis{axis}"].domain, fig.layout[f"yaxis{axis}"].domain
    fig.add_annotation(text=text, showarrow=False, xref="paper", yref="paper", x=sum(x) / 2, y=sum(y) / 2,
                       xanchor="center", yanchor="middle")


def pass_figure(study: Study, arms: Sequence[str] = tuple(a.name for a in PRIMARY)) -> go.Figure:
    """(a) Held-out Pass@1 (strict) against the step for ``arms``, mean ± 95 % CI over seeds (step 0 is
    the untrained model); (b) beside it, the drift at each lag: mean |log r′| = |log π_k − log α| over
    a step's tokens (``log_ratio_k_abs``), each seed's mean over its trained steps at that lag."""
    have = [arm for arm in arms if arm in study.arms]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, column_widths=[0.55, 0.45], subplot_titles=(
        "(a) held-out Pass@1, strict", "(b) drift: mean |log r′| at each lag"))
    lagged = 0
    for arm in have:
        name, color = f"{arm_label(arm)} (n = {study.n(arm)})", arm_color(arm)
        steps, values = study.pass_curve(arm)
        for trace in ci_traces(steps, values, name, color, PASS_BOUNDS):
            fig.add_trace(trace, row=1, col=1)
        lags, drift = study.drift_by_lag(arm)
        if len(lags) > 1:
            lagged += 1
            for trace in ci_traces(lags, drift, name, color, DRIFT_BOUNDS, showlegend=False):
                fig.add_trace(trace, row=1, col=2)
    if not have:
        _no_data(fig, "no finished unit of these arms yet", col=1)
    if not lagged:
        _no_data(fig, "no finished unit with v > 1 yet", col=2)
    fig.update_xaxes(title_text="step k", row=1, col=1)
    fig.update_yaxes(title_text="Pass@1", range=[0, 1], row=1, col=1)
    fig.update_xaxes(title_text="lag k − k0 (steps since α was synced)", row=1, col=2)
    fig.update_yaxes(title_text="mean |log r′| per token", rangemode="tozero", row=1, col=2)
    fig.update_layout(height=HEIGHT, margin=dict(t=70), title=_title(study, "mean ± 95 % CI over seeds"))
    return fig


def _title(study: Study, what: str) -> str:
    s = study.settings
    return f"{s.get('model', '?')} on {s.get('task', '?')}, {s.get('steps', '?')} steps: {what}"


def paired_figure(tests: Sequence[PairedTest]) -> go.Figure:
    """Each paired difference of held-out Pass@1 (arm − reference, seed by seed) with its 90 % CI (thick:
    the equivalence test) and 95 % CI (thin: the difference test), the seeds' values, and the margin
    ±m shaded: "equivalent" needs the thick bar inside it, "worse" the thin bar left of 0."""
    fig = go.Figure()
    labels = [f"{arm_label(t.a)} − {arm_label(t.b)} (n = {t.n}): {t.verdict}" for t in tests]
    for level, width in ((0.95, 1.5), (0.90, 6)):
        intervals = [(t, t.ci(level)) for t in tests]
        shown = [(t, ci, label) for (t, ci), label in zip(intervals, labels, strict=True) if ci is not None]
        fig.add_trace(go.Scatter(
            x=[t.estimate for t, _, _ in shown], y=[label for _, _, label in shown], mode="markers",
            marker=dict(size=1, color="black"), showlegend=bool(shown),
            name=f"{level:.0%} CI ({'thick bar: equivalence' if level == 0.90 else 'thin bar: difference'})",
            error_x=dict(type="data", symmetric=False, array=[ci[1] - t.estimate for t, ci, _ in shown],
                         arrayminus=[t.estimate - ci[0] for t, ci, _ in shown], thickness=width, width=0,
                         color="black")))
    fig.add_trace(go.Scatter(x=[t.estimate for t in tests], y=labels, mode="markers", name="mean difference",
                             marker=dict(size=11, color=[arm_color(t.a) for t in tests])))
    fig.add_trace(go.Scatter(x=[d for t in tests for d in t.diffs], y=[lab for t, lab in zip(tests, labels, strict=True)
                                                                      for _ in t.diffs],
                             mode="markers", marker=dict(symbol="x", color="grey"), name="one seed"))
    for margin in sorted({t.margin for t in tests}):
        fig.add_vrect(x0=-margin, x1=margin, fillcolor="green", opacity=0.12, line_width=0)
    fig.add_vline(x=0, line_dash="dot")
    margins = ", ".join(f"±{m:g}" for m in sorted({t.margin for t in tests})) or "none"
    fig.update_layout(height=160 + 55 * max(len(tests), 1),
                      yaxis=dict(autorange="reversed", categoryorder="array", categoryarray=labels),
                      xaxis_title=f"Δ held-out Pass@1 after training (shaded: equivalence margin {margins})",
                      title="Paired differences against the reference (same seeds, same questions)",
                      margin=dict(l=20))
    if not tests:
        fig.add_annotation(text="no comparison has both arms yet", showarrow=False, xref="paper", yref="paper",
                           x=0.5, y=0.5)
    return fig


def secondary_figure(study: Study) -> go.Figure:
    """The secondary arms, mean ± 95 % CI over seeds: (a) sample reuse against the optimiser passes made
    (i per trained step): ``v1_i4`` against ``v1`` (the same samples) and ``v1_steps4`` (as many passes,
    each on fresh samples); (b) the zero-variance mask at β = 0.04 against the step."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=(
        "(a) sample reuse: Pass@1 per optimiser pass", "(b) the mask at β = 0.04: Pass@1"))
    for col, arms in ((1, ("v1", "v1_i4", "v1_steps4")), (2, ("mask_b04", "nomask_b04"))):
        have = [arm for arm in arms if arm in study.arms]
        for arm in have:
            steps, values = study.pass_curve(arm)
            x = steps
            if col == 1:
                trained = 1.0 - np.nan_to_num(study.metric(arm, "skipped"))
                passes = np.concatenate([np.zeros((1, trained.shape[1])), np.cumsum(trained, axis=0)])
                x = ARM_BY_NAME[arm].i * passes[np.minimum(steps, len(passes) - 1)].mean(axis=1)
            for trace in ci_traces(x, values, f"{arm_label(arm)} (n = {study.n(arm)})", arm_color(arm), PASS_BOUNDS):
                fig.add_trace(trace, row=1, col=col)
        if not have:
            _no_data(fig, "no finished unit of these arms yet", col=col)
        fig.update_yaxes(title_text="Pass@1" if col == 1 else None, range=[0, 1], row=1, col=col)
    fig.update_xaxes(title_text="optimiser passes (mean over seeds)", row=1, col=1)
    fig.update_xaxes(title_text="step k", row=1, col=2)
    fig.update_layout(height=HEIGHT, margin=dict(t=70),
                      title=_title(study, "secondary arms, mean ± 95 % CI over seeds"))
    return fig


R_PRIME_REACH = math.log2(1.1)
"""The colour scale reaches at least r′ ∈ [1/1.1, 1.1]: r′ = 1 everywhere still gets distinct colour-bar ticks."""


def token_ratio_figure(tokens: Sequence[Sequence[str]], ratios: np.ndarray, rewards: Sequence[float],
                       advantages: Sequence[float], lag: int, note: str = "") -> go.Figure:
    """Heat map of the per-token r′ = π_k/α of one group's completions (rows), padding blank; the colour
    is log₂ r′ (symmetric about r′ = 1), the colour bar labelled in r′; tokens at integer positions.
    ``note`` (e.g. :attr:`~grpo_lab.lm.group_view.GroupView.note`) goes under the title."""
    text = [list(row) + [""] * (ratios.shape[1] - len(row)) for row in tokens]
    labels = [f"y{j + 1}: r={r:.0f} A={a:+.2f}" for j, (r, a) in enumerate(zip(rewards, advantages, strict=True))]
    with np.errstate(divide="ignore"):
        z = np.where(ratios > 0, np.log2(np.where(ratios > 0, ratios, 1.0)), np.nan)
    reach = max(float(np.nanmax(np.abs(z))) if np.isfinite(z).any() else 0.0, R_PRIME_REACH)
    ticks = np.linspace(-reach, reach, 5)
    fig = go.Figure(go.Heatmap(
        z=z, text=text, texttemplate="%{text}", y=labels, colorscale="RdBu", zmid=0.0, zmin=-reach, zmax=reach,
        customdata=ratios, hovertemplate="%{y}, token %{x}: %{text}, r′ = %{customdata:.4f}<extra></extra>",
        colorbar=dict(title=dict(text="r′", side="top"), tickvals=ticks, ticktext=[f"{2 ** t:.3g}" for t in ticks],
                      len=1.0, thickness=14)))
    title = f"Per-token r′ = π_k/α at lag {lag}" + (f"<br><sup>{note}</sup>" if note else "")
    fig.update_layout(title=title, yaxis=dict(autorange="reversed", title="completion: reward r, advantage A"),
                      xaxis=dict(title="token t", tick0=0, dtick=max(1, math.ceil(ratios.shape[1] / 20))),
                      height=max(300, 140 + 34 * len(tokens)))
    return fig
