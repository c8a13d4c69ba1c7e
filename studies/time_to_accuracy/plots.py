"""Time to accuracy's figures (notebook 03 §3c) from ``studies/time_to_accuracy/results/summary.json``
(:mod:`studies.time_to_accuracy.summary`): every seed's exact-J curve against training seconds or optimiser steps with
the targets, and the time ratios to TRL (or to grpo_lab v1: the decomposition) with their intervals. They only
draw what the summary holds.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative

from grpo_lab.viz.display import new_figure, title_below_toolbar
from studies.time_to_accuracy.summary import V1

RECORDED = "MEASURED by studies/time_to_accuracy/run.py (not re-run here)"
"""Where these figures' numbers come from: the study's committed units, not this notebook's run."""


def tta_curves_figure(summary: Mapping[str, Any], by: str = "seconds") -> go.Figure:
    """Each unit's exact J (one line per seed, one colour per arm) against training seconds (``by="seconds"``:
    speed) or optimiser steps (``by="optimizer_steps"``: learning per update), with the targets dashed."""
    if by not in ("seconds", "optimizer_steps"):
        raise ValueError(f"by must be 'seconds' or 'optimizer_steps', got {by!r}")
    title = (f"Exact J against {'training seconds' if by == 'seconds' else 'optimiser steps'}: {summary['task']}, "
             f"{summary['budget_seconds']:.0f} s a unit, J every {summary['eval_every_seconds']:.0f} s"
             f"<br><sup>{RECORDED}</sup>")
    fig = new_figure(yaxis_title="exact J (strict)", yaxis_range=[0, 1],
                     xaxis_title="training seconds (evaluation off the clock)" if by == "seconds" else
                     "optimiser steps")
    fig.update_layout(**title_below_toolbar(title, 460))
    arms = sorted({run["arm"] for run in summary["runs"]})
    for arm, color in zip(arms, itertools.cycle(qualitative.Plotly), strict=False):
        for k, run in enumerate(r for r in summary["runs"] if r["arm"] == arm):
            seconds = list(run["curve"])
            x = [float(s) for s in seconds] if by == "seconds" else [run["optimizer_steps"][s] for s in seconds]
            fig.add_scatter(x=x, y=[run["curve"][s] for s in seconds], mode="lines+markers", name=arm,
                            legendgroup=arm, showlegend=k == 0, line=dict(color=color, width=1.5),
                            marker=dict(size=4), hovertext=f"{arm} seed {run['seed']}")
    for name, level in summary["targets"]["levels"].items():
        fig.add_hline(y=level, line=dict(dash="dash", color="grey", width=1),
                      annotation_text=f"target {name} ({level:.3f}, fixed {summary['targets']['fixed_on']})")
    return fig


BOUND_TEXT = {"exact": "no seed censored", "upper": "an upper bound: only the denominator has censored seeds",
              "lower": "a lower bound: only this arm has censored seeds",
              "neither": "no bound: both arms have censored seeds"}
BOUND_SYMBOL = {"exact": "circle", "upper": "triangle-left", "lower": "triangle-right", "neither": "diamond"}
"""A ratio's marker and hover text by its ``bound`` (:func:`~studies.stats.passage.censoring_bound`): a triangle
points the way the ratio of mean times lies."""


def tta_ratio_figure(summary: Mapping[str, Any], to_v1: bool = False) -> go.Figure:
    """Each arm's time ratio per target (restricted means, :mod:`studies.stats.passage`) with its 95 % bootstrap
    interval, on a log axis: against the reference (TRL), or with ``to_v1`` against ``grpo_lab_v1`` (the
    decomposition: what switching off one cause costs the loop). An arm whose ratio is not resolved is left out;
    one whose interval is not resolved has no bars and names the reason in its hover text; a bound under censoring
    is drawn as a triangle pointing the way the ratio of mean times lies (:data:`BOUND_SYMBOL`)."""
    denominator, key = (V1, "time_ratios_to_v1") if to_v1 else (summary["reference"], "time_ratios")
    fig = new_figure(xaxis_type="log", xaxis_title=f"training time to the target ÷ {denominator}'s (restricted means)",
                     yaxis_title="arm")
    fig.update_layout(**title_below_toolbar(f"Time ratios to {denominator}<br>95 % bootstrap intervals over seeds"
                                            f"<br><sup>{RECORDED}</sup>", 160 + 60 * max(1, len(summary[key]))))
    for name, color in zip(summary["targets"]["levels"], itertools.cycle(qualitative.Plotly), strict=False):
        arms, ratios, plus, minus, notes, symbols = [], [], [], [], [], []
        for arm, by_target in summary[key].items():
            entry = by_target[name]
            if entry["ratio"] is None:
                continue
            arms.append(arm)
            ratios.append(entry["ratio"])
            resolved = entry["ci_low"] is not None
            plus.append(entry["ci_high"] - entry["ratio"] if resolved else 0.0)
            minus.append(entry["ratio"] - entry["ci_low"] if resolved else 0.0)
            reached = f"reached {entry['reached_share']:.0%}, {denominator} {entry['reference_reached_share']:.0%}"
            notes.append("; ".join(filter(None, (entry["note"], reached, BOUND_TEXT[entry["bound"]]))))
            symbols.append(BOUND_SYMBOL[entry["bound"]])
        fig.add_scatter(x=ratios, y=arms, mode="markers", name=f"target {name}",
                        marker=dict(color=color, size=9, symbol=symbols),
                        error_x=dict(type="data", array=plus, arrayminus=minus), hovertext=notes)
    fig.add_vline(x=1.0, line=dict(color="grey", dash="dot"))
    return fig
