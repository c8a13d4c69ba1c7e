"""Training with each group's prompt scored once (``share_prompt``) against every prompt + completion
whole, side by side in one run on the CPU default (``grpo_lab/configs/cpu_arith_smollm2.yaml``).

One rollout is sampled; then the loop's training of it (``GRPOLoop._train``: forward, backward and
the optimiser step over all P·G rows, micro-batched as configured) is timed with the knob on and
off in turn, ``--repeats`` times each, after one untimed warm-up each. The zero-variance mask is
off so that every row trains on both sides. Before timing, both sides score the batch at the same
θ, and the largest log-prob difference is printed::

    python benchmarks/shared_prompt.py [--config grpo_lab/configs/cpu_arith_smollm2.yaml] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from grpo_lab.advantages import whiten
from grpo_lab.lm.build import build_loop
from grpo_lab.lm.recipes import load_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="grpo_lab/configs/cpu_arith_smollm2.yaml")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    config = load_config(args.config).replace(mask_zero_variance=False)
    loop = build_loop(config)
    generator = torch.Generator().manual_seed(config.seed)
    rollout = loop.sampler.sample(loop.task.prompts(config.prompts_per_step, generator), config.G, generator)
    rewards = loop.task.rewards(rollout, generator)
    if not bool(whiten(rewards).abs().sum() > 0):
        raise SystemExit("every group agreed on its rewards: no gradient to time; try another seed")
    B, Lp = rollout.extra["prompt_ids"].shape
    print(f"{args.config}: P={config.prompts_per_step}, G={config.G}, B={B} rows, prompts {Lp} tokens (padded), "
          f"completions {rollout.completions.shape[1]} tokens, micro-batch {config.micro_batch_size}, "
          f"{torch.get_num_threads()} torch threads")

    with torch.no_grad():
        scores = {}
        for share in (True, False):
            loop.policy.share_prompt = share
            scores[share] = loop.policy.logprobs(rollout, slice(None))
    gap = float((scores[True] - scores[False])[rollout.mask].abs().max())
    print(f"max |log π shared − log π whole| = {gap:.2e}")

    times: dict[bool, list[float]] = {True: [], False: []}
    for repeat in range(args.repeats + 1):
        for share in (True, False):
            loop.policy.share_prompt = share
            start = time.perf_counter()
            loop._train(rollout, loop.plan(rollout, rewards))
            if repeat:  # the first round warms up
                times[share].append(time.perf_counter() - start)
    median = {share: statistics.median(t) for share, t in times.items()}
    for share, label in ((True, "shared prompt"), (False, "whole")):
        print(f"{label:14s} train s/step: " + " ".join(f"{t:6.2f}" for t in times[share])
              + f"   median {median[share]:.2f}")
    print(f"ratio shared / whole = {median[True] / median[False]:.2f}")


if __name__ == "__main__":
    main()
