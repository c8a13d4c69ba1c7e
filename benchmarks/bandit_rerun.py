"""How long one re-run of the live bandit panel takes (notebook 01), engine against loop.

The panel re-trains ``steps`` × ``runs`` on every slider change with
:func:`~grpo_lab.exact.closed_form.run_bandit_closed_form` (gradient in closed form); the
budget is 0.5 s for 300 steps × 8 runs on a 2-core CPU, at every slider's extreme too
(i = 10, G = 32, v = 20, 16 runs). The same runs through
:class:`~grpo_lab.loop.GRPOLoop` (:func:`~grpo_lab.exact.bandit.run_bandit`, autograd)
are timed alongside, interleaved repeat by repeat so that both see the same
machine load; it prints the medians, their ratio and the engine's share of the
budget::

    python benchmarks/bandit_rerun.py              # or: make bench
    python benchmarks/bandit_rerun.py --profile    # plus the top cProfile entries of the engine
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from grpo_lab.exact.bandit import BanditRun, run_bandit
from grpo_lab.exact.bandit_lab import lab_config, lab_problem
from grpo_lab.exact.closed_form import run_bandit_closed_form

BUDGET_S = 0.5
ENGINES: dict[str, Callable[..., BanditRun]] = {"closed form (panel)": run_bandit_closed_form, "GRPOLoop": run_bandit}
CASES: dict[str, dict[str, object]] = {
    "on-policy (v=1, i=1)": {}, "v=10": {"v": 10}, "beta=0.1": {"beta": 0.1}, "i=4": {"i": 4},
    "extreme i=10": {"i": 10}, "extreme G=32": {"G": 32}, "extreme v=20": {"v": 20}, "extreme runs=16": {"runs": 16}}
"""Each case changes the panel's defaults; ``runs`` is the number of runs, the rest config fields."""


def time_case(steps: int, runs: int, repeats: int, **changes: object) -> dict[str, list[float]]:
    """Seconds per re-run of each engine, ``repeats`` times, interleaved (after one warm-up each);
    also checks that both engines drew the same curves."""
    problem, config = lab_problem(), lab_config(steps=steps, **changes)
    curves = {name: engine(problem, config, runs=runs).J for name, engine in ENGINES.items()}
    first, second = curves.values()
    if not np.allclose(first, second, rtol=0, atol=1e-10):
        raise AssertionError(f"the engines disagree: max |ΔJ| = {np.abs(first - second).max():.2e}")
    times: dict[str, list[float]] = {name: [] for name in ENGINES}
    for _ in range(repeats):
        for name, engine in ENGINES.items():
            start = time.perf_counter()
            engine(problem, config, runs=runs)
            times[name].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="print the top cProfile entries of one engine re-run")
    args = parser.parse_args()
    print(f"CPU cores: {os.cpu_count()}, torch {torch.__version__}, torch threads {torch.get_num_threads()} "
          f"(both engines use 1); {args.steps} steps x {args.runs} runs, median of {args.repeats}")
    fast, loop = ENGINES
    for label, changes in CASES.items():
        config_changes = {key: value for key, value in changes.items() if key != "runs"}
        times = time_case(args.steps, int(changes.get("runs", args.runs)), args.repeats, **config_changes)
        median = {name: statistics.median(t) for name, t in times.items()}
        print(f"{label:22s} {fast}: {median[fast]:.3f} s (best {min(times[fast]):.3f})   {loop}: {median[loop]:.3f} s"
              f"   ratio {median[fast] / median[loop]:.2f}   = {median[fast] / BUDGET_S:.2f}x the {BUDGET_S} s budget"
              f"  [{'ok' if median[fast] < BUDGET_S else 'OVER'}]")
    if args.profile:
        problem, config = lab_problem(), lab_config(steps=args.steps)
        profiler = cProfile.Profile()
        profiler.runcall(run_bandit_closed_form, problem, config, args.runs)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
