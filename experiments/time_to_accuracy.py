"""Time to accuracy against TRL (issue 25 §5): grpo_lab at v = 1 and v = 8 and TRL's GRPOTrainer, each for
the same training seconds, Pass@1 on held-out questions at fixed shares of the budget.

The recipe is the CPU study's (``grpo_lab/configs/cpu_study_smollm2.yaml``: bundled SmolLM2-135M, sum3, strict
reward, P = 4, G = 8, 8 tokens, T = 0.7, lr 2e-5, β = 0, loss type ``grpo``); see
:mod:`grpo_lab.study.time_to_accuracy` for what each arm runs. Each (arm, seed) is a unit that writes
``results/time_to_accuracy/units/<arm>_s<seed>.json`` when it finishes; run it again and it continues with
the next missing unit, seed by seed. Run it alone on the machine (the clock is wall time)::

    .venv/bin/python experiments/time_to_accuracy.py [--budget 600] [--seeds 3] [--units N] [--arms ...]

``GRPO_LAB_SMOKE=1`` shrinks it to seconds and writes under ``runs/`` (nothing committed).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys

import torch

from grpo_lab.config import smoke_mode
from grpo_lab.lm.recipes import CONFIG_DIR, load_config
from grpo_lab.study.time_to_accuracy import ALL_ARMS, ARMS, committed_dir, run_units, target_findings

SMOKE_SIZES = dict(prompts_per_step=2, G=4, max_completion_length=4, eval_problems=4, eval_samples=1,
                   train_problems=8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=600.0, help="training seconds per run")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--units", type=int, default=None, help="run at most this many units")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ALL_ARMS,
                        help="default: the compared arms; trl_every_batch (stock TRL) on request")
    parser.add_argument("--eval-problems", type=int, default=200, help="held-out questions (x eval_samples = 2)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    base = load_config(CONFIG_DIR / "cpu_study_smollm2.yaml", [f"eval_problems={args.eval_problems}"])
    budget, out = args.budget, args.out or str(committed_dir())
    if smoke_mode():
        base, budget, out = base.replace(**SMOKE_SIZES), min(budget, 4.0), args.out or "runs/time_to_accuracy_smoke"
    machine = {"node": platform.node(), "processor": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
               "command": shlex.join([os.path.basename(sys.executable), *sys.argv])}
    print(f"{machine}; budget {budget:.0f} s; writing {out}", flush=True)
    summary = run_units(base, budget, out, seeds=args.seeds, arms=args.arms, units=args.units, machine=machine)
    if "trl_final_pass_at_1" in summary:
        print(f"TRL's final Pass@1 {summary['trl_final_pass_at_1']:.3f} "
              f"(untrained {summary['untrained_pass_at_1']:.3f})")
    for arm, finding in target_findings(summary).items():
        print(f"{arm}: {finding}")


if __name__ == "__main__":
    main()
