"""The loop's step with α on transformers (``sampler: hf``) vs on vLLM's engine (``sampler: vllm``), side by side.

Same config (``grpo_lab/configs/cpu_arith_smollm2.yaml``: bundled SmolLM2-135M, float32, CPU, add1), same seed, v = 1
(every step syncs, so the push is in every step). The two loops step in turn, so machine noise hits both
alike; medians of sample (generation + rewards), train and sync seconds are printed, and the ratio of the
median steps. Needs vLLM (``.venv-vllm`` from ``make test-vllm``):

    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python benchmarks/sampler_step.py \\
        [--steps 6] [--tokens 32] [--task add1]
"""

from __future__ import annotations

import argparse
import statistics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="timed steps per sampler (after one warm-up step)")
    parser.add_argument("--tokens", type=int, default=32, help="max_completion_length")
    parser.add_argument("--task", default="add1", help="gsm_symbolic: word problems whose answers use 128 tokens")
    args = parser.parse_args()

    from grpo_lab.lm.build import build_loop
    from grpo_lab.lm.recipes import recipe

    loops = {name: build_loop(recipe("cpu_arith_smollm2", v=1, sampler=name, max_completion_length=args.tokens,
                                     steps=10**6, task=args.task)) for name in ("hf", "vllm")}
    records: dict[str, list] = {name: [] for name in loops}
    for k in range(args.steps + 1):
        for name, loop in loops.items():
            record = loop.step()
            if k > 0:  # step 0 pays one-off costs
                records[name].append(record)
    median = {name: {key: statistics.median(getattr(r, key) for r in rs)
                     for key in ("sample_seconds", "train_seconds", "sync_seconds")} for name, rs in records.items()}
    tokens = {name: statistics.median(r.num_tokens for r in rs) for name, rs in records.items()}
    print(f"{args.steps} timed steps each, v = 1, {args.task}, T_max = {args.tokens}, decoder "
          f"{type(loops['hf'].sampler.decoder).__name__}; medians in seconds")
    print(f"{'sampler':8} {'sample':>8} {'train':>8} {'sync':>8} {'step':>8} {'tokens':>7}")
    for name, m in median.items():
        print(f"{name:8} {m['sample_seconds']:8.3f} {m['train_seconds']:8.3f} {m['sync_seconds']:8.3f} "
              f"{sum(m.values()):8.3f} {tokens[name]:7.0f}")
    step = {name: statistics.median(r.sample_seconds + r.train_seconds + r.sync_seconds for r in rs)
            for name, rs in records.items()}
    print(f"step(vllm) / step(hf) = {step['vllm'] / step['hf']:.2f}; "
          f"sample(vllm) / sample(hf) = {median['vllm']['sample_seconds'] / median['hf']['sample_seconds']:.2f}")


if __name__ == "__main__":
    main()
