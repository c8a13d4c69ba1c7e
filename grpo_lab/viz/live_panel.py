"""Notebook 02's live ablation, drawn: knobs (v, i, the correction, ε, β, mask) set a
:class:`~grpo_lab.exact.live_run.LiveRun` of the lag frontier's recipe (SmolLM2-135M on ``addsubmul1``, lr 1e-5,
strict scoring), and one figure draws, as it trains, its **exact J** on a fixed subset of the task's questions and
its training reward, over a backdrop of finished runs of the same recipe.

**The backdrop** (``pilot``: the frontier pilot's v = 1 units at lr 1e-5 in notebook 02,
``studies.lag_frontier.frontier.PILOT_UNITS``) is drawn from the units' files: their exact J at their evaluation
steps on the **same subset** the live run is scored on (computed from each unit's ``j_per_question``, matched to
the subset by question text), their whole-set J (dotted, for reference only) and their training reward per step.
The units' per-question values are J_low, each within its unit's ``pruned_max`` of J.

**The live J** (:mod:`grpo_lab.exact.live_run`: when it is taken, on which questions, at what cost) is drawn with
an upper error bar up to J_low + pruned (~1e-4, also given in the status line); the figure says "exact J on 27 of
363 questions": the J of those questions, not of the task. The status line's time per step leaves the
evaluations out, and gives their own seconds.

**Run** trains in a background thread, **Stop** (or **Kernel > Interrupt** while no cell is executing) ends the
run after its step in progress; the figure keeps its traces in the widget's state, so a reloaded page draws the
run as it stands (:func:`~grpo_lab.viz.display.redraw`). This module holds the knobs, the figure and the status
line; the run is :class:`~grpo_lab.exact.live_run.LiveRun`'s.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..exact.live_run import EVAL_EVERY, EVAL_QUESTIONS, EVAL_THREADS, STEPS, JPoint, LiveRun, schedule_text
from ..lm.background import Sitting, hook_interrupt
from ..lm.recipes import recipe
from ..lm.train_config import TrainConfig
from ..loop import GRPOLoop
from ..objective import IS_CORRECTIONS
from .display import display_mode, redraw, show_panel, title_below_toolbar
from .plots import HEIGHT
from .widgets import knob

SUBPLOT_TITLE_PX = 20
"""Room above the top row for its subplot title."""
PILOT_COLOR, LIVE_COLOR = "#7f7f7f", "black"


def ordinal(n: int) -> str:
    """``n`` as an ordinal: 1st, 2nd, 3rd, 11th, 20th, 22nd."""
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass(frozen=True)
class Pilot:
    """The backdrop's units, read from their files: per seed, exact J per evaluation step on the whole question
    set (``j``), per question (``j_per_question``, in the order of ``questions``), and the training reward per
    step (``reward``)."""

    task: str
    lr: float
    v: int
    seeds: list[int]
    questions: list[str]
    j_steps: list[int]
    j: np.ndarray
    """[seeds, evaluation steps]: the unit's ``j_curve``."""
    j_per_question: np.ndarray
    """[seeds, evaluation steps, questions]."""
    reward: np.ndarray
    """[seeds, steps]: ``reward_mean`` of each step's record (step k: the step that took π_k to π_{k+1})."""
    pruned_max: float
    seconds_per_step: float
    """The units' training wall seconds per step (1 torch thread; each step also measured the drift at lag 1)."""

    def subset_j(self, texts: Sequence[str]) -> np.ndarray:
        """[seeds, evaluation steps]: mean J over the questions ``texts`` (a KeyError names one the pilot lacks)."""
        where = {q: i for i, q in enumerate(self.questions)}
        missing = [t for t in texts if t not in where]
        if missing:
            raise KeyError(f"the pilot's units hold no J for {missing[:3]}")
        return self.j_per_question[:, :, [where[t] for t in texts]].mean(axis=2)

    @property
    def label(self) -> str:
        """"pilot v = 1, lr 1e-5, 2 seeds"."""
        return f"pilot v = {self.v}, lr {short_number(self.lr)}, {len(self.seeds)} seeds"


def short_number(x: float) -> str:
    """``x`` as a person writes it: 1e-5, 3e-6, 0.5."""
    text = f"{x:g}"
    return text.replace("e-0", "e-").replace("e+0", "e")


def load_pilot(paths: Sequence[str | Path]) -> Pilot:
    """The pilot units at ``paths``; they must share task, lr, v, questions and evaluation steps."""
    units = [json.loads(Path(p).read_text()) for p in paths]
    if not units:
        raise ValueError("the backdrop needs at least one pilot unit")
    first = units[0]
    steps = sorted(int(s) for s in first["j_curve"])
    for unit in units:
        if (unit["task"], unit["lr"], unit["v"], unit["questions"], sorted(int(s) for s in unit["j_curve"])) != \
                (first["task"], first["lr"], first["v"], first["questions"], steps):
            raise ValueError("the pilot units differ in task, lr, v, questions or evaluation steps")
    return Pilot(task=first["task"], lr=first["lr"], v=first["v"], seeds=[u["seed"] for u in units],
                 questions=list(first["questions"]), j_steps=steps,
                 j=np.array([[u["j_curve"][str(s)] for s in steps] for u in units]),
                 j_per_question=np.array([[u["j_per_question"][str(s)] for s in steps] for u in units]),
                 reward=np.array([[r["reward_mean"] for r in u["steps_log"]] for u in units]),
                 pruned_max=max(u["pruned_max"] for u in units),
                 seconds_per_step=float(np.mean([u["wall_seconds"] / u["steps"] for u in units])))


def make_knobs(config: TrainConfig) -> dict[str, W.ValueWidget]:
    """The live run's knobs (:func:`~grpo_lab.viz.widgets.knob`), named as the :class:`TrainConfig` field
    each sets."""
    return {
        "v": knob("v", W.IntSlider, config.v, min=1, max=32),
        "i": knob("i", W.IntSlider, config.i, min=1, max=8),
        "is_correction": knob("is_correction", W.Dropdown, config.is_correction, options=IS_CORRECTIONS),
        "eps_low": knob("eps_low", W.FloatSlider, config.eps_low, min=0.05, max=0.5, step=0.05),
        "beta": knob("beta", W.FloatSlider, config.beta, min=0.0, max=0.2, step=0.01),
        "mask_zero_variance": knob("mask_zero_variance", W.Checkbox, config.mask_zero_variance),
    }


class LivePanel(LiveRun):
    """A :class:`~grpo_lab.exact.live_run.LiveRun` with knobs, drawn: exact J on a fixed subset of the task's
    questions and the training reward, over a backdrop of finished runs (module docstring).

    ``base``, ``problems``, ``steps``, ``eval_questions``, ``eval_every``, ``eval_threads``, ``model``,
    ``tokenizer``, ``out_dir``: the run's (:class:`~grpo_lab.exact.live_run.LiveRun`); the knobs start at
    ``base``'s values. ``pilot``: the backdrop's unit files (None: no backdrop; a pilot of another task is a
    ValueError); ``mode``: the display mode (:func:`~grpo_lab.viz.display.display_mode`).
    """

    def __init__(self, base: TrainConfig, problems: list[Any], steps: int = STEPS,
                 eval_questions: int = EVAL_QUESTIONS, eval_every: int = EVAL_EVERY,
                 pilot: Sequence[str | Path] | None = None, eval_threads: int | None = EVAL_THREADS,
                 model: Any = None, tokenizer: Any = None, out_dir: str | Path | None = None,
                 mode: str | None = None) -> None:
        super().__init__(base, problems, steps=steps, eval_questions=eval_questions, eval_every=eval_every,
                         eval_threads=eval_threads, model=model, tokenizer=tokenizer, out_dir=out_dir)
        self.pilot = None if pilot is None else load_pilot(pilot)
        if self.pilot is not None and self.pilot.task != base.task:
            raise ValueError(f"the pilot's units ran {self.pilot.task!r}, the panel's task is {base.task!r}: "
                             "pass pilot=None or the pilot of that task")
        self.mode = display_mode(mode)
        self.knobs = make_knobs(base)
        self.run_button = W.Button(description="Run", button_style="success", icon="play")
        self.stop_button = W.Button(description="Stop", button_style="warning", icon="stop")
        self.progress = W.IntProgress(value=0, min=0, max=steps, description="step 0")
        self.status = W.HTML(html.escape(f"press Run: {steps} steps, {self.subset_text()} "
                                         f"{schedule_text(eval_every)}; {self._expected()}"))
        self.figure = self._new_figure()
        self._line, self._j_line = "", ""
        self.run_button.on_click(lambda _: self.start())
        self.stop_button.on_click(lambda _: self.stop("Stop"))

    # ------------------------------------------------------------------------- the figure

    def subset_text(self) -> str:
        """What the live J is taken over, as every label says it."""
        n = len(self.questions)
        every = "every question" if self.stride == 1 else f"every {ordinal(self.stride)}"
        return f"exact J on {n} of {self.question_count} questions ({every})"

    def _new_figure(self) -> go.Figure:
        """Two rows over the step: (a) exact J, the pilot on the same questions (mean of its seeds, band: their
        range) and on all of them (dotted), the live run with its bound; (b) the training reward."""
        n, total = len(self.questions), self.question_count
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.14, row_heights=[0.6, 0.4],
                            subplot_titles=(f"(a) {self.subset_text()}: J_low, bar up to J_low + pruned",
                                            f"(b) training reward: mean over each step's P·G = "
                                            f"{self.base.prompts_per_step * self.base.G} completions"))
        fig.update_annotations(font_size=12)
        title = ("Live run" + (f" over the frontier pilot's v = {self.pilot.v} at lr {short_number(self.pilot.lr)} "
                               f"({len(self.pilot.seeds)} seeds)" if self.pilot else "")
                 + f"<br><sup>J on {n} of {total} questions is not the whole-set J: compare the live run with "
                   "the pilot's solid line</sup>")
        fig.update_layout(**title_below_toolbar(title, int(1.8 * HEIGHT), headroom=SUBPLOT_TITLE_PX),
                          legend=dict(font_size=11, orientation="h", x=0, xanchor="left", y=-0.1, yanchor="top"),
                          hovermode="x")
        fig.update_layout(margin=dict(b=130))
        fig.update_xaxes(range=[0, self.steps])
        fig.update_xaxes(title_text="step k (J: π_θ after k steps)", row=2, col=1)
        fig.update_yaxes(title_text="exact J (strict Pass@1)", range=[0, 1], row=1, col=1)
        fig.update_yaxes(title_text="training reward", range=[0, 1], row=2, col=1)
        if self.pilot is not None:
            p, steps = self.pilot, np.array(self.pilot.j_steps)
            subset = p.subset_j([q.question for q in self.questions])
            name = f"{p.label}: J on these {n} of {total} (band: the seeds' range)"
            if len(p.seeds) > 1:
                low, high = subset.min(axis=0), subset.max(axis=0)
                fig.add_trace(go.Scatter(x=np.concatenate([steps, steps[::-1]]), y=np.concatenate([high, low[::-1]]),
                                         fill="toself", fillcolor=PILOT_COLOR, opacity=0.2, line=dict(width=0),
                                         mode="lines", hoverinfo="skip", showlegend=False, legendgroup=name),
                              row=1, col=1)
            fig.add_trace(go.Scatter(x=steps, y=subset.mean(axis=0), name=name, legendgroup=name, mode="lines+markers",
                                     line=dict(color=PILOT_COLOR, width=2),
                                     hovertemplate=f"step %{{x}}: J %{{y:.3f}} (J_low; each question within "
                                                   f"{p.pruned_max:.1e})<extra>pilot, mean of {len(p.seeds)} "
                                                   "seeds</extra>"), row=1, col=1)
            fig.add_trace(go.Scatter(x=steps, y=p.j.mean(axis=0), name=f"pilot: J on all {total} questions (mean of "
                                     "the seeds)",
                                     mode="lines", line=dict(color=PILOT_COLOR, width=1, dash="dot")), row=1, col=1)
            fig.add_trace(go.Scatter(x=np.arange(p.reward.shape[1]), y=p.reward.mean(axis=0),
                                     name="pilot: training reward (mean of the seeds)", mode="lines",
                                     line=dict(color=PILOT_COLOR, width=1)), row=2, col=1)
        fig.add_trace(go.Scatter(x=[], y=[], name=f"live run: J on these {n} of {total}", mode="lines+markers",
                                 line=dict(color=LIVE_COLOR, width=3),
                                 error_y=dict(type="data", symmetric=False, array=[], arrayminus=[], width=4),
                                 hovertemplate="step %{x}: J_low %{y:.4f}, J ≤ J_low + %{customdata:.1e}"
                                               "<extra>live run</extra>"), row=1, col=1)
        self._live_j = len(fig.data) - 1
        fig.add_trace(go.Scatter(x=[], y=[], name="live run: training reward", mode="lines",
                                 line=dict(color=LIVE_COLOR, width=2)), row=2, col=1)
        self._live_reward = len(fig.data) - 1
        if self.mode == "widget":
            try:
                return go.FigureWidget(fig)
            except ImportError:
                pass
        return fig

    @property
    def live_j_trace(self) -> Any:
        """The figure's live exact-J trace (x: steps, y: J_low, error_y.array: pruned)."""
        return self.figure.data[self._live_j]

    @property
    def live_reward_trace(self) -> Any:
        """The figure's live training-reward trace."""
        return self.figure.data[self._live_reward]

    def _set_j(self) -> None:
        """The live J trace from :attr:`j`: J_low, and an error bar up to J_low + pruned."""
        steps = sorted(self.j)
        pruned = [self.j[s].pruned for s in steps]
        trace = self.live_j_trace
        trace.x, trace.y, trace.customdata = steps, [self.j[s].j_low for s in steps], pruned
        trace.error_y.array, trace.error_y.arrayminus = pruned, [0.0] * len(steps)

    def _set_reward(self, loop: GRPOLoop | None) -> None:
        """The live reward trace from ``loop``'s history (none: empty)."""
        rewards = [] if loop is None else [r.reward_mean for r in loop.history]
        self.live_reward_trace.x, self.live_reward_trace.y = list(range(len(rewards))), rewards

    # ------------------------------------------------------------------------- the run's config and status

    def config(self) -> TrainConfig:
        """The live run's config: ``base``, with the knobs' values (β = 0 keeps no π_ref)."""
        return super().config().replace(**{name: knob.value for name, knob in self.knobs.items()})

    def _expected(self) -> str:
        """The expected time per step before any live step: the pilot's, when the pilot ran this task at this
        size (its recipe's P, G and T_max), else after the first step."""
        if self.pilot is None:
            return "the time per step shows after the first step"
        pilot = recipe("cpu_arith_smollm2", task=self.pilot.task)
        b = self.base
        if (b.prompts_per_step, b.G, b.max_completion_length) != \
                (pilot.prompts_per_step, pilot.G, pilot.max_completion_length):
            return "the time per step shows after the first step"
        per_step = self.pilot.seconds_per_step
        return (f"expected ~{per_step * self.steps / 60:.0f} min of training ({per_step:.1f} s a step, the pilot's "
                "v = 1 runs with 1 torch thread; the live step time replaces it once a step has run) plus the "
                "evaluations")

    def _status(self, line: str, *notes: str) -> str:
        """The status line: ``line``, the last J, then ``notes``."""
        return " · ".join(part for part in (line, self._j_line, *notes) if part)

    def _under_way(self, loop: GRPOLoop) -> str:
        """The note on the step in progress ("" when the sitting trains no more)."""
        return f"step {loop.k + 1}/{self.steps} under way" if self.going(loop) else ""

    def _on_setting_up(self, new: bool) -> None:
        if new:
            self.status.value = "setting up a new run: " + ("copying" if self.model is not None else "loading") + \
                " the untrained model"

    def _on_new_loop(self) -> None:
        with redraw(self.figure):
            self._set_j()
            self._set_reward(self.loop)

    def _on_ready(self, loop: GRPOLoop, setup_seconds: float) -> None:
        self._j_line = ""
        self._line = f"set up in {setup_seconds:.0f} s" + (f", resumed at step {loop.k}" if loop.k else "")

    def _on_evaluating(self, step: int) -> None:
        self.status.value = html.escape(f"{self._line} · step {step}: {self.subset_text()} under way")

    def _on_evaluated(self, point: JPoint) -> None:
        self._j_line = (f"J at step {point.step}: {point.j_low:.3f} ≤ J ≤ {point.j_low + point.pruned:.4f} on "
                        f"{len(self.questions)} of {self.question_count} questions ({point.seconds:.0f} s, off the "
                        "training clock)")
        with redraw(self.figure):
            self._set_j()

    def _on_measured(self, loop: GRPOLoop) -> None:
        self.status.value = html.escape(self._status(self._line, self._under_way(loop)))

    def _draw(self, loop: GRPOLoop) -> None:
        """The live reward curve and the status line: the last step, and the time left at this sitting's pace
        (its time per step leaves the evaluations out; the time left adds the evaluations to come)."""
        with redraw(self.figure):
            self._set_reward(loop)
        self.progress.value, self.progress.description = loop.k, f"step {loop.k}"
        record = loop.history[-1]
        self._line = (f"step {loop.k}/{self.steps} · reward {record.reward_mean:.3f} · lag {record.lag} · "
                      f"masked {record.masked_frac:.0%} · {self.seconds_per_step(loop):.1f} s a step (set-up "
                      "included, evaluations not)" + (f", ~{self.seconds_left(loop):.0f} s left"
                                                       if loop.k < self._last else ""))
        self.status.value = html.escape(self._status(self._line, self._under_way(loop)))

    def _on_failed(self, config: TrainConfig, exc: Exception) -> None:
        step = self.runner.saved_step(config)
        resume = "starts over" if step is None else f"resumes from its checkpoint at step {step}"
        self.status.value = html.escape(f"{self._line} · stopped at step {self._last_k} by {type(exc).__name__}: {exc} "
                                        f"· nothing saved from this step; Run with the same knobs {resume}")

    def _on_ended(self, sitting: Sitting) -> None:
        """The status line once a sitting ends."""
        loop = sitting.loop
        if sitting.error:
            self.status.value = f"stopped: {html.escape(sitting.error)}"
            return
        if self._interrupted_at is not None:
            self.status.value = html.escape(f"{self._line} · interrupted during the evaluation at step "
                                            f"{self._interrupted_at}: no J drawn for it; Run with the same knobs "
                                            "evaluates it")
            return
        notes = []
        if loop.k >= sitting.last and not sitting.trained and not sitting.stopped_by:
            done = (f"the run has all {self.steps} steps: change a knob to start a new one" if loop.k >= self.steps
                    else f"at step {loop.k}: no step asked for")
            self.status.value = html.escape(self._status(done))
            return
        if sitting.stopped_by:
            notes.append(f"stopped by {sitting.stopped_by} at step {loop.k}: Run with the same knobs continues")
        if sitting.trained:
            notes.append(f"checkpoint {self.checkpoint} ({self.checkpoint.stat().st_size / 2**30:.2f} GiB, one per "
                         "panel, replaced at every save, removed when the kernel ends)")
        self.status.value = html.escape(self._status(self._line, *notes))

    # ------------------------------------------------------------------------- the widget

    def help_text(self) -> str:
        """What the buttons do, shown under them."""
        ends = "Stop or Kernel > Interrupt" if self.interruptible else "Stop (Kernel > Interrupt does not reach it)"
        subset = self.subset_text()
        return (f"Run trains {self.steps} steps in the background, Run again continues, a new knob value starts "
                f"over; {ends} ends a run after its step in progress. {subset[0].upper()}{subset[1:]} "
                f"{schedule_text(self.eval_every)}, between steps. One checkpoint: {self.checkpoint}.")

    @property
    def widget(self) -> W.Widget:
        figure = [self.figure] if isinstance(self.figure, W.DOMWidget) else []
        knobs = list(self.knobs.values())
        return W.VBox([W.HBox([W.VBox(knobs[:3]), W.VBox([*knobs[3:], W.HBox([self.run_button, self.stop_button])])]),
                       W.HTML(f"<small>{html.escape(self.help_text())}</small>"), self.progress, *figure, self.status])

    def show(self) -> None:
        """Widget mode: the live panel. Static mode: the figure and the status line as they are now."""
        self.interruptible = hook_interrupt()
        show_panel(self.mode, lambda: self.widget, self.figure, self.status.value)

    def show_and_run(self, steps: int | None = None) -> GRPOLoop:
        """What notebook 02's cell does: in widget mode show the panel, then train ``steps`` steps in it (the
        reader watches them); otherwise train, then show the figure and the status line as the run left them."""
        if self.mode == "widget":
            self.show()
            return self.run(steps)
        loop = self.run(steps)
        self.show()
        return loop
