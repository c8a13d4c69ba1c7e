"""A live panel: sliders for the loop's knobs re-run the bandit and redraw one figure in place.

Each change re-runs ``steps`` × ``runs`` with :func:`~grpo_lab.exact.closed_form.run_bandit_closed_form`
(the loop's steps with the gradient in closed form: the same curves as
:func:`~grpo_lab.exact.bandit.run_bandit` without autograd's per-step overhead; ``benchmarks/bandit_rerun.py``
times both), through :func:`~grpo_lab.exact.studies.train_runs` (under AdamW or clipping each run
trains alone, so that it clips its own gradient), and replaces the traces of the figure inside
``batch_update``. Without a front end the same code runs: the figure is a plain ``go.Figure`` and
:meth:`BanditPanel.rerun` can be called directly (see :mod:`grpo_lab.viz.display`).
"""

from __future__ import annotations

import math
import time
from typing import Any

import ipywidgets as W
import numpy as np

from ..config import EMPTY_STEPS, GRPOConfig
from ..exact.bandit import MAX_EPS_STD, BanditProblem, BanditRun
from ..exact.studies import OPTIMIZER_SETTINGS, lab_config, lab_problem, lab_size, train_runs
from ..objective import BANDS, IS_CORRECTIONS, MASK_NORMALIZATIONS
from .display import display_mode, new_figure, show_panel
from .plots import COLORS, HEIGHT, band_traces


def optimizer_setting(config: GRPOConfig) -> str:
    """The :data:`~grpo_lab.exact.studies.OPTIMIZER_SETTINGS` entry whose optimiser and clip ``config`` has."""
    for name, setting in OPTIMIZER_SETTINGS.items():
        if (config.optimizer, config.max_grad_norm) == (setting["optimizer"], setting["max_grad_norm"]):
            return name
    raise ValueError(f"the panel offers {list(OPTIMIZER_SETTINGS)}; got optimizer = {config.optimizer!r} with "
                     f"max_grad_norm = {config.max_grad_norm!r}")


def make_controls(config: GRPOConfig, runs: int) -> dict[str, W.ValueWidget]:
    """One widget per knob, named as the :class:`~grpo_lab.GRPOConfig` field it sets (``optimizer`` picks
    a setting of :data:`~grpo_lab.exact.studies.OPTIMIZER_SETTINGS`: optimiser and clip; ``runs`` is the
    number of runs); they fire on release, not while dragging."""
    style: dict[str, Any] = dict(style={"description_width": "70px"})
    common: dict[str, Any] = dict(continuous_update=False, **style)
    return {
        "v": W.IntSlider(config.v, 1, 20, description="v (sync)", **common),
        "i": W.IntSlider(config.i, 1, 10, description="i (passes)", **common),
        "eps_low": W.FloatSlider(config.eps_low, min=0.0, max=0.5, step=0.05, description="ε clip", **common),
        "beta": W.FloatSlider(config.beta, min=0.0, max=2.0, step=0.05, description="β (KL)", **common),
        "G": W.IntSlider(config.G, 2, 32, description="G", **common),
        "eps_std": W.FloatLogSlider(config.eps_std, base=10, min=-6, max=math.log10(MAX_EPS_STD), step=0.25,
                                    description="ε_std", readout_format=".1e", **common),
        "mask_zero_variance": W.Checkbox(config.mask_zero_variance, description="zero-variance mask", indent=False),
        "mask_normalize": W.Dropdown(options=list(MASK_NORMALIZATIONS), value=config.mask_normalize,
                                     description="mask norm.", **style),
        "empty_step": W.Dropdown(options=list(EMPTY_STEPS), value=config.empty_step, description="empty step",
                                 **style),
        "band": W.Dropdown(options=list(BANDS), value=config.band, description="band", **style),
        "is_correction": W.Dropdown(options=list(IS_CORRECTIONS), value=config.is_correction,
                                    description="correction", **style),
        "ref_period": W.IntSlider(config.ref_period, 0, 100, step=5, description="ref period", **common),
        "optimizer": W.Dropdown(options=list(OPTIMIZER_SETTINGS), value=optimizer_setting(config),
                                description="optimiser", **style),
        "lr": W.FloatLogSlider(config.lr, base=10, min=-3, max=1.5, step=0.1, description="lr", **common),
        "runs": W.IntSlider(runs, 1, 16, description="runs", **common),
        "seed": W.IntSlider(config.seed, 0, 99, description="seed", **common),
    }


class BanditPanel:
    """J(π_θ) per step, mean ± std over runs, for the knobs' current values, against a
    fixed baseline (the lab's on-policy config with the mask).

    ``panel.rerun()`` runs once with the current values; ``panel.show()`` displays it.
    """

    def __init__(self, problem: BanditProblem | None = None, config: GRPOConfig | None = None,
                 runs: int | None = None, mode: str | None = None) -> None:
        self.problem = problem if problem is not None else lab_problem()
        self.base = config if config is not None else lab_config()
        self.mode = display_mode(mode)
        self.controls = make_controls(self.base, runs if runs is not None else lab_size().runs)
        self.status = W.HTML()
        self.figure = new_figure(self.mode, height=HEIGHT, xaxis_title="step k", yaxis_title="J(π_θ)",
                                 title="Live bandit: change a knob, the runs re-train")
        baseline = train_runs(self.problem, self.base, runs=self.controls["runs"].value)
        x = np.arange(len(baseline.J))
        for trace in band_traces(x, baseline.J, "baseline: v = 1, i = 1, mask", "grey", dash="dot"):
            self.figure.add_trace(trace)
        for trace in band_traces(x, baseline.J, "current knobs", COLORS[0]):
            self.figure.add_trace(trace)
        self.last: BanditRun | None = None
        for name, control in self.controls.items():
            control.observe(self._optimizer_changed if name == "optimizer" else lambda change: self.rerun(),
                            names="value")
        self.rerun()

    def _optimizer_changed(self, change: dict[str, Any]) -> None:
        """A new optimiser brings its own learning rate; setting it re-runs (once), else re-run here."""
        lr = float(OPTIMIZER_SETTINGS[change["new"]].get("lr", self.base.lr))
        if self.controls["lr"].value != lr:
            self.controls["lr"].value = lr
        else:
            self.rerun()

    def config(self) -> GRPOConfig:
        """The config the knobs describe (a reference reset needs β > 0, so β = 0 turns it off)."""
        values = {name: c.value for name, c in self.controls.items() if name not in ("runs", "optimizer")}
        if values["beta"] == 0:
            values["ref_period"] = 0
        setting = OPTIMIZER_SETTINGS[self.controls["optimizer"].value]
        return self.base.replace(**values, optimizer=setting["optimizer"], max_grad_norm=setting["max_grad_norm"])

    def rerun(self) -> BanditRun:
        """Train ``runs`` runs with the current knobs and replace the 'current' traces."""
        config, runs = self.config(), self.controls["runs"].value
        start = time.perf_counter()
        result = train_runs(self.problem, config, runs=runs)
        seconds = time.perf_counter() - start
        band, line = band_traces(np.arange(len(result.J)), result.J, "current knobs", COLORS[0])
        with self.figure.batch_update():
            self.figure.data[2].x, self.figure.data[2].y = band.x, band.y
            self.figure.data[3].x, self.figure.data[3].y = line.x, line.y
        mean, std = result.J[-1].mean(), result.J[-1].std()
        note = "" if config.ref_period or not self.controls["ref_period"].value else " (ref period ignored: β = 0)"
        self.status.value = (f"final J = {mean:.3f} ± {std:.3f} over {runs} runs · masked groups "
                             f"{result.masked_frac.mean():.0%} · {result.optimizer_passes[-1]} passes · "
                             f"re-run {seconds:.2f} s{note}")
        self.last = result
        return result

    @property
    def widget(self) -> W.Widget:
        """Controls in three columns, the figure (in widget mode) and a status line."""
        boxes = list(self.controls.values())
        columns = W.HBox([W.VBox(boxes[n::3]) for n in range(3)])
        figure = [self.figure] if isinstance(self.figure, W.DOMWidget) else []
        return W.VBox([columns, *figure, self.status])

    def show(self) -> None:
        """Widget mode: the live panel. Static mode: the figure as it is now (knobs inactive)."""
        show_panel(self.mode, lambda: self.widget, self.figure, self.status.value)
