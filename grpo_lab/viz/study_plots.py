"""One group's tokens in notebook 02 (§9): the per-token r′ = π_k/α of a group's completions as a heat map
(the group: :func:`grpo_lab.lm.group_view.group_view`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

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
