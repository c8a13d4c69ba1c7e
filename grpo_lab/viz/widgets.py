"""A live panel: sliders for the loop's knobs re-run the bandit and redraw one figure in place.

Each change re-runs ``steps`` × ``runs`` with :func:`~grpo_lab.exact.closed_form.run_bandit_closed_form`
(the loop's steps with the gradient in closed form: the same curves as
:func:`~grpo_lab.exact.bandit.run_bandit` without autograd's per-step overhead; ``benchmarks/bandit_rerun.py``
times both), through :func:`~grpo_lab.exact.bandit_lab.train_runs` (under AdamW or clipping each run
trains alone, so that it clips its own gradient), and replaces the traces of the figure inside
:func:`~grpo_lab.viz.display.redraw` (a reloaded page draws them too). Without a front end the same
code runs: the figure is a plain ``go.Figure`` and :meth:`BanditPanel.rerun` can be called directly (see
:mod:`grpo_lab.viz.display`).

Every knob widget, here and in notebook 02's live panel (:mod:`grpo_lab.viz.live_panel`), is built by
:func:`knob` from one table, :data:`KNOBS`: its label, its tooltip, the label's width.
"""

from __future__ import annotations

import math
import time
from typing import Any

import ipywidgets as W
import numpy as np

from ..config import EMPTY_STEPS, GRPOConfig
from ..exact.bandit import MAX_EPS_STD, BanditProblem, BanditRun
from ..exact.bandit_lab import OPTIMIZER_SETTINGS, lab_config, lab_problem, lab_size, train_runs
from ..objective import BANDS, IS_CORRECTIONS, MASK_NORMALIZATIONS
from .display import display_mode, new_figure, redraw, show_panel, title_below_toolbar
from .plots import COLORS, HEIGHT, band_traces


def optimizer_setting(config: GRPOConfig) -> str:
    """The :data:`~grpo_lab.exact.bandit_lab.OPTIMIZER_SETTINGS` entry whose optimiser and clip ``config`` has."""
    for name, setting in OPTIMIZER_SETTINGS.items():
        if (config.optimizer, config.max_grad_norm) == (setting["optimizer"], setting["max_grad_norm"]):
            return name
    raise ValueError(f"the panel offers {list(OPTIMIZER_SETTINGS)}; got optimizer = {config.optimizer!r} with "
                     f"max_grad_norm = {config.max_grad_norm!r}")


KNOBS: dict[str, tuple[str, str]] = {
    "v": ("v (sync)", "v: α ← π_θ every v steps (v = 1: on-policy)"),
    "i": ("i (passes)", "i: optimiser passes on each batch (i > 1: sample reuse)"),
    "eps_low": ("ε clip", "eps_low: how far r = π_θ/α may move from r′ = π_k/α before it is clipped"),
    "beta": ("β (KL)", "beta: weight of the KL penalty towards π_ref (0: no π_ref)"),
    "G": ("G", "G: completions sampled per prompt (a group)"),
    "eps_std": ("ε_std", "eps_std: added to the group's reward variance before whitening"),
    "mask_zero_variance": ("zero-variance mask", "mask_zero_variance: drop groups whose G rewards agree (σ = 0)"),
    "mask_normalize": ("mask norm.", "mask_normalize: masked groups stay in the loss's denominator (batch) "
                                     "or leave it (unmasked)"),
    "empty_step": ("empty step", "empty_step: a step with no signal is skipped, or takes an optimiser step "
                                 "on a zero gradient (optimizer_step)"),
    "band": ("band", "band: the clip interval around r′, additive (the paper) or multiplicative (TRL)"),
    "is_correction": ("correction", "is_correction: ratio (the paper's r′ = π_k/α), truncated (min(r′, C)), "
                                    "mask (r′, 0 outside [1/C, C]), icepop (r′, 0 outside [a, C]) or none "
                                    "(ignore α)"),
    "is_cap": ("cap C", "is_cap: the upper bound C on r′ of truncated, mask and icepop"),
    "is_floor": ("floor a", "is_floor: the lower bound a on r′ of icepop (mask takes 1/C)"),
    "ref_period": ("ref period", "ref_period: steps between resets π_ref ← π_θ (0: never)"),
    "optimizer": ("optimiser", "optimizer and max_grad_norm: plain SGD, or AdamW with gradient clipping"),
    "lr": ("lr", "lr: the learning rate"),
    "runs": ("runs", "runs trained with these knobs: the band is their mean ± std"),
    "seed": ("seed", "seed: the runs' random seed"),
}
"""Every panel knob, by the config field it sets: (label, tooltip). Both panels build their widgets
from here (:func:`knob`), so a knob reads the same in notebooks 01 and 02."""
LABEL_PX = 100
"""Width of a knob's label: the longest ("i (passes)", "mask norm.", "empty step", "correction", "ref
period": 10 characters, 62–77 px in JupyterLab's 13 px font) fits whole, with no "…"."""
SLIDERS = (W.IntSlider, W.FloatSlider, W.FloatLogSlider)


def knob(name: str, kind: type[W.ValueWidget], value: Any, **options: Any) -> W.ValueWidget:
    """The ``kind`` widget of knob ``name`` (a key of :data:`KNOBS`) at ``value``: its label and tooltip,
    a label :data:`LABEL_PX` wide; a slider fires on release, not while dragging. ``options``: the
    widget's range or choices."""
    label, tooltip = KNOBS[name]
    if kind is W.Checkbox:
        return W.Checkbox(value, description=label, tooltip=tooltip, indent=False)
    if issubclass(kind, SLIDERS):
        options = {"continuous_update": False, **options}
    return kind(value=value, description=label, tooltip=tooltip, style={"description_width": f"{LABEL_PX}px"},
                **options)


def make_controls(config: GRPOConfig, runs: int) -> dict[str, W.ValueWidget]:
    """The bandit panel's knobs, named as the :class:`~grpo_lab.GRPOConfig` field each sets (``optimizer``
    picks a setting of :data:`~grpo_lab.exact.bandit_lab.OPTIMIZER_SETTINGS`: optimiser and clip; ``runs`` is
    the number of runs)."""
    return {
        "v": knob("v", W.IntSlider, config.v, min=1, max=20),
        "i": knob("i", W.IntSlider, config.i, min=1, max=10),
        "eps_low": knob("eps_low", W.FloatSlider, config.eps_low, min=0.0, max=0.5, step=0.05),
        "beta": knob("beta", W.FloatSlider, config.beta, min=0.0, max=2.0, step=0.05),
        "G": knob("G", W.IntSlider, config.G, min=2, max=32),
        "eps_std": knob("eps_std", W.FloatLogSlider, config.eps_std, base=10, min=-6, max=math.log10(MAX_EPS_STD),
                        step=0.25, readout_format=".1e"),
        "mask_zero_variance": knob("mask_zero_variance", W.Checkbox, config.mask_zero_variance),
        "mask_normalize": knob("mask_normalize", W.Dropdown, config.mask_normalize, options=list(MASK_NORMALIZATIONS)),
        "empty_step": knob("empty_step", W.Dropdown, config.empty_step, options=list(EMPTY_STEPS)),
        "band": knob("band", W.Dropdown, config.band, options=list(BANDS)),
        "is_correction": knob("is_correction", W.Dropdown, config.is_correction, options=list(IS_CORRECTIONS)),
        "is_cap": knob("is_cap", W.FloatSlider, config.is_cap, min=1.05, max=5.0, step=0.05),
        "is_floor": knob("is_floor", W.FloatSlider, 0.5 if config.is_floor is None else config.is_floor, min=0.05,
                         max=0.95, step=0.05),
        "ref_period": knob("ref_period", W.IntSlider, config.ref_period, min=0, max=100, step=5),
        "optimizer": knob("optimizer", W.Dropdown, optimizer_setting(config), options=list(OPTIMIZER_SETTINGS)),
        "lr": knob("lr", W.FloatLogSlider, config.lr, base=10, min=-3, max=1.5, step=0.1),
        "runs": knob("runs", W.IntSlider, runs, min=1, max=16),
        "seed": knob("seed", W.IntSlider, config.seed, min=0, max=99),
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
        self.figure = new_figure(self.mode, xaxis_title="step k", yaxis_title="J(π_θ)",
                                 **title_below_toolbar("Live bandit: change a knob, the runs re-train", HEIGHT))
        baseline = train_runs(self.problem, self.base, runs=self.controls["runs"].value)
        x = np.arange(len(baseline.J))
        with redraw(self.figure):
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
        trained = time.perf_counter()
        band, line = band_traces(np.arange(len(result.J)), result.J, "current knobs", COLORS[0])
        with redraw(self.figure):
            self.figure.data[2].x, self.figure.data[2].y = band.x, band.y
            self.figure.data[3].x, self.figure.data[3].y = line.x, line.y
        updated = time.perf_counter()
        mean, std = result.J[-1].mean(), result.J[-1].std()
        note = "" if config.ref_period or not self.controls["ref_period"].value else " (ref period ignored: β = 0)"
        # what this re-run took in the kernel, measured now; the browser's drawing comes after it
        self.status.value = (f"final J = {mean:.3f} ± {std:.3f} over {runs} runs · masked groups "
                             f"{result.masked_frac.mean():.0%} · {result.optimizer_passes[-1]} passes · "
                             f"re-run {updated - start:.2f} s in the kernel (training {trained - start:.2f} s, "
                             f"figure update {updated - trained:.3f} s){note}")
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
