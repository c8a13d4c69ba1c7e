"""α's weights on 2 MiB pages against 4 KiB pages: HFSampler.sample of one batch, side by side in one run.

Two samplers of the same weights (bundled SmolLM2 fp32, CPU), one built with ``huge_pages=True``
(the default: one buffer advised with ``madvise(MADV_HUGEPAGE)``), one with ``huge_pages=False``,
sample the same prompts in turn (same seeds, so the same tokens), ``--repeats`` times each after
one warm-up each. Decoding reads every weight once per token, so it is bound by memory reads and
by the TLB misses of 4 KiB pages::

    python benchmarks/huge_pages.py [--G 8] [--prompts 2] [--tokens 32] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from grpo_lab.build import build_loop
from grpo_lab.sampling import HFSampler
from grpo_lab.train_config import TrainConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    config = TrainConfig(G=args.G, prompts_per_step=args.prompts, max_completion_length=args.tokens,
                         train_problems=50, temperature=1.0)
    loop = build_loop(config)
    prompts = loop.task.prompts(args.prompts, torch.Generator().manual_seed(0))
    samplers = {"2 MiB": loop.sampler, "4 KiB": HFSampler(loop.policy, loop.sampler.tokenizer, args.tokens,
                                                          huge_pages=False)}
    if not loop.sampler.huge_pages:
        raise SystemExit("this machine gave no huge pages (not Linux, or transparent huge pages set to never)")
    seconds: dict[str, list[float]] = {name: [] for name in samplers}
    for repeat in range(args.repeats + 1):
        tokens = []
        for name, sampler in samplers.items():
            start = time.perf_counter()
            rollout = sampler.sample(prompts, args.G, torch.Generator().manual_seed(repeat))
            if repeat:  # the first round is a warm-up
                seconds[name].append(time.perf_counter() - start)
            tokens.append(rollout.completions)
        assert torch.equal(*tokens), "the two samplers drew different tokens"
    median = {name: statistics.median(s) for name, s in seconds.items()}
    print(f"G={args.G}, P={args.prompts}, {args.tokens} tokens, {torch.get_num_threads()} threads, "
          f"median of {args.repeats} (after a warm-up each)")
    for name, values in seconds.items():
        print(f"  α on {name} pages: {median[name]:.2f} s  ({', '.join(f'{v:.2f}' for v in values)})")
    print(f"ratio 2 MiB / 4 KiB: {median['2 MiB'] / median['4 KiB']:.2f}")


if __name__ == "__main__":
    main()
