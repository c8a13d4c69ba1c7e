"""Notebook 02's live ablation: knobs (v, i, the correction, ε, β, mask) train a short run on the CPU
study's task and overlay its reward, step by step, on the study's cached curves.

The run trains through :func:`grpo_lab.lm.training.train`, like any other: its stop event is the
**Stop** button, its per-step callback redraws the figure; this module only draws and keeps the knobs.
In a kernel with a front end, **Run** trains in a background thread (the notebook stays
responsive); **Stop**, or **Kernel > Interrupt** while no cell is executing, ends the run after the
step in progress (:func:`hook_interrupt`). The loop and the figure keep everything done so far,
and **Run** with the same knobs continues it; changing a knob starts a new run from the untrained
model. Without a front end, :meth:`LivePanel.run` trains synchronously; a kernel interrupt
(Ctrl-C) there also finishes the step, saves the checkpoint and returns.

Each panel keeps one run folder, ``<out_dir>`` (``checkpoint.pt``, ``metrics.jsonl``, ``config.json``),
whose checkpoint is replaced whenever a run stops or ends (a SmolLM2-135M checkpoint holds π_θ, α and
AdamW's moments: its size is in the status line). A step that fails (a non-finite gradient at pass 2
of i = 2, after pass 1 moved π_θ) saves nothing: the panel drops that loop, and **Run** with the same
knobs resumes from the last checkpoint. A disk too full (or read-only) for the checkpoint stops the
run with one line in the status, and the kernel stays usable.
"""

from __future__ import annotations

import copy
import html
import math
import statistics
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import ipywidgets as W
import numpy as np

from ..files import DiskError
from ..lm.build import build_loop
from ..lm.checkpoint import load_checkpoint
from ..lm.recipes import run_dir
from ..lm.train_config import DTYPES, TrainConfig
from ..lm.training import CHECKPOINT_FILE, RunDirInUse, train
from ..loop import GRPOLoop
from ..objective import IS_CORRECTIONS
from ..study.design import PRIMARY, Study
from .display import display_mode, new_figure, show_panel, title_below_toolbar
from .plots import HEIGHT
from .study_plots import arm_color, arm_label, ci_traces
from .widgets import knob


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
    ``tokenizer``: the untrained model (default: ``base.model``), of which each new run trains a copy;
    ``out_dir``: the panel's run folder, holding its one checkpoint (default
    :func:`~grpo_lab.lm.recipes.run_dir` ``("nb02_live")``).
    """

    def __init__(self, study: Study, base: TrainConfig, problems: list[Any], steps: int = 20, model: Any = None,
                 tokenizer: Any = None, out_dir: str | Path | None = None, mode: str | None = None) -> None:
        self._loads_model = model is None
        if model is None:
            model, tokenizer = self._load_untrained(base)
        self.study, self.base, self.model, self.tokenizer, self.problems = study, base, model, tokenizer, problems
        self.steps, self.mode = steps, display_mode(mode)
        self.out_dir = Path(out_dir if out_dir is not None else run_dir("nb02_live"))
        self.checkpoint = self.out_dir / CHECKPOINT_FILE
        self.knobs = make_knobs(base)
        self.run_button = W.Button(description="Run", button_style="success", icon="play")
        self.stop_button = W.Button(description="Stop", button_style="warning", icon="stop")
        self.progress = W.IntProgress(value=0, min=0, max=steps, description="step 0")
        self.status = W.HTML(f"press Run: {steps} steps; {self._expected()}")
        self.figure = new_figure(self.mode, xaxis_title="step k",
                                 yaxis=dict(range=[0, 1], title="training reward (mean of P·G)"),
                                 **title_below_toolbar("Live run over the study's curves (mean ± 95 % CI over "
                                                       "seeds, in [0, 1])", HEIGHT))
        for arm in (a.name for a in PRIMARY if a.name in study.arms):
            reward = study.metric(arm, "reward_mean")
            for trace in ci_traces(np.arange(reward.shape[0]), reward, f"{arm_label(arm)} (study, n = {study.n(arm)})",
                                   arm_color(arm), (0.0, 1.0), dash="dot"):
                self.figure.add_trace(trace)
        self.figure.add_scatter(x=[], y=[], name="live run", mode="lines+markers", line=dict(color="black", width=3))
        self.loop: GRPOLoop | None = None
        self._saved: tuple[dict[str, Any], int] | None = None
        """The knobs and the step of the run whose checkpoint this panel last wrote (None: none yet)."""
        self._stop = threading.Event()
        self._stopped_by, self._line = "", ""
        self.interruptible = False
        """Whether Kernel > Interrupt reaches a background run (:func:`hook_interrupt`, set by show and start)."""
        self._thread: threading.Thread | None = None
        self.run_button.on_click(lambda _: self.start())
        self.stop_button.on_click(lambda _: self.stop("Stop"))

    def config(self) -> TrainConfig:
        """The live run's config: the study's, with the knobs' values (β = 0 keeps no π_ref)."""
        return self.base.replace(**self._knob_values(), steps=self.steps, output_dir=str(self.out_dir),
                                 checkpoint_every=0)

    def _knob_values(self, config: TrainConfig | None = None) -> dict[str, Any]:
        """The knobs' values: the widgets' (default), or those ``config`` was built with."""
        if config is None:
            return {name: knob.value for name, knob in self.knobs.items()}
        return {name: getattr(config, name) for name in self.knobs}

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
        """The current loop if it was built with these knobs, else a fresh one from the untrained model,
        resumed from the panel's checkpoint when that holds a run with these knobs (a failed step dropped
        the run's loop)."""
        knobs = self._knob_values(config)
        if self.loop is None or self._knob_values(self.loop.config) != knobs:
            self.status.value = "setting up a new run: copying the untrained model"
            if self.model is None:                                    # released: load it again
                self.model, self.tokenizer = self._load_untrained(self.base)
            loop = build_loop(config, copy.deepcopy(self.model), self.tokenizer, self.problems)
            if self._checkpoint_step(knobs) is not None:
                load_checkpoint(loop, self.checkpoint)
            self.loop = loop
        return self.loop

    @staticmethod
    def _load_untrained(base: TrainConfig) -> tuple[Any, Any]:
        from ..lm.models import load_policy

        return load_policy(base.model, dtype=DTYPES[base.dtype], device=base.torch_device())

    def release(self) -> None:
        """Free the run's loop (π_θ's copy, α and the optimiser state, ~4× the model's size) and the untrained
        model the panel loaded (a model passed in is the caller's to keep), and return the freed pages to the
        OS: what a cell that needs the memory calls. The next Run loads the model again and, with the same
        knobs, resumes from the panel's checkpoint."""
        from ..lm.memory import return_freed_memory

        self.stop("release")
        if self._thread is not None:
            self._thread.join()
        self.loop = None
        if self._loads_model:
            self.model = None
        return_freed_memory()

    def _checkpoint_step(self, knobs: dict[str, Any]) -> int | None:
        """The step of the panel's checkpoint if it holds a run with ``knobs`` (None: another run's, or none)."""
        return self._saved[1] if self._saved is not None and self._saved[0] == knobs else None

    def stop(self, by: str = "Stop") -> None:
        """End the run after the step in progress (what Stop and Kernel > Interrupt do)."""
        self._stopped_by = by
        self._stop.set()

    def _clear_stop(self) -> None:
        self._stopped_by = ""
        self._stop.clear()

    def run(self, steps: int | None = None) -> GRPOLoop:
        """:meth:`_train` in the caller's thread (what a cell calls), after clearing an earlier Stop."""
        self._clear_stop()
        return self._train(steps)

    def _train(self, steps: int | None = None) -> GRPOLoop:
        """Train up to ``steps`` more steps (default: to the panel's total) through
        :func:`~grpo_lab.lm.training.train`, redrawing after each; returns the loop.

        Stops early on Stop or an interrupt, also one pressed while the run is set up; a sitting that
        trained leaves a checkpoint of whole steps. A disk that cannot hold the checkpoint
        (:class:`~grpo_lab.files.DiskError`, checked before the first step) or a run folder in use
        ends the run with the error's one line in the status; the last checkpoint stays. Any other
        error (a failed step) is raised, after the status names it and the panel drops the loop, whose
        π_θ may be half-updated: **Run** then resumes from the last checkpoint."""
        config = self.config()
        start = time.perf_counter()
        loop = self._loop_for(config)
        last = self.steps if steps is None else min(self.steps, loop.k + steps)
        if loop.k >= last:
            self.status.value = f"the run has all {self.steps} steps: change a knob to start a new one"
            return loop
        first = loop.k
        self._line = f"set up in {time.perf_counter() - start:.0f} s" + (f", resumed at step {first}" if first else "")
        self.status.value = html.escape(f"{self._line} · step {first + 1}/{self.steps} under way")
        try:
            train(config.replace(steps=last), loop, progress=False, resume=False, stop=self._stop,
                  on_step=lambda trained, _: self._draw(trained, first, start, last))
        except (DiskError, RunDirInUse) as exc:
            self.status.value = f"stopped: {html.escape(str(exc))}"
            return loop
        except Exception as exc:
            self.loop = None
            step = self._checkpoint_step(self._knob_values(config))
            resume = "starts over" if step is None else f"resumes from its checkpoint at step {step}"
            self.status.value = html.escape(f"{self._line} · stopped at step {loop.k} by {type(exc).__name__}: {exc} "
                                            f"· nothing saved from this step; Run with the same knobs {resume}")
            raise
        line = self._line
        if loop.k < last:
            line += (f" · stopped by {self._stopped_by or 'an interrupt'} at step {loop.k}: Run with the same knobs "
                     "continues")
        if loop.k > first:
            self._saved = self._knob_values(config), loop.k
            line += (f" · checkpoint {self.checkpoint} ({self.checkpoint.stat().st_size / 2**30:.2f} GiB, one per "
                     "panel, replaced at every save)")
        self.status.value = html.escape(line)
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
        going = loop.k < last and not self._stop.is_set()
        self.status.value = html.escape(self._line + (f" · step {loop.k + 1}/{self.steps} under way" if going else ""))

    def start(self) -> None:
        """Run in a background thread (what the Run button does); ignored while a run is going. The stop
        flag is cleared here, before the run is set up, so that a Stop pressed during the set-up counts."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._clear_stop()
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
