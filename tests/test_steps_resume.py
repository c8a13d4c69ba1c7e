"""Steps to target: a unit killed after an evaluation point resumes from its checkpoint and ends as the unit an
uninterrupted run writes (its points, steps and final weights, exactly), for the loop and for TRL, on a tiny model;
and what a checkpoint refuses."""

import json
from pathlib import Path

import pytest
import torch
from reliability_runs import TIMING, problems, tiny_model, tokenizer

import grpo_lab.lm.rewards
from grpo_lab.lm.train_config import TrainConfig
from studies.clock import StepClock
from studies.steps_to_target import resume
from studies.steps_to_target import units as stu
from studies.steps_to_target.resume import UnitCheckpoint

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = 6
"""Training problems: TRL's sampler takes 2 a step, so an epoch is 3 batches and a resume at 2 or 4 optimiser steps
lies at or past an epoch's end (its shuffle must be the uninterrupted run's)."""


class Killed(Exception):
    """The process's death, simulated in-process: raised by an evaluation, before its point is saved."""


def even_length(text, finished, gold, form, timeout=None):
    """A reward a random tiny model earns in about half its completions, so that its groups have signal (the strict
    reward gives it none): both trainers score through ``strict_reward``."""
    return len(text) % 2 == 0


@pytest.fixture
def sitting(tmp_path, monkeypatch, one_thread):
    """``run(out, arm, kill_at)``: one unit of ``arm`` in ``out`` (exact J every 2 optimiser steps to a cap of 6, the
    targets out of reach), this process killed at its ``kill_at``-th evaluation; returns the unit (None if killed)
    and the trained weights at each evaluation it ran."""
    from studies.lag_frontier.frontier import exact_j

    monkeypatch.setattr(grpo_lab.lm.rewards, "strict_reward", even_length)
    monkeypatch.setattr(resume, "SPACING_SECONDS", 0.0)      # a checkpoint at every evaluation point
    model, tok, questions = tiny_model(), tokenizer(), list(problems()[:1])
    base = TrainConfig(G=2, prompts_per_step=2, lr=1e-2, max_completion_length=3, train_problems=PROBLEMS,
                       micro_batch_size=4, scoring="strict", temperature=1.0, sync_audit=False, empty_step="skip")
    untrained = exact_j(model, tok, questions, base).mean
    design = {"task": "add1", "lr": 1e-2, "targets": {"targets": {"50%": untrained + 0.5}, "untrained_j": untrained,
                                                      "question_count": 1},
              "order": [["grpo_lab_v1", 7], ["trl", 7]], "every": 2, "min_steps": 2, "cap": 6, "batch_cap": 12,
              "threads": 1, "eval_threads": 1}
    real = stu.evaluator

    def run(out: Path, arm: str, kill_at: int | None = None):
        out.mkdir(exist_ok=True)
        (out / "design.json").write_text(json.dumps(design))
        weights: list[dict[str, torch.Tensor]] = []

        def evaluator(questions, config, threads):
            evaluate = real(questions, config, threads)

            def killing(trained, tokenizer):
                if len(weights) + 1 == kill_at:
                    raise Killed
                weights.append({k: v.detach().clone() for k, v in trained.state_dict().items()})
                return evaluate(trained, tokenizer)
            return killing

        monkeypatch.setattr(stu, "evaluator", evaluator)
        done = stu.run_units(out, ROOT, arms=[arm], model=model, tokenizer=tok, questions=questions,
                             problems=lambda config: problems()[:PROBLEMS], base=base, log=lambda line: None)
        return (done[0] if done else None), weights

    return run


def same_unit(resumed: dict, full: dict) -> None:
    """Everything a unit measures is the uninterrupted run's, as its file holds it; only seconds and provenance
    may differ."""
    resumed, full = json.loads(json.dumps(resumed)), json.loads(json.dumps(full))

    def untimed(points):
        return [{k: v for k, v in p.items() if k != "training_seconds"} for p in points]

    assert untimed(resumed["points"]) == untimed(full["points"])
    assert [s["optimizer_step"] for s in resumed["step_log"]] == [s["optimizer_step"] for s in full["step_log"]]
    for key in ("optimizer_steps", "steps", "stopped_by", "untrained_j", "config", "design_sha"):
        assert resumed[key] == full[key], key
    if "records" in full:
        assert [{k: v for k, v in r.items() if k not in TIMING} for r in resumed["records"]] == \
               [{k: v for k, v in r.items() if k not in TIMING} for r in full["records"]]


@pytest.mark.parametrize("arm", ["grpo_lab_v1", "trl"])
def test_a_unit_killed_twice_resumes_to_the_uninterrupted_unit(sitting, tmp_path, arm):
    """Killed at its 2nd evaluation (4 optimiser steps: the checkpoint of 2 remains), resumed and killed at its 2nd
    again (6 steps: the checkpoint of 4), resumed to the cap: the unit file and the final weights are the
    uninterrupted run's bit for bit, both resumes are recorded, and the checkpoint is gone."""
    full, full_weights = sitting(tmp_path / "full", arm)
    assert full["optimizer_steps"] == 6 and full["resumes"] == [] and len(full_weights) == 3
    out = tmp_path / "killed"
    checkpoint, unit_file = out / "units" / f"{arm}_s7.ckpt", out / "units" / f"{arm}_s7.json"
    for saved in ("point-2", "point-4"):
        with pytest.raises(Killed):
            sitting(out, arm, kill_at=2)
        assert [p.name for p in checkpoint.glob("point-*")] == [saved] and not unit_file.exists()
    resumed, weights = sitting(out, arm)
    same_unit(resumed, full)
    assert len(weights) == 1 and weights[-1].keys() == full_weights[-1].keys()
    assert all(torch.equal(weights[-1][k], full_weights[-1][k]) for k in weights[-1])
    assert not torch.equal(full_weights[-1]["model.embed_tokens.weight"], full_weights[0]["model.embed_tokens.weight"])
    assert [(r["optimizer_steps"], r["git_commit"]) for r in resumed["resumes"]] == \
           [(2, full["git_commit"]), (4, full["git_commit"])]
    assert {"load_start", "at", "steps", "torch_threads"} <= set(resumed["resumes"][0])
    assert resumed["eval_seconds"] > 0 and resumed["checkpoint_seconds"] > 0
    assert not checkpoint.exists() and not list((out / "units").glob("*.lock"))
    assert json.loads(unit_file.read_text()) == json.loads(json.dumps(resumed))


def test_a_checkpoint_of_another_config_is_refused_and_a_killed_save_is_dropped(tmp_path):
    """A unit resumes only its own checkpoint (same arm, seed, design and config); a save killed before its rename
    (left in staging) is dropped, and an older point left beside a newer one is removed."""
    clock = StepClock(every=2, cap=8, min_steps=2, stop_at=1.0, batch_cap=8)
    clock.start()
    for _ in range(4):
        clock.after_step(True, lambda: (0.25, {}))
    unit = {"arm": "trl", "seed": 1, "design_sha": "a", "config": {"lr": 1.0}, "load_start": [0.0]}
    path = tmp_path / "units" / "trl_s1.json"
    assert not UnitCheckpoint(path, clock).due()                  # 600 s have not passed since the start
    saver = UnitCheckpoint(path, clock, spacing=0.0)
    saver.open(unit)
    assert saver.due()
    saver.begin()
    (saver.staging / "loop-4").mkdir(parents=True)
    saver.commit(saver.staging / "loop-4", {"skipped": 3})
    assert not saver.due() and [p.name for p in saver.points()] == ["point-4"]
    (saver.folder / "point-2").mkdir()
    (saver.staging / "half").mkdir(parents=True)
    again = StepClock(every=2, cap=8, min_steps=2, stop_at=1.0, batch_cap=8)
    resumed = UnitCheckpoint(path, again, spacing=0.0)
    record = resumed.open(unit | {"load_start": [1.0]})
    assert [p.name for p in saver.points()] == ["point-4"] and not saver.staging.exists()
    assert again.points == clock.points and again.optimizer_steps == 4 and resumed.trainer_state == {"skipped": 3}
    assert record["resumes"][0]["load_start"] == [1.0] and record["load_start"] == [0.0]
    with pytest.raises(ValueError, match="another config"):
        UnitCheckpoint(path, StepClock(2, 8, 2, 1.0, 8)).open(unit | {"config": {"lr": 2.0}})
