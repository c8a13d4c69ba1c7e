"""Run the units of the lag frontier, decided (the design: ``design.py`` beside this file), and rebuild its summary.

A unit is one arm at one seed: it trains on the two thirds of the questions not held out, logs which questions
each step drew, and computes exact J on every question at 0, ¼, ½, ¾ and the end of the budget (off the clock).
It is written to ``units/<arm>_s<seed>.json`` with its provenance as it finishes; a unit whose file exists is
skipped, and a unit another process is running is skipped too (an advisory lock the OS releases if that process
dies), so processes side by side, and sittings one after another, share one unit order::

    python studies/lag_decided/run.py --units 4 [--threads 1]       # the next 4 confirmatory units
    python studies/lag_decided/run.py --units 12 --arms v1 v10_ratio  # only the open comparison's arms (C1)
    python studies/lag_decided/run.py --regime2-pilot 3e-6          # the second regime's drift pilot
    python studies/lag_decided/run.py --regime2 3e-6 --units 2       # the second regime's units at that lr
    python studies/lag_decided/run.py --corrections --units 2        # the field's corrections (exploratory)
    python studies/lag_decided/run.py --corrections --arms v10_icepop --units 8   # one of them
    python studies/lag_decided/run.py --summary                      # rebuild summary.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:   # run as a script from any folder
    sys.path.insert(0, str(ROOT))

from grpo_lab.provenance import provenance  # noqa: E402
from studies.lag_decided import design  # noqa: E402
from studies.lag_decided.summary import rebuild_summary  # noqa: E402
from studies.locks import UnitLock  # noqa: E402


def base_config(lr: float, steps: int) -> Any:
    from grpo_lab.lm.recipes import recipe

    return recipe(design.RECIPE, task=design.TASK, lr=lr, steps=steps, scoring="strict", empty_step="skip",
                  checkpoint_every=0)


def run_unit(arm: str, seed: int, lr: float, steps: int, out: Path,
             fields: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Train ``arm`` at ``seed`` and write ``out/<arm>_s<seed>.json``; None if it exists or is running elsewhere.
    ``fields`` are the config fields the arm sets (this study's :func:`design.arm_fields` unless given: another
    study's arm, such as ``studies/lag_free``'s, runs through this same loop). The tree is called dirty for any
    change outside the study's unit folders (``<study>/units*``)."""

    from grpo_lab.lm.build import build_loop
    from grpo_lab.lm.tasks import all_questions
    from grpo_lab.lm.text_task import train_problems
    from studies.lag_frontier.frontier import curve_of, endpoints, train_with_exact_j

    path = out / f"{arm}_s{seed}.json"
    if path.exists():
        return None
    with UnitLock(path) as held:
        if not held or path.exists():
            return None
        fields = design.arm_fields(arm) if fields is None else fields
        unit: dict[str, Any] = {"arm": arm, **fields, "seed": seed, "lr": lr, "steps": steps,
                                **provenance(ROOT, ignore=out.resolve().parent / "units")}
        wall, cpu = time.perf_counter(), time.process_time()
        config = base_config(lr, steps).replace(seed=seed, **fields)
        questions = all_questions(config.task)
        index = {q.question: i for i, q in enumerate(questions)}
        held_out = {q.question for q, out_ in zip(questions, design.held_out(questions), strict=True) if out_}
        loop = build_loop(config, problems=[p for p in train_problems(config) if p.question not in held_out])
        drawn: list[list[int]] = []
        results, records, eval_seconds = train_with_exact_j(
            loop, questions, config, after_step=lambda loop: drawn.append([index[p.question] for p in loop.task.drawn]))
        curve, per_question = curve_of(results)
        j_auc, j_final = endpoints(curve)
        unit.update(task=config.task, j_curve=curve, j_per_question=per_question, j_auc=j_auc, j_final=j_final,
                    drawn=drawn, records=records, load_end=list(os.getloadavg()),
                    wall_seconds=time.perf_counter() - wall, cpu_seconds=time.process_time() - cpu,
                    eval_seconds=eval_seconds)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(unit) + "\n")
        tmp.replace(path)
        return unit


def queue(args: argparse.Namespace) -> list[tuple[str, int, float, int]]:
    """(arm, seed, lr, steps) of the units this call may run, in the design's order; ``--arms`` keeps only
    those arms."""
    if args.regime2_pilot is not None:
        return [("v10_ratio", design.REGIME2_PILOT_SEED, args.regime2_pilot, design.STEPS)]
    if args.corrections:
        arms, seeds, lr, steps = list(design.CORRECTION_ARMS), design.CORRECTION_SEEDS, design.LR, design.STEPS
    elif args.regime2 is not None:
        arms, seeds, lr, steps = list(design.ARMS), design.REGIME2_SEEDS, args.regime2, args.regime2_steps
    else:
        arms, seeds, lr, steps = list(design.ARMS), design.SEEDS, design.LR, design.STEPS
    kept = [arm for arm in arms if args.arms is None or arm in args.arms]
    return [(arm, seed, lr, steps) for arm, seed in design.unit_order(kept, seeds)]


def unit_dir(out: Path, arm: str, lr: float) -> Path:
    """The confirmatory units in ``out/units``, the exploratory corrections' in ``out/units_corrections``, the
    second regime's (and its pilot) in ``out/units_lr<lr>``."""
    if lr != design.LR:
        return out / f"units_lr{lr:g}"
    return out / ("units_corrections" if arm in design.CORRECTION_ARMS else "units")


def unit_arguments(parser: argparse.ArgumentParser, out: Path) -> argparse.ArgumentParser:
    """The options every study run through :func:`run_units` takes: how many units, on how many threads, in which
    folder (``out`` by default), or only the summary rebuilt."""
    parser.add_argument("--units", type=int, default=1, help="how many units to run at most (0: none)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--summary", action="store_true", help="rebuild summary.json and run nothing")
    return parser


def arguments() -> argparse.ArgumentParser:
    """The command line of this script."""
    parser = unit_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]), HERE)
    parser.add_argument("--regime2-pilot", type=float, default=None, metavar="LR")
    parser.add_argument("--regime2", type=float, default=None, metavar="LR")
    parser.add_argument("--regime2-steps", type=int, default=design.STEPS)
    parser.add_argument("--corrections", action="store_true", help="the field's corrections (exploratory)")
    parser.add_argument("--arms", nargs="+", choices=[*design.ARMS, *design.CORRECTION_ARMS], default=None,
                        help="only these arms (an open comparison's, or one correction's)")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = arguments().parse_args(argv)
    if args.summary:
        summary = rebuild_summary(args.out)
        print(json.dumps({"looks_reached": summary["looks_reached"], "seeds_in": summary["seeds_in"]}))
        return
    run_units(((arm, seed, lr, steps, unit_dir(args.out, arm, lr), None) for arm, seed, lr, steps in queue(args)),
              args.units, args.threads)


def run_units(units: Iterable[tuple[str, int, float, int, Path, dict[str, Any] | None]], most: int,
              threads: int) -> None:
    """Run at most ``most`` of ``units`` ((arm, seed, lr, steps, folder, fields) for :func:`run_unit`, in order;
    one that exists or runs elsewhere does not count) on ``threads`` torch threads. ``units`` may be lazy: a study
    whose comparison has stopped yields no more."""
    import torch

    torch.set_num_threads(threads)
    done = 0
    for arm, seed, lr, steps, folder, fields in units:
        if done >= most:
            break
        unit = run_unit(arm, seed, lr, steps, folder, fields)
        if unit is not None:   # no endpoint printed: nothing is read before its look is due
            done += 1
            print(f"{arm} seed {seed} (lr {lr:g}): done in {unit['wall_seconds']:.0f} s "
                  f"(exact J {unit['eval_seconds']:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
