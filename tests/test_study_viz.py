"""Notebook 02's group figure (the per-token r′) and its live panel on the tiny model: the backdrop is the
frontier pilot's units, the live exact J is that of the loop's π_θ at its steps, the panel trains through
``training.train`` (a Stop pressed during set-up counts, Kernel > Interrupt reaches a background run, in a real
ipykernel too, one checkpoint per panel, release frees the run, a step that fails at pass 2 saves nothing and the
run resumes exactly), and the group view says why r′ is what it is."""

import gc
import html
import json
import math
import os
import queue
import re
import signal
import threading
import time
import weakref

import numpy as np
import pytest
import torch
from fault_scenarios import poison_gradients
from reliability_runs import even_length, problems, rows_of, tiny_model, tokenizer
from test_viz import title_clears_toolbar

from grpo_lab.exact.strict_j import Sampling, exact_evaluate
from grpo_lab.lm import background
from grpo_lab.lm.background import BackgroundRun
from grpo_lab.lm.sampling import stop_and_pad_ids
from grpo_lab.lm.tasks import all_questions
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.lm.training import load_metrics
from grpo_lab.viz.token_ratios import token_ratio_figure
from studies.lag_frontier import frontier
from studies.lag_frontier.live_panel import LivePanel, eval_subset

RUN_FOLDER = ["checkpoint.pt", "config.json", "metrics.jsonl", "run.lock"]
"""What the panel's run folder holds: ``training.train``'s files, one checkpoint."""


def test_token_ratio_figure_blanks_padding_and_labels_the_colour_bar_in_r():
    ratios = np.array([[1.0, 2.0, 0.0], [0.5, 1.0, 1.0]])
    fig = token_ratio_figure([["a", "b"], ["c", "d", "e"]], ratios, [1.0, 0.0], [0.7, -0.7], lag=3)
    z = np.array(fig.data[0].z, dtype=float)
    assert math.isnan(z[0, 2]) and z[0, 1] == pytest.approx(1.0) and z[1, 0] == pytest.approx(-1.0)   # log2 r′
    bar = fig.data[0].colorbar
    assert list(bar.ticktext) == ["0.5", "0.707", "1", "1.41", "2"] and len(bar.tickvals) == 5
    assert fig.layout.height >= 300 and fig.layout.title.text == "Per-token r′ = π_k/α at lag 3"


def test_token_ratio_figure_at_r_one_everywhere_has_distinct_ticks_integer_positions_and_says_why():
    """π_θ unmoved since the sync: r′ = 1 on every token. The colour bar still reads five distinct values
    (not "1, 1"), token positions tick at integers, and the note says why."""
    flat = token_ratio_figure([["a", "b", "c"]], np.ones((1, 3)), [1.0], [0.0], lag=2, note="π_θ has not moved")
    ticks = list(flat.data[0].colorbar.ticktext)
    assert len(set(ticks)) == 5 and ticks[2] == "1"
    assert flat.layout.title.text.endswith("<br><sup>π_θ has not moved</sup>")
    for width in (3, 100):                                   # a short completion, and one of 100 tokens
        axis = token_ratio_figure([["a"]], np.ones((1, width)), [1.0], [0.0], lag=1).layout.xaxis
        assert axis.tick0 == 0 and float(axis.dtick).is_integer() and axis.dtick >= 1
        assert width / axis.dtick <= 20                      # at most 20 ticks, each on a token


@pytest.fixture
def panel_parts():
    """The frontier's task (its questions are the live J's, and the pilot's), the tiny model, add1's problems."""
    base = TrainConfig(task="addsubmul1", G=4, prompts_per_step=2, v=2, lr=1e-3, max_completion_length=8,
                       temperature=1.0)
    return base, list(problems()), tiny_model(), tokenizer()


def status(panel):
    """The status line as the reader sees it (the widget holds HTML)."""
    return html.unescape(panel.status.value)


def make_panel(panel_parts, tmp_path, steps=3, out="live", eval_questions=1, eval_every=16, **changes):
    """A panel on the tiny model, its knobs at ``base`` with ``changes``, its run folder ``tmp_path / out``; exact J
    on 1 question at step 0 and the last step (the tiny model's walk takes seconds)."""
    base, problems, model, tokenizer = panel_parts
    return LivePanel(base.replace(**changes), problems, steps=steps, eval_questions=eval_questions,
                     eval_every=eval_every, model=model, tokenizer=tokenizer, out_dir=tmp_path / out, mode="none")


def pilot_units():
    return [json.loads((frontier.PILOT_RESULTS / "units" / f"addsubmul1_lr1e-05_s{s}.json").read_text())
            for s in (0, 1)]


def test_the_backdrop_is_the_pilots_units_on_the_same_questions(panel_parts, tmp_path):
    """The pilot's J per question is in all_questions' order (as the frontier's untrained unit's): the subset
    curve is the units' own values at the subset's indices, the whole-set curve their j_curve, the reward their
    steps' reward_mean; every series has a legend entry and every axis a title."""
    units = pilot_units()
    untrained = json.loads((frontier.RESULTS / "units" / "untrained.json").read_text())
    texts = [q.question for q in all_questions("addsubmul1")]
    assert texts == untrained["questions"] == units[0]["questions"] == units[1]["questions"] and len(texts) == 363
    assert eval_subset(texts, 27) == list(range(0, 351, 13)) and eval_subset(texts, 4) == [0, 90, 180, 270]
    with pytest.raises(ValueError, match="between 1 and the task's 363"):
        eval_subset(texts, 0)

    panel = LivePanel(panel_parts[0], panel_parts[1], steps=3, model=panel_parts[2], tokenizer=panel_parts[3],
                      out_dir=tmp_path / "live", mode="none")                # the default subset: 27 questions
    assert [q.question for q in panel.questions] == texts[::13][:27]
    assert panel.subset_text() == "exact J on 27 of 363 questions (every 13th)"
    fig, steps = panel.figure, [0, 32, 64, 96, 128]
    lines = {t.name: t for t in fig.data if t.fill != "toself"}
    assert list(lines) == ["pilot v = 1, lr 1e-5, 2 seeds: J on these 27 of 363 (band: the seeds' range)",
                           "pilot: J on all 363 questions (mean of the seeds)",
                           "pilot: training reward (mean of the seeds)",
                           "live run: J on these 27 of 363", "live run: training reward"]
    assert fig.layout.title.text.startswith("Live run over the frontier pilot's v = 1 at lr 1e-5 (2 seeds)")
    assert all(t.showlegend is not False for t in lines.values())
    per_seed = np.array([[np.mean([u["j_per_question"][str(s)][i] for i in range(0, 351, 13)]) for s in steps]
                         for u in units])
    subset, whole, reward = list(lines.values())[:3]
    assert list(subset.x) == steps and np.allclose(subset.y, per_seed.mean(axis=0), rtol=0, atol=1e-12)
    band = next(t for t in fig.data if t.fill == "toself")
    assert np.allclose(band.y, np.concatenate([per_seed.max(axis=0), per_seed.min(axis=0)[::-1]]), rtol=0, atol=1e-12)
    assert np.allclose(whole.y, [np.mean([u["j_curve"][str(s)] for u in units]) for s in steps], rtol=0, atol=1e-12)
    rewards = np.array([[r["reward_mean"] for r in u["steps_log"]] for u in units])
    assert list(reward.x) == list(range(128)) and np.allclose(reward.y, rewards.mean(axis=0), rtol=0, atol=1e-12)
    assert np.abs(per_seed.mean(axis=0) - np.array(whole.y)).max() < 0.025   # the subset tracks the whole set
    assert fig.layout.xaxis2.title.text.startswith("step k") and fig.layout.yaxis.title.text.startswith("exact J")
    assert fig.layout.yaxis2.title.text == "training reward" and list(fig.layout.xaxis.range) == [0, 3]
    assert title_clears_toolbar(fig) and "27 of 363 questions" in fig.layout.annotations[0].text
    assert "not the whole-set J" in fig.layout.title.text
    with pytest.raises(ValueError, match="the pilot's units ran 'addsubmul1', the panel's task is 'add1'"):
        make_panel(panel_parts, tmp_path, task="add1")


def test_live_panel_continues_stops_restarts_and_keeps_one_checkpoint(panel_parts, tmp_path):
    from grpo_lab.lm.group_view import group_view, token_ratios

    panel = make_panel(panel_parts, tmp_path)
    assert "the time per step shows after the first step" in status(panel)   # not the pilot's P, G, T_max
    assert "exact J on 1 of 363 questions (every 363rd) at step 0 and every 16 steps" in status(panel)
    first = panel.run(steps=2)
    assert first.k == 2 and list(panel.live_reward_trace.x) == [0, 1] and panel.progress.value == 2
    assert sorted(panel.j) == [0] and list(panel.live_j_trace.x) == [0]  # evaluated at 0; next at the last step
    assert sorted(p.name for p in (tmp_path / "live").iterdir()) == RUN_FOLDER
    where = re.escape(str(tmp_path / "live" / "checkpoint.pt"))
    assert re.search(rf"checkpoint {where} \(0\.\d\d GiB, one per panel", status(panel)) and "step 2/3" in status(panel)
    assert "evaluations not" in status(panel) and "J at step 0: " in status(panel)
    assert panel.run() is first and first.k == 3                       # same knobs: the run continues
    assert sorted(panel.j) == [0, 3] and "J at step 3: " in status(panel)
    assert rows_of(load_metrics(tmp_path / "live")) == rows_of(first.history)     # train's metrics.jsonl, all 3
    assert panel.run() is first and "the run has all 3 steps" in status(panel)

    panel.knobs["is_correction"].value = "none"                          # a knob: a new run from the untrained model
    panel._draw = lambda loop, *_: panel.stop()                         # Stop pressed during the first step
    second = panel.run()
    assert second is not first and second.k == 1 and second.config.is_correction == "none"
    assert "stopped by Stop at step 1" in status(panel)
    assert sorted(panel.j) == [0] and list(panel.live_j_trace.x) == [0]  # the new run's J: the old one's is gone
    assert sorted(p.name for p in (tmp_path / "live").iterdir()) == RUN_FOLDER   # replaced, not added
    assert torch.load(tmp_path / "live" / "checkpoint.pt", weights_only=True)["k"] == 1
    assert len(load_metrics(tmp_path / "live")) == 1

    # the tiny model never answers add1: every group is masked, every step skipped, π_θ never moved
    assert all(r.skipped for r in first.history)
    view = group_view(first, seed=3)
    G, T = panel.base.G, panel.base.max_completion_length
    assert len(view.texts) == G and view.ratios.shape[0] == G and view.ratios.shape[1] <= T
    assert view.lag == first.k - first.schedule.last_sync and view.kept == bool(view.rewards.std() > 0)
    assert abs(float(view.advantages.sum())) < 1e-5 and view.tv >= 0
    assert all(len(tokens) == int((row > 0).sum()) for tokens, row in zip(view.tokens, view.ratios, strict=True))
    assert view.trained == 0 and view.note.startswith("π_θ has not moved since α was last synced")
    assert float((view.ratios[view.ratios > 0] - 1).abs().max()) < 1e-3 and view.lag == 1
    r = token_ratios(torch.tensor([[0.0, -1.0]]), torch.tensor([[0.0, -2.0]]), torch.tensor([[True, False]]))
    assert r.tolist() == [[1.0, 0.0]]


def rewarded_build(monkeypatch):
    """build_loop with a reward that varies within groups: the steps train, π_θ moves."""
    real = background.build_loop

    def rewarded(*args, **kwargs):
        loop = real(*args, **kwargs)
        loop.task.reward_fn = even_length
        return loop

    monkeypatch.setattr(background, "build_loop", rewarded)


def test_the_live_j_is_exact_j_of_the_loops_policy_at_its_steps(panel_parts, tmp_path, monkeypatch):
    """Each live point equals exact_evaluate of the loop's π_θ at that step on the panel's questions, under the
    run's sampling (T, T_max) and the model's stop ids (the panel with 1 torch thread, the reference with torch's
    setting: equal to rounding); the figure draws those values and their bound."""
    rewarded_build(monkeypatch)
    base, _, model, tok = panel_parts
    panel = make_panel(panel_parts, tmp_path, steps=4, eval_questions=2, eval_every=2, lr=1e-2)
    sampling = Sampling(temperature=base.temperature, top_p=base.top_p, top_k=base.top_k,
                        max_tokens=base.max_completion_length)
    stops = stop_and_pad_ids(model, tok, None)[0]
    threads = torch.get_num_threads()

    def reference(policy):
        torch.set_num_threads(1)                     # as fast as the panel's (rounding may differ with threads)
        try:
            return exact_evaluate(policy, tok, panel.questions, sampling, eos_token_ids=stops)
        finally:
            torch.set_num_threads(threads)

    expected, draw = {0: reference(model)}, panel._draw                   # step 0: the untrained model

    def draw_and_evaluate(loop, *rest):
        draw(loop, *rest)
        if loop.k in (2, 4):
            expected[loop.k] = reference(loop.policy.model)

    panel._draw = draw_and_evaluate
    loop = panel.run()
    assert torch.get_num_threads() == threads                           # the evaluations' 1 thread is put back
    assert loop.k == 4 and not all(r.skipped for r in loop.history) and sorted(panel.j) == [0, 2, 4]
    for k, result in expected.items():
        np.testing.assert_allclose([panel.j[k].j_low, panel.j[k].pruned, panel.j[k].pruned_max],
                                   [result.mean, result.pruned.mean(), result.pruned.max()], rtol=1e-6, atol=0)
        assert 0 <= panel.j[k].pruned <= 1e-3
    assert abs(panel.j[4].j_low / panel.j[0].j_low - 1) > 1e-3             # π_θ moved: J did too
    trace = panel.live_j_trace
    assert list(trace.x) == [0, 2, 4] and list(trace.y) == [panel.j[k].j_low for k in (0, 2, 4)]
    assert list(trace.error_y.array) == list(trace.customdata) == [panel.j[k].pruned for k in (0, 2, 4)]
    assert not any(trace.error_y.arrayminus)


def test_release_frees_the_run_and_the_loaded_model_and_the_next_run_resumes(panel_parts, tmp_path, monkeypatch):
    base, problems, _, _ = panel_parts
    loads = []
    monkeypatch.setattr(BackgroundRun, "load_untrained", staticmethod(lambda b: loads.append(b) or (tiny_model(),
                                                                                               tokenizer())))
    panel = LivePanel(base, problems, steps=3, eval_questions=1, out_dir=tmp_path / "live", mode="none")
    first = panel.run(steps=2)
    history, j_at_0 = rows_of(first.history), panel.j[0]
    assert panel.model is None                         # the model the panel loaded is the run's π_θ, not kept beside it
    freed = [weakref.ref(first), weakref.ref(first.policy.model), weakref.ref(first.sampler)]
    del first
    panel.release()
    gc.collect()
    assert panel.loop is None and panel.model is None and len(loads) == 1   # the panel loaded it: it frees it
    assert [ref() for ref in freed] == [None] * 3                         # nothing else holds π_θ (the model) or α
    resumed = panel.run()                                                    # loads it again, resumes at step 2
    assert len(loads) == 2 and resumed.k == 3
    assert rows_of(resumed.history[:2]) == history
    assert sorted(panel.j) == [0, 3] and panel.j[0] == j_at_0              # the run's J at 0 is kept, 3 is new
    given = make_panel(panel_parts, tmp_path, out="given")
    given.run(steps=1)
    given.release()
    assert given.loop is None and given.model is panel_parts[2]             # a model passed in is the caller's


def test_a_stop_pressed_while_run_sets_up_is_kept(panel_parts, tmp_path, monkeypatch):
    panel = make_panel(panel_parts, tmp_path)
    real = background.build_loop

    def slow_build(*args, **kwargs):                 # Stop arrives while the model is copied and the loop built
        panel.stop_button.click()
        return real(*args, **kwargs)

    monkeypatch.setattr(background, "build_loop", slow_build)
    panel.run_button.click()
    panel.runner.join(timeout=120)
    assert panel.loop.k == 0 and "stopped by Stop at step 0" in status(panel)
    assert not (tmp_path / "live" / "checkpoint.pt").exists()              # nothing trained: nothing saved


def same_state(a, b) -> bool:
    """Equal nested state: tensors bit for bit, everything else by ==."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_state, a, b))
    return a == b


def training_state(loop) -> dict:
    """Everything a checkpoint holds but the config (its output_dir differs) and the history's wall-clock fields."""
    state = {key: value for key, value in loop.state_dict().items() if key not in ("config", "history")}
    return {**state, "history": rows_of(loop.history)}


def test_a_fault_at_pass_2_saves_nothing_and_the_panel_resumes_exactly(panel_parts, tmp_path, monkeypatch):
    """i = 2: a NaN gradient at the second optimiser pass of step 2 comes after the first pass moved π_θ,
    while k stayed 2. The panel saves nothing of that state and drops its loop; Run resumes from the
    checkpoint of step 2 and ends bit for bit where an uninterrupted run ends."""
    from grpo_lab.lm.group_view import group_view

    rewarded_build(monkeypatch)
    uninterrupted = make_panel(panel_parts, tmp_path, steps=4, out="uninterrupted", i=2).run()
    assert uninterrupted.k == 4 and not uninterrupted.history[2].skipped and uninterrupted.config.i == 2

    panel = make_panel(panel_parts, tmp_path, steps=4, out="live", i=2)
    faulty = panel.run(steps=2)
    poison_gradients(faulty, step=2, pass_index=1)
    with pytest.raises(FloatingPointError, match="non-finite gradient norm nan at step 2"):
        panel.run()
    assert faulty.k == 2 and panel.loop is None
    assert ("stopped at step 2 by FloatingPointError" in status(panel)
            and "Run with the same knobs resumes from its checkpoint at step 2" in status(panel))
    saved = torch.load(tmp_path / "live" / "checkpoint.pt", weights_only=True)
    assert saved["k"] == 2 and not same_state(saved["policy"], faulty.policy.state_dict())   # pass 1 had moved π_θ
    assert len(load_metrics(tmp_path / "live")) == 2

    drawn = []
    panel._draw = lambda loop, *_: drawn.append(loop.k)
    resumed = panel.run()
    assert resumed is panel.loop and resumed is not faulty and resumed.k == 4
    assert drawn == [3, 4]                                                 # it trained steps 2 and 3 only
    assert same_state(training_state(resumed), training_state(uninterrupted))
    assert rows_of(load_metrics(tmp_path / "live")) == rows_of(uninterrupted.history)

    view = group_view(uninterrupted, seed=3)                # steps 2 and 3 trained since the sync at step 2
    assert view.lag == 2 and view.trained == 2 and "took 2 optimiser steps since α was last synced" in view.note
    assert float((view.ratios[view.ratios > 0] - 1).abs().max()) > 1e-3   # r′ drifts from 1


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
    threads = torch.get_num_threads()
    previous = signal.signal(signal.SIGINT, background._stop_running)
    try:
        panel.start()
        while panel.runner.running:              # the main thread runs the handler between these waits
            panel.runner.join(timeout=0.05)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert signalled.is_set() and panel.loop.k < 50 and "stopped by Kernel > Interrupt" in status(panel)
    assert sorted(panel.j) == [0] and torch.get_num_threads() == threads   # J at 0, in the run's thread
    assert not list(background._RUNNING)                               # a finished run is not stopped again


def test_hook_interrupt_in_a_real_ipykernel(tmp_path):
    """ipykernel ignores SIGINT while idle; after :func:`hook_interrupt` an interrupt between messages
    reaches the registered runs, and the kernel keeps executing cells. The test waits for the run's own
    word that it was stopped (a line on IOPub), not for a time: the next cell is sent only once the
    handler has run, so the interrupt cannot land in that cell instead."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3")
    try:
        def execute(code):
            reply = kc.execute_interactive(code, timeout=120, output_hook=lambda msg: outputs.append(msg))
            assert reply["content"]["status"] == "ok", reply["content"]
            return "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")

        def wait_for_line(text, seconds=120):
            """Read IOPub until a stream message holds ``text`` (the handler runs between messages, so no
            execute request is its parent); queue.Empty if none comes within ``seconds``."""
            deadline, seen = time.monotonic() + seconds, ""
            while text not in seen:
                msg = kc.get_iopub_msg(timeout=max(deadline - time.monotonic(), 0.01))
                seen += msg["content"].get("text", "") if msg["msg_type"] == "stream" else ""
            return seen

        outputs = []
        hooked = execute("""
from grpo_lab.lm import background
class Run:
    def __init__(self): self.by = None
    def stop(self, by):
        self.by = by
        print("stopped by", by, flush=True)
run = Run(); background._RUNNING.add(run)
print(background.hook_interrupt())""")
        assert hooked.strip() == "True"
        km.interrupt_kernel()                                            # the kernel is idle: SIGINT between messages
        try:
            wait_for_line("stopped by Kernel > Interrupt")
        except queue.Empty:
            pytest.fail("the interrupt did not reach the registered run within 120 s")
        outputs.clear()
        assert execute("print(run.by)").strip() == "Kernel > Interrupt"
        outputs.clear()
        assert json.loads(execute("import json; print(json.dumps(1 + 1))")) == 2
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_static_mode_shows_the_panel_as_the_run_left_it(panel_parts, tmp_path, capsys):
    base, problems, model, tokenizer = panel_parts
    panel = LivePanel(base, problems, steps=3, eval_questions=1, model=model, tokenizer=tokenizer,
                      out_dir=tmp_path / "live", mode="static")
    loop = panel.show_and_run(steps=1)
    printed = capsys.readouterr().out
    assert loop.k == 1 and "step 1/3" in printed and "checkpoint" in printed and "press Run" not in printed


def test_model_loading_silences_transformers_progress_bars_and_puts_them_back(monkeypatch):
    """The "Loading weights" bar is silenced where every model loads (notebook 02 loads one per run)."""
    from transformers.utils import logging

    from grpo_lab.lm import models

    seen = []

    class Loader:
        @staticmethod
        def from_pretrained(source, **kwargs):
            seen.append(logging.is_progress_bar_enabled())
            return source

    monkeypatch.setattr(models, "AutoTokenizer", Loader)
    monkeypatch.setattr(models, "AutoModelForCausalLM", Loader)
    logging.enable_progress_bar()                     # transformers' default, unless the environment turned it off
    assert models._from_pretrained("a model", torch.float32, False, True) == ("a model", "a model")
    assert seen == [True, False] and logging.is_progress_bar_enabled()   # the model loads without a bar
    with models.quiet_loading():
        assert not logging.is_progress_bar_enabled()
    assert logging.is_progress_bar_enabled()


@pytest.mark.slow
def test_notebook_02s_cell_at_smoke_size_and_the_untrained_j_of_the_frontier(tmp_path):
    """Notebook 02's live cell in smoke mode (SmolLM2-135M, the frontier's recipe shrunk, exact J on 4 questions
    at T_max = 4) trains 2 steps with J at steps 0 and 2; at the frontier's own size the panel's J at step 0 is the
    frontier's untrained unit on the same 4 questions (its J_low per question, rounded to 1e-6)."""
    from grpo_lab.lm.recipes import recipe
    from grpo_lab.lm.text_task import train_problems

    start = time.perf_counter()
    base = recipe("cpu_arith_smollm2", task="addsubmul1", lr=1e-5, scoring="strict", empty_step="skip", v=16)
    smoke = base.replace(G=4, prompts_per_step=2, max_completion_length=4, micro_batch_size=8)
    panel = LivePanel(smoke, train_problems(smoke), steps=4, eval_questions=4, eval_every=2,
                      out_dir=tmp_path / "smoke", mode="none")
    live = panel.show_and_run(steps=2)
    assert live.k == 2 and sorted(panel.j) == [0, 2] and list(panel.live_reward_trace.x) == [0, 1]
    assert all(0 <= p.j_low <= 1 and p.pruned_max <= 1e-3 for p in panel.j.values())
    assert [q.question for q in panel.questions] == ["Calculate 0 * 0.", "Calculate 10 - 10.", "Calculate 4 + 3.",
                                                     "Calculate 7 * 5."]
    smoke_seconds = time.perf_counter() - start

    full = LivePanel(base, train_problems(base), steps=128, eval_questions=4,   # loads the untrained model
                     out_dir=tmp_path / "full", mode="none")
    assert re.search(r"expected ~\d+ min of training \(\d+\.\d s a step, the pilot's v = 1 runs", status(full))
    assert full.run(steps=0).k == 0 and "no step asked for" in status(full)
    untrained = json.loads((frontier.RESULTS / "units" / "untrained.json").read_text())
    expected = np.mean([untrained["j_per_question"][i] for i in (0, 90, 180, 270)])
    assert abs(full.j[0].j_low - expected) <= 1e-6 and full.j[0].pruned <= 1e-3
    print(f"smoke cell {smoke_seconds:.0f} s; J evaluations {[round(p.seconds, 1) for p in panel.j.values()]} s "
          f"(4 questions, T_max 4), {full.j[0].seconds:.1f} s (4 questions, T_max 8); load {os.getloadavg()}")
