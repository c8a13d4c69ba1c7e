"""α's decoding paths side by side in one run: what each piece of the CPU decoding path saves.

Samplers of the same weights (bundled SmolLM2-135M, float32, CPU; P prompts × G completions, T_max
tokens, T = 1) that differ in one piece each:

- ``model``: ``decoder="model"``, the model's plain forward over its ``DynamicCache`` (F.linear);
- ``model, GEMM kernel``: the same with every ``nn.Linear`` of its α patched, *here only*, to call
  :func:`grpo_lab.lm.decoding.kernels.linear` (what the kernel gives without LeanDecoder);
- ``lean, F.linear``: :class:`~grpo_lab.lm.decoding.decoder.LeanDecoder` with torch's products;
- ``lean, GEMM kernel``: LeanDecoder with the kernel's products (the default, its weights on 2 MiB pages);
- ``lean, GEMM kernel, 4 KiB``: the default with α's packed buffer in plain memory.

1. **Sampling steps in lockstep** (what decides): every arm prefills the same prompts, then the arms take
   turns at every step (in a rotating order), each timed for one sampling step, as ``HFSampler`` runs
   it: the decoder's step, log-softmax at T, one draw. All are fed the same tokens (drawn from the
   first arm), so their caches hold the same sequences. Turns of tens of milliseconds put the load of a
   shared machine on every arm alike, where whole rollouts of seconds each do not. Printed: median ms per
   step over ``--rounds`` rollouts × (T_max − 1) steps, and for each piece the median of the paired
   ratios (with / without, step by step); a piece stays if it saves ≥ 10 % (ratio ≤ 0.90).
2. **Whole rollouts** (``HFSampler.sample``, same prompts and seed per round, arms in turn, a warm-up
   round first): median seconds per rollout and per decoding step, and the share of tokens each arm drew
   alike with the first (the sums' other orders can flip a draw at a boundary of the CDF)::

    python benchmarks/decoding.py [--G 8] [--prompts 2] [--tokens 32] [--rounds 10] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from grpo_lab.lm.build import build_loop
from grpo_lab.lm.decoding import kernels
from grpo_lab.lm.decoding.decoder import LeanDecoder
from grpo_lab.lm.policy import positions_from_mask
from grpo_lab.lm.sampling import HFSampler, draw_tokens, tokenize_prompts
from grpo_lab.lm.train_config import TrainConfig

PIECES = (("LeanDecoder (torch's products)", "lean, F.linear", "model"),
          ("LeanDecoder (kernel products)", "lean, GEMM kernel", "model, GEMM kernel"),
          ("GEMM kernel in LeanDecoder", "lean, GEMM kernel", "lean, F.linear"),
          ("GEMM kernel in the model", "model, GEMM kernel", "model"),
          ("2 MiB pages", "lean, GEMM kernel", "lean, GEMM kernel, 4 KiB"),
          ("the default path", "lean, GEMM kernel", "model"))
"""(piece, the arm with it, the arm without it)."""


def samplers(G: int, prompts: int, tokens: int) -> tuple[dict[str, HFSampler], list[str]]:
    """The arms of the module docstring, and ``prompts`` problems of the task to sample."""
    config = TrainConfig(G=G, prompts_per_step=prompts, max_completion_length=tokens, train_problems=50,
                         temperature=1.0)
    loop = build_loop(config)
    policy, tokenizer = loop.policy, loop.sampler.tokenizer
    default = loop.sampler
    if not (isinstance(default.decoder, LeanDecoder) and default.decoder.huge_pages and kernels.kernel() is not None):
        raise SystemExit("the default sampler is not LeanDecoder with the GEMM kernel on 2 MiB pages here")
    model_kernel = HFSampler(policy, tokenizer, tokens, decoder="model")
    for layer in model_kernel.model.modules():
        if isinstance(layer, torch.nn.Linear):
            layer.forward = lambda x, layer=layer: kernels.linear(x, layer.weight, layer.bias)
    torch_products = HFSampler(policy, tokenizer, tokens, decoder="lean")
    torch_products.decoder.linear = F.linear
    small_pages = HFSampler(policy, tokenizer, tokens, decoder="model")
    small_pages.decoder = LeanDecoder.from_model(small_pages.model, huge_pages=False)
    arms = {"model": HFSampler(policy, tokenizer, tokens, decoder="model"), "model, GEMM kernel": model_kernel,
            "lean, F.linear": torch_products, "lean, GEMM kernel": default, "lean, GEMM kernel, 4 KiB": small_pages}
    return arms, loop.task.prompts(prompts, torch.Generator().manual_seed(0))


@torch.no_grad()
def lockstep(arms: dict[str, HFSampler], batch: list[str], G: int, rounds: int) -> dict[str, list[float]]:
    """Seconds of each arm's sampling steps, the arms taking turns at every step (part 1 of the module
    docstring); ``rounds`` rollouts after a warm-up one, T_max − 1 steps each."""
    names = list(arms)
    first = arms[names[0]]
    T, steps = first.temperature, first.max_completion_length - 1
    prompt_ids, prompt_mask = tokenize_prompts(first.tokenizer, batch)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds + 1):
        torch.manual_seed(round_)
        logits = {}
        for name, sampler in arms.items():
            prefill = sampler.decoder.prefill(prompt_ids, prompt_mask, positions_from_mask(prompt_mask), steps + 1)
            sampler.decoder.repeat(G)
            logits[name] = prefill.repeat_interleave(G, dim=0)
        key_mask = prompt_mask.repeat_interleave(G, dim=0)
        position = key_mask.long().sum(1)
        for t in range(steps):
            token = draw_tokens(torch.log_softmax(logits[names[0]].float() / T, dim=-1))
            key_mask = torch.cat([key_mask, key_mask.new_ones(key_mask.shape[0], 1)], dim=1)
            shift = (round_ * steps + t) % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.perf_counter()
                logits[name] = arms[name].decoder.step(token, position + t, key_mask)
                draw_tokens(torch.log_softmax(logits[name].float() / T, dim=-1))
                if round_:
                    seconds[name].append(time.perf_counter() - start)
    return seconds


def report_lockstep(seconds: dict[str, list[float]]) -> None:
    print(f"1. sampling steps in lockstep: ms per step, median (and fastest) of {len(next(iter(seconds.values())))}")
    for name, values in seconds.items():
        print(f"  {name:26s} {statistics.median(values) * 1e3:7.1f}  ({min(values) * 1e3:.1f})")
    for piece, with_it, without in PIECES:
        ratio = statistics.median(a / b for a, b in zip(seconds[with_it], seconds[without], strict=True))
        print(f"  {piece:30s}: {with_it!r} / {without!r} = {ratio:.2f} (median of paired steps; "
              f"{'pays' if ratio <= 0.9 else 'does not pay'}: a piece stays at ≤ 0.90)")


def sample_in_turn(arms: dict[str, HFSampler], batch: list[str], G: int,
                   repeats: int) -> dict[str, list[tuple[float, torch.Tensor]]]:
    """For each arm, (seconds, completions) of ``repeats`` rounds; round r draws with seed r, the arms
    in an order rotated by r; a warm-up round first is not returned."""
    rounds: dict[str, list[tuple[float, torch.Tensor]]] = {name: [] for name in arms}
    names = list(arms)
    for repeat in range(repeats + 1):
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            start = time.perf_counter()
            rollout = arms[name].sample(batch, G, torch.Generator().manual_seed(repeat))
            if repeat:
                rounds[name].append((time.perf_counter() - start, rollout.completions))
    return rounds


def report_rollouts(rounds: dict[str, list[tuple[float, torch.Tensor]]]) -> None:
    first = list(rounds)[0]
    print(f"2. whole rollouts (HFSampler.sample), median of {len(rounds[first])}: s per rollout, ms per decoding "
          f"step, tokens alike with {first!r}")
    per_step: dict[str, float] = {}
    for name, values in rounds.items():
        same = total = 0
        for (_, a), (_, b) in zip(rounds[first], values, strict=True):
            if a.shape == b.shape:
                same, total = same + int((a == b).sum()), total + a.numel()
        steps = [seconds / drawn.shape[1] for seconds, drawn in values]
        per_step[name] = statistics.median(steps)
        print(f"  {name:26s} {statistics.median(s for s, _ in values):6.2f} {per_step[name] * 1e3:7.1f}  "
              f"{same:5d}/{total:<5d} (ms per step, each round: {', '.join(f'{v * 1e3:.0f}' for v in steps)})")
    for piece, with_it, without in PIECES:
        print(f"  {piece:30s}: {with_it!r} / {without!r} = {per_step[with_it] / per_step[without]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=10, help="rollouts of steps in lockstep (part 1)")
    parser.add_argument("--repeats", type=int, default=5, help="whole rollouts per arm (part 2)")
    args = parser.parse_args()
    arms, batch = samplers(args.G, args.prompts, args.tokens)
    print(f"G={args.G}, P={args.prompts}, T_max={args.tokens}, {torch.get_num_threads()} torch threads")
    report_lockstep(lockstep(arms, batch, args.G, args.rounds))
    report_rollouts(sample_in_turn(arms, batch, args.G, args.repeats))


if __name__ == "__main__":
    main()
