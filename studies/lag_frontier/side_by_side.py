"""Notebook 02's lag going wrong, live: the frontier's recipe at v = 1, at a long lag v with the paper's correction
(``ratio``) and at the same lag without it (``none``), trained one after another for one sync period each, so
that the lagged arms reach lag v − 1 once.

Each arm is a :class:`~grpo_lab.lm.background.BackgroundRun` in the caller's thread: it loads the untrained model,
trains without writing a checkpoint, and is freed (its loop and its run folder) before the next arm loads, so
one run is in memory at a time.
Along the way it keeps what the notebook draws:

- exact J on the live panel's question subset (:func:`~grpo_lab.exact.live_run.exact_j`) at step 0 (once:
  the arms share the untrained model) and every ``eval_every`` steps;
- every step's record (the drift, mean |log r′| per token, by step and so by lag);
- one group (:func:`~grpo_lab.lm.group_view.group_view`) as the last step of the sync period draws it, at the
  largest lag the run reaches (v − 1), with r′ on each token and on each finished completion's stop token.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from grpo_lab.exact.live_run import exact_j
from grpo_lab.lm.background import BackgroundRun
from grpo_lab.lm.group_view import GroupView, group_view
from grpo_lab.lm.memory import return_freed_memory
from grpo_lab.lm.tasks import Problem
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.loop import GRPOLoop, StepRecord
from grpo_lab.viz.display import title_below_toolbar
from grpo_lab.viz.plots import COLORS, HEIGHT


def arms(v: int) -> dict[str, dict[str, Any]]:
    """The three arms: ``v1``, ``v<v>_ratio`` (the paper's r′ = π_k/α) and ``v<v>_none`` (no correction)."""
    return {"v1": {"v": 1, "is_correction": "ratio"}, f"v{v}_ratio": {"v": v, "is_correction": "ratio"},
            f"v{v}_none": {"v": v, "is_correction": "none"}}


STYLE = {"v1": ("black", "solid", "circle"), "ratio": (COLORS[0], "dash", "square"),
         "none": (COLORS[2], "dot", "diamond")}
"""Colour, dash and marker per arm kind: distinct in colour and in line, so a grey print still tells them apart."""


@dataclass
class Arm:
    """One arm's run: its config, step records, exact J by step (J_low and the pruned mass), its group at the
    largest lag, and its training seconds (evaluations left out)."""

    name: str
    config: TrainConfig
    history: list[StepRecord] = field(default_factory=list)
    j: dict[int, tuple[float, float]] = field(default_factory=dict)
    view: GroupView | None = None
    train_seconds: float = 0.0
    eval_seconds: float = 0.0

    @property
    def style(self) -> tuple[str, str, str]:
        return STYLE["v1" if self.config.v == 1 else self.config.is_correction]

    def drift_at(self, lag: int) -> float:
        """Mean |log r′| per token over the trained steps at ``lag`` (nan if none)."""
        values = [r.log_ratio_k_abs for r in self.history if r.lag == lag and not r.skipped]
        return float(np.mean(values)) if values else float("nan")

    def drift_text(self, lag: int) -> str:
        """The drift at ``lag`` as a learner reads it: its value, or why there is none (no trained step there)."""
        drift = self.drift_at(lag)
        if not np.isnan(drift):
            return f"drift at lag {lag}: {drift:.2f} nats a token"
        if any(r.lag == lag for r in self.history):
            why = "its steps there were skipped: every group's rewards agreed"
        elif self.config.v == 1:
            why = "v = 1 syncs α at every step: the lag is always 0"
        elif lag >= self.config.v:
            why = f"v = {self.config.v} syncs α before the lag reaches {self.config.v}"
        else:
            why = "no step ran at that lag"
        return f"drift at lag {lag}: undefined ({why})"


def run_arms(base: TrainConfig, problems: Sequence[Problem], questions: Sequence[Problem], out_dir: str | Path,
             v: int = 16, eval_every: int = 8, report: Callable[[str], None] = print) -> dict[str, Arm]:
    """Train :func:`arms` ``(v)`` on ``base`` for v steps each, one after another in ``out_dir/<arm>``, each freed
    (loop and run folder) before the next; exact J on ``questions`` at step 0 and every ``eval_every`` steps and at
    the end; the group at step v − 1. ``report`` gets one line per arm."""
    results: dict[str, Arm] = {}
    untrained: tuple[float, float] | None = None
    eval_steps = sorted({*range(0, v + 1, eval_every), v})
    for name, changes in arms(v).items():
        arm = results[name] = Arm(name, base.replace(**changes, steps=v))
        runner = BackgroundRun(Path(out_dir) / name, list(problems), save=False)

        def evaluate(loop: GRPOLoop, arm: Arm = arm) -> None:
            start = time.perf_counter()
            result = exact_j(loop, questions)
            arm.j[loop.k] = (result.mean, float(result.pruned.mean()))
            arm.eval_seconds += time.perf_counter() - start

        def ready(loop: GRPOLoop, new: bool, arm: Arm = arm, evaluate: Callable[[GRPOLoop], None] = evaluate) -> bool:
            nonlocal untrained
            if untrained is None:
                evaluate(loop)
                untrained = arm.j[0]
            arm.j[0] = untrained
            return True

        def after_step(loop: GRPOLoop, record: StepRecord, arm: Arm = arm,
                       evaluate: Callable[[GRPOLoop], None] = evaluate) -> None:
            if loop.k in eval_steps:
                evaluate(loop)
            if loop.k == v - 1:                 # the group the last step of the period trains on, at lag v − 1
                arm.view = group_view(loop)

        start = time.perf_counter()
        try:
            arm.history = list(runner.run(arm.config, on_step=after_step, on_ready=ready).loop.history)
        finally:                                # the sitting is not kept: it would hold the loop past release
            runner.release()
            runner.clean()
            return_freed_memory()
        arm.train_seconds = time.perf_counter() - start - arm.eval_seconds
        j_end = arm.j[max(arm.j)][0]
        report(f"{name:10} J {arm.j[0][0]:.3f} -> {j_end:.3f} after {len(arm.history)} steps; {arm.drift_text(v - 1)}; "
               f"{arm.train_seconds:.0f} s training, {arm.eval_seconds:.0f} s evaluating")
    with contextlib.suppress(OSError):
        Path(out_dir).rmdir()                  # the arms' folders are gone; nothing else of ours is in it
    return results


def side_by_side_figure(results: dict[str, Arm], subset: str) -> go.Figure:
    """(a) exact J on ``subset`` against the step, one line per arm (J_low; the pruned mass is far below a
    pixel); (b) the drift, mean |log r′| per token of each step, against the step (= the lag, for one period)."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=(f"(a) exact J ({subset})", "(b) drift: mean |log r′| per token"))
    for arm in results.values():
        color, dash, symbol = arm.style
        steps = sorted(arm.j)
        fig.add_trace(go.Scatter(x=steps, y=[arm.j[s][0] for s in steps], name=arm.name, legendgroup=arm.name,
                                 mode="lines+markers", line=dict(color=color, dash=dash, width=2.5),
                                 marker=dict(symbol=symbol, size=9),
                                 hovertemplate="step %{x}: J_low %{y:.4f}<extra>" + arm.name + "</extra>"),
                      row=1, col=1)
        trained = [r for r in arm.history if not r.skipped]
        fig.add_trace(go.Scatter(x=[r.step for r in trained], y=[r.log_ratio_k_abs for r in trained],
                                 customdata=[r.lag for r in trained], name=arm.name, legendgroup=arm.name,
                                 showlegend=False, mode="lines+markers",
                                 line=dict(color=color, dash=dash, width=2.5), marker=dict(symbol=symbol, size=7),
                                 hovertemplate="step %{x}, lag %{customdata}: %{y:.3g}<extra>" + arm.name + "</extra>"),
                      row=1, col=2)
    fig.update_xaxes(title_text="step k", row=1, col=1)
    fig.update_xaxes(title_text="step k (lag = k mod v)", row=1, col=2)
    fig.update_yaxes(title_text="exact J (strict Pass@1)", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="mean |log r′| (nats)", rangemode="tozero", row=1, col=2)
    fig.update_annotations(font_size=12)
    title = "Lag going wrong, live: v = 1, and a long lag with and without the correction"
    fig.update_layout(**title_below_toolbar(title, HEIGHT + 40, headroom=20),
                      legend=dict(orientation="h", x=0, xanchor="left", y=-0.2, yanchor="top"))
    fig.update_layout(margin=dict(b=90))
    return fig
