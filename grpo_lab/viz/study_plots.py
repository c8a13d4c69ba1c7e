"""Figures of notebook 02's CPU study: curves per configuration (mean ± 95 % CI over seeds),
paired differences, Pass@1 per step and per second, and one group's tokens.

Everything drawn comes from :mod:`grpo_lab.study.results` (or a live loop); nothing here
computes more than a mean and an interval.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..study.results import Paired, Study, mean_ci
from .plots import COLORS, HEIGHT

ARM_LABELS = {"onpolicy": "on-policy, no mask", "masked": "on-policy + mask", "lr_matched": "no mask, lr-matched",
              "lagged_v8": "v = 8 + mask", "reuse_i4": "i = 4 + mask"}


def arm_color(study: Study, arm: str) -> str:
    return COLORS[study.arms.index(arm) % len(COLORS)] if arm in study.arms else "grey"


def ci_traces(x: np.ndarray, Y: np.ndarray, name: str, color: str, showlegend: bool = True,
              dash: str | None = None) -> list[go.Scatter]:
    """Mean over seeds as a line, its 95 % CI as a band; ``Y [len(x), seeds]``, NaN where a seed has no
    value (no band with one seed; the band narrows to the line at a point only one seed measured)."""
    mean, half = mean_ci(Y, axis=1)
    half = np.nan_to_num(half)
    line = go.Scatter(x=x, y=mean, name=name, legendgroup=name, showlegend=showlegend,
                      line=dict(color=color, dash=dash), mode="lines+markers" if len(x) < 8 else "lines")
    if Y.shape[1] < 2:
        return [line]
    band = go.Scatter(x=np.concatenate([x, x[::-1]]), y=np.concatenate([mean + half, (mean - half)[::-1]]),
                      fill="toself", fillcolor=color, opacity=0.18, line=dict(width=0), hoverinfo="skip",
                      showlegend=False, legendgroup=name)
    return [band, line]


def study_curves_figure(study: Study, arms: Sequence[str] | None = None, smooth: int = 4) -> go.Figure:
    """Training reward (moving mean over ``smooth`` steps) and held-out Pass@1 against the
    step (top) and the optimiser passes made (bottom: i per step that trained, the cost measure
    that machine load does not move), mean ± 95 % CI over seeds."""
    arms = list(arms or study.arms)
    fig = make_subplots(rows=2, cols=2, horizontal_spacing=0.09, vertical_spacing=0.16, subplot_titles=(
        f"training reward (mean of {smooth} steps)", "held-out Pass@1", "training reward vs optimiser passes",
        "held-out Pass@1 vs optimiser passes"))
    for arm in arms:
        color, name = arm_color(study, arm), ARM_LABELS.get(arm, arm)
        reward = study.steps_matrix(arm, "reward_mean")
        kernel = np.ones(smooth) / smooth
        smoothed = np.stack([np.convolve(col, kernel, mode="valid") for col in reward.T], axis=1)
        steps = np.arange(smooth - 1, reward.shape[0])
        trained = 1 - study.steps_matrix(arm, "skipped").astype(float)
        cost = np.cumsum(study.runs(arm)[0]["i"] * trained, axis=0).mean(axis=1)     # passes after each step
        pass_steps, passes = study.pass_curve(arm)
        pass_cost = np.concatenate([[0.0], cost[pass_steps[1:] - 1]])
        for trace in ci_traces(steps, smoothed, name, color):
            fig.add_trace(trace, row=1, col=1)
        for trace in ci_traces(pass_steps, passes, name, color, showlegend=False):
            fig.add_trace(trace, row=1, col=2)
        for trace in ci_traces(cost[smooth - 1:], smoothed, name, color, showlegend=False):
            fig.add_trace(trace, row=2, col=1)
        for trace in ci_traces(pass_cost, passes, name, color, showlegend=False):
            fig.add_trace(trace, row=2, col=2)
    for col in (1, 2):
        fig.update_xaxes(title_text="step k", row=1, col=col)
        fig.update_xaxes(title_text="optimiser passes (mean over seeds)", row=2, col=col)
    fig.update_layout(height=2 * HEIGHT, title=f"CPU study: {study.summary['model']} on {study.summary['task']}, "
                      f"mean ± 95 % CI over seeds")
    return fig


def paired_figure(diffs: Sequence[Paired]) -> go.Figure:
    """Each paired difference of held-out Pass@1 (a − b) with its 95 % CI and the seeds' values."""
    fig = go.Figure()
    labels = [f"{ARM_LABELS.get(d.a, d.a)} − {ARM_LABELS.get(d.b, d.b)} (n = {d.n})" for d in diffs]
    fig.add_trace(go.Scatter(x=[d.mean for d in diffs], y=labels, mode="markers", marker=dict(size=11),
                             error_x=dict(type="data", array=[0 if np.isnan(d.half) else d.half for d in diffs]),
                             name="mean ± 95 % CI"))
    fig.add_trace(go.Scatter(x=[x for d in diffs for x in d.diffs],
                             y=[label for d, label in zip(diffs, labels, strict=True) for _ in d.diffs],
                             mode="markers", marker=dict(symbol="x", color="grey"), name="one seed"))
    fig.add_vline(x=0, line_dash="dot")
    fig.update_layout(height=140 + 60 * len(diffs), xaxis_title="Δ held-out Pass@1 after training",
                      title="Paired differences (same seeds, same questions)", yaxis=dict(autorange="reversed"))
    return fig


def token_ratio_figure(tokens: Sequence[Sequence[str]], ratios: np.ndarray, rewards: Sequence[float],
                       advantages: Sequence[float], lag: int) -> go.Figure:
    """Heat map of the per-token r′ = π_k/α of one group's completions (rows), padding blank."""
    text = [[t for t in row] + [""] * (ratios.shape[1] - len(row)) for row in tokens]
    labels = [f"y{j + 1}: r={r:.0f} A={a:+.2f}" for j, (r, a) in enumerate(zip(rewards, advantages, strict=True))]
    fig = go.Figure(go.Heatmap(z=ratios, text=text, texttemplate="%{text}", y=labels, colorscale="RdBu",
                               zmid=1.0, colorbar=dict(title="r′")))
    fig.update_layout(title=f"Per-token r′ = π_k/α at lag {lag}", yaxis=dict(autorange="reversed"),
                      xaxis_title="token t", height=120 + 34 * len(tokens))
    return fig
