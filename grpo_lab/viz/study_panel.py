"""Notebook 02's live ablation: knobs (v, i, the correction, ε, β, mask) train a short run on the CPU
study's task and overlay its reward, step by step, on the study's cached curves.

In a kernel with a front end, **Run** trains in a background thread (the notebook stays
responsive); **Stop**, or **Kernel > Interrupt** while no cell is executing, ends the run after the
step in progress (:func:`hook_interrupt`). The loop and the figure keep everything done so far,
and **Run** with the same knobs continues it; changing a knob starts a new run from the untrained
model. Without a front end, :meth:`LivePanel.run` trains synchronously; a kernel interrupt
(Ctrl-C) there also finishes the step, saves the checkpoint and returns.

Each panel keeps one checkpoint, ``<out_dir>/checkpoint.pt``, replaced whenever a run stops or
ends (a SmolLM2-135M checkpoint holds π_θ, α and AdamW's moments: its size is in the status line).
A disk too full (or read-only) for it stops the run with one line in the status, and the kernel
stays usable.
"""

from __future__ import annotations

import contextlib
import copy
import html
import math
import statistics
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ipywidgets as W
import numpy as np

from ..files import DiskError
from ..lm.build import build_loop
from ..lm.checkpoint import save_checkpoint
from ..lm.memory import estimate_checkpoint, guard_disk
from ..lm.recipes import run_dir
from ..lm.train_config import DTYPES, TrainConfig
from ..lm.training import CHECKPOINT_FILE
from ..loop import GRPOLoop
from ..objective import IS_CORRECTIONS
from ..study.design import PRIMARY, Study
from .display import display_mode, new_figure, show_panel
from .plots import HEIGHT
from .study_plots import arm_color, arm_label, ci_traces

KNOBS = ("v", "i", "is_correction", "eps_low", "beta", "mask_zero_variance")


def make_knobs(config: TrainConfig) -> dict[str, W.ValueWidget]:
    """One widget per knob, named as the :class:`TrainConfig` field it sets."""
    style: dict[str, Any] = dict(style={"description_width": "80px"}, continuous_update=False)
    return {
        "v": W.IntSlider(config.v, 1, 32, description="v (sync)", **style),
        "i": W.IntSlider(config.i, 1, 8, description="i (passes)", **style),
        "is_correction": W.Dropdown(options=IS_CORRECTIONS, value=config.is_correction, description="correction",
                                    style=style["style"]),
        "eps_low": W.FloatSlider(config.eps_low, min=0.05, max=0.5, step=0.05, description="ε clip", **style),
        "beta": W.FloatSlider(config.beta, min=0.0, max=0.2, step=0.01, description="β (KL)", **style),
        "mask_zero_variance": W.Checkbox(config.mask_zero_variance, description="zero-variance mask", indent=False),
    }


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' progress bars off while a model loads (its "Loading weights" bar would sit in the
    notebook above the knobs), back as they were afterwards."""
    from transformers.utils import logging

    was_on = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            logging.enable_progress_bar()


# ----------------------------------------------------------------------------- Kernel > Interrupt

_RUNNING: weakref.WeakSet[LivePanel] = weakref.WeakSet()
"""Panels whose background run is going: what an interrupt stops."""


def _stop_running(signum: int, frame: Any) -> None:
    """SIGINT while the kernel is idle: stop every panel's background run (nothing else to stop: an
    idle ipykernel ignores SIGINT)."""
    for panel in list(_RUNNING):
        panel.stop("Kernel > Interrupt")


def hook_interrupt() -> bool:
    """Let Kernel > Interrupt reach a background run; False where it cannot (not in ipykernel).

    Kernel > Interrupt sends the kernel SIGINT. An idle ipykernel ignores it: around each message it
    handles, it installs Python's default handler (a KeyboardInterrupt in the executing cell) and then
    puts back the handler it found, kept in ``kernel.saved_sigint_handler``. Setting that one to
    :func:`_stop_running` (from a message handler: a button's click or a cell) makes SIGINT between
    messages stop the runs; while a cell executes, Interrupt stops that cell as before."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None or not hasattr(kernel, "saved_sigint_handler"):
        return False
    kernel.saved_sigint_handler = _stop_running
    return True


class LivePanel:
    """A short GRPO run with the knobs' values, drawn over the study's reward curves.

    ``study``: the cached study (its primary arms are drawn); ``base``: the study's config (task, P,
    G, T_max, lr); ``problems``: the training problems; ``steps``: a run's length; ``model`` /
    ``tokenizer``: the untrained model (default: ``base.model``, loaded without progress bars), of
    which each new run trains a copy; ``out_dir``: where the panel's one checkpoint goes (default
    :func:`~grpo_lab.lm.recipes.run_dir` ``("nb02_live")``).
    """

    def __init__(self, study: Study, base: TrainConfig, problems: list[Any], steps: int = 20, model: Any = None,
                 tokenizer: Any = None, out_dir: str | Path | None = None, mode: str | None = None) -> None:
        if model is None:
            from ..lm.models import load_policy

            with quiet_loading():
                model, tokenizer = load_policy(base.model, dtype=DTYPES[base.dtype], device=base.torch_device())
        self.study, self.base, self.model, self.tokenizer, self.problems = study, base, model, tokenizer, problems
        self.steps, self.mode = steps, display_mode(mode)
        self.out_dir = Path(out_dir if out_dir is not None else run_dir("nb02_live"))
        self.checkpoint = self.out_dir / CHECKPOINT_FILE
        self.knobs = make_knobs(base)
        self.run_button = W.Button(description="Run", button_style="success", icon="play")
        self.stop_button = W.Button(description="Stop", button_style="warning", icon="stop")
        self.progress = W.IntProgress(value=0, min=0, max=steps, description="step 0")
        self.status = W.HTML(f"press Run: {steps} steps; {self._expected()}")
        self.figure = new_figure(self.mode, height=HEIGHT, xaxis_title="step k", margin=dict(t=60),
                                 yaxis=dict(range=[0, 1], title="training reward (mean of P·G)"),
                                 title="Live run over the study's curves (mean ± 95 % CI over seeds, in [0, 1])")
        for arm in (a.name for a in PRIMARY if a.name in study.arms):
            reward = study.metric(arm, "reward_mean")
            for trace in ci_traces(np.arange(reward.shape[0]), reward, f"{arm_label(arm)} (study, n = {study.n(arm)})",
                                   arm_color(arm), (0.0, 1.0), dash="dot"):
                self.figure.add_trace(trace)
        self.figure.add_scatter(x=[], y=[], name="live run", mode="lines+markers", line=dict(color="black", width=3))
        self.loop: GRPOLoop | None = None
        self._stop = threading.Event()
        self._stopped_by, self._line = "", ""
        self.interruptible = False
        """Whether Kernel > Interrupt reaches a background run (:func:`hook_interrupt`, set by show and start)."""
        self._thread: threading.Thread | None = None
        self.run_button.on_click(lambda _: self.start())
        self.stop_button.on_click(lambda _: self.stop("Stop"))

    def config(self) -> TrainConfig:
        """The live run's config: the study's, with the knobs' values (β = 0 keeps no π_ref)."""
        values = {name: knob.value for name, knob in self.knobs.items()}
        return self.base.replace(**values, steps=self.steps, output_dir=str(self.out_dir), checkpoint_every=0)

    def _expected(self) -> str:
        """The expected run time before any live step: the study's median step time when the study ran
        this task at this size, else after the first step."""
        s, b = self.study.settings, self.base
        if self.study.arms and (s.get("task"), s.get("prompts_per_step"), s.get("G"), s.get("max_completion_length")) \
                == (b.task, b.prompts_per_step, b.G, b.max_completion_length):
            times = [m["sample_seconds"] + m["train_seconds"] + m["sync_seconds"] for units in self.study.units.values()
                     for unit in units.values() for m in unit["metrics"] if not m["skipped"]]
            per_step = statistics.median(times or [math.nan])
            return (f"expected ~{per_step * self.steps / 60:.1f} min ({per_step:.1f} s a step, the study's median "
                    f"on this machine; the live step time replaces it once a step has run)")
        return "the expected time shows after the first step"

    def _loop_for(self, config: TrainConfig) -> GRPOLoop:
        """The current loop if it was built with these knobs, else a fresh one from the untrained model."""
        knobs = {k: getattr(config, k) for k in KNOBS}
        if self.loop is None or {k: getattr(self.loop.config, k) for k in KNOBS} != knobs:
            self.status.value = "setting up a new run: copying the untrained model"
            self.loop = build_loop(config, copy.deepcopy(self.model), self.tokenizer, self.problems)
        return self.loop

    def stop(self, by: str = "Stop") -> None:
        """End the run after the step in progress (what Stop and Kernel > Interrupt do)."""
        self._stopped_by = by
        self._stop.set()

    def run(self, steps: int | None = None) -> GRPOLoop:
        """:meth:`_train` in the caller's thread (what a cell calls), after clearing an earlier Stop."""
        self._stop.clear()
        return self._train(steps)

    def _train(self, steps: int | None = None) -> GRPOLoop:
        """Train up to ``steps`` more steps (default: to the panel's total), redrawing after each.

        Stops early on Stop or an interrupt, also one pressed while the run is set up; a sitting that
        trained leaves a checkpoint of whole steps. A disk that cannot hold the checkpoint
        (:class:`~grpo_lab.files.DiskError`, checked before the first step) ends the run with the error's
        one line in the status; the last checkpoint stays."""
        config = self.config()
        start = time.perf_counter()
        loop = self._loop_for(config)
        last = self.steps if steps is None else min(self.steps, loop.k + steps)
        if loop.k >= last:
            self.status.value = f"the run has all {self.steps} steps: change a knob to start a new one"
            return loop
        first = loop.k
        self._line = f"set up in {time.perf_counter() - start:.0f} s"
        try:
            guard_disk(config, estimate_checkpoint(loop, config.steps), self.checkpoint)
            try:
                while loop.k < last and not self._stop.is_set():
                    self.status.value = f"{self._line} · step {loop.k + 1}/{self.steps} under way"
                    loop.step()
                    self._draw(loop, first, start, last)
            except KeyboardInterrupt:
                self.stop("an interrupt")
            finally:
                line = self._line
                if self._stop.is_set():
                    line += f" · stopped by {self._stopped_by} at step {loop.k}: Run with the same knobs continues"
                if loop.k > first:
                    path = save_checkpoint(loop, self.checkpoint)
                    line += (f" · checkpoint {path} ({path.stat().st_size / 2**30:.2f} GiB, one per panel, "
                             f"replaced at every save)")
                self.status.value = html.escape(line)
        except DiskError as exc:
            self.status.value = f"stopped: {html.escape(str(exc))}"
        return loop

    def _draw(self, loop: GRPOLoop, first: int, start: float, last: int) -> None:
        """The live curve and the status line: the last step, and the time left at this sitting's pace."""
        rewards = [r.reward_mean for r in loop.history]
        with self.figure.batch_update():
            self.figure.data[-1].x, self.figure.data[-1].y = list(range(len(rewards))), rewards
        self.progress.value, self.progress.description = loop.k, f"step {loop.k}"
        per_step = (time.perf_counter() - start) / (loop.k - first)
        record = loop.history[-1]
        self._line = (f"step {loop.k}/{self.steps} · reward {record.reward_mean:.3f} · lag {record.lag} · "
                      f"masked {record.masked_frac:.0%} · {per_step:.1f} s a step (set-up included)"
                      + (f", ~{per_step * (last - loop.k):.0f} s left" if loop.k < last else ""))
        self.status.value = html.escape(self._line)

    def start(self) -> None:
        """Run in a background thread (what the Run button does); ignored while a run is going. The stop
        flag is cleared here, before the run is set up, so that a Stop pressed during the set-up counts."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self.interruptible = hook_interrupt()
        _RUNNING.add(self)

        def target() -> None:
            try:
                self._train()
            finally:
                _RUNNING.discard(self)

        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()

    def help_text(self) -> str:
        """What the buttons do, shown under them."""
        ends = "Stop or Kernel > Interrupt" if self.interruptible else "Stop (Kernel > Interrupt does not reach it)"
        return (f"Run trains {self.steps} steps in the background, Run again continues, a new knob value starts "
                f"over; {ends} ends a run after its step in progress. One checkpoint: {self.checkpoint}.")

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
