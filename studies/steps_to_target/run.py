"""Run the units of the steps-to-target study (the design: ``design.py`` beside this file) and rebuild its summary.

A unit is one arm at one seed: exact J every k optimiser steps (off the clock) until both targets and the last TOST
step count are passed, or the cap. It is written to ``units/<arm>_s<seed>.json`` with its provenance as it
finishes; a unit whose file exists is skipped, and so is one another process is running (an advisory lock the OS
releases if that process dies), so processes side by side, and sittings one after another, share one order; a unit
whose process died resumes from its last evaluation point (its checkpoint, ``units/<arm>_s<seed>.ckpt/``). Step
counts do not depend on the load, so the loop's units run as two processes at one thread each; TRL's, as amended
(``design.TRL_UNIT_SCORING``), at 2 threads, one at a time::

    python studies/steps_to_target/run.py --design                          # design.json, once, before any unit
    python studies/steps_to_target/run.py --units 10 --threads 1 --arms grpo_lab_v1 &   # two processes share
    python studies/steps_to_target/run.py --units 10 --threads 1 --arms grpo_lab_v1 &   # the order
    python studies/steps_to_target/run.py --units 5 --threads 2 --arms trl
    python benchmarks/step_seconds.py                                       # the seconds half, alone on the machine
    python studies/steps_to_target/run.py --summary                         # summary.json from both halves
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:   # run as a script from any folder
    sys.path.insert(0, str(ROOT))

from studies.steps_to_target import design  # noqa: E402
from studies.steps_to_target.summary import rebuild_summary, summary_lines  # noqa: E402
from studies.steps_to_target.units import run_units  # noqa: E402


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--design", action="store_true", help="write design.json (refused if another one exists)")
    parser.add_argument("--units", type=int, default=1, help="how many units to run at most")
    parser.add_argument("--arms", nargs="+", choices=design.ARMS, default=None, help="only these arms' units")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the design's)")
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--summary", action="store_true")
    args = parser.parse_args(argv)
    path = args.out / "design.json"
    if args.design:
        record = json.loads(json.dumps(design.design_record()))
        if path.exists() and json.loads(path.read_text()) != record:
            sys.exit(f"{path} holds another design; a design is fixed before its units: use another --out")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"{path}: {len(record['order'])} units, cap {record['cap']}, every {record['every']}")
        return
    if args.summary:
        print("\n".join(summary_lines(rebuild_summary(args.out))))
        return
    if not path.exists():
        sys.exit(f"no design in {args.out}: run with --design first")
    import torch

    torch.set_num_threads(args.threads or design.load_design(args.out)["threads"])
    run_units(args.out, ROOT, units=args.units, arms=args.arms, log=lambda line: print(line, flush=True))


if __name__ == "__main__":
    main()
