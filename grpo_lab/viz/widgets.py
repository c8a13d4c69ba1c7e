"""A live panel: sliders for the loop's knobs re-run the bandit and redraw one figure in place.

Each change re-runs ``steps`` × ``runs`` with :func:`~grpo_lab.exact.closed_form.run_bandit_closed_form`
(the loop's steps with the gradient in closed form: the same curves as
:func:`~grpo_lab.exact.bandit.run_bandit` without autograd's per-step overhead; ``benchmarks/bandit_rerun.py``
times both) and replaces the traces of the figure inside ``batch_update``. Without a front
end the same code runs: the figure is a plain ``go.Figure`` and
:meth:`BanditPanel.rerun` can be called directly (see :mod:`grpo_lab.viz.display`).
"""

from __future__ import annotations

import math
import time
from typing import Any

import ipywidgets as W
import numpy as np

from ..config import GRPOConfig
from ..exact.bandit import MAX_EPS_STD, BanditProblem, BanditRun
from ..exact.closed_form import run_bandit_closed_form
from ..exact.studies import lab_config, lab_problem, lab_size
from ..objective import BANDS, MASK_NORMALIZATIONS
from .display import display_mode, new_figure, show_panel
from .plots import COLORS, HEIGHT, band_traces


def make_controls(config: GRPOConfig, runs: int) -> dict[str, W.ValueWidget]:
    """One widget per knob, named as the :class:`~grpo_lab.GRPOConfig` field it sets
    (``runs`` is the number of stacked runs); they fire on release, not while dragging."""
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
        "band": W.Dropdown(options=list(BANDS), value=config.band, description="band", **style),
        "ref_period": W.IntSlider(config.ref_period, 0, 100, step=5, description="ref period", **common),
        "lr": W.FloatLogSlider(config.lr, base=10, min=-1, max=1.5, step=0.1, description="lr (SGD)", **common),
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
        baseline = run_bandit_closed_form(self.problem, self.base, runs=self.controls["runs"].value)
        x = np.arange(len(baseline.J))
        for trace in band_traces(x, baseline.J, "baseline: v = 1, i = 1, mask", "grey", dash="dot"):
            self.figure.add_trace(trace)
        for trace in band_traces(x, baseline.J, "current knobs", COLORS[0]):
            self.figure.add_trace(trace)
        self.last: BanditRun | None = None
        for control in self.controls.values():
            control.observe(lambda change: self.rerun(), names="value")
        self.rerun()

    def config(self) -> GRPOConfig:
        """The config the knobs describe (a reference reset needs β > 0, so β = 0 turns it off)."""
        values = {name: c.value for name, c in self.controls.items() if name != "runs"}
        if values["beta"] == 0:
            values["ref_period"] = 0
        return self.base.replace(**values)

    def rerun(self) -> BanditRun:
        """Train ``runs`` runs with the current knobs and replace the 'current' traces."""
        config, runs = self.config(), self.controls["runs"].value
        start = time.perf_counter()
        result = run_bandit_closed_form(self.problem, config, runs=runs)
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
