"""The training driver around the loop: one owner per run directory, one-line CLI errors, and the
``report_to`` loggers (TensorBoard event files, an offline wandb run) holding the logged metrics."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from reliability_runs import REPO, make_loop, problems, tokenizer, train_config
from tiny_lm import tiny_model

from grpo_lab.lm.build import build_loop, moved_share
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.lm.training import LOCK_FILE, RunDirInUse, load_metrics, train

pytestmark = pytest.mark.usefixtures("one_thread")

HOLDER = r"""
import sys, time
from pathlib import Path
from grpo_lab.lm.training import hold_run_dir
with hold_run_dir(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


def start_holder(out: Path) -> subprocess.Popen:
    """A real process that owns ``out`` (as a running ``grpo-lab train`` would) until killed."""
    out.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    return holder


def test_a_second_run_into_a_held_directory_is_refused_at_once(tmp_path):
    out = tmp_path / "run"
    holder = start_holder(out)
    try:
        config = train_config("bandit", out)
        with pytest.raises(RunDirInUse, match=rf"in use by another training run \(pid {holder.pid}\)"):
            train(config, make_loop("bandit", config), progress=False)
        start = time.perf_counter()
        cli = subprocess.run([sys.executable, "-m", "grpo_lab.cli", "train", "--config",
                              "grpo_lab/configs/cpu_arith_smollm2.yaml", "--set", f"output_dir={out}"],
                             cwd=REPO, capture_output=True, text=True, timeout=300)
        seconds = time.perf_counter() - start
    finally:
        holder.kill()
        holder.wait()
    assert cli.returncode == 2 and cli.stdout == ""
    threads, *lines = cli.stderr.strip().splitlines()       # the thread count it chose, then the error
    assert threads.startswith("grpo-lab train: torch threads: "), threads
    assert len(lines) == 1 and f"pid {holder.pid}" in lines[0] and lines[0].startswith("grpo-lab train: error:"), lines
    assert not (out / "metrics.jsonl").exists()    # refused before the model loaded or anything was written
    assert seconds < 120                           # the time to import torch, not to load SmolLM2 and train


def test_a_killed_runs_stale_lock_is_taken_over(tmp_path, capsys):
    out = tmp_path / "run"
    holder = start_holder(out)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert (out / LOCK_FILE).read_text().strip() == str(holder.pid)   # the dead run's pid is still there
    config = train_config("bandit", out)
    loop = train(config, make_loop("bandit", config), progress=False)
    assert f"taking over the lock left by pid {holder.pid}" in capsys.readouterr().out
    assert [row["step"] for row in load_metrics(out)] == list(range(loop.k)) and loop.k == config.steps
    assert (out / LOCK_FILE).read_text() == ""     # a clean exit leaves no owner behind
    train(config, make_loop("bandit", config), progress=False)   # and the next run starts quietly
    assert "taking over" not in capsys.readouterr().out


def test_missing_model_is_one_line_not_a_traceback(tmp_path):
    cli = subprocess.run([sys.executable, "-m", "grpo_lab.cli", "train",
                          "--config", "grpo_lab/configs/cpu_arith_smollm2.yaml",
                          "--set", "model=/does/not/exist", "--set", f"output_dir={tmp_path / 'run'}"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 2
    threads, *lines = cli.stderr.strip().splitlines()       # the thread count it chose, then the error
    assert threads.startswith("grpo-lab train: torch threads: "), threads
    assert lines == ["grpo-lab train: error: name_or_path '/does/not/exist' is not a model directory"]


def logged_run(tmp_path: Path, logger: str) -> tuple[Path, list[dict]]:
    config = train_config("bandit", tmp_path / "run", report_to=(logger,), steps=6)
    train(config, make_loop("bandit", config), progress=False)
    return tmp_path / "run", load_metrics(tmp_path / "run")


def test_tensorboard_event_files_hold_the_logged_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, rows = logged_run(tmp_path, "tensorboard")
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    for key in ("reward_mean", "masked_frac", "lag", "grad_norm", "loss"):
        scalars = events.Scalars(key)
        assert [s.step for s in scalars] == [row["step"] for row in rows]
        assert [s.value for s in scalars] == pytest.approx([row[key] for row in rows], rel=1e-6, abs=1e-7)


def wandb_records(path: Path) -> list:
    """The records of an offline ``.wandb`` file: a LevelDB-style log (32 KiB blocks of chunks with a
    7-byte header: crc32, length, type) after a 7-byte ``:W&B`` header, each record a protobuf."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):
        if block - pos % block < 7:                # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4: pos + 7])
        pending += data[pos + 7: pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):                          # FULL or LAST: a whole record
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
        elif kind == 0:                             # zero fill at the end of the file
            break
    return records


def test_wandb_offline_run_holds_the_logged_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out, rows = logged_run(tmp_path, "wandb")
    [path] = (out / "wandb").glob("offline-run-*/run-*.wandb")
    history = [{item.nested_key[0] if item.nested_key else item.key: json.loads(item.value_json)
                for item in r.history.item} for r in wandb_records(path) if r.WhichOneof("record_type") == "history"]
    assert [h["_step"] for h in history] == [row["step"] for row in rows]
    for key in ("reward_mean", "masked_frac", "lag", "grad_norm", "synced"):
        assert [h[key] for h in history] == [row[key] for row in rows]


def test_train_stops_at_config_steps_of_a_loop_built_for_more(tmp_path):
    """The study trains one loop to each scoring step in turn: train() must stop at the given steps,
    not run on to the steps the loop was built with."""
    config = train_config("bandit", tmp_path / "run", steps=10)
    loop = make_loop("bandit", config)
    for stop in (3, 7, 10):
        loop = train(config.replace(steps=stop), loop, progress=False)
        assert loop.k == stop and len(loop.history) == stop
        assert len(load_metrics(tmp_path / "run")) == stop


def test_a_stop_event_ends_the_run_after_the_step_and_on_step_sees_each_step(tmp_path):
    """What notebook 02's live panel drives: ``on_step`` after every logged step, and a ``stop`` set from it
    (as the Stop button would) ends the run after that step with a checkpoint; a stop already set runs no
    step and leaves the checkpoint as it was."""
    import threading

    import torch

    config = train_config("bandit", tmp_path / "run", checkpoint_every=0)
    stop, seen = threading.Event(), []

    def on_step(loop, record):
        seen.append((loop.k, record.step, len(load_metrics(tmp_path / "run"))))
        if loop.k == 3:
            stop.set()

    loop = train(config, make_loop("bandit", config), progress=False, stop=stop, on_step=on_step)
    assert loop.k == 3 and seen == [(1, 0, 1), (2, 1, 2), (3, 2, 3)]    # called once each step is logged
    checkpoint = tmp_path / "run" / "checkpoint.pt"
    assert torch.load(checkpoint, weights_only=True)["k"] == 3
    written = checkpoint.stat().st_mtime_ns
    again = train(config, make_loop("bandit", config), progress=False, stop=stop, on_step=on_step)
    assert again.k == 3 and len(seen) == 3 and checkpoint.stat().st_mtime_ns == written   # resumed, no step, no save
    stop.clear()
    assert train(config, again, progress=False).k == config.steps


def test_moved_share_is_what_adamw_moves_in_bfloat16():
    """An update of size lr changes a bfloat16 weight only where lr is at least half its spacing: the share
    ``moved_share`` predicts is the set one AdamW step (first step: each weight moves by lr) really changes."""
    weights = torch.nn.Parameter(torch.tensor([1.0, 1e-4, 0.0, -2.0, 3e-3, 0.5], dtype=torch.bfloat16))
    predicted = (weights.detach().float() + 1e-3).to(torch.bfloat16) != weights.detach()
    assert predicted.tolist() == [False, True, True, False, True, False]
    model = torch.nn.Module()
    model.w = weights
    assert moved_share(model, 1e-3) == pytest.approx(0.5)
    before = weights.detach().clone()
    weights.grad = -torch.ones_like(weights)
    torch.optim.AdamW([weights], lr=1e-3, weight_decay=0.0).step()
    assert (weights.detach() != before).tolist() == predicted.tolist()
    assert moved_share(model.float(), 1e-3) == 1.0


def test_build_loop_warns_when_half_precision_rounds_the_updates_away():
    """A model given in bfloat16 trains its bfloat16 weights: warned. One in float32 under dtype = bfloat16 is
    mixed precision (float32 weights, bfloat16 forwards): not warned."""
    config = TrainConfig(prompts_per_step=2, G=2, lr=1e-6, dtype="bfloat16", device="cpu")
    said = (r"π_θ's weights are in torch.bfloat16 .* lr = 1e-06 a step: an update of that size changes [0-9.]+% "
            r"of them")
    with pytest.warns(UserWarning, match=said + r".*Give build_loop the model in float32"):
        build_loop(config, tiny_model().to(torch.bfloat16), tokenizer(), list(problems()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_loop(config, tiny_model(), tokenizer(), list(problems()))
