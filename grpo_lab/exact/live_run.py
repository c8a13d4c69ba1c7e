"""A language-model run that trains as a notebook watches it and takes its **exact J** as it goes: the engine of
notebook 02's live panel (:class:`~grpo_lab.viz.live_panel.LivePanel` draws it and gives it its knobs).

**The run.** A :class:`LiveRun` trains through :func:`~grpo_lab.lm.training.train` in a
:class:`~grpo_lab.lm.background.BackgroundRun`: in a background thread (:meth:`LiveRun.start`) or in the caller's
(:meth:`LiveRun.run`). It continues a run with the same config, starts over from the untrained model when the
config changes, resumes from its checkpoint after a failed step, and removes its run folder (``checkpoint.pt``,
about 2 GB for SmolLM2-135M) when the kernel ends. :meth:`LiveRun.stop`, or **Kernel > Interrupt** while no cell
is executing, ends a run after the step (and any evaluation) in progress.

**The live J.** At the steps of :func:`eval_schedule` (0, 1, 2, 4, … below ``eval_every``, then every
``eval_every`` steps, and the run's last step: the curve has points from the first minutes on) it computes exact J
of the loop's π_θ (:func:`~grpo_lab.exact.strict_j.exact_evaluate` under the run's sampling: T, top-p/top-k,
T_max and the model's stop ids, as the lag frontier's units do; with 1 torch thread, :data:`EVAL_THREADS`) on
``eval_questions`` questions of :func:`~grpo_lab.lm.tasks.all_questions`: every (363 // n)-th, from the first
(:func:`eval_subset`). The default, 27 questions (every 13th: 8 sums, 10 differences, 9 products), was chosen
among the strides 11–24 (15–33 questions) as the one whose subset J tracked the frontier pilot's whole-set J
closest: within 0.024 at each of its five evaluation steps (stride 20: 0.030, the others 0.06–0.19; stride 11
takes only "a op 0"). It is the J of those 27 questions, not of the task. One evaluation took 3.7–5.1 s of CPU
(6–11 s wall) with 1 torch thread on the 2-core machine at load 4.6–5.8 (the untrained model and the pilot's π_θ
at steps 32 and 128); smoke mode's 4 questions at T_max = 4, 1.4–1.8 s. Each point is J_low with its certified
bound, J_low ≤ J ≤ J_low + pruned. The evaluation runs between steps, off the training clock: the time per step
leaves it out.

What a run shows is left to a subclass: the ``_on_*`` methods, called as the run goes, do nothing here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..lm.background import BackgroundRun, Sitting, hook_interrupt, run_key
from ..lm.memory import return_freed_memory
from ..lm.recipes import run_dir
from ..lm.sampling import stop_and_pad_ids
from ..lm.tasks import Problem, all_questions
from ..lm.train_config import TrainConfig
from ..loop import GRPOLoop
from .strict_j import ExactEvaluation, Sampling, exact_evaluate

EVAL_QUESTIONS = 27
"""Questions of the live exact J by default: every 13th of ``addsubmul1``'s 363 (module docstring)."""
EVAL_EVERY = 16
"""Steps between two live evaluations by default, after the early ones (:func:`eval_schedule`): 0, 1, 2, 4, 8,
16, 32, …, 128 over the frontier's budget."""
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
"""A run's length by default: the lag frontier's budget."""


def eval_subset(questions: Sequence[Any], n: int) -> list[int]:
    """The indices of the live evaluation's ``n`` questions: every (len // n)-th of ``questions``, from the first."""
    if not 1 <= n <= len(questions):
        raise ValueError(f"eval_questions must be between 1 and the task's {len(questions)} questions, got {n}")
    stride = len(questions) // n
    return list(range(0, stride * n, stride))


def eval_schedule(steps: int, every: int) -> list[int]:
    """The steps at which a run of ``steps`` steps is evaluated: 0, the powers of two below ``every`` (1, 2, 4, …:
    the curve takes shape in the first steps, at log2(every) evaluations more), every multiple of ``every``, and
    the last step."""
    if every < 1:
        raise ValueError(f"eval_every must be at least 1, got {every}")
    early = {2**n for n in range(every.bit_length()) if 2**n < every}
    return sorted(s for s in {0, *early, *range(0, steps + 1, every), steps} if s <= steps)


def schedule_text(every: int) -> str:
    """:func:`eval_schedule` in words: "at steps 0, 1, 2, 4, 8 and every 16 steps"."""
    early = [0, *(2**n for n in range(every.bit_length()) if 2**n < every)]
    return "at every step" if every == 1 else f"at steps {', '.join(map(str, early))} and every {every} steps"


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
    """One live evaluation: exact J of π_θ after ``step`` steps on the run's questions."""

    step: int
    j_low: float
    """Mean J_low over the questions."""
    pruned: float
    """Mean pruned mass: J_low ≤ J ≤ J_low + pruned."""
    pruned_max: float
    """The largest pruned mass of one question."""
    seconds: float


class LiveRun:
    """A GRPO run of ``base`` (its :meth:`config`) on ``problems``, evaluated by exact J as it trains (module
    docstring).

    ``steps``: a run's length (default :data:`STEPS`); ``eval_questions``: how many of
    :func:`~grpo_lab.lm.tasks.all_questions` ``(base.task)`` the live exact J covers (:func:`eval_subset`; default
    :data:`EVAL_QUESTIONS`); ``eval_every``: steps between evaluations once the early ones are done
    (:func:`eval_schedule`; default :data:`EVAL_EVERY`); ``eval_threads``: torch threads during an evaluation
    (default :data:`EVAL_THREADS`; None: torch's setting); ``model`` / ``tokenizer``: the untrained model (default:
    ``base.model``, loaded by the first run), of which each new run trains a copy; ``out_dir``: the run folder,
    holding its one checkpoint (default :func:`~grpo_lab.lm.recipes.run_dir` ``("nb02_live")``), removed when the
    kernel ends.

    After a run: ``loop`` (its :class:`~grpo_lab.loop.GRPOLoop`, ``loop.history`` its step records), ``j`` (step →
    :class:`JPoint`), ``questions`` (the evaluated problems); ``runner`` is the
    :class:`~grpo_lab.lm.background.BackgroundRun` that trains it.
    """

    def __init__(self, base: TrainConfig, problems: list[Any], steps: int = STEPS,
                 eval_questions: int = EVAL_QUESTIONS, eval_every: int = EVAL_EVERY,
                 eval_threads: int | None = EVAL_THREADS, model: Any = None, tokenizer: Any = None,
                 out_dir: str | Path | None = None) -> None:
        eval_schedule(steps, eval_every)                       # a bad eval_every fails here, not at the first run
        task_questions = all_questions(base.task)
        self.question_count = len(task_questions)
        self.questions: list[Problem] = [task_questions[i] for i in eval_subset(task_questions, eval_questions)]
        self.stride = self.question_count // eval_questions
        self.base, self.problems = base, problems
        self.steps, self.eval_every, self.eval_threads = steps, eval_every, eval_threads
        self.out_dir = Path(out_dir if out_dir is not None else run_dir("nb02_live"))
        self.runner = BackgroundRun(self.out_dir, problems, model=model, tokenizer=tokenizer)
        self.checkpoint = self.runner.checkpoint
        self.j: dict[int, JPoint] = {}
        """The live run's exact J by step (that of :attr:`loop`'s run, or of the run a failed step dropped)."""
        self._j_key: dict[str, Any] | None = None
        """The :func:`~grpo_lab.lm.background.run_key` of the run whose J points :attr:`j` holds."""
        self._first = self._last = self._last_k = 0
        """This sitting's first step, the step it was asked to reach, and the last step it reached."""
        self._start = 0.0
        self._eval_seconds = 0.0
        """Seconds of evaluation in the current sitting (left out of its time per step)."""
        self._interrupted_at: int | None = None
        self._steps_asked: int | None = None
        self.interruptible = False
        """Whether Kernel > Interrupt reaches a background run (:func:`hook_interrupt`, set by start)."""

    # ------------------------------------------------------------------------- the run's state

    def config(self) -> TrainConfig:
        """The run's config: ``base`` at the run's length, in the run folder, saved only at a sitting's end."""
        return self.base.replace(steps=self.steps, output_dir=str(self.out_dir), checkpoint_every=0)

    @property
    def loop(self) -> GRPOLoop | None:
        """The current run's loop (None before the first run, after :meth:`release` or a failed step)."""
        return self.runner.loop

    @property
    def model(self) -> Any:
        """The untrained model the runner holds (None while a run it loaded trains it, or after a release)."""
        return self.runner.model

    def eval_steps(self) -> list[int]:
        """The steps at which the live run is evaluated (:func:`eval_schedule`)."""
        return eval_schedule(self.steps, self.eval_every)

    def seconds_per_step(self, loop: GRPOLoop) -> float:
        """This sitting's wall seconds per step, set-up included, evaluations not."""
        return (time.perf_counter() - self._start - self._eval_seconds) / (loop.k - self._first)

    def seconds_left(self, loop: GRPOLoop) -> float:
        """The sitting's time left at its pace: its steps to come at :meth:`seconds_per_step`, and its evaluations
        to come at the mean evaluation time so far."""
        measured = [p.seconds for p in self.j.values()]
        per_eval = sum(measured) / len(measured) if measured else 0.0
        schedule = self.eval_steps()
        evals_left = sum(1 for s in schedule if loop.k < s <= self._last) + (loop.k in schedule)
        return self.seconds_per_step(loop) * (self._last - loop.k) + per_eval * evals_left

    # ------------------------------------------------------------------------- evaluating

    def evaluate(self, loop: GRPOLoop) -> ExactEvaluation:
        """Exact J of ``loop``'s π_θ on the run's questions (:func:`exact_j`) with ``eval_threads`` torch threads."""
        return exact_j(loop, self.questions, self.eval_threads)

    def _measure(self, loop: GRPOLoop) -> None:
        """Evaluate ``loop`` at its step if that is an evaluation step without a J yet."""
        if loop.k not in self.eval_steps() or loop.k in self.j:
            return
        self._on_evaluating(loop.k)
        start = time.perf_counter()
        result = self.evaluate(loop)
        seconds = time.perf_counter() - start
        self._eval_seconds += seconds
        self.j[loop.k] = JPoint(loop.k, result.mean, float(result.pruned.mean()), float(result.pruned.max()),
                                seconds)
        self._on_evaluated(self.j[loop.k])

    # ------------------------------------------------------------------------- training

    def release(self) -> None:
        """Free the run's loop (π_θ's copy, α and the optimiser state, ~4× the model's size) and the untrained
        model the run loaded (a model passed in is the caller's to keep), and return the freed pages to the
        OS: what a cell that needs the memory calls. The next run loads the model again and, with the same
        config, resumes from the checkpoint."""
        self.runner.release()

    def stop(self, by: str = "Stop") -> None:
        """End the run after the step in progress (what Stop and Kernel > Interrupt do)."""
        self.runner.stop(by)

    def run(self, steps: int | None = None) -> GRPOLoop | None:
        """Train up to ``steps`` more steps (default: to the run's total) in the caller's thread (what a cell
        calls), evaluating at the evaluation steps (the step the run starts from too, step 0 of a new run, unless
        it has its J); returns the loop.

        Stops early on :meth:`stop` or an interrupt (also one pressed while the run is set up: then nothing is
        evaluated either); a sitting that trained leaves a checkpoint of whole steps. An interrupt during an
        evaluation leaves that step without a J: the next run with the same config computes it. A disk that
        cannot hold the checkpoint or a run folder in use ends the run with the error's one line in the
        sitting. Any other error (a failed step) is raised, after ``_on_failed``: the next run resumes from the
        last checkpoint."""
        config = self.config()
        self._setting_up(config, steps)
        try:
            sitting = self.runner.run(config, steps, on_step=self._after_step,
                                      on_ready=lambda loop, new: self._ready(loop, new, config))
        except Exception as exc:
            self._on_failed(config, exc)
            raise
        self._on_ended(sitting)
        return sitting.loop

    def start(self) -> None:
        """:meth:`run` in a background thread (what a Run button does); ignored while a run is going."""
        config = self.config()
        self.interruptible = hook_interrupt()
        if self.runner.running:
            return
        self._setting_up(config, None)

        def ended(sitting: Sitting | None, error: BaseException | None) -> None:
            if sitting is not None:
                self._on_ended(sitting)
            elif isinstance(error, Exception):
                self._on_failed(config, error)

        self.runner.start(config, on_step=self._after_step,
                          on_ready=lambda loop, new: self._ready(loop, new, config), on_end=ended)

    def _setting_up(self, config: TrainConfig, steps: int | None) -> None:
        self._interrupted_at = None
        self._steps_asked = steps
        self._start = time.perf_counter()
        self._on_setting_up(self.loop is None or run_key(self.loop.config) != run_key(config))

    def _ready(self, loop: GRPOLoop, new: bool, config: TrainConfig) -> bool:
        """Once the runner has the loop: keep the J points of this run up to its step (a new loop resumed from
        the checkpoint) or none (a new run), and evaluate at the step the run starts from unless it has its J;
        False (train nothing) after an interrupt during that evaluation."""
        if new:
            key = run_key(config)
            same_run = self.runner.saved_step(config) is not None and self._j_key == key
            self.j = {k: p for k, p in self.j.items() if k <= loop.k} if same_run else {}
            self._j_key = key
            self._on_new_loop()
        self._first = self._last_k = loop.k
        self._last = self.steps if self._steps_asked is None else min(self.steps, loop.k + self._steps_asked)
        self._eval_seconds = 0.0
        self._on_ready(loop, time.perf_counter() - self._start)
        try:
            self._measure(loop)
        except KeyboardInterrupt:
            self._interrupted_at = loop.k
            return False
        self._on_measured(loop)
        return True

    def _after_step(self, loop: GRPOLoop, record: Any = None) -> None:
        """After each step: show it, then evaluate at an evaluation step (unless the run was stopped)."""
        self._last_k = loop.k
        self._draw(loop)
        if not self.runner.stopping:
            self._measure(loop)
            self._on_measured(loop)

    def going(self, loop: GRPOLoop) -> bool:
        """Whether this sitting trains another step after ``loop``'s."""
        return loop.k < self._last and not self.runner.stopping

    # ------------------------------------------------------------------------- what a view shows (nothing here)

    def _on_setting_up(self, new: bool) -> None:
        """A sitting is about to set up its loop (``new``: a new run, whose model is copied or loaded)."""

    def _on_new_loop(self) -> None:
        """The runner built a new loop; :attr:`j` holds this run's points."""

    def _on_ready(self, loop: GRPOLoop, setup_seconds: float) -> None:
        """The loop is set up, at step ``loop.k``."""

    def _on_evaluating(self, step: int) -> None:
        """An evaluation at ``step`` begins."""

    def _on_evaluated(self, point: JPoint) -> None:
        """An evaluation ended with ``point``."""

    def _on_measured(self, loop: GRPOLoop) -> None:
        """The step ``loop.k`` has its J, if it is an evaluation step; the next step follows if :meth:`going`."""

    def _draw(self, loop: GRPOLoop) -> None:
        """A step ended at ``loop.k``, before its evaluation."""

    def _on_failed(self, config: TrainConfig, exc: Exception) -> None:
        """A step failed with ``exc``; nothing of it was saved."""

    def _on_ended(self, sitting: Sitting) -> None:
        """A sitting ended (done, stopped, or ended by a disk error)."""
