"""Time to accuracy against TRL: the design, the units in its order, and the summary.

The study (``design.py`` beside this file): the frontier's recipe, exact J at every 30 s of training clock (off the
clock), targets read from ``results/targets.json``, six arms that switch off one cause of the speed-up at a
time, ≥ 5 seeds each in a seeded random order. The statistic: ``grpo_lab/stats/passage.py``.

1. Fix the targets (once, before the design; from the frontier's ``v1`` units, on every k-th question or all)::

       python studies/time_to_accuracy/run.py --fix-targets studies/lag_frontier/results --date 2026-12-03 [--every 3]

2. Fix the design (once; it records the targets, arms, order, budget, threads; a unit from another is refused)::

       python studies/time_to_accuracy/run.py --design [--budget 600] [--seeds 5] [--lag-v 4]
           [--lag-correction ratio] [--arms …] [--threads 2] [--eval-threads 2] [--full-budget]

3. Run units, alone on the machine (the clock is wall time), each written to ``units/<arm>_s<seed>.json`` as it
   finishes with its provenance; the summary is rebuilt after each. Run it again to continue: a unit whose file
   exists is skipped, and processes sharing the directory (one sitting after another, or machines side by side)
   each claim the next unit with a lock file (a lock left by a killed process is removed by hand)::

       python studies/time_to_accuracy/run.py [--units N]

4. ``--summary`` rebuilds ``summary.json`` from the unit files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:   # run as a script from any folder
    sys.path.insert(0, str(ROOT))

from studies.time_to_accuracy import design as tta  # noqa: E402
from studies.time_to_accuracy.summary import ratio_table, rebuild_summary, targets_from_frontier  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=tta.committed_dir())
    parser.add_argument("--fix-targets", type=Path, metavar="FRONTIER_DIR",
                        help="write targets.json from the frontier's v1 units in this directory")
    parser.add_argument("--date", help="with --fix-targets: the date the targets are fixed on")
    parser.add_argument("--every", type=int, default=1, help="with --fix-targets: every k-th question (1: all)")
    parser.add_argument("--design", action="store_true", help="write design.json (once)")
    parser.add_argument("--budget", type=float, default=tta.BUDGET_SECONDS)
    parser.add_argument("--eval-every", type=float, default=tta.EVAL_EVERY_SECONDS)
    parser.add_argument("--seeds", type=int, default=tta.SEEDS)
    parser.add_argument("--lag-v", type=int, default=tta.LAG_V)
    parser.add_argument("--lag-correction", default=tta.LAG_CORRECTION, choices=("ratio", "truncated", "none"))
    parser.add_argument("--arms", nargs="+", default=None, help="arm names (default: every arm of the design)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads while training")
    parser.add_argument("--eval-threads", type=int, default=os.cpu_count(), help="torch threads while evaluating")
    parser.add_argument("--full-budget", action="store_true", help="train to the budget even once every target "
                        "is reached (default: stop then; every first passage is known)")
    parser.add_argument("--units", type=int, default=None, help="run at most this many units")
    parser.add_argument("--summary", action="store_true")
    args = parser.parse_args(argv)
    out: Path = args.out
    if args.fix_targets:
        if not args.date:
            parser.error("--fix-targets needs --date")
        if (out / "design.json").exists():
            sys.exit(f"{out / 'design.json'} exists: the targets were fixed with it; a new target needs a new --out")
        targets = targets_from_frontier(args.fix_targets, args.date, every=args.every)
        out.mkdir(parents=True, exist_ok=True)
        (out / "targets.json").write_text(json.dumps(targets, indent=1) + "\n")
        print(json.dumps(targets["targets"]))
        return
    if args.design:
        targets = tta.load_targets(out / "targets.json")
        design = tta.make_design(targets, budget=args.budget, every=args.eval_every, seeds=args.seeds,
                                 lag_v=args.lag_v, lag_correction=args.lag_correction, arm_names=args.arms,
                                 stop_when_reached=not args.full_budget, threads=args.threads,
                                 eval_threads=args.eval_threads, questions=len(tta.eval_questions(targets)))
        design = tta.write_design(out, design)
        print(f"design {tta.design_sha(design)[:12]}: {len(design['order'])} units, order {design['order']}")
        return
    if args.summary:
        for row in ratio_table(rebuild_summary(out)):
            print(row)
        return
    if not (out / "design.json").exists():
        sys.exit(f"no design in {out}: run with --design first")
    design = json.loads((out / "design.json").read_text())
    torch.set_num_threads(design["threads"])
    print(f"{len(design['order'])} units in the design; {design['threads']} torch threads; writing {out}", flush=True)
    tta.run_units(out, ROOT, units=args.units, on_unit=lambda unit: rebuild_summary(out),
                  log=lambda line: print(line, flush=True))
    if (out / "units" / "untrained.json").exists():
        for row in ratio_table(rebuild_summary(out)):
            print(row)


if __name__ == "__main__":
    main()
