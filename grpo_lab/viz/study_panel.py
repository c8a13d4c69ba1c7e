"""Notebook 02's live ablation: knobs (v, i, ε, β, mask) train a short run on the CPU study's
task and overlay its reward, step by step, on the study's cached curves.

In a kernel with a front end, **Run** trains in a background thread (the notebook stays
responsive) and **Stop** ends the run after the step in progress; the loop, its checkpoint and
the figure keep everything done so far, and **Run** with the same knobs continues it. Changing a
knob starts a new run. Without a front end, :meth:`LivePanel.run` trains synchronously; a
kernel interrupt (Ctrl-C) there also finishes the step, saves the checkpoint and returns.
A disk too full (or read-only) for the checkpoint stops the run with one line in the status,
and the kernel stays usable.
"""

from __future__ import annotations

import copy
import html
import threading
import time
from pathlib import Path
from typing import Any

import ipywidgets as W
import numpy as np

from ..files import DiskError
from ..lm.build import build_loop
from ..lm.checkpoint import save_checkpoint
from ..lm.memory import estimate_checkpoint, guard_disk
from ..lm.recipes import run_dir
from ..lm.train_config import TrainConfig
from ..loop import GRPOLoop
from ..study.results import Study
from .display import display_mode, new_figure, show_panel
from .plots import HEIGHT
from .study_plots import ARM_LABELS, arm_color, ci_traces

KNOBS = ("v", "i", "eps_low", "beta", "mask_zero_variance")


def make_knobs(config: TrainConfig) -> dict[str, W.ValueWidget]:
    """One widget per knob, named as the :class:`TrainConfig` field it sets."""
    style: dict[str, Any] = dict(style={"description_width": "80px"}, continuous_update=False)
    return {
        "v": W.IntSlider(config.v, 1, 16, description="v (sync)", **style),
        "i": W.IntSlider(config.i, 1, 8, description="i (passes)", **style),
        "eps_low": W.FloatSlider(config.eps_low, min=0.05, max=0.5, step=0.05, description="ε clip", **style),
        "beta": W.FloatSlider(config.beta, min=0.0, max=0.2, step=0.01, description="β (KL)", **style),
        "mask_zero_variance": W.Checkbox(config.mask_zero_variance, description="zero-variance mask", indent=False),
    }


class LivePanel:
    """A short GRPO run with the knobs' values, drawn over the study's reward curves.

    ``base``: the study's config (task, P, G, T_max, lr); ``model``/``tokenizer``: the
    untrained model (each new run trains a copy); ``problems``: the training problems;
    ``out_dir``: where the run's checkpoint goes (default :func:`~grpo_lab.lm.recipes.run_dir`).
    """

    def __init__(self, study: Study, base: TrainConfig, model: Any, tokenizer: Any, problems: list[Any],
                 steps: int = 20, out_dir: str | Path | None = None, mode: str | None = None) -> None:
        self.study, self.base, self.model, self.tokenizer, self.problems = study, base, model, tokenizer, problems
        self.steps, self.mode = steps, display_mode(mode)
        self.out_dir = Path(out_dir if out_dir is not None else run_dir("nb02_live"))
        self.knobs = make_knobs(base)
        self.run_button = W.Button(description="Run", button_style="success", icon="play")
        self.stop_button = W.Button(description="Stop", button_style="warning", icon="stop")
        self.progress = W.IntProgress(value=0, min=0, max=steps, description="step 0")
        self.status = W.HTML("press Run")
        self.figure = new_figure(self.mode, height=HEIGHT, xaxis_title="step k", yaxis_title="training reward",
                                 title="Live run over the study's curves (mean ± 95 % CI over seeds)")
        for arm in study.arms:
            reward = study.steps_matrix(arm, "reward_mean")
            for trace in ci_traces(np.arange(reward.shape[0]), reward, ARM_LABELS.get(arm, arm),
                                   arm_color(study, arm), dash="dot"):
                self.figure.add_trace(trace)
        self.figure.add_scatter(x=[], y=[], name="live run", mode="lines+markers", line=dict(color="black", width=3))
        self.loop: GRPOLoop | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.run_button.on_click(lambda _: self.start())
        self.stop_button.on_click(lambda _: self._stop.set())

    def config(self) -> TrainConfig:
        """The live run's config: the study's, with the knobs' values (β = 0 keeps no π_ref)."""
        values = {name: knob.value for name, knob in self.knobs.items()}
        return self.base.replace(**values, steps=self.steps, output_dir=str(self.out_dir), checkpoint_every=0)

    def _loop_for(self, config: TrainConfig) -> GRPOLoop:
        """The current loop if it was built with these knobs, else a fresh one from the untrained model."""
        knobs = {k: getattr(config, k) for k in KNOBS}
        if self.loop is None or {k: getattr(self.loop.config, k) for k in KNOBS} != knobs:
            self.loop = build_loop(config, copy.deepcopy(self.model), self.tokenizer, self.problems)
        return self.loop

    def run(self, steps: int | None = None) -> GRPOLoop:
        """Train up to ``steps`` more steps (default: to the panel's total), redrawing after each.
        Stops early on Stop or an interrupt; always leaves a checkpoint of whole steps. A disk that
        cannot hold the checkpoint (:class:`~grpo_lab.files.DiskError`, checked before the first step)
        ends the run with the error's one line in the status; the last checkpoint stays."""
        config, checkpoint = self.config(), self.out_dir / "checkpoint.pt"
        loop = self._loop_for(config)
        self._stop.clear()
        last = self.steps if steps is None else min(self.steps, loop.k + steps)
        start = time.perf_counter()
        try:
            guard_disk(config, estimate_checkpoint(loop, config.steps), checkpoint)
            try:
                while loop.k < last and not self._stop.is_set():
                    record = loop.step()
                    self._draw(loop, time.perf_counter() - start, record.lag)
            except KeyboardInterrupt:
                self.status.value += " · interrupted: the run keeps its finished steps"
            finally:
                save_checkpoint(loop, checkpoint)
        except DiskError as exc:
            self.status.value = f"stopped: {html.escape(str(exc))}"
        return loop

    def _draw(self, loop: GRPOLoop, seconds: float, lag: int) -> None:
        rewards = [r.reward_mean for r in loop.history]
        with self.figure.batch_update():
            self.figure.data[-1].x, self.figure.data[-1].y = list(range(len(rewards))), rewards
        self.progress.value, self.progress.description = loop.k, f"step {loop.k}"
        self.status.value = (f"step {loop.k}/{self.steps} · reward {rewards[-1]:.3f} · lag {lag} · "
                             f"masked {loop.history[-1].masked_frac:.0%} · {seconds:.0f} s this sitting")

    def start(self) -> None:
        """Run in a background thread (what the Run button does); ignored while a run is going."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()

    @property
    def widget(self) -> W.Widget:
        figure = [self.figure] if isinstance(self.figure, W.DOMWidget) else []
        knobs = list(self.knobs.values())
        return W.VBox([W.HBox([W.VBox(knobs[:3]), W.VBox([*knobs[3:], W.HBox([self.run_button, self.stop_button])])]),
                       self.progress, *figure, self.status])

    def show(self) -> None:
        """Widget mode: the live panel. Static mode: the figure as it is now."""
        show_panel(self.mode, lambda: self.widget, self.figure, self.status.value)
