"""Notebook 02's figures and live panel on fake study folders (any seeds per arm, arms missing): bands stay
inside their quantity's range, a Stop pressed during set-up counts, Kernel > Interrupt reaches a background
run (in a real ipykernel too), one checkpoint per panel, and the group view."""

import html
import json
import math
import os
import re
import signal
import threading

import numpy as np
import pytest
import torch
from reliability_runs import problems, tiny_model, tokenizer
from test_study import write_fake_units

from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.viz import study_panel
from grpo_lab.viz.study_panel import LivePanel
from grpo_lab.viz.study_plots import paired_figure, pass_figure, secondary_figure, token_ratio_figure


def band_values(fig, axis="x"):
    """Every y of the filled (band) traces on the subplot of x axis ``axis``."""
    bands = [np.asarray(t.y, dtype=float) for t in fig.data if t.fill == "toself" and (t.xaxis or "x") == axis]
    return np.concatenate(bands or [np.zeros(0)])


def test_pass_figure_with_any_seeds_and_missing_arms(tmp_path):
    # near 1 and near 0 with 3 seeds: the t interval alone would run past both bounds
    study = write_fake_units(tmp_path, {"v1": {0: 0.95, 1: 1.0, 2: 0.85}, "v32_none": {0: 0.0, 1: 0.1, 2: 0.02},
                                        "v8_ratio": {0: 0.5}})
    fig = pass_figure(study)
    names = [t.name for t in fig.data if t.showlegend is not False]
    assert names == ["v = 1 (n = 3)", "v = 8, ratio (n = 1)", "v = 32, none (n = 3)"]   # v32_ratio, v8_none: none yet
    bands = band_values(fig)
    assert len(bands) and bands.min() >= 0.0 and bands.max() <= 1.0
    assert bands.max() == 1.0 and bands.min() == 0.0                     # clipped, not dropped
    one_seed = [t for t in fig.data if t.legendgroup == "v = 8, ratio (n = 1)"]
    assert all(t.fill != "toself" for t in one_seed)                      # one seed: a line, no band
    drift = [t for t in fig.data if t.xaxis == "x2" and t.fill != "toself"]
    assert [list(t.x) for t in drift] == [[0, 2, 3]] * 2 and band_values(fig, "x2").min() >= 0.0

    empty = pass_figure(write_fake_units(tmp_path / "empty", {}))
    notes = [(a.text, a.x) for a in empty.layout.annotations if a.text.startswith("no finished")]
    assert not empty.data and [text for text, _ in notes] == ["no finished unit of these arms yet",
                                                               "no finished unit with v > 1 yet"]
    assert notes[0][1] < 0.5 < notes[1][1]                               # each in its own subplot


def test_paired_and_secondary_figures(tmp_path):
    study = write_fake_units(tmp_path, {"v1": {0: 0.4, 1: 0.5, 2: 0.6}, "v8_ratio": {0: 0.41, 1: 0.5, 2: 0.6},
                                        "v8_none": {0: 0.3}, "v1_i4": {0: 0.5, 1: 0.55}, "v1_steps4": {0: 0.7, 1: 0.8}})
    tests = study.tests()
    fig = paired_figure(tests)
    labels = list(fig.data[-2].y)
    assert labels == ["v = 8, ratio − v = 1 (n = 3): equivalent", "v = 8, none − v = 1 (n = 1): not resolved",
                      "v = 1, i = 4 − v = 1 (n = 2): not resolved",
                      "v = 1, i = 4 − v = 1, 4× steps (n = 2): not resolved"]
    ci95, ci90 = fig.data[0], fig.data[1]                                  # the seed with one unit has no bar
    assert len(ci95.y) == len(ci90.y) == 3 and "v = 8, none" not in " ".join(ci90.y)
    t = tests[0]
    assert ci90.error_x.array[0] == pytest.approx(t.ci(0.90)[1] - t.estimate)
    assert [(s.x0, s.x1) for s in fig.layout.shapes if s.type == "rect"] == [(-0.03, 0.03)]
    assert "no comparison" in paired_figure([]).layout.annotations[0].text

    fig = secondary_figure(study)
    lines = {t.name: t for t in fig.data if t.fill != "toself"}
    # optimiser passes at the last scoring step: i × trained steps (step 1 of each fake run is skipped)
    assert lines["v = 1 (n = 3)"].x[-1] == 3 and lines["v = 1, i = 4 (n = 2)"].x[-1] == 12
    assert lines["v = 1, 4× steps (n = 2)"].x[-1] == 15
    assert band_values(fig).max() <= 1.0 and "no finished unit" in fig.layout.annotations[-1].text   # (b): no arm


def test_token_ratio_figure_blanks_padding_and_labels_the_colour_bar_in_r():
    ratios = np.array([[1.0, 2.0, 0.0], [0.5, 1.0, 1.0]])
    fig = token_ratio_figure([["a", "b"], ["c", "d", "e"]], ratios, [1.0, 0.0], [0.7, -0.7], lag=3)
    z = np.array(fig.data[0].z, dtype=float)
    assert math.isnan(z[0, 2]) and z[0, 1] == pytest.approx(1.0) and z[1, 0] == pytest.approx(-1.0)   # log2 r′
    bar = fig.data[0].colorbar
    assert list(bar.ticktext) == ["0.5", "0.707", "1", "1.41", "2"] and len(bar.tickvals) == 5
    assert fig.layout.height >= 300


@pytest.fixture
def panel_parts(tmp_path):
    study = write_fake_units(tmp_path / "study", {"v1": {0: 0.3, 1: 0.4}, "v8_none": {0: 0.2}})
    base = TrainConfig(task="add12", G=4, prompts_per_step=2, v=2, lr=1e-3, max_completion_length=8, temperature=1.0)
    return study, base, list(problems()), tiny_model(), tokenizer()


def status(panel):
    """The status line as the reader sees it (the widget holds HTML)."""
    return html.unescape(panel.status.value)


def make_panel(panel_parts, tmp_path, steps=3):
    study, base, problems, model, tokenizer = panel_parts
    return LivePanel(study, base, problems, steps=steps, model=model, tokenizer=tokenizer, out_dir=tmp_path / "live",
                     mode="none")


def test_live_panel_continues_stops_restarts_and_keeps_one_checkpoint(panel_parts, tmp_path):
    from grpo_lab.lm.group_view import group_view, token_ratios

    panel = make_panel(panel_parts, tmp_path)
    assert "expected ~" in status(panel) and "s a step, the study's median" in status(panel)
    bands = band_values(panel.figure)
    assert [t.name for t in panel.figure.data if t.fill != "toself"] == ["v = 1 (study, n = 2)",
                                                                          "v = 8, none (study, n = 1)", "live run"]
    assert 0.0 <= bands.min() and bands.max() <= 1.0
    first = panel.run(steps=2)
    assert first.k == 2 and list(panel.figure.data[-1].x) == [0, 1] and panel.progress.value == 2
    assert sorted(p.name for p in (tmp_path / "live").iterdir()) == ["checkpoint.pt"]
    where = re.escape(str(tmp_path / "live" / "checkpoint.pt"))
    assert re.search(rf"checkpoint {where} \(0\.\d\d GiB, one per panel", status(panel)) and "step 2/3" in status(panel)
    assert panel.run() is first and first.k == 3                       # same knobs: the run continues
    assert panel.run() is first and status(panel).startswith("the run has all 3 steps")

    panel.knobs["is_correction"].value = "none"                          # a knob: a new run from the untrained model
    panel._draw = lambda loop, *_: panel.stop()                         # Stop pressed during the first step
    second = panel.run()
    assert second is not first and second.k == 1 and second.config.is_correction == "none"
    assert "stopped by Stop at step 1" in status(panel)
    assert sorted(p.name for p in (tmp_path / "live").iterdir()) == ["checkpoint.pt"]   # replaced, not added
    assert torch.load(tmp_path / "live" / "checkpoint.pt", weights_only=True)["k"] == 1

    view = group_view(first, seed=3)
    G, T = panel.base.G, panel.base.max_completion_length
    assert len(view.texts) == G and view.ratios.shape[0] == G and view.ratios.shape[1] <= T
    assert view.lag == first.k - first.schedule.last_sync and view.kept == bool(view.rewards.std() > 0)
    assert abs(float(view.advantages.sum())) < 1e-5 and view.tv >= 0
    assert all(len(tokens) == int((row > 0).sum()) for tokens, row in zip(view.tokens, view.ratios, strict=True))
    r = token_ratios(torch.tensor([[0.0, -1.0]]), torch.tensor([[0.0, -2.0]]), torch.tensor([[True, False]]))
    assert r.tolist() == [[1.0, 0.0]]


def test_a_stop_pressed_while_run_sets_up_is_kept(panel_parts, tmp_path, monkeypatch):
    panel = make_panel(panel_parts, tmp_path)
    real = study_panel.build_loop

    def slow_build(*args, **kwargs):                 # Stop arrives while the model is copied and the loop built
        panel.stop_button.click()
        return real(*args, **kwargs)

    monkeypatch.setattr(study_panel, "build_loop", slow_build)
    panel.run_button.click()
    panel._thread.join(timeout=120)
    assert panel.loop.k == 0 and "stopped by Stop at step 0" in status(panel)
    assert not (tmp_path / "live").exists()                              # nothing trained: nothing saved


def test_an_interrupt_stops_a_background_run(panel_parts, tmp_path):
    """SIGINT delivered to the process while the run trains in its thread (as an idle ipykernel would
    receive Kernel > Interrupt once :func:`hook_interrupt` has installed the handler)."""
    panel = make_panel(panel_parts, tmp_path, steps=50)
    draw, signalled = panel._draw, threading.Event()

    def draw_then_interrupt(loop, *rest):
        draw(loop, *rest)
        if loop.k == 1:
            os.kill(os.getpid(), signal.SIGINT)
            signalled.set()

    panel._draw = draw_then_interrupt
    previous = signal.signal(signal.SIGINT, study_panel._stop_running)
    try:
        panel.start()
        while panel._thread.is_alive():          # the main thread runs the handler between these waits
            panel._thread.join(timeout=0.05)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert signalled.is_set() and panel.loop.k < 50 and "stopped by Kernel > Interrupt" in status(panel)
    assert not list(study_panel._RUNNING)                               # a finished run is not stopped again


def test_hook_interrupt_in_a_real_ipykernel(tmp_path):
    """ipykernel ignores SIGINT while idle; after :func:`hook_interrupt` an interrupt between messages
    reaches the registered runs, and the kernel keeps executing cells."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        def execute(code):
            reply = kc.execute_interactive(code, timeout=120, output_hook=lambda msg: outputs.append(msg))
            assert reply["content"]["status"] == "ok", reply["content"]
            return "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")

        outputs = []
        hooked = execute("""
import threading
from grpo_lab.viz import study_panel
class Run:
    def __init__(self): self.by = None
    def stop(self, by): self.by = by
run = Run(); study_panel._RUNNING.add(run)
print(study_panel.hook_interrupt())""")
        assert hooked.strip() == "True"
        km.interrupt_kernel()                                            # the kernel is idle: SIGINT between messages
        outputs.clear()
        assert execute("import time; time.sleep(0.5); print(run.by)").strip() == "Kernel > Interrupt"
        outputs.clear()
        assert json.loads(execute("import json; print(json.dumps(1 + 1))")) == 2
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_static_mode_shows_the_panel_as_the_run_left_it(panel_parts, tmp_path, capsys):
    study, base, problems, model, tokenizer = panel_parts
    panel = LivePanel(study, base, problems, steps=3, model=model, tokenizer=tokenizer, out_dir=tmp_path / "live",
                      mode="static")
    loop = panel.show_and_run(steps=1)
    printed = capsys.readouterr().out
    assert loop.k == 1 and "step 1/3" in printed and "checkpoint" in printed and "press Run" not in printed


def test_quiet_loading_silences_transformers_progress_bars_and_puts_them_back():
    from transformers.utils import logging

    logging.enable_progress_bar()                     # transformers' default, unless the environment turned it off
    with study_panel.quiet_loading():
        assert not logging.is_progress_bar_enabled()
    assert logging.is_progress_bar_enabled()
