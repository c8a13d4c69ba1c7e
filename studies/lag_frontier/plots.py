"""Figures of notebook 02's lag frontier (:mod:`studies.lag_frontier.frontier`): exact J against v with one line per
correction, the drift and the importance weights by lag, which questions each arm learned, the mask arms,
and the findings by rule.

Everything drawn comes from ``studies/lag_frontier/results/summary.json`` and the unit files; nothing here tests. The
endpoint figures and the findings read the summary's analysis, which exists only once every unit of the
family is in (no interim looks): before that they say how many units are in. The drift and weights are not
endpoints and are drawn from whatever units exist, with their count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from grpo_lab.viz.plots import COLORS, HEIGHT
from studies.lag_frontier.frontier import CORRECTIONS, MASK_ARMS, PAPER_GSM8K, V_GRID

CORRECTION_STYLE = {"ratio": (COLORS[0], "solid"), "truncated": (COLORS[1], "dash"), "none": (COLORS[2], "dot")}
"""One colour and dash per correction, the same in every figure."""
ENDPOINT_TITLES = {"j_auc": "J_auc: mean J after step 0", "j_final": "exact J at the budget"}


def not_read(summary: Mapping[str, Any], family: str = "primary") -> str | None:
    """None once the family's analysis is read; else one line saying how many of its units are in."""
    status = summary["design"][family]
    if status["complete"]:
        return None
    return (f"{status['in']} of {status['units']} units of the {family} family are in: nothing is read before all "
            f"seeds are in (no interim looks); next missing: {', '.join(status['missing'][:3])}")


def _placeholder(text: str, title: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=text, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    fig.update_layout(title=title, height=HEIGHT // 2, xaxis_visible=False, yaxis_visible=False)
    return fig


def frontier_figure(summary: Mapping[str, Any]) -> go.Figure:
    """Each endpoint against v (log axis), one line per correction from ``v1``'s point, mean and 95 % CI over
    seeds; ``v1``'s mean ± the equivalence margin as a band, the untrained J and the best constant answer as
    lines."""
    title = f"The lag frontier on {summary.get('task', '?')}: exact J against v"
    reason = not_read(summary)
    if reason:
        return _placeholder(reason, title)
    arms, margin = summary["arms"], summary["margin"]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=[ENDPOINT_TITLES[e] for e in ("j_auc", "j_final")])
    for col, endpoint in enumerate(("j_auc", "j_final"), start=1):
        v1 = arms["v1"][endpoint]
        for correction in CORRECTIONS:
            color, dash = CORRECTION_STYLE[correction]
            names = ["v1", *(f"v{v}_{correction}" for v in V_GRID[1:])]
            points = [arms[n][endpoint] for n in names]
            mean = np.array([p["mean"] for p in points])
            ci = [p["ci"] or [p["mean"], p["mean"]] for p in points]
            fig.add_trace(go.Scatter(
                x=list(V_GRID), y=mean, name=correction, legendgroup=correction, showlegend=col == 1,
                mode="lines+markers", line=dict(color=color, dash=dash),
                error_y=dict(type="data", symmetric=False, array=[h - m for (_, h), m in zip(ci, mean, strict=True)],
                             arrayminus=[m - lo for (lo, _), m in zip(ci, mean, strict=True)])), row=1, col=col)
        if endpoint == "j_auc":   # after the traces: plotly drops a shape drawn on a subplot that has no data yet
            fig.add_hrect(y0=v1["mean"] - margin, y1=v1["mean"] + margin, fillcolor="grey", opacity=0.15,
                          line_width=0, row=1, col=col)
        lines = ((summary["untrained_j"], "untrained", "dot", "bottom right"),
                 (summary["constant_answer_j"], "best constant answer", "dash", "top left"))
        for y, label, dash, position in lines:   # the two lie close: labels on opposite sides, left panel only
            labelled = dict(annotation_text=label, annotation_position=position) if col == 1 else {}
            fig.add_hline(y=y, line=dict(color="black", dash=dash, width=1), row=1, col=col, **labelled)
        fig.update_xaxes(type="log", tickvals=list(V_GRID), ticktext=[str(v) for v in V_GRID], title_text="v",
                         row=1, col=col)
        fig.update_yaxes(title_text="exact J", row=1, col=col)
    fig.update_layout(title=f"{title}<br><sup>grey band: v1 ± margin {margin:.3f}</sup>", height=HEIGHT,
                      legend_title="correction")
    return fig


def _by_arm(units: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = {}
    for unit in units:
        out.setdefault(unit["arm"], []).append(unit)
    return out


V_SYMBOL = {1: "circle", 4: "circle", 16: "square", 32: "diamond"}
"""The drift figure's marker per v (an arm's colour and dash are its correction's)."""


def drift_figure(units: Sequence[Mapping[str, Any]]) -> go.Figure:
    """Per arm, over its trained steps: (a) the drift mean |log r′| by lag; (b) r′ (raw, before any cap): its
    median and 99th percentile by lag; (c) the token ESS raw and as applied, and the share of tokens capped."""
    trained = [u for u in units if u.get("beta", 0.0) == 0.0]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.12, subplot_titles=[
        "(a) drift by lag", "(b) r′: p50, p99 (dot)", "(c) ESS / N, ◆ applied"])
    names, ess, applied, colors, capped_text = [], [], [], [], []
    for arm, runs in _by_arm(trained).items():
        v, correction = runs[0]["v"], runs[0]["is_correction"]
        color, dash = CORRECTION_STYLE[correction] if v > 1 else ("black", "solid")
        records = [r for u in runs for r in u["records"] if not r["skipped"]]
        lags = sorted({r["lag"] for r in records})
        at = {lag: [r for r in records if r["lag"] == lag] for lag in lags}
        label = f"{arm} ({len(runs)} seed{'s' * (len(runs) > 1)})"
        symbol = V_SYMBOL.get(v, "circle")   # v by marker and width: one correction's arms share colour and dash
        fig.add_trace(go.Scatter(x=lags, y=[np.mean([r["log_ratio_k_abs"] for r in at[g]]) for g in lags],
                                 name=label, legendgroup=arm, mode="lines+markers",
                                 line=dict(color=color, dash=dash, width=1 + v / 8),
                                 marker=dict(symbol=symbol, size=6)), row=1, col=1)
        for key, line in (("log_ratio_k_p50", dash), ("log_ratio_k_p99", "dot")):
            fig.add_trace(go.Scatter(x=lags, y=[float(np.exp(np.median([r[key] for r in at[g]]))) for g in lags],
                                     name=f"{label}, {key[-3:]}", legendgroup=arm, showlegend=False,
                                     mode="lines+markers", marker=dict(symbol=symbol, size=5),
                                     line=dict(color=color, dash=line, width=1 + v / 8)), row=1, col=2)
        capped = np.mean([r["cap_frac"] for r in records])
        names.append(arm)
        ess.append(np.mean([r["ess_token"] for r in records]))
        applied.append(np.mean([r["ess_token_applied"] for r in records]))
        colors.append(color)
        capped_text.append(f"{capped:.1%} capped" if correction == "truncated" and v > 1 else "")
    fig.add_trace(go.Bar(x=names, y=ess, marker_color=colors, text=capped_text, name="ESS / N, raw",
                         showlegend=False), row=1, col=3)
    fig.add_trace(go.Scatter(x=names, y=applied, mode="markers", marker=dict(color="black", symbol="diamond"),
                             name="ESS / N, applied", showlegend=False), row=1, col=3)
    for col in (1, 2):
        fig.update_xaxes(title_text="lag k − k₀ (steps)", tickformat="d", row=1, col=col)
    fig.update_xaxes(title_text="arm", row=1, col=3)
    fig.update_yaxes(title_text="mean |log r′| per token", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="r′", type="log", row=1, col=2)
    fig.update_yaxes(title_text="ESS / N", range=[0, 1.05], row=1, col=3)
    fig.update_layout(title=f"Drift and importance weights by lag ({len(trained)} units)", height=HEIGHT + 90,
                      barmode="overlay", margin=dict(b=150),
                      legend=dict(orientation="h", x=0, xanchor="left", y=-0.3, yanchor="top"))  # every arm shows
    return fig


def question_figure(units: Sequence[Mapping[str, Any]], untrained: Mapping[str, Any], summary: Mapping[str, Any],
                    golds: Sequence[str] | None = None) -> go.Figure:
    """Which questions each arm learned: exact J per question at the budget, mean over seeds, one row per arm
    under the untrained model's row and the best constant answer's (1 where its answer is the gold), for the
    arms the summary reads (a family's once it is complete); questions ordered by their untrained J.
    ``golds``: the questions' gold answers, in the untrained unit's order (the constant answer's row needs
    them)."""
    title = "Exact J per question at the budget"
    reason = not_read(summary)
    if reason:
        return _placeholder(reason, title)
    questions, order = untrained["questions"], np.argsort(untrained["j_per_question"])
    constant = untrained["constant_answer"]["answer"]
    rows = {"untrained": np.asarray(untrained["j_per_question"])}
    if golds is not None:
        rows[f"always '{constant}'"] = np.array([float(g == constant) for g in golds])
    for arm, runs in _by_arm(units).items():
        if arm not in summary["arms"]:          # a family not complete yet is not read (no interim looks)
            continue
        final = [np.asarray(u["j_per_question"][str(max(map(int, u["j_per_question"])))]) for u in runs]
        rows[arm] = np.mean(final, axis=0)
    z = np.array([row[order] for row in rows.values()])
    fig = go.Figure(go.Heatmap(z=z, x=[questions[i] for i in order], y=list(rows), zmin=0, zmax=1,
                               colorscale="Viridis", colorbar=dict(title="J")))
    fig.update_layout(title=title, height=HEIGHT + 12 * len(rows), xaxis=dict(showticklabels=False,
                      title=f"{len(questions)} questions, by untrained J"),
                      yaxis=dict(autorange="reversed", title="arm, seed"))
    return fig


def mask_figure(summary: Mapping[str, Any]) -> go.Figure:
    """The mask arms at β > 0 (§4): J_auc mean and 95 % CI of each, in the design's order."""
    title = "The mask at β > 0: J_auc by arm"
    reason = not_read(summary) or not_read(summary, "mask")
    if reason:
        return _placeholder(reason, title)
    names = [arm.name for arm in MASK_ARMS]
    points = [summary["arms"][n]["j_auc"] for n in names]
    fig = go.Figure(go.Scatter(x=names, y=[p["mean"] for p in points], mode="markers",
                               error_y=dict(type="data", symmetric=False,
                                            array=[p["ci"][1] - p["mean"] for p in points],
                                            arrayminus=[p["mean"] - p["ci"][0] for p in points])))
    fig.update_layout(title=title, height=HEIGHT, yaxis_title="J_auc (exact)", xaxis_title="arm")
    return fig


def paired_estimate(summary: Mapping[str, Any], a: str, b: str) -> tuple[float, float, float, int]:
    """The mean paired difference ``a`` − ``b`` of J_auc over the seeds both arms have, its 95 % t interval and the
    seed count."""
    from grpo_lab.stats.intervals import mean_ci

    j_auc = {(run["arm"], run["seed"]): run["j_auc"] for run in summary["runs"]}
    seeds = sorted(seed for arm, seed in j_auc if arm == a and (b, seed) in j_auc)
    mean, half = mean_ci([j_auc[(a, s)] - j_auc[(b, s)] for s in seeds])
    return mean, mean - half, mean + half, len(seeds)


def findings(summary: Mapping[str, Any]) -> list[str]:
    """The findings the rule gives, one line each: the frontier per correction, then every comparison whose
    verdict is not "not resolved", then the collapses; or why nothing is read yet."""
    reason = not_read(summary)
    if reason:
        return [reason]
    lines = [f"frontier, {c}: " + (f"v = {v} is the largest v equivalent to v1 (every smaller v too)"
                                   if v != "not resolved" else "not resolved")
             for c, v in summary["frontier"].items()]
    for row in [*summary["comparisons"], *summary["mask_comparisons"]]:
        if row["verdict"] != "not resolved":
            lines.append(f"{row['comparison']}: {row['verdict']} (mean d {row['estimate']:+.3f}, margin "
                         f"±{row['margin']:.3f}, Holm p_eq {row['holm_p_equivalence']:.3g}, p_diff "
                         f"{row['holm_p_difference']:.3g}, sign-flip {row['p_sign_flip']:.3g}, n = {row['n']})")
    collapsed = {arm: e["collapsed"] for arm, e in summary["arms"].items() if e["collapsed"]}
    lines.append(f"collapses (final J below the untrained J): {collapsed or 'none'}")
    return lines


def paper_table(summary: Mapping[str, Any]) -> list[str]:
    """The paper's GSM8K rows, each beside the arms here that play its role (J_auc, mean [95 % CI], seeds)."""
    lines = [f"{'paper (GSM8K, Qwen2.5-0.5B, Pass@1)':58} {'paper':>24}   here (J_auc on {summary.get('task', '?')})"]
    for configuration, paper, names in PAPER_GSM8K:
        here = []
        for name in names:
            arm = summary["arms"].get(name)
            here.append(f"{name} {arm['j_auc']['mean']:.3f} [{arm['j_auc']['ci'][0]:.3f}, {arm['j_auc']['ci'][1]:.3f}] "
                        f"n = {len(arm['seeds'])}" if arm and arm["j_auc"]["ci"] else f"{name}: not read yet")
        lines.append(f"{configuration:58} {paper:>24}   {'; '.join(here) or 'not an arm of this study'}")
    return lines
