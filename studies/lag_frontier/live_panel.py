"""Notebook 02's live ablation: knobs (v, i, the correction, ε, β, mask) train a run of the lag frontier's recipe
(SmolLM2-135M on ``addsubmul1``, lr 1e-5, strict scoring) and draw, as it trains, its **exact J** on a
fixed subset of the task's questions and its training reward, over the frontier pilot's v = 1 runs at lr 1e-5.

**The backdrop** is the pilot's two finished v = 1 units at lr 1e-5 (:data:`PILOT_UNITS`, seeds 0 and 1): their
exact J at steps 0/32/64/96/128 on the **same subset** the live run is scored on (computed from each unit's
``j_per_question``, matched to the subset by question text), their whole-set J (all 363 questions, dotted, for
reference only) and their training reward per step. The pilot's per-question values are J_low, each within
its unit's ``pruned_max`` (≤ 0.0023) of J.

**The live J.** At step 0 and every ``eval_every`` steps (and at the run's last step) the panel computes exact J of
the loop's π_θ (:func:`~grpo_lab.exact.strict_j.exact_evaluate` under the run's sampling: T, top-p/top-k, T_max
and the model's stop ids, as the frontier's units do; with 1 torch thread, :data:`EVAL_THREADS`) on
``eval_questions`` questions of :func:`~grpo_lab.lm.tasks.all_questions`: every (363 // n)-th, from the first
(:func:`eval_subset`). The default, 27 questions (every 13th: 8 sums, 10 differences, 9 products), was chosen
among the strides 11–24 (15–33 questions) as the one whose subset J tracked the pilot's whole-set J closest:
within 0.024 at each of its five evaluation steps (stride 20: 0.030, the others 0.06–0.19; stride 11 takes only
"a op 0"). It is the J of those 27 questions, not of the task: the figure says "exact J on 27 of 363 questions".
One evaluation took 3.7–5.1 s of CPU (6–11 s wall) with 1 torch thread on the 2-core machine at load 4.6–5.8
(the untrained model and the pilot's π_θ at steps 32 and 128); smoke mode's 4 questions at T_max = 4, 1.4–1.8 s.
Each point is J_low with its certified bound, J_low ≤ J ≤ J_low + pruned (drawn as an upper error bar, ~1e-4,
and given in the status line). The evaluation runs between steps, off the training clock: the status line's time
per step leaves it out, and gives its own seconds.

The run itself is a :class:`~grpo_lab.lm.background.BackgroundRun`: it trains through
:func:`~grpo_lab.lm.training.train` in a background thread (**Run**) or in the cell's (:meth:`LivePanel.run`),
continues with the same knobs, starts over from the untrained model when a knob changes, resumes from its
checkpoint after a failed step, and removes its run folder (``checkpoint.pt``, about 2 GB for SmolLM2-135M)
when the kernel ends. **Stop**, or **Kernel > Interrupt** while no cell is executing, ends a run after the
step (and any evaluation) in progress. This module keeps the knobs, evaluates, and draws.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from grpo_lab.exact.strict_j import ExactEvaluation, Sampling, exact_evaluate
from grpo_lab.lm.background import BackgroundRun, Sitting, hook_interrupt
from grpo_lab.lm.memory import return_freed_memory
from grpo_lab.lm.recipes import recipe, run_dir
from grpo_lab.lm.sampling import stop_and_pad_ids
from grpo_lab.lm.tasks import Problem, all_questions
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.loop import GRPOLoop
from grpo_lab.objective import IS_CORRECTIONS
from grpo_lab.viz.display import display_mode, show_panel, title_below_toolbar
from grpo_lab.viz.plots import HEIGHT
from grpo_lab.viz.widgets import knob
from studies.lag_frontier.frontier import PILOT_RESULTS

PILOT_UNITS = tuple(PILOT_RESULTS / "units" / f"addsubmul1_lr1e-05_s{seed}.json" for seed in (0, 1))
"""The backdrop: the frontier pilot's finished v = 1 units at lr 1e-5 on ``addsubmul1`` (paths under ``results/``)."""
EVAL_QUESTIONS = 27
"""Questions of the live exact J by default: every 13th of ``addsubmul1``'s 363 (module docstring)."""
EVAL_EVERY = 16
"""Steps between two live evaluations by default (step 0 is always one): 0, 16, …, 128 over the frontier's budget."""
EVAL_THREADS = 1
"""Torch threads during a live evaluation by default (the setting is put back after it). The walk's forwards are of
a few rows each, where a second thread waits on the first: on the 2-core machine loaded ~5, 18 questions took
2.8–3.5 s wall with 1 thread and 10–26 s with 2 (SmolLM2-135M untrained and at the pilot's steps 32 and 128).
The frontier's units were evaluated with 1 too."""
EVAL_QUESTIONS_PER_BATCH = 9
"""Questions walked together in a live evaluation (``questions_per_batch`` of
:func:`~grpo_lab.exact.strict_j.exact_evaluate`, whose default walks 64 at once). The walk's KV cache holds a row
per open branch, and a lagged π_θ that has stopped ending its answers (notebook 02 §2) keeps many open: walking
the 27 questions at once added 1.0–1.1 GiB to the kernel, over the training step's peak (docs/benchmarks.md,
*Notebook memory*)."""
STEPS = 128
"""A run's length by default: the frontier's budget, over which the pilot is drawn."""
SUBPLOT_TITLE_PX = 20
"""Room above the top row for its subplot title."""
PILOT_COLOR, LIVE_COLOR = "#7f7f7f", "black"


def eval_subset(questions: Sequence[Any], n: int) -> list[int]:
    """The indices of the live evaluation's ``n`` questions: every (len // n)-th of ``questions``, from the first."""
    if not 1 <= n <= len(questions):
        raise ValueError(f"eval_questions must be between 1 and the task's {len(questions)} questions, got {n}")
    stride = len(questions) // n
    return list(range(0, stride * n, stride))


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


def load_pilot(paths: Sequence[str | Path] = PILOT_UNITS) -> Pilot:
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


def exact_j(loop: GRPOLoop, questions: Sequence[Problem], threads: int | None = EVAL_THREADS,
            questions_per_batch: int = EVAL_QUESTIONS_PER_BATCH) -> ExactEvaluation:
    """Exact J of ``loop``'s π_θ on ``questions``, as the frontier's units take it: the run's sampling (T,
    top-p/top-k, T_max) and system prompt, the model's stop ids; with ``threads`` torch threads (None: torch's
    setting), put back after; ``questions_per_batch`` questions walked at a time. The heap's freed pages go back
    to the OS before the walk and after it (:func:`~grpo_lab.lm.memory.return_freed_memory`): held, training's would
    lie under the walk's cache and the walk's under the next training step."""
    model, config = loop.policy.model, loop.config
    sampling = Sampling(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                        max_tokens=config.max_completion_length)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    return_freed_memory()
    try:
        return exact_evaluate(model, loop.task.tokenizer, questions, sampling, system_prompt=config.system_prompt,
                              eos_token_ids=stop_and_pad_ids(model, loop.task.tokenizer, None)[0],
                              questions_per_batch=questions_per_batch)
    finally:
        torch.set_num_threads(before)
        return_freed_memory()


@dataclass(frozen=True)
class JPoint:
    """One live evaluation: exact J of π_θ after ``step`` steps on the panel's questions."""

    step: int
    j_low: float
    """Mean J_low over the questions."""
    pruned: float
    """Mean pruned mass: J_low ≤ J ≤ J_low + pruned."""
    pruned_max: float
    """The largest pruned mass of one question."""
    seconds: float


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


class LivePanel:
    """A GRPO run of the frontier's recipe with the knobs' values: exact J on a fixed subset of the task's questions
    and the training reward, drawn over the frontier pilot's v = 1 runs (module docstring).

    ``base``: the run's config (task, P, G, T_max, T, lr; the knobs start at its values); ``problems``: the
    training problems; ``steps``: a run's length (default :data:`STEPS`, the frontier's budget);
    ``eval_questions``: how many of :func:`~grpo_lab.lm.tasks.all_questions` ``(base.task)`` the live exact J
    covers (:func:`eval_subset`; default :data:`EVAL_QUESTIONS`); ``eval_every``: steps between evaluations
    (default :data:`EVAL_EVERY`); ``pilot``: the backdrop's unit files (default :data:`PILOT_UNITS`; None: no
    backdrop; a pilot of another task is a ValueError); ``eval_threads``: torch threads during an evaluation
    (default :data:`EVAL_THREADS`; None: torch's setting); ``model`` / ``tokenizer``: the untrained model
    (default: ``base.model``, loaded by the first run), of which each new run trains a copy; ``out_dir``: the
    panel's run folder, holding its one checkpoint (default :func:`~grpo_lab.lm.recipes.run_dir` ``("nb02_live")``),
    removed when the kernel ends.

    After a run: ``loop`` (its :class:`~grpo_lab.loop.GRPOLoop`, ``loop.history`` its step records), ``j`` (step →
    :class:`JPoint`), ``questions`` (the evaluated problems); ``runner`` is the
    :class:`~grpo_lab.lm.background.BackgroundRun` that trains it.
    """

    def __init__(self, base: TrainConfig, problems: list[Any], steps: int = STEPS,
                 eval_questions: int = EVAL_QUESTIONS, eval_every: int = EVAL_EVERY,
                 pilot: Sequence[str | Path] | None = PILOT_UNITS, eval_threads: int | None = EVAL_THREADS,
                 model: Any = None, tokenizer: Any = None, out_dir: str | Path | None = None,
                 mode: str | None = None) -> None:
        if eval_every < 1:
            raise ValueError(f"eval_every must be at least 1, got {eval_every}")
        task_questions = all_questions(base.task)
        self.question_count = len(task_questions)
        self.questions: list[Problem] = [task_questions[i] for i in eval_subset(task_questions, eval_questions)]
        self.stride = self.question_count // eval_questions
        self.pilot = None if pilot is None else load_pilot(pilot)
        if self.pilot is not None and self.pilot.task != base.task:
            raise ValueError(f"the pilot's units ran {self.pilot.task!r}, the panel's task is {base.task!r}: "
                             "pass pilot=None or the pilot of that task")
        self.base, self.problems = base, problems
        self.steps, self.eval_every, self.eval_threads, self.mode = steps, eval_every, eval_threads, display_mode(mode)
        self.out_dir = Path(out_dir if out_dir is not None else run_dir("nb02_live"))
        self.runner = BackgroundRun(self.out_dir, problems, model=model, tokenizer=tokenizer)
        self.checkpoint = self.runner.checkpoint
        self.knobs = make_knobs(base)
        self.run_button = W.Button(description="Run", button_style="success", icon="play")
        self.stop_button = W.Button(description="Stop", button_style="warning", icon="stop")
        self.progress = W.IntProgress(value=0, min=0, max=steps, description="step 0")
        self.status = W.HTML(html.escape(f"press Run: {steps} steps, {self.subset_text()} at step 0 and every "
                                         f"{eval_every} steps; {self._expected()}"))
        self.figure = self._new_figure()
        self.j: dict[int, JPoint] = {}
        """The live run's exact J by step (that of :attr:`loop`'s run, or of the run a failed step dropped)."""
        self._j_knobs: dict[str, Any] | None = None
        """The knobs of the run whose J points :attr:`j` holds."""
        self._line, self._j_line = "", ""
        self._eval_seconds = 0.0
        """Seconds of evaluation in the current sitting (left out of its time per step)."""
        self.interruptible = False
        """Whether Kernel > Interrupt reaches a background run (:func:`hook_interrupt`, set by show and start)."""
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

    # ------------------------------------------------------------------------- the run

    def config(self) -> TrainConfig:
        """The live run's config: ``base``, with the knobs' values (β = 0 keeps no π_ref)."""
        return self.base.replace(**self._knob_values(), steps=self.steps, output_dir=str(self.out_dir),
                                 checkpoint_every=0)

    def _knob_values(self, config: TrainConfig | None = None) -> dict[str, Any]:
        """The knobs' values: the widgets' (default), or those ``config`` was built with."""
        if config is None:
            return {name: knob.value for name, knob in self.knobs.items()}
        return {name: getattr(config, name) for name in self.knobs}

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

    def eval_steps(self) -> list[int]:
        """The steps at which the live run is evaluated: 0, every ``eval_every``, and the last."""
        return sorted({*range(0, self.steps + 1, self.eval_every), self.steps})

    def evaluate(self, loop: GRPOLoop) -> ExactEvaluation:
        """Exact J of ``loop``'s π_θ on the panel's questions (:func:`exact_j`) with ``eval_threads`` torch threads."""
        return exact_j(loop, self.questions, self.eval_threads)

    def _measure(self, loop: GRPOLoop) -> None:
        """Evaluate ``loop`` at its step if that is an evaluation step without a J yet; draw it."""
        if loop.k not in self.eval_steps() or loop.k in self.j:
            return
        self.status.value = html.escape(f"{self._line} · step {loop.k}: {self.subset_text()} under way")
        start = time.perf_counter()
        result = self.evaluate(loop)
        seconds = time.perf_counter() - start
        self._eval_seconds += seconds
        self.j[loop.k] = JPoint(loop.k, result.mean, float(result.pruned.mean()), float(result.pruned.max()),
                                seconds)
        point = self.j[loop.k]
        self._j_line = (f"J at step {point.step}: {point.j_low:.3f} ≤ J ≤ {point.j_low + point.pruned:.4f} on "
                        f"{len(self.questions)} of {self.question_count} questions ({seconds:.0f} s, off the "
                        "training clock)")
        with self.figure.batch_update():
            self._draw_j()

    @property
    def loop(self) -> GRPOLoop | None:
        """The current run's loop (None before the first run, after :meth:`release` or a failed step)."""
        return self.runner.loop

    @property
    def model(self) -> Any:
        """The untrained model the runner holds (None while a run it loaded trains it, or after a release)."""
        return self.runner.model

    def _ready(self, loop: GRPOLoop, new: bool, config: TrainConfig, start: float) -> bool:
        """Once the runner has the loop: keep the J points of this run up to its step (a new loop resumed from
        the checkpoint) or none (a new run), redraw, and evaluate at the step the run starts from unless it has
        its J; False (train nothing) after an interrupt during that evaluation."""
        knobs = self._knob_values(config)
        if new:
            same_run = self.runner.saved_step(config) is not None and self._j_knobs == knobs
            self.j = {k: p for k, p in self.j.items() if k <= loop.k} if same_run else {}
            self._j_knobs = knobs
            self._redraw()
        first = self._first = self._last_k = loop.k
        self._last = self.steps if self._steps_asked is None else min(self.steps, first + self._steps_asked)
        self._eval_seconds, self._j_line = 0.0, ""
        self._line = f"set up in {time.perf_counter() - start:.0f} s" + (f", resumed at step {first}" if first else "")
        try:
            self._measure(loop)
        except KeyboardInterrupt:
            self._interrupted_at = loop.k
            return False
        self.status.value = html.escape(self._status(self._line, f"step {first + 1}/{self.steps} under way"))
        return True

    def _draw_j(self) -> None:
        """The live J trace from :attr:`j`: J_low, and an error bar up to J_low + pruned."""
        steps = sorted(self.j)
        pruned = [self.j[s].pruned for s in steps]
        trace = self.live_j_trace
        trace.x, trace.y, trace.customdata = steps, [self.j[s].j_low for s in steps], pruned
        trace.error_y.array, trace.error_y.arrayminus = pruned, [0.0] * len(steps)

    def _redraw(self) -> None:
        """Both live traces from the current loop and J points."""
        rewards = [] if self.loop is None else [r.reward_mean for r in self.loop.history]
        with self.figure.batch_update():
            self._draw_j()
            self.live_reward_trace.x, self.live_reward_trace.y = list(range(len(rewards))), rewards

    def release(self) -> None:
        """Free the run's loop (π_θ's copy, α and the optimiser state, ~4× the model's size) and the untrained
        model the panel loaded (a model passed in is the caller's to keep), and return the freed pages to the
        OS: what a cell that needs the memory calls. The next Run loads the model again and, with the same
        knobs, resumes from the panel's checkpoint."""
        self.runner.release()

    def stop(self, by: str = "Stop") -> None:
        """End the run after the step in progress (what Stop and Kernel > Interrupt do)."""
        self.runner.stop(by)

    def run(self, steps: int | None = None) -> GRPOLoop | None:
        """Train up to ``steps`` more steps (default: to the panel's total) in the caller's thread (what a cell
        calls), redrawing after each and evaluating at the evaluation steps (the step the run starts from too,
        step 0 of a new run, unless it has its J); returns the loop.

        Stops early on Stop or an interrupt (also one pressed while the run is set up: then nothing is
        evaluated either); a sitting that trained leaves a checkpoint of whole steps. An interrupt during an
        evaluation leaves that step without a J: the next Run with the same knobs computes it. A disk that
        cannot hold the checkpoint or a run folder in use ends the run with the error's one line in the status;
        the last checkpoint stays. Any other error (a failed step) is raised, after the status names it: **Run**
        then resumes from the last checkpoint."""
        config, start = self.config(), time.perf_counter()
        self._setting_up(config, steps)
        try:
            sitting = self.runner.run(config, steps, on_step=self._on_step_for(start),
                                      on_ready=lambda loop, new: self._ready(loop, new, config, start))
        except Exception as exc:
            self._failed(config, exc)
            raise
        self._ended(sitting)
        return sitting.loop

    def start(self) -> None:
        """:meth:`run` in a background thread (what the Run button does); ignored while a run is going."""
        config, start = self.config(), time.perf_counter()
        self.interruptible = hook_interrupt()
        if self.runner.running:
            return
        self._setting_up(config, None)

        def ended(sitting: Sitting | None, error: BaseException | None) -> None:
            if sitting is not None:
                self._ended(sitting)
            elif isinstance(error, Exception):
                self._failed(config, error)

        self.runner.start(config, on_step=self._on_step_for(start),
                          on_ready=lambda loop, new: self._ready(loop, new, config, start), on_end=ended)

    def _status(self, line: str, *notes: str) -> str:
        """The status line: ``line``, the last J, then ``notes``."""
        return " · ".join(part for part in (line, self._j_line, *notes) if part)

    def _after_step(self, loop: GRPOLoop, start: float) -> None:
        """What runs after each step: redraw, then evaluate at an evaluation step (unless the run was stopped)."""
        first, last = self._first, self._last
        self._last_k = loop.k
        self._draw(loop, first, start, last)
        if not self.runner.stopping:
            self._measure(loop)
            going = loop.k < last and not self.runner.stopping
            self.status.value = html.escape(self._status(self._line, f"step {loop.k + 1}/{self.steps} under way"
                                                         if going else ""))

    def _draw(self, loop: GRPOLoop, first: int, start: float, last: int) -> None:
        """The live reward curve and the status line: the last step, and the time left at this sitting's pace
        (its time per step leaves the evaluations out; the time left adds the evaluations to come at the
        sitting's mean evaluation time)."""
        rewards = [r.reward_mean for r in loop.history]
        with self.figure.batch_update():
            self.live_reward_trace.x, self.live_reward_trace.y = list(range(len(rewards))), rewards
        self.progress.value, self.progress.description = loop.k, f"step {loop.k}"
        per_step = (time.perf_counter() - start - self._eval_seconds) / (loop.k - first)
        record = loop.history[-1]
        measured = [p.seconds for p in self.j.values()]
        per_eval = float(np.mean(measured)) if measured else 0.0
        evals_left = sum(1 for s in self.eval_steps() if loop.k < s <= last) + (loop.k in self.eval_steps())
        self._line = (f"step {loop.k}/{self.steps} · reward {record.reward_mean:.3f} · lag {record.lag} · "
                      f"masked {record.masked_frac:.0%} · {per_step:.1f} s a step (set-up included, evaluations "
                      "not)" + (f", ~{per_step * (last - loop.k) + per_eval * evals_left:.0f} s left"
                                if loop.k < last else ""))
        going = loop.k < last and not self.runner.stopping
        self.status.value = html.escape(self._status(self._line, f"step {loop.k + 1}/{self.steps} under way"
                                                     if going else ""))

    def _setting_up(self, config: TrainConfig, steps: int | None) -> None:
        self._interrupted_at: int | None = None
        self._steps_asked = steps
        if self.loop is None or self._knob_values(self.loop.config) != self._knob_values(config):
            self.status.value = "setting up a new run: " + ("copying" if self.model is not None else "loading") + \
                " the untrained model"

    def _on_step_for(self, start: float) -> Any:
        return lambda loop, _: self._after_step(loop, start)

    def _failed(self, config: TrainConfig, exc: Exception) -> None:
        step = self.runner.saved_step(config)
        resume = "starts over" if step is None else f"resumes from its checkpoint at step {step}"
        self.status.value = html.escape(f"{self._line} · stopped at step {self._last_k} by {type(exc).__name__}: {exc} "
                                        f"· nothing saved from this step; Run with the same knobs {resume}")

    def _ended(self, sitting: Sitting) -> None:
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

    def help_text(self) -> str:
        """What the buttons do, shown under them."""
        ends = "Stop or Kernel > Interrupt" if self.interruptible else "Stop (Kernel > Interrupt does not reach it)"
        subset = self.subset_text()
        return (f"Run trains {self.steps} steps in the background, Run again continues, a new knob value starts "
                f"over; {ends} ends a run after its step in progress. {subset[0].upper()}{subset[1:]} at step 0 "
                f"and every {self.eval_every} steps, between steps. One checkpoint: {self.checkpoint}.")

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
