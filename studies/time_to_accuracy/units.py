"""Running one time-to-accuracy unit: an arm at a seed, trained for a budget of training
seconds, with exact J evaluated off the clock at every mark; and the untrained unit.

The design (arms, seeds, order, budget, marks, targets, threads) is :mod:`studies.time_to_accuracy.design`'s;
this module only trains and evaluates. A unit file ``units/<arm>_s<seed>.json`` holds:

* ``points``: one per evaluation: the marks it serves (a step that passes two marks is evaluated once),
  ``training_seconds`` (the clock at the evaluation: at or just after the mark), ``steps``, ``optimizer_steps``,
  ``j`` (the mean exact J, its certified lower end, as the frontier reports), ``pruned_max`` and ``j_per_question``;
  so J per second and J per optimiser step both come from the file;
* ``step_log``: per step the training seconds at its end and whether AdamW stepped; the loop's arms also keep
  every :class:`~grpo_lab.loop.StepRecord` (``records``);
* provenance as every study's units (:func:`grpo_lab.provenance.provenance`: commit, CPU, versions, threads, load
  at the start) plus the load at the end, wall, CPU and evaluation seconds, and ``design_sha``, which ties the
  unit to the design it was run under.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from studies.clock import Checkpoint, EvaluationClock, MarkClock
from studies.lag_frontier.frontier import claim, exact_j, provenance

LOOP_STATE = "loop.pt"
"""The loop's file in a checkpoint folder (:func:`grpo_lab.lm.checkpoint.save_checkpoint`)."""


def evaluator(questions: Sequence[Any], config: Any, threads: int | None) -> Callable[[Any, Any], tuple]:
    """``evaluate(model, tokenizer)`` → (J, extras): exact J of ``model`` on ``questions`` under ``config``'s
    sampling (:func:`~studies.lag_frontier.frontier.exact_j`), with torch at ``threads`` threads while it runs (it is
    off the clock; None: as training)."""
    def evaluate(model: Any, tokenizer: Any) -> tuple[float, dict[str, Any]]:
        training_threads = torch.get_num_threads()
        torch.set_num_threads(threads or training_threads)
        try:
            with torch.no_grad():
                result = exact_j(model, tokenizer, questions, config)
        finally:
            torch.set_num_threads(training_threads)
        return result.mean, {"pruned_max": float(result.pruned.max()),
                             "j_per_question": [round(float(j), 6) for j in result.j_low]}
    return evaluate


def train_grpo_lab(config: Any, model: Any, tokenizer: Any, problems: Sequence[Any], clock: EvaluationClock,
                   evaluate: Callable[[Any, Any], tuple], checkpoint: Checkpoint | None = None) -> dict[str, Any]:
    """The loop (:func:`~grpo_lab.lm.build.build_loop`, set-up off the clock) until the clock says stop; J of
    ``loop.policy``'s model. With ``checkpoint``, the loop resumes from its file there (``GRPOLoop.state_dict``:
    π_θ, α, optimiser, schedules, generator, history: an exact resume) and saves one when an evaluation point is due.
    Returns the unit's ``records``."""
    from grpo_lab.lm.build import build_loop
    from grpo_lab.lm.checkpoint import load_checkpoint, save_checkpoint

    loop = build_loop(config, model=model, tokenizer=tokenizer, problems=problems)
    if checkpoint is not None and checkpoint.resume_from is not None:
        load_checkpoint(loop, checkpoint.resume_from / LOOP_STATE)
    clock.start()
    while True:
        record = loop.step()
        if clock.after_step(not record.skipped, lambda: evaluate(loop.policy.model, tokenizer)):
            break
        if checkpoint is not None and checkpoint.due():
            checkpoint.begin()
            folder = checkpoint.staging / f"loop-{loop.k}"
            save_checkpoint(loop, folder / LOOP_STATE)
            checkpoint.commit(folder, {})
    return {"records": [dataclasses.asdict(r) for r in loop.history]}


def train_trl(config: Any, model: Any, tokenizer: Any, problems: Sequence[Any], clock: EvaluationClock,
              evaluate: Callable[[Any, Any], tuple], skip_empty: bool,
              checkpoint: Checkpoint | None = None) -> dict[str, Any]:
    """TRL's ``GRPOTrainer`` (:func:`~studies.time_to_accuracy.trl_side.run_trl`, resumable with ``checkpoint``)
    until the clock says stop; the unit records TRL's resolved ``GRPOConfig`` as the trainer holds it
    (``trl_config``: ``trainer.args``, after its own defaults and checks), not only the kit's config it was built
    from."""
    from studies.time_to_accuracy.trl_side import run_trl

    resolved: dict[str, Any] = {}
    run_trl(config, model, tokenizer, problems, clock.start,
            lambda stepped, trained: clock.after_step(stepped, lambda: evaluate(trained, tokenizer)), skip_empty,
            on_trainer=lambda trainer: resolved.update(json.loads(trainer.args.to_json_string())),
            checkpoint=checkpoint)
    return {"trl_config": resolved}


def write_json(path: Path, content: dict[str, Any]) -> None:
    """``content`` to ``path`` through a temporary file (a reader never sees half a unit)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(content) + "\n")
    tmp.replace(path)


def run_unit(arm: Any, seed: int, config: Any, out_dir: Path, root: Path, design_sha: str, *, budget: float,
             every: float, stop_at: float | None, questions: Sequence[Any], untrained_j: float,
             eval_threads: int | None, model: Any, tokenizer: Any, problems: Sequence[Any]) -> dict[str, Any] | None:
    """Train one unit (``config``: the arm's recipe at ``seed``) on a copy of ``model`` and write
    ``<out_dir>/units/<arm>_s<seed>.json``; None if the file exists or another process holds its lock
    (:func:`~studies.lag_frontier.frontier.claim`). The curve starts at (0, ``untrained_j``): every arm starts from
    the same weights, evaluated once by the untrained unit."""
    path = out_dir / "units" / f"{arm.name}_s{seed}.json"
    if path.exists() or not claim(path):
        return None
    try:
        unit: dict[str, Any] = {"arm": arm.name, "seed": seed, "design_sha": design_sha, **provenance(root),
                                "config": config.to_dict()}
        clock = MarkClock(budget, every, stop_at)
        evaluate = evaluator(questions, config, eval_threads)
        unit |= {"untrained_j": untrained_j,
                 **train_unit(arm, config, clock, evaluate, model, tokenizer, problems)}
        last = clock.points[-1]
        unit |= {"optimizer_steps": last["optimizer_steps"], "stopped_early": last["marks"][-1] < budget,
                 "follow_up_seconds": last["training_seconds"]}
        write_json(path, unit)
    finally:
        path.with_suffix(".lock").unlink(missing_ok=True)
    return unit


def train_unit(arm: Any, config: Any, clock: EvaluationClock, evaluate: Callable[[Any, Any], tuple], model: Any,
               tokenizer: Any, problems: Sequence[Any], checkpoint: Checkpoint | None = None) -> dict[str, Any]:
    """Train a copy of ``model`` as ``arm`` says (the loop, or TRL with its empty-batch rule) until ``clock`` says
    stop, resuming from and saving to ``checkpoint`` if given; what every unit records of it: the clock's ``points``
    and ``step_log``, the trainer's extras (the loop's ``records``, TRL's ``trl_config``), ``steps``, the load at
    the end, wall, CPU and evaluation seconds (this process's wall and CPU seconds)."""
    wall, cpu = time.perf_counter(), time.process_time()
    trained = copy.deepcopy(model)
    if arm.trainer == "trl":
        extra = train_trl(config, trained, tokenizer, problems, clock, evaluate, arm.skip_empty, checkpoint)
    else:
        extra = train_grpo_lab(config, trained, tokenizer, problems, clock, evaluate, checkpoint)
    return {"points": clock.points, "step_log": clock.step_log, **extra, "steps": len(clock.step_log),
            "load_end": list(os.getloadavg()), "wall_seconds": time.perf_counter() - wall,
            "cpu_seconds": time.process_time() - cpu, "eval_seconds": clock.eval_seconds}


def run_untrained(out_dir: Path, root: Path, design_sha: str, config: Any, questions: Sequence[Any],
                  eval_threads: int | None, model: Any, tokenizer: Any) -> dict[str, Any]:
    """``<out_dir>/units/untrained.json``: exact J of the untrained model per question, every curve's point at
    0 s, with a unit's provenance; computed once (the file is read if it exists)."""
    path = out_dir / "units" / "untrained.json"
    if path.exists():
        return json.loads(path.read_text())
    unit: dict[str, Any] = {"design_sha": design_sha, **provenance(root)}
    wall = time.perf_counter()
    j, extras = evaluator(questions, config, eval_threads)(model, tokenizer)
    unit |= {"j": j, **extras, "questions": [q.question for q in questions], "eval_seconds": time.perf_counter() - wall,
             "load_end": list(os.getloadavg())}
    write_json(path, unit)
    return unit
