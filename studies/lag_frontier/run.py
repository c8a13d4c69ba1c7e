"""The lag frontier's units (the design and analysis: ``frontier.py`` beside this file).

Each unit is one arm at one seed on the study's recipe (the task and lr the pilot chose: ``addsubmul1`` at
1e-5), with exact J at 0, ¼, ½, ¾ and the end of the budget; it is written to ``results/units/<arm>_s<seed>.json``
with its provenance as it finishes, and a unit whose file exists is skipped, so sittings one after another (or
processes side by side, each claiming the next unit with a lock file) share the work. Every arm at seed n runs
before any at n + 1. ``--summary`` rebuilds ``results/summary.json`` from the unit files::

    python studies/lag_frontier/run.py --task addsubmul1 --lr 1e-5 [--arms v1 v4_ratio …] [--seeds 5] [--threads 1]
    python studies/lag_frontier/run.py --task addsubmul1 --lr 1e-5 --mask-arms
    python studies/lag_frontier/run.py --task addsubmul1 --lr 1e-5 --summary
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:   # run as a script from any folder
    sys.path.insert(0, str(ROOT))

from grpo_lab.lm.recipes import recipe  # noqa: E402
from studies.lag_frontier import frontier  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--arms", nargs="+", default=None, help="arm names (default: all of the design's)")
    parser.add_argument("--mask-arms", action="store_true", help="the mask arms of §4 instead")
    parser.add_argument("--seeds", type=int, default=frontier.SEEDS)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--summary", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = recipe("cpu_arith_smollm2", task=args.task, lr=args.lr, steps=args.steps, scoring="strict",
                  empty_step="skip", checkpoint_every=0)
    if args.summary:
        summary = frontier.rebuild_summary(args.out, base)
        print(json.dumps({key: summary[key] for key in ("untrained_j", "constant_answer_j", "margin", "frontier")}))
        return
    design = frontier.MASK_ARMS if args.mask_arms else frontier.ARMS
    arms = [arm for arm in design if args.arms is None or arm.name in args.arms]
    unknown = set(args.arms or ()) - {arm.name for arm in design}
    if unknown:
        raise SystemExit(f"unknown arms {sorted(unknown)}; the design's: {[arm.name for arm in design]}")
    frontier.run_untrained(base, args.out, ROOT)
    for arm, seed in frontier.unit_order(arms, args.seeds):
        unit = frontier.run_unit(arm, seed, base, args.out, ROOT)
        if unit is not None:  # no endpoint printed: nothing is read before every unit is in
            print(f"{arm.name} seed {seed}: done in {unit['wall_seconds']:.0f} s (exact J "
                  f"{unit['eval_seconds']:.0f} s), largest pruned mass {unit['pruned_max']:.1e}", flush=True)


if __name__ == "__main__":
    main()
