"""One group's tokens in notebook 02 (§9): the per-token r′ = π_k/α of a group's completions as a heat map
(the group: :func:`grpo_lab.lm.group_view.group_view`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

R_PRIME_REACH = math.log2(1.1)
"""The colour scale reaches at least r′ ∈ [1/1.1, 1.1]: r′ = 1 everywhere still gets distinct colour-bar ticks."""
R_PRIME_CLIP = 4.0
"""The colour scale reaches at most r′ ∈ [1/16, 16] (log₂ r′ = ±4): a lagged run's r′ spans 1e-17 to 1e16, and a scale
that wide turns every other token white. A token beyond it takes the end colour and prints its r′ under it."""


def token_ratio_figure(tokens: Sequence[Sequence[str]], ratios: np.ndarray, rewards: Sequence[float],
                       advantages: Sequence[float], lag: int, note: str = "") -> go.Figure:
    """Heat map of the per-token r′ = π_k/α of one group's completions (rows), padding blank; the colour
    is log₂ r′ (symmetric about r′ = 1) clipped to ±:data:`R_PRIME_CLIP`, the colour bar labelled in r′ (its ends
    "≤" and "≥" when a token lies beyond); a clipped token prints its true r′ under it, and every token's
    hover gives it; tokens at integer positions. ``note`` (e.g.
    :attr:`~grpo_lab.lm.group_view.GroupView.note`) goes under the title."""
    labels = [f"y{j + 1}: r={r:.0f} A={a:+.2f}" for j, (r, a) in enumerate(zip(rewards, advantages, strict=True))]
    with np.errstate(divide="ignore"):
        z = np.where(ratios > 0, np.log2(np.where(ratios > 0, ratios, 1.0)), np.nan)
    largest = float(np.nanmax(np.abs(z))) if np.isfinite(z).any() else 0.0
    reach = min(max(largest, R_PRIME_REACH), R_PRIME_CLIP)
    clipped = np.abs(np.nan_to_num(z)) > reach
    text = [[token + (f"<br>{ratios[i, t]:.0e}" if clipped[i, t] else "") for t, token in enumerate(row)]
            + [""] * (ratios.shape[1] - len(row)) for i, row in enumerate(tokens)]
    ticks = np.linspace(-reach, reach, 5)
    ticktext = [f"{2 ** t:.3g}" for t in ticks]
    if largest > reach:
        ticktext[0], ticktext[-1] = "≤" + ticktext[0], "≥" + ticktext[-1]
    fig = go.Figure(go.Heatmap(
        z=np.clip(z, -reach, reach), text=text, texttemplate="%{text}", y=labels, colorscale="RdBu", zmid=0.0,
        zmin=-reach, zmax=reach, customdata=ratios,
        hovertemplate="%{y}, token %{x}: %{text}, r′ = %{customdata:.3g}<extra></extra>",
        colorbar=dict(title=dict(text="r′", side="top"), tickvals=ticks, ticktext=ticktext, len=1.0, thickness=14)))
    title = f"Per-token r′ = π_k/α at lag {lag}" + (f"<br><sup>{note}</sup>" if note else "")
    fig.update_layout(title=title, yaxis=dict(autorange="reversed", title="completion: reward r, advantage A"),
                      xaxis=dict(title="token t", tick0=0, dtick=max(1, math.ceil(ratios.shape[1] / 20))),
                      height=max(300, 140 + 34 * len(tokens)))
    return fig
