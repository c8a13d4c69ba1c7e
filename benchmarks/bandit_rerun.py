"""How long one re-run of the live bandit panel takes (notebook 01).

The panel re-trains ``steps`` × ``runs`` on every slider change; the budget is
0.5 s for 300 steps × 8 runs on a 2-core CPU. Prints the median and best of a
few repeats after one warm-up, and the ratio to the budget::

    python benchmarks/bandit_rerun.py              # or: make bench
    python benchmarks/bandit_rerun.py --profile    # plus the top cProfile entries
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import time

import torch

from grpo_lab.bandit import run_bandit
from grpo_lab.viz.lab import lab_config, lab_problem

BUDGET_S = 0.5


def time_rerun(steps: int, runs: int, repeats: int, **changes: object) -> list[float]:
    """Wall-clock seconds of ``repeats`` runs of the panel's computation (after one warm-up)."""
    problem, config = lab_problem(), lab_config(steps=steps, **changes)
    run_bandit(problem, config, runs=runs)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run_bandit(problem, config, runs=runs)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="print the top cProfile entries of one re-run")
    args = parser.parse_args()
    print(f"CPU cores: {os.cpu_count()}, torch {torch.__version__}, torch threads {torch.get_num_threads()} "
          f"(run_bandit uses 1)")
    for label, changes in [("on-policy (v=1, i=1)", {}), ("v=10", {"v": 10}), ("beta=0.1", {"beta": 0.1})]:
        times = time_rerun(args.steps, args.runs, args.repeats, **changes)
        median = statistics.median(times)
        print(f"{label:22s} {args.steps} steps x {args.runs} runs: median {median:.3f} s, best {min(times):.3f} s"
              f"  = {median / BUDGET_S:.2f}x the {BUDGET_S} s budget  [{'ok' if median < BUDGET_S else 'OVER'}]")
    if args.profile:
        problem, config = lab_problem(), lab_config(steps=args.steps)
        profiler = cProfile.Profile()
        profiler.runcall(run_bandit, problem, config, args.runs)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
