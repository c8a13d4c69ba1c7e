"""Notebook 03's figures: measured step times and predicted speed-ups of a lag v.

The numbers come from :mod:`grpo_lab.scale.throughput` (measure, fit, predict); each function here
only draws them.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative

from ..loop import StepRecord
from ..scale.costmodel import PAPER_ITERS_PER_SECOND, StepCostModel, paper_cost_model, paper_effective_bandwidth_gb_s
from ..scale.throughput import (
    MEASURED,
    MODEL_SIZES,
    PAPER,
    WARMUP_STEPS,
    effective_v,
    size_speedups,
    step_seconds,
    timed,
)
from .display import new_figure


def step_time_figure(runs: Mapping[str, Sequence[StepRecord]], model: StepCostModel) -> go.Figure:
    """MEASURED mean seconds per step, split into sample / train / sync, beside the step time the
    v = 1 fit predicts at each run's effective v."""
    names, windows = list(runs), [timed(r) for r in runs.values()]
    fig = new_figure(barmode="stack", height=380, yaxis_title="seconds per step",
                     title=f"{MEASURED}: mean step time after {WARMUP_STEPS} warm-up step (shared machine: noisy)")
    for key, label in (("sample_seconds", "sample (gen)"), ("train_seconds", "train"), ("sync_seconds", "sync")):
        fig.add_bar(x=names, y=[np.mean([getattr(r, key) for r in w]) for w in windows], name=f"{label}, {MEASURED}")
    fig.add_scatter(x=names, y=[float(model.step_seconds(effective_v(w))) for w in windows], mode="markers",
                    marker=dict(symbol="diamond", size=12, color="black"), name="predicted from the v=1 fit")
    return fig


def speedup_v_figure(measured: StepCostModel, runs: Mapping[str, Sequence[StepRecord]], base: str = "v=1",
                     max_v: int = 32) -> go.Figure:
    """Predicted speed-up step(1)/step(v) for v = 1..max_v: the PAPER 7B model and the model fitted
    here, with the measured points: the paper's v = 10 and, per run, step(base) / step(run) at the
    run's steps per sync."""
    vs, paper = np.arange(1, max_v + 1), paper_cost_model()
    fig = new_figure(height=380, xaxis_title="v (steps per sync)", yaxis_title="speed-up step(1) / step(v)",
                     title="What a lag of v buys: step(v) = gen + train + sync / v")
    fig.add_scatter(x=vs, y=paper.speedup(vs), name=f"{PAPER} 7B colocate model (sync {paper.sync:.1f} s)")
    fig.add_scatter(x=vs, y=measured.speedup(vs), name=f"fit to {base}, {MEASURED} (sync {measured.sync:.2g} s)")
    fig.add_scatter(x=[10], y=[PAPER_ITERS_PER_SECOND[10] / PAPER_ITERS_PER_SECOND[1]], mode="markers",
                    marker=dict(size=11), name=f"{PAPER} measured, v=10")
    one = step_seconds(timed(runs[base]))
    windows = {name: timed(records) for name, records in runs.items()}
    fig.add_scatter(x=[effective_v(w) for w in windows.values()], y=[one / step_seconds(w) for w in windows.values()],
                    text=list(windows), mode="markers", marker=dict(size=11, symbol="x"),
                    name=f"{MEASURED}: step({base}) / step(run)")
    return fig


def speedup_size_figure(v: int, fixed_shares: Sequence[float]) -> go.Figure:
    """Predicted speed-up at lag v against model size, one line per assumption (see :func:`size_model`)."""
    fig = new_figure(height=380, xaxis_title="parameters N", xaxis_type="log", yaxis_title=f"speed-up at v={v}",
                     title=f"{PAPER}-anchored prediction against model size (sync at "
                           f"{paper_effective_bandwidth_gb_s():.2f} GB/s, bf16)")
    for share, speedups in size_speedups(v, fixed_shares).items():
        fig.add_scatter(x=list(MODEL_SIZES.values()), y=speedups, text=list(MODEL_SIZES), mode="lines+markers",
                        hovertemplate="%{text}: %{y:.3f}", name=f"gen+train: {share:.0%} fixed per step, rest ∝ N")
    # the sizes named once, on the axis: over each line's points their names run into each other
    fig.update_xaxes(tickvals=list(MODEL_SIZES.values()), ticktext=list(MODEL_SIZES))
    return fig


def split_figure(data: Mapping[str, Any]) -> go.Figure:
    """Per step of each run (:func:`~grpo_lab.scale.throughput.load_split`'s data), the two parts of log r′:
    staleness |log π_k − log π_sync| (solid, filled markers) and mismatch |log π_sync − log α| (dotted, open
    markers), one colour per run, log scale (a part equal to 0 is not drawn)."""
    fig = new_figure(height=420, xaxis_title="step k (lag in the hover)", yaxis_title="mean |·| per token",
                     yaxis_type="log", title="MEASURED by experiments/offpolicy_split.py: log r′ in two parts")
    for run, color in zip(data["runs"], itertools.cycle(qualitative.Plotly)):
        steps = [r["step"] for r in run["records"]]
        lags = [f"lag {r['lag']}" for r in run["records"]]
        for key, dash, symbol in (("staleness_abs", "solid", "circle"), ("mismatch_abs", "dot", "circle-open")):
            values = [r[key] if r[key] > 0 else None for r in run["records"]]
            if any(value is not None for value in values):  # v = 1: staleness is 0 at every step
                fig.add_scatter(x=steps, y=values, text=lags, mode="lines+markers", line=dict(dash=dash, color=color),
                                marker_symbol=symbol, name=f"{run['name']}: {key.removesuffix('_abs')}")
    return fig


def fit_figure(stats: Mapping[int, tuple[float, float]], model: StepCostModel, source: str) -> go.Figure:
    """MEASURED mean step time ± standard error at each v beside the fitted step(v) curve."""
    vs = np.array(sorted(stats), dtype=float)
    grid = np.linspace(1, vs.max(), 64)
    fig = new_figure(height=380, xaxis_title="v (steps per sync)", yaxis_title="seconds per step",
                     title=f"step(v) = gen + train + sync / v, fitted to the {MEASURED} means ({source})")
    fig.add_scatter(x=vs, y=[stats[int(v)][0] for v in vs], mode="markers", marker=dict(size=10),
                    error_y=dict(type="data", array=[stats[int(v)][1] for v in vs]),
                    name=f"{MEASURED}: mean ± standard error")
    fig.add_scatter(x=grid, y=model.step_seconds(grid), mode="lines",
                    name=f"fit: {model.gen + model.train:.3g} s + {model.sync:.3g} s / v")
    return fig

