"""Does the decoder show in a whole loop step? LeanDecoder vs the model's forward, side by side in one run.

Two loops of the same recipe and seed differ only in α's decoder (``lean`` on torch's products vs
``model``); they step in turn, so the machine's noise hits both alike. Each loop step is Algorithm 1's
whole step (sync, sampling, rewards, train). Printed per thread count and completion budget: median
seconds per step of each arm, the median of the paired ratios lean / model, and the median tokens per
step (the work: both draw from the same weights, so their lengths agree up to a draw flipped by rounding).
A decoder stays only if it saves ≥ 10 % of a whole step (ratio ≤ 0.90)::

    python benchmarks/decoder_loop_step.py [--steps 6] [--threads 1 2] [--tokens 8 128]

``--tokens 8``: the CPU recipe (add1, 8 tokens). ``--tokens 128``: gsm_symbolic's chain of thought.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def arms(tokens: int) -> dict[str, object]:
    from grpo_lab.lm.build import build_loop
    from grpo_lab.lm.recipes import recipe
    from grpo_lab.lm.sampling import HFSampler

    task = {"task": "add1"} if tokens <= 8 else {"task": "gsm_symbolic"}
    loops = {}
    for decoder in ("lean", "model"):
        loop = build_loop(recipe("cpu_arith_smollm2", v=1, max_completion_length=tokens, steps=10**6,
                                 train_problems=200, **task))
        sampler = HFSampler(loop.policy, loop.tokenizer, tokens, loop.config.temperature, decoder=decoder)
        if decoder == "lean":
            sampler.decoder.linear = torch.nn.functional.linear
        loop.sampler = sampler
        loops[decoder] = loop
    return loops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tokens", type=int, nargs="+", default=[8, 128])
    args = parser.parse_args()
    for tokens in args.tokens:
        loops = arms(tokens)
        for threads in args.threads:
            torch.set_num_threads(threads)
            seconds = {name: [] for name in loops}
            work = {name: [] for name in loops}
            names = list(loops)
            for k in range(args.steps + 1):
                for name in names[k % 2:] + names[:k % 2]:
                    start = time.perf_counter()
                    record = loops[name].step()
                    if k:
                        seconds[name].append(time.perf_counter() - start)
                        work[name].append(record.num_tokens)
            ratio = statistics.median(a / b for a, b in zip(seconds["lean"], seconds["model"], strict=True))
            print(f"T_max {tokens:4d}, {threads} thread(s): " + ", ".join(
                f"{n} {statistics.median(s):.2f} s/step ({statistics.median(work[n]):.0f} tokens)"
                for n, s in seconds.items()) + f"; lean/model = {ratio:.2f}", flush=True)


if __name__ == "__main__":
    main()
