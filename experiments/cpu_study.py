"""The paper's table on a 2-core CPU: on-policy, + mask, its lr-matched control, v = 8, i = 4, paired seeds.

Trains every (configuration, seed) of :mod:`grpo_lab.study.cpu_study` from ``configs/cpu_study_smollm2.yaml``
(SmolLM2-135M, sums of 1-2-digit numbers) and scores held-out Pass@1 before and after (and at
``--eval-steps``, if given). Resumable: run it again with the same
arguments and finished runs are skipped, an unfinished one continues from its checkpoint.

    .venv/bin/python experiments/cpu_study.py [--seeds 0 1 2] [--steps 16] [--set key=value ...]

Writes ``results/cpu_study/summary.json`` and ``results/cpu_study/metrics/*.jsonl`` (small,
committed; notebook 02 reads them); checkpoints go to ``runs/cpu_study/`` (not committed).
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from grpo_lab.lm.recipes import CONFIG_DIR, load_config
from grpo_lab.study.cpu_study import ARMS, run_study


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--eval-steps", type=int, nargs="*", default=[])
    parser.add_argument("--arms", nargs="+", default=[a.name for a in ARMS], choices=[a.name for a in ARMS])
    parser.add_argument("--out", default="results/cpu_study")
    parser.add_argument("--runs-dir", default="runs/cpu_study")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field of configs/cpu_study_smollm2.yaml")
    args = parser.parse_args()
    base = load_config(CONFIG_DIR / "cpu_study_smollm2.yaml", [f"steps={args.steps}", *args.set])
    print(f"{platform.node()}: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; task {base.task}, P = {base.prompts_per_step}, G = {base.G}, "
          f"T_max = {base.max_completion_length}, {args.steps} steps, seeds {args.seeds}", flush=True)
    start = time.perf_counter()
    arms = [a for a in ARMS if a.name in args.arms]
    summary = run_study(base, args.out, args.seeds, args.runs_dir, arms=arms, eval_steps=args.eval_steps,
                        log=lambda line: print(f"[{time.perf_counter() - start:7.0f} s] {line}", flush=True))
    print(f"{len(summary['runs'])} runs in {args.out}/summary.json; this sitting {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
