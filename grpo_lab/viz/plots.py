"""Plotly figures for notebook 01. Each function takes results from
:mod:`grpo_lab.exact.bandit_lab` (or the bandit) and returns a ``go.Figure``;
nothing here computes what it draws beyond means and bands."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from ..exact.bandit import BanditRun, bound_weight
from ..exact.bandit_lab import (
    LONG_ON_POLICY,
    MASK_ARMS,
    MATCHED_LR,
    BoundConstants,
    GroupBatch,
    KLEstimates,
    KLGradients,
    LagSweep,
    MaskOptimizerRuns,
    TimelineStep,
    surrogate_curves,
    trl_surrogate_curves,
    wall_clock,
)
from ..scale.costmodel import StepCostModel

COLORS = qualitative.Plotly
HEIGHT = 420


def band_traces(x: np.ndarray, Y: np.ndarray, name: str, color: str, dash: str | None = None,
                showlegend: bool = True) -> list[go.Scatter]:
    """Mean over runs as a line and mean ± std as a filled band; ``Y [len(x), R]``."""
    mean, std = Y.mean(axis=1), Y.std(axis=1)
    band = go.Scatter(x=np.concatenate([x, x[::-1]]), y=np.concatenate([mean + std, (mean - std)[::-1]]),
                      fill="toself", fillcolor=color, opacity=0.2, line=dict(width=0), hoverinfo="skip",
                      showlegend=False, legendgroup=name)
    line = go.Scatter(x=x, y=mean, name=name, line=dict(color=color, dash=dash), legendgroup=name,
                      showlegend=showlegend)
    return [band, line]


def whitening_figure(batch: GroupBatch) -> go.Figure:
    """Heatmap of A_α for one sampled batch; each cell shows its arm, reward and advantage,
    each row its context, group mean μ, std σ and whether the mask keeps it."""
    r, A, arms = batch.rewards.numpy(), batch.advantages.numpy(), batch.arms.numpy()
    labels = [f"x={int(c)}  μ={row.mean():.2f} σ={row.std():.2f}  {'kept' if k else 'MASKED'}"
              for c, row, k in zip(batch.contexts, r, batch.keep, strict=True)]
    text = [[f"arm {y}<br>r={rv:.0f}<br>A={av:+.2f}" for y, rv, av in zip(yy, rr, aa, strict=True)]
            for yy, rr, aa in zip(arms, r, A, strict=True)]
    fig = go.Figure(go.Heatmap(z=A, text=text, texttemplate="%{text}", y=labels,
                               x=[f"y{j + 1}" for j in range(r.shape[1])],
                               colorscale="RdBu", zmid=0, colorbar=dict(title="A_α")))
    fig.update_layout(title=f"One batch from α: whitened advantages, ε_std = {batch.eps_std:g}",
                      yaxis=dict(autorange="reversed", title="group: context x, μ, σ, mask"),
                      xaxis_title="response y_j", height=120 + 60 * r.shape[0])
    return fig


TRL_EVERY = 25
"""TRL's curves are drawn as open markers every this many points of r: they lie on the multiplicative band's
lines up to TRL's cap, and a line drawn on a line would hide."""


def surrogate_figure(ratio: torch.Tensor, ratio_ks: Sequence[float], eps: float) -> go.Figure:
    """f_ε(r, r′, A) against r for several r′: rows A = +1 / A = −1, columns additive / multiplicative band;
    in the multiplicative column TRL as it applies that band (zero when r′ > its cap of 3; the release checked:
    :data:`grpo_lab.scale.trl_surface.VERIFIED_TRL`), as open circles in the line's colour, so that where the two
    coincide both show."""
    fig = make_subplots(rows=2, cols=2, shared_xaxes=True, horizontal_spacing=0.14, vertical_spacing=0.1,
                        subplot_titles=["additive band, A = +1", "multiplicative (○ TRL), A = +1",
                                        "additive band, A = −1", "multiplicative (○ TRL), A = −1"])
    x = ratio.numpy()
    for row, a in ((1, 1.0), (2, -1.0)):
        for col, band in ((1, "additive"), (2, "multiplicative")):
            curves = surrogate_curves(ratio, list(ratio_ks), a, eps, band).numpy()
            fig.add_trace(go.Scatter(x=x, y=a * x, name="r·A (no clip)", line=dict(color="lightgrey", dash="dot"),
                                     showlegend=row == col == 1, legendgroup="raw"), row=row, col=col)
            for n, (rk, y) in enumerate(zip(ratio_ks, curves, strict=True)):
                fig.add_trace(go.Scatter(x=x, y=y, name=f"r′ = {rk:g}", line=dict(color=COLORS[n]),
                                         showlegend=row == col == 1, legendgroup=str(rk)), row=row, col=col)
            if band == "multiplicative":
                trl = trl_surrogate_curves(ratio, list(ratio_ks), a, eps).numpy()
                for n, (rk, y) in enumerate(zip(ratio_ks, trl, strict=True)):
                    fig.add_trace(go.Scatter(x=x[::TRL_EVERY], y=y[::TRL_EVERY], name=f"TRL 1.16, w = r′ = {rk:g}",
                                             mode="markers", marker=dict(color=COLORS[n], symbol="circle-open",
                                                                         size=8, line_width=2),
                                             showlegend=row == 1, legendgroup=f"TRL {rk}"), row=row, col=col)
    fig.update_xaxes(title_text="r = π_θ/α", row=2)
    fig.update_yaxes(title_text="f_ε")
    fig.update_layout(title=f"Clipped surrogate f_ε(r, r′, A), ε = {eps:g}", height=2 * HEIGHT - 100)
    return fig


def kl_figure(kl: KLEstimates) -> go.Figure:
    """Left: each estimator's mean under y ~ α = π_{k−lag} against the exact KL (importance
    weighting removes the bias). Right: per-sample standard deviation."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["mean of the estimate", "per-sample std"],
                        horizontal_spacing=0.16)
    weighted = ("circle-open", "square-open", "diamond-open")     # the weighted means coincide with the exact KL
    for n, kind in enumerate(kl.mean):
        c = COLORS[n]
        fig.add_trace(go.Scatter(x=kl.lags, y=kl.mean[kind], name=kind, mode="lines+markers",
                                 line=dict(color=c), legendgroup=kind), row=1, col=1)
        fig.add_trace(go.Scatter(x=kl.lags, y=kl.std[kind], name=kind, mode="lines+markers",
                                 line=dict(color=c), legendgroup=kind, showlegend=False), row=1, col=2)
        fig.add_trace(go.Scatter(x=kl.lags, y=np.full(len(kl.lags), kl.iw_mean[kind]),
                                 name=f"{kind} × π/α", mode="lines+markers", line=dict(color=c, dash="dot"),
                                 marker=dict(symbol=weighted[n % 3], size=8 + 4 * n, line_width=2),
                                 legendgroup=f"{kind} × π/α"), row=1, col=1)
    fig.add_trace(go.Scatter(x=kl.lags, y=np.full(len(kl.lags), kl.exact), name="exact KL(π ‖ π_ref)",
                             mode="lines", line=dict(color="black", dash="dash", width=1)), row=1, col=1)
    fig.update_xaxes(title_text="lag of α behind π (steps)")
    fig.update_yaxes(title_text="estimate of KL(π ‖ π_ref)", row=1, col=1)
    fig.update_yaxes(title_text="std of one sample's estimate", row=1, col=2)
    fig.update_layout(title=f"KL(π ‖ π_ref) = {kl.exact:.4f} estimated from samples of α", height=HEIGHT)
    return fig


def kl_gradient_figure(gradients: KLGradients) -> go.Figure:
    """Left: cosine of each estimator's expected gradient to ∇KL(π ‖ π_ref) against the lag of α
    (solid unweighted, dotted weighted by π/α; black dashed: the forward KL's gradient). Right: their norms
    (black: the norm of ∇KL(π ‖ π_ref))."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["direction", "size"], horizontal_spacing=0.18)
    symbols = ("circle", "square", "diamond")
    for n, kind in enumerate(("k1", "k2", "k3")):
        for key, dash, symbol in ((kind, None, symbols[n]), (f"{kind} × π/α", "dot", f"{symbols[n]}-open")):
            for col, values in ((1, gradients.cosine[key]), (2, gradients.norm[key])):
                fig.add_trace(go.Scatter(x=gradients.lags, y=values, name=key, mode="lines+markers",
                                         line=dict(color=COLORS[n], dash=dash), legendgroup=key,
                                         marker=dict(symbol=symbol, size=7 + 3 * n), showlegend=col == 1),
                              row=1, col=col)
    # the references as legend entries, not labels on the lines: a label on a line hides what it labels
    fig.add_trace(go.Scatter(x=gradients.lags, y=np.full(len(gradients.lags), gradients.forward_cosine), mode="lines",
                             name="∇KL(π_ref ‖ π), the forward KL", line=dict(color="black", dash="dash", width=1)),
                  row=1, col=1)
    fig.add_trace(go.Scatter(x=gradients.lags, y=np.full(len(gradients.lags), gradients.reverse_norm), mode="lines",
                             name="‖∇KL(π ‖ π_ref)‖", line=dict(color="black", dash="longdash", width=1)),
                  row=1, col=2)
    fig.update_xaxes(title_text="lag of α behind π (steps)")
    fig.update_yaxes(title_text="cosine to ∇KL(π ‖ π_ref)", row=1, col=1)
    fig.update_yaxes(title_text="norm of the expected gradient", row=1, col=2)
    fig.update_layout(title="KL estimators as loss terms: the force each one exerts (exact expectations)",
                      height=HEIGHT)
    return fig


def bound_figure(runs: Mapping[str, BanditRun], run: int = 0, steps: int | None = None) -> go.Figure:
    """Per step k, mean over contexts: true J(π_{k+1}) − J(π_k) and Theorem 1's lower bound, one row per run."""
    fig = make_subplots(rows=len(runs), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=list(runs))
    for row, r in enumerate(runs.values(), start=1):
        n = len(r.improvement) if steps is None else min(steps, len(r.improvement))
        k = np.arange(n)
        fig.add_trace(go.Scatter(x=k, y=r.improvement[:n, run].mean(-1), name="J(π_{k+1}) − J(π_k)",
                                 line=dict(color=COLORS[0]), showlegend=row == 1), row=row, col=1)
        fig.add_trace(go.Scatter(x=k, y=r.bound[:n, run].mean(-1), name="Theorem 1 lower bound",
                                 line=dict(color=COLORS[1]), showlegend=row == 1), row=row, col=1)
    fig.update_xaxes(title_text="step k", row=len(runs))
    fig.update_yaxes(title_text="change of J per step")
    fig.update_layout(title=f"Theorem 1 per step (run {run}, mean over contexts)", height=HEIGHT * len(runs) * 0.7)
    return fig


def bound_constants_figure(bounds: BoundConstants, run: int = 0, steps: int | None = None) -> go.Figure:
    """Per step k, mean over contexts, one run: the true improvement, Theorem 1 with its constants (factor 2),
    the same bound with the tight constants, and the most the tight one can be, TV(π, α) − TV(π_k, α)."""
    n = len(bounds.improvement) if steps is None else min(steps, len(bounds.improvement))
    k = np.arange(n)
    fig = go.Figure()
    curves = [(bounds.improvement, "J(π_{k+1}) − J(π_k)", None), (bounds.paper, "Theorem 1 (factor 2)", None),
              (bounds.tight, "tight constants (factor 1)", None), (bounds.ceiling, "TV(π, α) − TV(π_k, α)", "dot")]
    for color, (values, name, dash) in zip(COLORS, curves):
        fig.add_trace(go.Scatter(x=k, y=values[:n, run].mean(-1), name=name, line=dict(color=color, dash=dash)))
    fig.add_hline(y=0, line=dict(color="grey", width=1))
    fig.update_layout(title=f"Theorem 1's constants (run {run}, mean over contexts)", xaxis_title="step k",
                      yaxis_title="per-step change of J", height=HEIGHT)
    return fig


def timeline_figure(timelines: Mapping[str, Sequence[TimelineStep]], steps: int = 8) -> go.Figure:
    """One row per schedule, one column per optimiser step t: the cell reads a (the batch was sampled by α = θ_a)
    and c (the clip band is centred on θ_c), ⟳ marks a sync α ← θ_t; orange: θ_t ≠ θ_c, the clip can act."""
    names = list(timelines)
    rows = [list(timelines[name])[:steps] for name in names]
    z = [[float(s.clip_can_act) for s in row] for row in rows]
    text = [[f"{'⟳ ' if s.sync else ''}{s.batch}<br>α = θ{s.sampler}<br>band at θ{s.centre}" for s in row]
            for row in rows]
    fig = go.Figure(go.Heatmap(z=z, text=text, texttemplate="%{text}", x=[f"t = {t}" for t in range(steps)], y=names,
                               zmin=0, zmax=1, showscale=False, xgap=2, ygap=2,
                               colorscale=[[0, "#c6dbef"], [0.5, "#c6dbef"], [0.5, "#fdae6b"], [1, "#fdae6b"]]))
    fig.update_layout(title="Who sampled each batch, where the clip band sits<br><sub>orange: the clip can act; "
                            "⟳: sync; each column one optimiser step θ_t → θ_{t+1}</sub>",
                      yaxis=dict(autorange="reversed", title="schedule"), height=120 + 70 * len(names))
    return fig


ARM_LINES = (dict(line_width=7, opacity=0.45), dict(line_dash="dash"), dict(line_dash="dot", line_width=3))
"""The (a′) arms' line styles, one each: where two took the same steps (a flat 0), the wide translucent line,
the dashes and the dots all show."""


def mask_optimizer_figure(mask_runs: MaskOptimizerRuns, reference: str = "mask, batch") -> go.Figure:
    """Per optimiser setting, each arm's J minus ``reference``'s, mean ± std over runs (paired by seed): a flat
    zero line means the arm took exactly the reference's steps."""
    settings = list(mask_runs.max_grad_norm)
    fig = make_subplots(rows=1, cols=len(settings), subplot_titles=settings, shared_yaxes=True)
    for col, setting in enumerate(settings, start=1):
        base = mask_runs.J[setting, reference]
        for n, arm in enumerate(a for a in MASK_ARMS if a != reference):
            diff = mask_runs.J[setting, arm] - base
            band, line = band_traces(np.arange(len(diff)), diff, f"{arm} − {reference}", COLORS[n + 1],
                                     showlegend=col == 1)
            line.update(**ARM_LINES[n % len(ARM_LINES)])     # arms that took the same steps lie on one line
            fig.add_trace(band, row=1, col=col)
            fig.add_trace(line, row=1, col=col)
    fig.update_xaxes(title_text="step k")
    fig.update_yaxes(title_text="ΔJ, paired by seed", col=1)
    fig.update_layout(title="The same knobs under two optimisers (runs trained alone)", height=HEIGHT + 60,
                      legend=dict(orientation="h", y=-0.3))
    return fig


def lag_figure(sweep: LagSweep) -> go.Figure:
    """Left: the two TV terms against v. Right: mean bound and mean true improvement against v."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["TV terms of the bound", "per-step means"],
                        horizontal_spacing=0.16)
    for n, (y, name) in enumerate([(sweep.tv_pi_alpha, "TV(π_{k+1}, α)"), (sweep.tv_pik_alpha, "TV(π_k, α)")]):
        fig.add_trace(go.Scatter(x=sweep.v, y=y, name=name, mode="lines+markers", line=dict(color=COLORS[n + 2])),
                      row=1, col=1)
    fig.add_trace(go.Scatter(x=sweep.v, y=sweep.improvement, name="J(π_{k+1}) − J(π_k)", mode="lines+markers",
                             line=dict(color=COLORS[0])), row=1, col=2)
    fig.add_trace(go.Scatter(x=sweep.v, y=sweep.bound, name="lower bound", mode="lines+markers",
                             line=dict(color=COLORS[1])), row=1, col=2)
    fig.update_xaxes(title_text="sync period v")
    fig.update_yaxes(title_text="total variation", row=1, col=1)
    fig.update_yaxes(title_text="change of J per step", row=1, col=2)
    fig.update_layout(title="What a lag costs the guarantee", height=HEIGHT)
    return fig


def tv_figure(run: BanditRun, steps: int | None = None) -> go.Figure:
    """Per step: the logged ``tv_estimate`` (½·mean |r′ − 1| over the step's samples) against its expectation,
    the exact TV(π_k, α) averaged over runs and (uniform) contexts; needs ``track_bound=True``."""
    exact = run.tv_pik_alpha.mean(axis=(1, 2))
    estimate = np.array([r.tv_estimate for r in run.records])
    n = len(exact) if steps is None else min(steps, len(exact))
    k = np.arange(n)
    fig = go.Figure([go.Scatter(x=k, y=exact[:n], name="exact TV(π_k, α), mean over contexts",
                                line=dict(color=COLORS[0])),
                     go.Scatter(x=k, y=estimate[:n], name="tv_estimate (logged, from the step's samples)",
                                mode="markers", marker=dict(color=COLORS[1]))])
    fig.update_layout(title=f"TV(π_k, α) along a v = {run.config.v} run: the logged estimate and the exact value",
                      xaxis_title="step k", yaxis_title="TV", height=HEIGHT)
    return fig


def bound_weight_figure(eps_stds: Sequence[float], points: int = 401) -> go.Figure:
    """(1 − σ)/σ with σ = sqrt(p(1 − p) + ε_std) against the success probability p (log scale)."""
    p = torch.linspace(0, 1, points, dtype=torch.float64)[:, None]           # [N, 1]: N one-arm contexts
    fig = go.Figure()
    for n, eps in enumerate(eps_stds):
        w = bound_weight(torch.ones_like(p), p, eps)                    # [N]
        fig.add_trace(go.Scatter(x=p[:, 0].numpy(), y=w.numpy(), name=f"ε_std = {eps:g}", line=dict(color=COLORS[n])))
    fig.add_hline(y=1, line=dict(color="grey", dash="dash"), annotation_position="top left",
                  annotation_text="weight ≥ 1 (σ ≤ ½): with the factor 2 the bound is ≤ 0")
    fig.update_layout(title="Theorem 1's weight (1 − σ)/σ on TV(π, α)", xaxis_title="success probability p = μ_α(x)",
                      yaxis=dict(title="(1 − σ)/σ", type="log"), height=HEIGHT)
    return fig


RUN_LINES = {"on-policy + mask": dict(dash="dash"), "v = 10": dict(width=7, opacity=0.45)}
"""Runs drawn dashed, or wide and translucent, in every figure: their curves lie on others' in the findings
figure (the mask on "no mask" in (a), v = 10 on v = 1 in (b)), so both show; the legend shows one style per run."""
COINCIDE_ATOL = 1e-3
"""Two mean J curves closer than this at every step are drawn as one line: the figure says they coincide."""


def run_styles(results: Mapping[str, BanditRun]) -> dict[str, dict[str, object]]:
    """One colour and line style per run of ``results``, shared by the findings and wall-clock figures. A run
    whose curve lies on an earlier one's (:func:`coinciding`) and would be drawn in the same dash and width is
    dotted, so that both show."""
    plain = {"dash": None, "width": 2, "opacity": 1.0}
    styles = {name: {"color": COLORS[n % len(COLORS)], **plain, **RUN_LINES.get(name, {})}
              for n, name in enumerate(results)}
    for later, earlier in coinciding(results, list(results)):
        a, b = styles[earlier], styles[later]
        if (a["dash"], a["width"]) == (b["dash"], b["width"]):
            b["dash"] = "dot" if a["dash"] != "dot" else "dashdot"
    return styles


def coinciding(results: Mapping[str, BanditRun], names: Sequence[str]) -> list[tuple[str, str]]:
    """Pairs (later, earlier) of ``names`` whose mean J curves lie within ``COINCIDE_ATOL`` at every step."""
    means = {name: results[name].J.mean(axis=1) for name in names}
    return [(b, a) for j, b in enumerate(names) for a in names[:j]
            if means[a].shape == means[b].shape and np.allclose(means[a], means[b], rtol=0, atol=COINCIDE_ATOL)]


def run_traces(x: np.ndarray, run: BanditRun, name: str, style: Mapping[str, object],
               showlegend: bool = True) -> list[go.Scatter]:
    """:func:`band_traces` of one run in its style (colour, dash, width, opacity)."""
    band, line = band_traces(x, run.J, name, str(style["color"]), style["dash"], showlegend)
    line.update(line_width=style["width"], opacity=style["opacity"])
    return [band, line]


def findings_figure(results: Mapping[str, BanditRun]) -> go.Figure:
    """The paper's four findings, mean ± std over runs: (a) mask, (b) v and i per step,
    (c) sample reuse per optimiser pass, (d) resetting π_ref. A panel's title names the curves that lie
    exactly on another (computed from the runs)."""
    panels = [["on-policy, no mask", "on-policy + mask", "mask, unmasked normalisation", MATCHED_LR],
              ["on-policy + mask", "v = 10", "sample reuse i = 10"],
              [LONG_ON_POLICY, "sample reuse i = 10"],
              ["β = 1, fixed π_ref", "β = 1, π_ref reset every 20", "on-policy + mask"]]
    titles = ["(a) the mask and its normalisation", "(b) per step: lag v vs reuse i",
              "(c) per optimiser pass", "(d) KL to π_ref: fixed vs reset"]
    titles = [title + "".join(f"<br><sub>{b}<br>lies on {a}</sub>" for b, a in coinciding(results, names))
              for title, names in zip(titles, panels, strict=True)]
    styles = run_styles(results)
    fig = make_subplots(rows=2, cols=2, subplot_titles=titles, horizontal_spacing=0.12, vertical_spacing=0.2)
    seen: set[str] = set()
    for n, names in enumerate(panels):
        row, col = divmod(n, 2)
        for name in names:
            r = results[name]
            x = np.concatenate([[0], r.optimizer_passes]) if n == 2 else np.arange(len(r.J))
            for trace in run_traces(x, r, name, styles[name], showlegend=name not in seen):
                fig.add_trace(trace, row=row + 1, col=col + 1)
            seen.add(name)
    runs = next(iter(results.values())).J.shape[1]
    fig.update_xaxes(title_text="step k")
    fig.update_xaxes(title_text="optimiser passes", row=2, col=1)
    fig.update_yaxes(title_text="J(π_θ)")
    fig.update_layout(title=f"The paper's findings in the bandit (mean ± std over {runs} runs)<br><sub>a curve that "
                            f"lies on another: mean J within {COINCIDE_ATOL:g} at every step</sub>",
                      height=2 * HEIGHT + 160, margin=dict(t=200), legend=dict(orientation="h", y=-0.1))
    return fig


def wall_clock_figure(results: Mapping[str, BanditRun], names: Sequence[str], model: StepCostModel) -> go.Figure:
    """J against modelled wall-clock hours: each step costs gen + i·train + sync (sync only when synced).
    Each run in its style of :func:`findings_figure`."""
    fig, styles = go.Figure(), run_styles(results)
    for name in names:
        hours = wall_clock(results[name], model) / 3600
        fig.add_traces(run_traces(hours, results[name], name, styles[name]))
    fig.update_layout(title=(f"J against time modelled from the paper's 7B rates<br><sub>not measured: "
                             f"gen {model.gen:.1f} s + i × train {model.train:.1f} s"
                             f" + sync {model.sync:.1f} s every v steps</sub>"),
                      xaxis_title="modelled hours (paper's 7B cost model)", yaxis_title="J(π_θ)", height=HEIGHT)
    return fig
