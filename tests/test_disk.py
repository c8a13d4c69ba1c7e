"""A full or read-only disk: refused before the run when the checkpoints cannot fit; otherwise one
clear DiskError when a write fails, with the last checkpoint, metrics.jsonl and the run lock intact."""

from __future__ import annotations

import contextlib
import errno
import json
import re
import shutil

import pytest
import torch
from fault_scenarios import SCENARIOS, FillingFile, lock_released, read_only
from reliability_runs import make_loop, problems, tiny_model, tokenizer, train_config

from grpo_lab import cli
from grpo_lab.files import DiskError, append_line, atomic_write
from grpo_lab.lm.build import build_loop
from grpo_lab.lm.checkpoint import save_checkpoint
from grpo_lab.lm.disk_guard import estimate_checkpoint, estimate_run_checkpoint, guard_disk
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.lm.training import CHECKPOINT_FILE

pytestmark = pytest.mark.usefixtures("one_thread")

DISK = ["disk_full_before_the_run", "disk_full_mid_checkpoint", "disk_full_mid_metrics_line"]
READ_ONLY = ["read_only_output_dir", "read_only_mid_run"]


def fake_free(monkeypatch, free: int) -> None:
    """``shutil.disk_usage`` reports ``free`` bytes free, wherever asked."""
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=free))


def needed(config: TrainConfig, loop, tmp_path) -> int:
    """The bytes the disk guard asks for, read from its refusal with nothing free."""
    with pytest.raises(DiskError) as caught:
        guard_disk(config, estimate_checkpoint(loop, config.steps), tmp_path / CHECKPOINT_FILE, free=0)
    return int(re.search(r"the run needs (\d+) bytes", str(caught.value)).group(1))


@pytest.mark.parametrize("kind", ["bandit", "lm"])
@pytest.mark.parametrize("name", DISK)
def test_full_disk_is_refused_or_stops_clearly_and_nothing_is_lost(name, kind, tmp_path):
    outcome = SCENARIOS[name](tmp_path, kind)
    assert outcome.ok, f"{outcome.fault}: failed {outcome.failed()} {outcome.note}"


@pytest.mark.parametrize("kind", ["bandit", "lm"])
@pytest.mark.parametrize("name", READ_ONLY)
def test_read_only_output_dir_stops_clearly_and_nothing_is_lost(name, kind, tmp_path):
    """Read-only by ``chmod 0o555`` where that stops this process; as root (the test machines, where
    permissions stop nothing and a read-only mount needs privileges) ``os.open`` raises EROFS for the
    folder's paths, as a read-only file system does: ``fault_scenarios.read_only`` says which in the note."""
    outcome = SCENARIOS[name](tmp_path, kind)
    assert outcome.ok, f"{outcome.fault}: failed {outcome.failed()} {outcome.note}"
    assert outcome.note.startswith(("made read-only by chmod", "made read-only by EROFS"))


@pytest.mark.parametrize("changes", [{}, {"beta": 0.05}, {"optimizer": "sgd"}], ids=["adamw", "reference", "sgd"])
def test_estimate_covers_the_written_checkpoint(changes, tmp_path):
    """π_θ, α, π_ref when β > 0, AdamW's moments (SGD none): at least what torch writes, at most 2 MiB more."""
    config = train_config("lm", tmp_path, **changes)
    loop = make_loop("lm", config)
    estimate = estimate_checkpoint(loop, config.steps)
    list(loop.run())
    assert bool(loop.optimizer.state) == (config.optimizer == "adamw")  # the moments exist by now
    written = save_checkpoint(loop, tmp_path / "c.pt").stat().st_size
    assert written <= estimate <= written + 2 * 2**20


@pytest.mark.parametrize("changes", [{}, {"beta": 0.05}, {"optimizer": "sgd"}], ids=["adamw", "reference", "sgd"])
def test_estimate_before_the_loop_equals_the_loops(changes, tmp_path):
    """From π_θ and the config alone (before α is copied) the estimate is the built loop's."""
    config = train_config("lm", tmp_path, **changes)
    model = tiny_model()
    model.requires_grad_(True)
    before = estimate_run_checkpoint(config, model, config.steps)
    loop = build_loop(config, model, tokenizer(), list(problems()))
    assert before == estimate_checkpoint(loop, config.steps)


def test_preflight_refuses_before_alpha_is_copied(tmp_path, monkeypatch):
    """``train(config)`` builds its loop; a disk too small stops it once π_θ is loaded, before HFSampler
    copies it into α (no second copy of the weights is ever made)."""
    import grpo_lab.lm.models as models
    import grpo_lab.lm.sampling as sampling
    from grpo_lab.lm.training import train

    config = train_config("lm", tmp_path / "run")
    monkeypatch.setattr(models, "load_policy", lambda *args, **kwargs: (tiny_model(), tokenizer()))
    monkeypatch.setattr("grpo_lab.lm.build.train_problems", lambda config: list(problems()))
    copies = []
    monkeypatch.setattr(sampling.HFSampler, "__init__", lambda self, *args, **kwargs: copies.append(args))
    fake_free(monkeypatch, 2**16)
    with pytest.raises(DiskError, match="disk guard: output_dir"):
        train(config, progress=False)
    assert copies == [] and sorted(p.name for p in (tmp_path / "run").iterdir()) == ["run.lock"]


def test_guard_asks_for_two_checkpoints_with_periodic_saves_and_one_without(tmp_path):
    config = train_config("lm", tmp_path / "run")
    loop = make_loop("lm", config)
    one = estimate_checkpoint(loop, config.steps)
    periodic, final_only = needed(config, loop, tmp_path), needed(config.replace(checkpoint_every=0), loop, tmp_path)
    assert one <= final_only < one + 2**20 and 2 * one <= periodic < 2 * one + 2**20
    guard_disk(config, one, tmp_path / CHECKPOINT_FILE, free=periodic)                # exactly enough: runs
    with pytest.raises(DiskError, match="checkpoint_every = 0"):
        guard_disk(config, one, tmp_path / CHECKPOINT_FILE, free=periodic - 1)
    with pytest.raises(DiskError) as caught:
        guard_disk(config.replace(checkpoint_every=0), one, tmp_path / CHECKPOINT_FILE, free=final_only - 1)
    assert "checkpoint_every" not in str(caught.value)          # already 0: not offered as the fix
    (tmp_path / CHECKPOINT_FILE).write_bytes(b"\0" * one)        # the last run's checkpoint: replaced, so free
    assert needed(config, loop, tmp_path) == periodic - one


def test_a_large_checkpoint_is_announced_before_it_is_written(tmp_path, capsys):
    from grpo_lab.files import size_text
    from grpo_lab.lm.disk_guard import LARGE_CHECKPOINT

    config = train_config("lm", tmp_path / "run")
    guard_disk(config, LARGE_CHECKPOINT - 1, tmp_path / CHECKPOINT_FILE, free=10 * LARGE_CHECKPOINT)
    assert capsys.readouterr().out == ""                                  # below the threshold: silent
    guard_disk(config, LARGE_CHECKPOINT, tmp_path / CHECKPOINT_FILE, free=10 * LARGE_CHECKPOINT)
    said = capsys.readouterr().out
    assert size_text(LARGE_CHECKPOINT) in said, said
    assert str(tmp_path) in said and "checkpoint_every = 0" in said


def test_preflight_refusal_names_path_needed_and_free(tmp_path, monkeypatch):
    from grpo_lab.lm.training import train

    config = train_config("lm", tmp_path / "run")
    loop = make_loop("lm", config)
    need = needed(config, loop, tmp_path / "run")
    fake_free(monkeypatch, need - 1)
    with pytest.raises(DiskError) as caught:
        train(config, loop, progress=False)
    message = str(caught.value)
    assert caught.value.errno == errno.ENOSPC and "\n" not in message
    for words in (repr(str(tmp_path / "run")), f"needs {need} bytes", f"has {need - 1} bytes",
                  "another output_dir", "checkpoint_every = 0", "smaller model"):
        assert words in message
    assert loop.k == 0 and sorted(p.name for p in (tmp_path / "run").iterdir()) == ["run.lock"]


def cli_recipe(tmp_path) -> str:
    config = train_config("lm", tmp_path / "run")
    path = tmp_path / "recipe.yaml"
    fields = ("G", "prompts_per_step", "v", "lr", "max_completion_length", "train_problems", "steps",
              "checkpoint_every", "seed", "output_dir")
    path.write_text("".join(f"{f}: {json.dumps(getattr(config, f))}\n" for f in fields))
    return str(path)


@pytest.mark.parametrize("fault", ["preflight", "mid_checkpoint", "read_only"])
def test_cli_prints_one_line_and_exits_non_zero(fault, tmp_path, monkeypatch, capsys):
    import grpo_lab.lm.training as training

    monkeypatch.setattr(training, "build_loop", lambda config, checkpoint: make_loop("lm", config, checkpoint))
    out, stack, recipe = tmp_path / "run", contextlib.ExitStack(), cli_recipe(tmp_path)
    if fault == "preflight":
        fake_free(monkeypatch, 2**20)
        expected = "disk guard:"
    elif fault == "mid_checkpoint":
        real_save = torch.save

        def save(obj, f, *args, **kwargs):
            real_save(obj, FillingFile(f, room=1000) if obj["k"] == 4 else f, *args, **kwargs)

        monkeypatch.setattr(torch, "save", save)
        expected = "the checkpoint of step 4"
    else:
        out.mkdir()
        how = stack.enter_context(read_only(out))  # chmod, or EROFS from os.open as root (see read_only)
        expected = "read-only file system" if how == "EROFS" else "permission denied"
    with stack:
        code = cli.main(["train", "--config", recipe, "--quiet"])
    monkeypatch.undo()
    threads, err = capsys.readouterr().err.split("\n", 1)     # the thread count it chose, then the error
    assert code == 2 and "Traceback" not in err and threads.startswith("grpo-lab train: torch threads: ")
    assert err.count("\n") == 1 and err.startswith("grpo-lab train: error: ") and expected in err, err
    if fault == "mid_checkpoint":
        assert torch.load(out / CHECKPOINT_FILE, weights_only=True)["k"] == 2 and lock_released(out)


def test_atomic_write_and_append_line_keep_the_previous_contents(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    atomic_write(path, '{"runs": 1}')
    with pytest.raises(DiskError, match=r"the summary to .*: no space left on device, \d+ bytes .* free; "
                                        r"summary.json keeps its previous contents") as caught:
        atomic_write(path, lambda f: FillingFile(f, room=3).write(b'{"runs": 2}'), what="the summary")
    assert caught.value.errno == errno.ENOSPC
    assert path.read_text() == '{"runs": 1}' and [p.name for p in tmp_path.iterdir()] == ["summary.json"]

    lines, real_write, calls = tmp_path / "metrics.jsonl", __import__("os").write, []
    append_line(lines, '{"step": 0}')

    def half_then_full(fd, data):                         # the disk fills in the middle of the line
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data)[:5])
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr("os.write", half_then_full)
    with pytest.raises(DiskError, match="disk quota exceeded"):
        append_line(lines, '{"step": 1}', what="the metrics of step 1")
    monkeypatch.undo()
    assert lines.read_text() == '{"step": 0}\n' and len(calls) == 2


def test_live_panel_shows_the_disk_error_in_its_status_and_stays_usable(tmp_path, monkeypatch):
    from grpo_lab.viz.live_panel import LivePanel

    base = TrainConfig(G=4, prompts_per_step=2, v=2, lr=1e-3, max_completion_length=4, temperature=1.0)
    panel = LivePanel(base, list(problems()), steps=3, eval_questions=1, pilot=None, model=tiny_model(),
                      tokenizer=tokenizer(), out_dir=tmp_path / "live", mode="none")
    fake_free(monkeypatch, 2**10)
    loop = panel.run(steps=2)
    assert loop.k == 0 and panel.status.value.startswith("stopped: disk guard:") and "\n" not in panel.status.value
    assert not (tmp_path / "live" / CHECKPOINT_FILE).exists()
    monkeypatch.undo()
    assert panel.run(steps=2).k == 2                                 # with room, the same run goes on

    monkeypatch.setattr(torch, "save", lambda obj, f, *a, **k: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")))
    assert panel.run().k == 3
    assert panel.status.value.startswith("stopped: could not write the checkpoint of step 3 to ")
    monkeypatch.undo()
    assert torch.load(tmp_path / "live" / CHECKPOINT_FILE, weights_only=True)["k"] == 2
