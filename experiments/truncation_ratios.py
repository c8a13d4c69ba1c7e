"""What top-p / top-k sampling does to r′ = π_k/α′ at lag 0 (docs/theory.md §3, *Truncated sampling*).

Right after a sync α = π_k, but a sampler that truncates draws from α′ = α·1[S]/α(S) and returns log α′,
while π_k scores the full distribution: log r′ = log α(S) ≤ 0 on every sampled token. For each setting
``top_p:top_k`` this samples ``--batches`` × P prompts × G completions of the CPU default's task (the
``cpu_arith_smollm2`` recipe: bundled SmolLM2-135M, add1) with the in-process sampler, scores them with
π_k, and prints what a StepRecord logs of them (:func:`grpo_lab.objective.ratio_diagnostics`: ESS per
token and per sequence, log r′ quantiles), the mean r′ and the share of tokens with r′ outside [0.9, 1.1];
then the cost of the cut: one decoding step's sampling (log-softmax, cut, draw) against the untruncated
one, on the model's next-token logits, medians of paired timings::

    .venv/bin/python experiments/truncation_ratios.py [--batches 4] [--temperature 0.7] [--tokens 8] \\
        [--settings 1:0 0.9:0 0.8:0 1:50] [--repeats 60]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

BAND = 0.1
"""Tokens with |r′ − 1| > BAND are counted (the band of the report at github.com/huggingface/trl/issues/6789)."""


def setting(text: str) -> tuple[float, int]:
    """``top_p:top_k`` → (top_p, top_k)."""
    top_p, top_k = text.split(":")
    return float(top_p), int(top_k)


def stacked(parts: list[torch.Tensor]) -> torch.Tensor:
    """The rows of ``[b, T_j]`` tensors, each right-padded with zeros (False) to the longest T_j."""
    out = parts[0].new_zeros(sum(p.shape[0] for p in parts), max(p.shape[1] for p in parts))
    row = 0
    for p in parts:
        out[row:row + p.shape[0], :p.shape[1]] = p
        row += p.shape[0]
    return out


def step_costs(logits: torch.Tensor, temperature: float, settings: list[tuple[float, int]],
               repeats: int) -> tuple[float, dict[tuple[float, int], float]]:
    """One decoding step's sampling (:func:`~grpo_lab.lm.sampling.sample_next`: log-softmax, the cut, the draw)
    on ``logits [positions, rows, V]``, each setting after the untruncated one in turn: the untruncated
    median in ms, and each setting's median ratio to it over the paired repeats (robust to a shared CPU)."""
    from grpo_lab.lm.sampling import sample_next

    plain, ratios = [], {s: [] for s in settings}
    for r in range(repeats):
        step = logits[r % logits.shape[0]]
        start = time.perf_counter()
        sample_next(step, temperature)
        plain.append(time.perf_counter() - start)
        for top_p, top_k in settings:
            start = time.perf_counter()
            sample_next(step, temperature, top_p, top_k)
            ratios[top_p, top_k].append((time.perf_counter() - start) / plain[-1])
    return 1e3 * float(np.median(plain)), {s: float(np.median(v)) for s, v in ratios.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=4, help="batches of P·G completions per setting")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--tokens", type=int, default=8, help="max_completion_length")
    parser.add_argument("--settings", nargs="+", type=setting, default=[(1.0, 0), (0.9, 0), (0.8, 0), (1.0, 50)])
    parser.add_argument("--repeats", type=int, default=60, help="paired timings of one sampling step")
    args = parser.parse_args()

    from grpo_lab.lm.build import build_loop
    from grpo_lab.lm.recipes import recipe
    from grpo_lab.lm.sampling import HFSampler
    from grpo_lab.objective import ratio_diagnostics

    loop = build_loop(recipe("cpu_arith_smollm2", temperature=args.temperature, max_completion_length=args.tokens))
    P, G = loop.config.prompts_per_step, loop.config.G
    samplers = {s: HFSampler(loop.policy, loop.task.tokenizer, args.tokens, top_p=s[0], top_k=s[1])  # α = π_k
                for s in args.settings}
    generator = torch.Generator().manual_seed(0)
    parts: dict[tuple[float, int], list[tuple[torch.Tensor, ...]]] = {s: [] for s in args.settings}
    for _ in range(args.batches):
        prompts = loop.task.prompts(P, generator)
        for s, sampler in samplers.items():
            rollout = sampler.sample(prompts, G, generator)
            with torch.no_grad():
                parts[s].append((loop.policy.logprobs(rollout, slice(None)), rollout.logp_alpha, rollout.mask))
    with torch.no_grad():  # the next-token logits of the last rollout, to time one sampling step on
        ids = torch.cat([rollout.extra["prompt_ids"], rollout.completions], dim=1)
        mask = torch.cat([rollout.extra["prompt_mask"], rollout.mask.long()], dim=1)
        logits = loop.policy.model(input_ids=ids, attention_mask=mask).logits[:, -rollout.completions.shape[1]:]
    plain_ms, costs = step_costs(logits.transpose(0, 1).contiguous(), args.temperature, args.settings, args.repeats)

    print(f"SmolLM2-135M, {loop.config.task}, T = {args.temperature}, {args.tokens} tokens, lag 0, "
          f"{args.batches} × {P}·{G} completions per setting; one untruncated sampling step of {P * G} rows: "
          f"{plain_ms:.2f} ms")
    print("top_p top_k | tokens  mean r′  ess_token  ess_seq  log r′ p50   p99      max     |r′−1|>0.1 | step cost")
    for s in args.settings:
        log_p, log_alpha, mask = (stacked([part[j] for part in parts[s]]) for j in range(3))
        mask = mask.bool()
        diagnostics = ratio_diagnostics(log_p, log_alpha, mask)
        ratio = (log_p - log_alpha)[mask].double().exp()
        print(f"{s[0]:5g} {s[1]:5d} | {int(mask.sum()):6d}  {float(ratio.mean()):.4f}   "
              f"{diagnostics['ess_token']:.4f}    {diagnostics['ess_seq']:.4f}   "
              f"{diagnostics['log_ratio_k_p50']:+.4f}  {diagnostics['log_ratio_k_p99']:+.4f}  "
              f"{diagnostics['log_ratio_k_max']:+.4f}  {float(((ratio - 1).abs() > BAND).double().mean()):8.1%}  | "
              f"{costs[s]:.2f}×", flush=True)


if __name__ == "__main__":
    main()
