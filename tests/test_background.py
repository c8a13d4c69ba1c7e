"""The background-run helper on the tiny model: a second sitting continues the run, a new config starts over,
a failed step's loop is dropped and the next sitting resumes from the checkpoint, a stop during set-up trains
nothing, and the run folder is gone when the process ends (a script's exit and a real ipykernel's shutdown),
unless the run was told to keep it."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from reliability_runs import problems, tiny_model, tokenizer

from grpo_lab.lm.background import RUN_FILES, BackgroundRun
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.lm.training import CHECKPOINT_FILE

ROOT = Path(__file__).resolve().parent.parent
BASE = TrainConfig(G=4, prompts_per_step=2, v=2, lr=1e-3, max_completion_length=4, temperature=1.0, steps=3)


def runner(tmp_path, **kwargs):
    return BackgroundRun(tmp_path / "run", list(problems()), model=tiny_model(), tokenizer=tokenizer(), **kwargs)


def test_a_sitting_continues_the_run_a_new_config_starts_over_and_clean_removes_its_files(tmp_path):
    run = runner(tmp_path)
    first = run.run(BASE, steps=2)
    assert (first.first, first.loop.k, first.last, first.trained, first.stopped_by, first.error) == (0, 2, 2, 2, "", "")
    assert sorted(p.name for p in run.out_dir.iterdir()) == sorted(RUN_FILES)
    assert run.saved_step(BASE) == 2 and run.saved_step(BASE.replace(v=3)) is None
    again = run.run(BASE)                                         # the same config: the same loop, to its end
    assert again.loop is first.loop and (again.first, again.loop.k) == (2, 3)
    assert run.run(BASE.replace(steps=5), steps=1).loop is first.loop     # the length is not part of the run
    other = run.run(BASE.replace(v=3), steps=1)
    assert other.loop is not first.loop and other.first == 0 and other.loop.k == 1
    run.clean()
    assert not run.out_dir.exists() and run.saved is None


def test_a_stop_before_the_set_up_ends_trains_nothing_and_a_dropped_loop_resumes_from_the_checkpoint(tmp_path):
    run = runner(tmp_path)
    sitting = run.run(BASE, on_ready=lambda loop, new: run.stop("test") or True)
    assert sitting.loop.k == 0 and sitting.stopped_by == "test" and not (run.out_dir / CHECKPOINT_FILE).exists()
    assert run.run(BASE, steps=2).loop.k == 2
    run.loop = None                                               # what a failed step leaves
    resumed, new = run.prepare(BASE)
    assert new and resumed.k == 2
    ready = []
    assert run.run(BASE, on_ready=lambda loop, new: ready.append(new) or False).trained == 0 and ready == [False]


def test_start_trains_in_a_thread_and_hands_its_end_to_on_end(tmp_path):
    run, ended = runner(tmp_path), []
    assert run.start(BASE, on_end=lambda sitting, error: ended.append((sitting.loop.k, error)))
    run.join(timeout=120)
    assert not run.running and ended == [(3, None)]


def script_leaves(tmp_path, keep: bool) -> list[str]:
    """Run a script that trains one step into a folder and exits; what the folder holds afterwards."""
    folder = tmp_path / f"keep_{keep}"
    code = textwrap.dedent(f"""
        from reliability_runs import problems, tiny_model, tokenizer
        from grpo_lab.lm.background import BackgroundRun
        from grpo_lab.lm.train_config import TrainConfig
        run = BackgroundRun({str(folder)!r}, list(problems()), model=tiny_model(), tokenizer=tokenizer(), keep={keep})
        config = TrainConfig(G=4, prompts_per_step=2, v=2, lr=1e-3, max_completion_length=4, temperature=1.0, steps=1)
        assert run.run(config).loop.k == 1
        assert (run.out_dir / "checkpoint.pt").is_file()
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=tmp_path, timeout=300)
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_the_run_folder_is_removed_when_the_process_ends_unless_kept(tmp_path):
    assert script_leaves(tmp_path, keep=False) == []
    assert script_leaves(tmp_path, keep=True) == sorted(RUN_FILES)


def test_what_a_killed_process_left_is_removed_by_the_next_run_in_the_folder(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    for name in RUN_FILES:
        (folder / name).write_text("x")
    BackgroundRun(folder, [], keep=True)
    assert sorted(p.name for p in folder.iterdir()) == sorted(RUN_FILES)      # kept: a run told to keep its folder
    BackgroundRun(folder, [])
    assert not folder.exists()


def test_a_real_kernel_removes_the_run_folder_when_it_shuts_down(tmp_path):
    """A notebook's kernel ends by a shutdown request (closing the notebook, restarting the kernel): the folder
    goes with it. Files the run did not write are left, and so is the folder that holds them."""
    from jupyter_client.manager import start_new_kernel

    folders = [tmp_path / "only_run_files", tmp_path / "with_a_note"]
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT))
    try:
        reply = kc.execute_interactive(
            "from pathlib import Path\nfrom grpo_lab.lm.background import RUN_FILES, BackgroundRun\n"
            f"folders = [Path(f) for f in {[str(f) for f in folders]!r}]\n"
            "runs = [BackgroundRun(f, []) for f in folders]\n"                  # then the run writes its files
            "for f in folders:\n    f.mkdir()\n    [(f / name).write_text('x') for name in RUN_FILES]\n"
            "(folders[1] / 'note.txt').write_text('mine')\n", timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    assert not folders[0].exists()
    assert sorted(p.name for p in folders[1].iterdir()) == ["note.txt"]


def test_a_run_that_saves_nothing_writes_no_checkpoint(tmp_path):
    run = runner(tmp_path, save=False)
    assert run.run(BASE).loop.k == 3
    assert not (run.out_dir / CHECKPOINT_FILE).exists() and run.saved_step(BASE) is None
    assert (run.out_dir / "metrics.jsonl").is_file()
