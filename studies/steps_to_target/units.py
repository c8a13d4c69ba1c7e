"""Running the steps half of the steps-to-target study: one arm at one seed, exact J every k optimiser steps (off the
clock), until both targets and the last TOST step count are passed or the cap; the units of ``design.json``'s order.

The design (arms, seeds, k, the cap, the targets, threads) is ``design.json``'s, written by :mod:`.design`; the
training and the evaluation are the time-to-accuracy study's (:func:`studies.time_to_accuracy.units.train_unit`,
its :func:`~studies.time_to_accuracy.units.evaluator` and untrained unit), driven here by :class:`StepClock`. A unit
file ``units/<arm>_s<seed>.json`` holds ``points`` (per evaluation: ``optimizer_steps``, ``steps`` (batches),
``training_seconds``, ``j``, ``j_per_question``, ``pruned_max``), ``step_log``, ``stopped_by`` (``targets``,
``cap`` or ``batch_cap``), the loop's ``records`` or TRL's resolved ``trl_config``, and its provenance
(:func:`grpo_lab.provenance.provenance`: commit and whether the tree had changes outside the units folder, CPU
model and vector extensions, library versions, threads, load at the start) with the load at the end, wall, CPU,
evaluation and checkpoint seconds and ``design_sha``. Its training seconds are a record only: units share the
machine, so they measure nothing. TRL's units train with its fused LM head scoring the completion positions only
and record that amendment (:data:`~.design.TRL_UNIT_SCORING`: a censored unit at stock scoring outlasts a sitting).

Units resume from their last checkpoint: the first evaluation point 10 minutes after the last save saves the
trainer's and the clock's state (:mod:`.resume`), and a process that finds a killed unit's checkpoint continues it
exactly where it was, recording each resume's provenance, time and step in ``resumes``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from grpo_lab.provenance import provenance
from studies.clock import StepClock
from studies.locks import UnitLock
from studies.steps_to_target import design as study
from studies.steps_to_target.resume import UnitCheckpoint
from studies.time_to_accuracy import design as tta
from studies.time_to_accuracy.trl_side import completion_scoring
from studies.time_to_accuracy.units import evaluator, train_unit, write_json

UNITS = "units"


def arms_by_name() -> dict[str, tta.Arm]:
    """The time-to-accuracy study's arms (:func:`studies.time_to_accuracy.design.arms`) by name."""
    return {arm.name: arm for arm in tta.arms()}


def run_unit(arm: tta.Arm, seed: int, config: Any, out: Path, root: Path, design: dict[str, Any], *,
             questions: Sequence[Any], untrained_j: float, model: Any, tokenizer: Any,
             problems: Sequence[Any]) -> dict[str, Any] | None:
    """Train one unit on a copy of ``model`` under :class:`StepClock` and write ``<out>/units/<arm>_s<seed>.json``,
    resuming from its checkpoint if a process left one (:class:`~studies.steps_to_target.resume.UnitCheckpoint`,
    saved at an evaluation point every 10 minutes or so, removed once the file is written); None if the file exists
    or another process holds its lock (:class:`studies.locks.UnitLock`)."""
    path = out / UNITS / f"{arm.name}_s{seed}.json"
    if path.exists():
        return None
    with UnitLock(path) as held:
        if not held or path.exists():
            return None
        clock = StepClock(design["every"], design["cap"], design["min_steps"],
                          max(design["targets"]["targets"].values()), design["batch_cap"])
        checkpoint = UnitCheckpoint(path, clock)
        amendment = study.UNIT_AMENDMENT
        amended = arm.name == amendment["arm"]
        unit = checkpoint.open({"arm": arm.name, "seed": seed, "design_sha": tta.design_sha(design),
                                **({"amendment": amendment["number"], "scoring": amendment["scoring"],
                                    "amendment_sha": study.amendment_sha(amendment)} if amended else {}),
                                **provenance(root, ignore=path.parent), "config": config.to_dict()})
        evaluate = evaluator(questions, config, design["eval_threads"])
        with completion_scoring() if amended else contextlib.nullcontext():
            trained = train_unit(arm, config, clock, evaluate, model, tokenizer, problems, checkpoint)
        unit |= {"untrained_j": untrained_j, **trained, **checkpoint.totals(trained),
                 "optimizer_steps": clock.optimizer_steps, "stopped_by": clock.stopped_by}
        write_json(path, unit)
        checkpoint.remove()
        return unit


def run_units(out: Path, root: Path, *, units: int | None = None, arms: Sequence[str] | None = None,
              model: Any = None, tokenizer: Any = None, questions: Sequence[Any] | None = None,
              problems: Callable[[Any], Sequence[Any]] | None = None, base: Any = None,
              log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Run the next units of ``<out>/design.json``'s order (only ``arms`` if given) that no file or lock holds, at
    most ``units``, after the untrained unit (:func:`studies.time_to_accuracy.design.prepare_sitting`: its J must be
    the targets'). ``model``/``tokenizer`` (default: the recipe's, loaded), ``questions`` (default: the targets'
    set), ``problems`` (config → training problems) and ``base`` (the shared recipe) are for tests on a tiny
    model."""
    from grpo_lab.lm.text_task import train_problems

    design = json.loads((out / "design.json").read_text())
    base, model, tokenizer, questions, untrained = tta.prepare_sitting(out, root, design, base, model, tokenizer,
                                                                       questions)
    known = arms_by_name()
    done: list[dict[str, Any]] = []
    for name, seed in design["order"]:
        if units is not None and len(done) >= units:
            break
        if arms is not None and name not in arms:
            continue
        config = tta.arm_config(base, known[name], seed)
        unit = run_unit(known[name], seed, config, out, root, design, questions=questions, untrained_j=untrained["j"],
                        model=model, tokenizer=tokenizer, problems=(problems or train_problems)(config))
        if unit is not None:
            done.append(unit)
            log(f"unit {name}_s{seed}: {unit['optimizer_steps']} optimiser steps in {unit['steps']} batches, "
                f"stopped by {unit['stopped_by']}; {unit['wall_seconds']:.0f} s wall, "
                f"{unit['eval_seconds']:.0f} s of exact J")
    return done
