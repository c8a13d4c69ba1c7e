"""P4, the reward gain: does the CPU default run raise held-out reward by >= 15 points within 10 minutes (v = 4)?

Trains ``grpo_lab/configs/cpu_arith_smollm2.yaml`` (bundled SmolLM2-135M, one-digit additions,
lagged server v = 4) for at most ``--minutes`` of wall clock, then evaluates Pass@1 on
held-out problems (another generator seed) before and after, with the same sampling seed.

    .venv/bin/python experiments/cpu_reward_gain.py [--minutes 10] [--seed 0] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import time

from grpo_lab.lm.build import build_loop
from grpo_lab.lm.evaluate import evaluate
from grpo_lab.lm.recipes import CONFIG_DIR, load_config
from grpo_lab.lm.text_task import eval_problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    config = load_config(CONFIG_DIR / "cpu_arith_smollm2.yaml", [f"seed={args.seed}", "steps=100000", *args.set])
    problems = eval_problems(config)
    loop = build_loop(config)

    def pass_at_1() -> float:
        return evaluate(loop.policy, loop.task.tokenizer, problems, n=config.eval_samples,
                        max_completion_length=config.max_completion_length, seed=1234,
                        progress=False).pass_at(1, config.scoring)

    before = pass_at_1()
    start = time.perf_counter()
    while time.perf_counter() - start < 60 * args.minutes:
        r = loop.step()
        print(f"step {r.step:3d} lag {r.lag} reward {r.reward_mean:.3f} masked {r.masked_frac:.2f} "
              f"t {time.perf_counter() - start:6.1f}s", flush=True)
    trained = time.perf_counter() - start
    after = pass_at_1()
    print(f"P4 seed {args.seed}: {loop.k} steps in {trained / 60:.1f} min (v = {config.v}); held-out Pass@1 "
          f"{before:.3f} -> {after:.3f} ({100 * (after - before):+.1f} points; target >= +15) on "
          f"{len(problems)} questions x {config.eval_samples} samples")


if __name__ == "__main__":
    main()
