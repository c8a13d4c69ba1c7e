"""A dashboard of an LLM run's step records (notebooks 02 and 03).

One figure, one panel per question a reader asks of a run: is reward rising,
how many groups carry signal, how stale is α, how far did α drift, what does a
step cost. Several runs (e.g. v = 1 and v = 4) share the panels, one colour each.
A step whose loss counted no token (every group masked) has no r′, clip fraction or KL
over counted tokens: those panels leave a gap there (None: JSON has no NaN), not a 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..objective import NO_TOKEN_METRICS
from .display import new_figure, title_below_toolbar

PANELS = (
    ("reward_mean", "reward (mean of P·G)"),
    ("masked_frac", "masked fraction (σ = 0)"),
    ("lag", "lag k − k0"),
    ("ratio_k_max", "max r′ = π_k/α"),
    ("log_ratio_k_abs", "mean |log π_k − log α|"),
    ("clip_low_frac", "clip fraction (low)"),
    ("kl", "KL(π_θ‖π_ref)"),
    ("step_seconds", "seconds per step"),
)
"""(field, title): two panels a row, so each title and y-axis title has half a notebook's width; seconds per step are
sample + train + sync."""
UNITS = {"reward_mean": "reward", "masked_frac": "share of groups", "lag": "steps", "ratio_k_max": "r′",
         "log_ratio_k_abs": "nats a token", "clip_low_frac": "share of tokens", "kl": "nats a token",
         "step_seconds": "s"}
"""Each panel's y-axis title (its quantity's unit); every x axis is the step."""
OVER_COUNTED_TOKENS = {*NO_TOKEN_METRICS, "kl"} - {"num_tokens"}
"""Fields that are means or maxima over the loss's counted tokens: undefined on a step that counted none."""
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
COLUMNS = 2
HEIGHT = 900
SUBPLOT_TITLE_PX = 20
"""Room above the top row for its subplot titles (12 px font)."""


def _values(records: Sequence[Any], key: str) -> list[float | None]:
    """``key`` of each record; None (a gap) where the field is over counted tokens and the step counted none, or
    is not finite (plotly draws both as gaps; a NaN in a figure's JSON is out of range for the format)."""
    rows = [r if isinstance(r, Mapping) else r.to_dict() for r in records]
    if key == "step_seconds":
        return [r["sample_seconds"] + r["train_seconds"] + r["sync_seconds"] for r in rows]
    if key in OVER_COUNTED_TOKENS:
        return [r[key] if r["num_tokens"] and math.isfinite(r[key]) else None for r in rows]
    return [r[key] if math.isfinite(r[key]) else None for r in rows]


def dashboard(runs: Mapping[str, Sequence[Any]], title: str = "", mode: str | None = None) -> go.Figure:
    """Panels of the metrics in ``docs/metrics.md`` for each named run's records
    (``StepRecord`` s or their dicts, e.g. from ``training.load_metrics``), under ``title``."""
    rows = -(-len(PANELS) // COLUMNS)
    fig = make_subplots(rows=rows, cols=COLUMNS, subplot_titles=[heading for _, heading in PANELS],
                        horizontal_spacing=0.14, vertical_spacing=0.09)
    fig.update_layout(**title_below_toolbar(title, HEIGHT, headroom=SUBPLOT_TITLE_PX))
    fig.update_layout(margin=dict(b=30))
    fig.update_annotations(font_size=12)
    for order, (colour, (name, records)) in enumerate(zip(COLOURS * 4, runs.items())):
        steps = _values(records, "step")
        later = len(runs) - 1 - order   # runs drawn over this one: its markers show around theirs where they meet
        for index, (key, _) in enumerate(PANELS):
            fig.add_trace(go.Scatter(x=steps, y=_values(records, key), name=name, legendgroup=name,
                                     showlegend=index == 0, mode="lines+markers", marker_size=4 + 2 * later,
                                     line=dict(color=colour)), row=index // COLUMNS + 1, col=index % COLUMNS + 1)
    for index, (key, _) in enumerate(PANELS):
        fig.update_xaxes(title_text="step", title_standoff=2, row=index // COLUMNS + 1, col=index % COLUMNS + 1)
        fig.update_yaxes(title_text=UNITS[key], title_standoff=2, row=index // COLUMNS + 1, col=index % COLUMNS + 1)
    live = new_figure(mode)
    live.update_layout(fig.layout)
    live.add_traces(list(fig.data))
    return live
