"""Notebook 02's opening figure from ``studies/lag_decided/summary.json``: the decided answer once a look is reached
(each comparison's estimate of the J_auc difference with its repeated confidence interval, against the
equivalence margin), and before that the design the units fill in (the seeds each look needs, the seeds in).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import plotly.graph_objects as go

from grpo_lab.viz.display import title_below_toolbar
from grpo_lab.viz.plots import COLORS, HEIGHT
from studies.lag_decided.design import COMPARISONS, PLAN


def answer_line(summary: Mapping[str, Any]) -> str:
    """One line: each comparison's verdict, or how far the units are from the first look."""
    if not summary["comparisons"]:
        return (f"pending: {summary['seeds_in']} of {PLAN.looks[0]} seeds of every arm are in for the first look "
                f"(looks at {', '.join(map(str, PLAN.looks))} seeds)")
    return "; ".join(f"{name} {c['comparison']}: {c['verdict']}, {c['estimate']:+.3f} [{c['rci'][0]:+.3f}, "
                     f"{c['rci'][1]:+.3f}] at {c['looks_reached'][-1]} seeds"
                     for name, c in summary["comparisons"].items())


def decided_figure(summary: Mapping[str, Any]) -> go.Figure:
    """The estimates with their repeated CIs against ±margin (a look reached), else the looks against the seeds in."""
    margin = summary["design"]["margin"]
    if summary["comparisons"]:
        names = list(summary["comparisons"])
        rows = [summary["comparisons"][n] for n in names]
        fig = go.Figure(go.Scatter(
            x=[r["estimate"] for r in rows], y=[f"{n}: {r['comparison']}" for n, r in zip(names, rows, strict=True)],
            mode="markers", marker=dict(size=11, color=COLORS[0]), name="estimate, repeated CI",
            error_x=dict(type="data", symmetric=False, array=[r["rci"][1] - r["estimate"] for r in rows],
                         arrayminus=[r["estimate"] - r["rci"][0] for r in rows])))
        fig.add_vrect(x0=-margin, x1=margin, fillcolor="grey", opacity=0.15, line_width=0,
                      annotation_text=f"±margin {margin}", annotation_position="top left")
        fig.add_vline(x=0, line=dict(color="black", width=1))
        fig.update_layout(xaxis_title="difference in J_auc (a − b)", yaxis_title="comparison")
        title = "The lag frontier, decided: " + ", ".join(f"{n} {summary['comparisons'][n]['verdict']}" for n in names)
    else:
        looks = list(PLAN.looks)
        fig = go.Figure(go.Bar(x=[f"look {k + 1}" for k in range(len(looks))], y=looks, name="seeds a look needs",
                               marker_color="lightgrey", text=[f"{n} seeds" for n in looks], textposition="outside"))
        fig.add_hline(y=summary["seeds_in"], line=dict(color=COLORS[1], dash="dash", width=2),
                      annotation_text=f"seeds in: {summary['seeds_in']}", annotation_position="top left")
        fig.update_layout(xaxis_title="look (O'Brien–Fleming spending)", yaxis_title="seeds of every arm",
                          yaxis_range=[0, looks[-1] * 1.2])
        title = ("The lag frontier, decided: pending<br><sup>" + ", ".join(f"{n} {a} − {b}" for n, (a, b) in
                                                                          COMPARISONS.items())
                 + f"; margin ±{margin} of J_auc</sup>")
    fig.update_layout(**title_below_toolbar(title, HEIGHT), showlegend=False)
    return fig
