"""The CPU study (issue 24): v = 1, 8, 32 with and without the importance correction, plus sample reuse
and the mask at β = 0.04, as units that each write their own result file.

Runs the next missing units of :func:`grpo_lab.study.cpu_study.unit_order` (every arm has n seeds before
any gets n + 1) from ``grpo_lab/configs/cpu_study_smollm2.yaml`` and rebuilds ``results/cpu_study/summary.json``
after each; run it again in a later sitting and it continues where it stopped (an interrupted unit
continues from its checkpoint in ``runs/cpu_study_checkpoints/``). Two processes started side by side
split the missing units between them (each skips what the other has finished or is training); on a
2-core machine give each ``OMP_NUM_THREADS=1``::

    .venv/bin/python experiments/cpu_study.py [--units N | --until HH:MM] [--seeds 8] [--arms v1 v8_ratio ...]
    .venv/bin/python experiments/cpu_study.py --pilot --lrs 2e-5 5e-5 1e-4 [--set steps=40]

``--pilot`` runs ``v1`` and ``v32_ratio`` at seeds 0 and 1 per learning rate into ``results/cpu_study_pilot/``
and prints the drift by lag, the paired SD and the seeds it takes. ``GRPO_LAB_SMOKE=1`` shrinks everything
and writes under ``runs/cpu_study_smoke/`` (nothing committed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import time

import torch

from grpo_lab.config import smoke_mode
from grpo_lab.lm.recipes import CONFIG_DIR, load_config
from grpo_lab.study.cpu_study import run_pilot, run_units, smoke_base, study_dir
from grpo_lab.study.design import ARMS


def deadline(text: str) -> float:
    """``HH:MM`` today (tomorrow if already past) as a Unix time."""
    now = dt.datetime.now()
    hour, minute = (int(x) for x in text.split(":"))
    at = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    return (at if at > now else at + dt.timedelta(days=1)).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=None, help="run at most this many units (default: all missing)")
    parser.add_argument("--until", type=deadline, default=None, metavar="HH:MM",
                        help="start no unit that would not finish by then (by the median unit time so far)")
    parser.add_argument("--seeds", type=int, default=8, help="seeds per primary arm")
    parser.add_argument("--secondary-seeds", type=int, default=3)
    parser.add_argument("--arms", nargs="+", default=[a.name for a in ARMS], choices=[a.name for a in ARMS])
    parser.add_argument("--pilot", action="store_true", help="the learning-rate pilot instead of the study")
    parser.add_argument("--lrs", type=float, nargs="+", default=[], help="the pilot's learning rates")
    parser.add_argument("--out", default=None, help="default: results/cpu_study (pilot: results/cpu_study_pilot)")
    parser.add_argument("--runs-dir", default=None, help="checkpoints while a unit trains (default: runs/...)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field of grpo_lab/configs/cpu_study_smollm2.yaml")
    args = parser.parse_args()
    base = smoke_base(load_config(CONFIG_DIR / "cpu_study_smollm2.yaml", args.set))
    name = ("cpu_study_pilot" if args.pilot else "cpu_study") + ("_smoke" if smoke_mode() else "")
    out = args.out or (f"runs/{name}" if smoke_mode() else str(study_dir().parent / name))
    runs_dir = args.runs_dir or f"runs/{name}_checkpoints"
    print(f"{platform.node()}: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; task {base.task}, P = {base.prompts_per_step}, G = {base.G}, "
          f"T_max = {base.max_completion_length}, {base.steps} steps, lr {base.lr:g}; writing {out}", flush=True)
    start = time.perf_counter()

    def log(line: str) -> None:
        print(f"[{time.perf_counter() - start:7.0f} s] {line}", flush=True)

    if args.pilot:
        reports = run_pilot(base, args.lrs, out, runs_dir, log=log)
        print(json.dumps(reports, indent=1))
        return
    summary = run_units(base, out, runs_dir, seeds=args.seeds, secondary_seeds=args.secondary_seeds,
                        arms=[a for a in ARMS if a.name in args.arms], units=args.units, until=args.until, log=log)
    for test in summary.get("tests", []):
        if test["kind"] == "equivalence":
            ci = "no CI" if test["ci"] is None else f"90 % CI [{test['ci'][0]:+.3f}, {test['ci'][1]:+.3f}]"
            estimate = "-" if test["estimate"] is None else f"{test['estimate']:+.3f}"
            print(f"{test['comparison']:24} n = {test['n']}: {estimate}, {ci} -> {test['finding']}")
    print(f"{len(summary.get('runs', []))} units in {out}/summary.json; "
          f"this sitting {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
