"""The numerics gap at lag 0: log r′ = log π_k − log α of the same tokens right after a sync, fp32 and bf16 engines.

α on vLLM's engine and π_k in the trainer hold the same weights at lag 0, yet score the same tokens
differently (paged attention and fused kernels with a KV cache against one full forward; in bf16 the
rounding of every layer). This prints, per engine dtype, the distribution of log r′ over every sampled
token of ``--prompts`` prompts × G completions of the CPU default's task, and the share of tokens whose r′
leaves the clip band [1 − ε, 1 + ε] or exceeds the caps a truncated importance weight would use: whether
such a cap is needed is read off these shares. Needs vLLM (``.venv-vllm`` from ``make test-vllm``)::

    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python experiments/vllm_numerics.py \\
        [--prompts 8] [--tokens 32] [--dtypes float32 bfloat16]
"""

from __future__ import annotations

import argparse
import gc

import numpy as np

CAPS = (2.0, 5.0)
"""r′ caps a truncated importance weight could use; the share of tokens above each is printed."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32, help="max_completion_length")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    args = parser.parse_args()

    from grpo_lab.lm.build import build_loop
    from grpo_lab.lm.recipes import recipe
    from grpo_lab.scale.throughput import log_ratio_at_lag0

    for dtype in args.dtypes:
        config = recipe("cpu_arith_smollm2", sampler="vllm", dtype=dtype, max_completion_length=args.tokens)
        loop = build_loop(config)
        log_r = log_ratio_at_lag0(loop, prompts=args.prompts)
        ratio, eps = np.exp(log_r), config.eps_low
        quantiles = np.percentile(log_r, [1, 50, 99])
        print(f"{dtype:9} {log_r.size} tokens: mean |log r′| {np.abs(log_r).mean():.2e}, max |log r′| "
              f"{np.abs(log_r).max():.2e}, quantiles 1/50/99 % {quantiles[0]:+.2e} {quantiles[1]:+.2e} "
              f"{quantiles[2]:+.2e}; r′ in [{ratio.min():.4f}, {ratio.max():.4f}]; outside [1 ± ε = {eps}] "
              f"{np.mean(np.abs(ratio - 1) > eps):.2%}; "
              + ", ".join(f"r′ > {cap:g}: {np.mean(ratio > cap):.2%}" for cap in CAPS), flush=True)
        del loop
        gc.collect()  # one engine at a time: vLLM keeps one set of process groups per process


if __name__ == "__main__":
    main()
