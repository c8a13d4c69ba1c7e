"""Notebook 02's figures of the decided study: the answer (each comparison's estimate of the J_auc difference with
its repeated confidence interval, against the margin; before the first look, the design the units fill in), and
the drift picture (what a lag costs in J_auc against how far the policy moved while the server waited).

The drift picture has one point per arm (mean over its seeds, 95 % t intervals both ways) and a faint point per
seed: x is the unit's mean |log r′| per token over its trained steps (the drift across the lag window), y its J_auc
minus ``v1``'s at the same seed and lr. Colour is the correction, the marker the study (the 5-seed frontier at lr
1e-5, this study's confirmatory arms at 1e-5, its second regime at 3e-6), the marker's fill the frontier's v; the
legend names each arm under its study (names printed beside the points run into each other). What it lets a
learner see: the cost of a
lag is consistent with the drift; the drift is an outcome that moves with the lr and with v, so the figure does not
separate it from them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go

from grpo_lab.stats.intervals import mean_ci
from grpo_lab.viz.display import title_below_toolbar
from grpo_lab.viz.plots import COLORS, HEIGHT
from studies.lag_decided.design import COMPARISONS, PLAN, lr_label
from studies.lag_decided.summary import drift, load
from studies.readme import signed_interval

CORRECTION_COLORS = {"ratio": "#1f77b4", "truncated": "#2ca02c", "none": "#d62728", "mask": "#9467bd",
                     "icepop": "#8c564b", "icepop (sequence)": "#e377c2"}
STUDY_MARKERS = {"frontier (lr 1e-5)": "circle", "decided (lr 1e-5)": "diamond", "decided (lr 3e-6)": "square"}
V_FILLS = {4: "-open", 16: "-open-dot"}
"""The marker's fill per v where not filled: the frontier's arms of one correction differ only in v."""


def drift_points(units: Iterable[Mapping[str, Any]], study: str) -> list[dict[str, Any]]:
    """Per unit of a lagged arm: its study, arm, correction, seed, drift and J_auc − ``v1``'s at the same seed
    (units without a ``v1`` partner, and the β > 0 mask arms, are left out)."""
    units = [u for u in units if u.get("beta", 0.0) == 0.0]
    v1 = {u["seed"]: u["j_auc"] for u in units if u["arm"] == "v1"}
    return [{"study": study, "arm": u["arm"], "v": u["v"], "seed": u["seed"],
             "correction": u["is_correction"] + (" (sequence)" if u.get("level") == "sequence" else ""),
             "drift": drift(u), "cost": u["j_auc"] - v1[u["seed"]]}
            for u in units if u["arm"] != "v1" and u["seed"] in v1]


def study_points(frontier_units: Path, decided: Path) -> list[dict[str, Any]]:
    """The points of every study that has units: the frontier's, this study's at 1e-5 (only once a look is due,
    as the summary reads them), its exploratory corrections' (once all are in) and its second regime's."""
    from studies.lag_decided import design
    from studies.lag_decided.summary import rebuild_summary

    points = drift_points(load(frontier_units).values(), "frontier (lr 1e-5)")
    summary = rebuild_summary(decided, write=False)
    confirmatory = load(decided / "units") if summary["looks_reached"] else {}
    if summary["looks_reached"]:
        seeds = set(summary["arms"]["v1"]["seeds"])
        points += drift_points([u for (arm, seed), u in confirmatory.items() if seed in seeds], "decided (lr 1e-5)")
    if summary["corrections"]["arms"]:   # the field's corrections, each paired with v1 at its seed
        seeds = set(design.CORRECTION_SEEDS)
        units = [u for (arm, seed), u in (confirmatory | load(decided / "units_corrections")).items()
                 if seed in seeds and (arm == "v1" or arm in design.CORRECTION_ARMS)]
        points += drift_points(units, "decided (lr 1e-5)")
    if summary["regime2"]["arms"]:
        lr = summary["regime2"]["lr"]
        units = [u for (arm, seed), u in load(decided / f"units_lr{lr}").items() if seed in design.REGIME2_SEEDS]
        points += drift_points(units, f"decided (lr {lr_label(lr)})")
    return points


def drift_cost_figure(points: list[dict[str, Any]]) -> go.Figure:
    """J_auc − v1 against the window drift: per arm a mean with 95 % t intervals, per seed a faint point; the
    legend lists the arms by study."""
    fig = go.Figure()
    arms = sorted({(p["study"], p["v"], p["arm"], p["correction"]) for p in points},
                  key=lambda a: (list(STUDY_MARKERS).index(a[0]) if a[0] in STUDY_MARKERS else len(STUDY_MARKERS),)
                  + a)
    for study, v, arm, correction in arms:
        rows = [p for p in points if (p["study"], p["arm"]) == (study, arm)]
        x, y = np.array([p["drift"] for p in rows]), np.array([p["cost"] for p in rows])
        color = CORRECTION_COLORS.get(correction, "black")
        symbol = STUDY_MARKERS.get(study, "x") + V_FILLS.get(v, "")
        fig.add_trace(go.Scatter(x=x, y=y, mode="markers", marker=dict(color=color, symbol=symbol, size=6),
                                 opacity=0.25, name=arm, showlegend=False, legendgroup=study, hoverinfo="text",
                                 text=[f"{arm} seed {p['seed']} ({study})" for p in rows]))
        (mx, hx), (my, hy) = mean_ci(x), mean_ci(y)
        fig.add_trace(go.Scatter(
            x=[float(mx)], y=[float(my)], mode="markers", name=arm, legendgroup=study,
            legendgrouptitle_text=study, marker=dict(color=color, symbol=symbol, size=12,
                                                      line=dict(color="black", width=1)),
            error_x=dict(type="data", array=[0.0 if np.isnan(hx) else float(hx)]),
            error_y=dict(type="data", array=[0.0 if np.isnan(hy) else float(hy)]), hoverinfo="text",
            hovertext=f"{arm} ({study}): drift {float(mx):.2f}, J_auc − v1 {float(my):+.3f}, {len(rows)} seeds"))
    fig.add_hline(y=0.0, line=dict(color="grey", dash="dot", width=1))
    fig.update_xaxes(title_text="drift over the lag window: mean |log r′| per token", type="log")
    fig.update_yaxes(title_text="J_auc − v1's (same seed, same lr)")
    fills = ", ".join(f"{name.strip('-').replace('-', ' ')} v = {v}" for v, name in V_FILLS.items())
    fig.update_layout(title=f"What a lag costs, against the drift over its window<br><sup>colour: the correction; "
                            f"marker: the study; frontier: {fills}, filled v = 32</sup>",
                      height=HEIGHT + 180, legend=dict(groupclick="toggleitem"))
    return fig


def answer_line(summary: Mapping[str, Any]) -> str:
    """One line: each comparison's verdict, or how far the units are from the first look."""
    if not summary["comparisons"]:
        return (f"pending: {summary['seeds_in']} of {PLAN.looks[0]} seeds of every arm are in for the first look "
                f"(looks at {', '.join(map(str, PLAN.looks))} seeds)")
    return "; ".join(f"{c['comparison']}: {c['verdict']}, {c['estimate']:+.3f} [{c['rci'][0]:+.3f}, "
                     f"{c['rci'][1]:+.3f}] at {c['looks_reached'][-1]} seeds"
                     for c in summary["comparisons"].values())


def differences_text(entry: Mapping[str, Any]) -> str:
    """An exploratory entry's paired differences, each with its unadjusted 95 % t interval, joined by "; "."""
    return "; ".join(f"{name.replace(' - ', ' − ')} {signed_interval(d)}" for name, d in entry["differences"].items())


def drifts_text(entry: Mapping[str, Any]) -> str:
    """An exploratory entry's arms with their mean window drift (nats a token)."""
    return ", ".join(f"{arm} {arm_entry['drift']['mean']:.2g}" for arm, arm_entry in entry["arms"].items())


def regime2_line(summary: Mapping[str, Any]) -> str:
    """One line: the second regime's paired differences with their t intervals and each arm's window drift, or
    that its units are not all in."""
    entry = summary["regime2"]
    if not entry["arms"]:
        return "pending: not all of its units are in"
    return (f"lr {lr_label(entry['lr'])}, {len(entry['arms']['v1']['seeds'])} seeds, exploratory (unadjusted 95 % t "
            f"CIs): {differences_text(entry)}; window drift (nats a token) {drifts_text(entry)}")


def corrections_line(summary: Mapping[str, Any]) -> str:
    """One line: the field's corrections at v = 10, each paired with ``v10_ratio`` and ``v10_none`` by seed, with
    their t intervals and window drift, or that their units are not all in."""
    entry = summary["corrections"]
    if not entry["arms"]:
        return "pending: not all of their units are in"
    return (f"lr {lr_label(summary['design']['lr'])}, v = 10, {len(entry['seeds'])} seeds, exploratory (unadjusted "
            f"95 % t CIs): {differences_text(entry)}; window drift (nats a token) {drifts_text(entry)}")


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
