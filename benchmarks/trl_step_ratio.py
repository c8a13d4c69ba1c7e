"""P1, the step ratio: grpo_lab's loop against TRL's GRPOTrainer on the same work, side by side in one run.

Same model (bundled SmolLM2-135M, float32, CPU), same problems (add1, or ``--task``), G, prompts per step P,
max completion tokens, β and i = 1, temperature 1. The loop runs v = 1 (it syncs α every step,
a cost TRL does not pay without vLLM), and by default without the zero-variance mask
(``--mask off``) so that, like TRL, it trains every group. The two run interleaved, one step
each in turn, so machine noise hits both alike. Printed for each side, as medians over steps:

- the step split into sample (generation), reward, sync and train (everything else: the
  π_ref forward, the policy's forward and backward, the optimiser step);
- seconds per completion token (the two draw different completions, of different lengths);
- the training FLOP/s it reached, as a share of this machine's GEMM peak, measured in the
  same run with a float32 matmul micro-benchmark.

Training FLOPs are counted from the shapes each side ran: a forward costs 2·N_body per
token position it processes (N_body: the weights outside the embedding) plus 2·N_head per
position where logits are taken; backward costs twice the forward; the β > 0 reference
forward once more. Attention scores (under 2 % at these lengths) are left out.

    .venv/bin/python benchmarks/trl_step_ratio.py [--steps 5] [--G 8] [--prompts 2] [--tokens 32 128]
                                                   [--task gsm_symbolic] [--beta 0.04] [--mask off|on]

With vLLM's CPU engine as the loop's α (``--sampler vllm``; TRL's side is unchanged)::

    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python benchmarks/trl_step_ratio.py \
        --sampler vllm --tokens 128 --task gsm_symbolic --micro-batch 4 --trl-checkpointing off

Several ``--tokens`` budgets are measured one after another in one run, each side by side. Issue 38 §3
(where the lead holds as completions lengthen) runs ``--tokens 32 128 --task gsm_symbolic``: word problems whose
chain of thought uses the budget (add1's answers take ~5 tokens whatever the budget; add1 stays the default, the
P1 row's task). α decodes as the loop does (:class:`grpo_lab.lm.decoding.ModelDecoder`, the model's forward over
a KV cache preallocated for the rollout; the header line names it); ``benchmarks/decoding.py`` compares decoders.

Target: per-step ratio <= 0.5 (the loop at most half of TRL's step time).
"""

from __future__ import annotations

import argparse
import gc
import inspect
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

PARTS = ("sample", "reward", "sync", "train")


@dataclass
class Side:
    """One trainer's step function and what it measured, step by step."""

    step: Callable[[], None]
    parts: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in (*PARTS, "total")})
    tokens: list[int] = field(default_factory=list)
    flops: list[float] = field(default_factory=list)
    decoder: str = ""


def timed(function: Callable[..., Any], seconds: list[float]) -> Callable[..., Any]:
    """``function``, appending the seconds of each call to ``seconds``."""
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - start)
    return wrapper


def timed_once(function: Callable[[], Any]) -> float:
    """Seconds one call of ``function`` took."""
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def weight_counts(model: torch.nn.Module) -> tuple[int, int]:
    """(N_body, N_head): weights outside the input embedding, and the LM head's (tied or not)."""
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    body = sum(p.numel() for p in model.parameters() if p is not embedding and p is not head)
    return body, head.numel()


def forward_flops(n_body: int, n_head: int, positions: int, logit_positions: int) -> float:
    return 2.0 * (n_body * positions + n_head * logit_positions)


def gemm_peak(size: int = 2048, repeats: int = 5) -> float:
    """This machine's float32 matmul FLOP/s: the best of ``repeats`` [size × size] products."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    best = min(timed_once(lambda: torch.mm(a, b)) for _ in range(repeats))
    return 2.0 * size**3 / best


def task_for(args: argparse.Namespace, tokens: int) -> str:
    """The task of the ``tokens`` budget: ``--task`` (default add1) at every budget."""
    return args.task


def recipe_config(args: argparse.Namespace, tokens: int) -> Any:
    """The recipe both sides run (a speed benchmark: lr 1e-6, T = 1, so little changes step to step)."""
    from grpo_lab.lm.train_config import TrainConfig

    return TrainConfig(G=args.G, prompts_per_step=args.prompts, v=1, i=1, beta=args.beta, lr=1e-6,
                       temperature=1.0, max_completion_length=tokens, train_problems=200, steps=10**6,
                       mask_zero_variance=args.mask == "on", task=task_for(args, tokens),
                       micro_batch_size=args.micro_batch, sampler=args.sampler, seed=0)


def lab_side(args: argparse.Namespace, tokens: int) -> Side:
    from grpo_lab.lm.build import build_loop
    from grpo_lab.lm.policy import PACKED_INPUTS, inputs_used, packed_layout

    loop = build_loop(recipe_config(args, tokens))
    side = Side(step=lambda: None, decoder=type(getattr(loop.sampler, "decoder", loop.sampler)).__name__)
    n_body, n_head = weight_counts(loop.policy.model)
    rewards: list[float] = []
    loop.task.rewards = timed(loop.task.rewards, rewards)
    rollouts: list[Any] = []
    sample = loop.sampler.sample
    loop.sampler.sample = lambda *a, **k: rollouts.append(sample(*a, **k)) or rollouts[-1]

    def step() -> None:
        record = loop.step()
        rollout = rollouts.pop()
        trained_rows = rollout.mask.shape[0] if not record.skipped else 0
        # What LMPolicy runs (share_prompt): a sequence per prompt with its rows' inputs packed after it
        # (up to each row's last scored column), padded to the longest; logits at the scored tokens.
        ids, mask = rollout.extra["prompt_ids"], rollout.extra["prompt_mask"]
        start = int(mask.any(0).long().argmax())
        used = inputs_used(rollout.mask.bool())
        first, _, _, width = packed_layout(ids[:, start:], mask[:, start:], used, PACKED_INPUTS)
        positions = len(first) * width if trained_rows else 0
        logits = int(rollout.mask.sum()) if trained_rows else 0
        passes = 3 + (1 if args.beta > 0 else 0)
        side.flops.append(passes * forward_flops(n_body, n_head, positions, logits))
        side.tokens.append(int(rollout.mask.sum()))  # completion tokens drawn (TRL counts the same)
        total = record.sample_seconds + record.train_seconds + record.sync_seconds
        for part, seconds in (("sample", record.sample_seconds - rewards[-1]), ("reward", rewards[-1]),
                              ("sync", record.sync_seconds), ("train", record.train_seconds), ("total", total)):
            side.parts[part].append(seconds)

    side.step = step
    return side


def trl_side(args: argparse.Namespace, tokens: int) -> Side:
    from transformers import AutoTokenizer
    from trl import GRPOConfig as TRLGRPOConfig

    from grpo_lab.lm.models import bundled_model_dir
    from grpo_lab.lm.text_task import train_problems
    from grpo_lab.scale.launch import stock_trl_config, stock_trl_trainer

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir())
    config = recipe_config(args, tokens)
    # transformers 5.2x renamed gradient_checkpointing (the vllm-cpu extra pins 5.19, which has only the old name)
    checkpointing = next(name for name in ("activation_checkpointing", "gradient_checkpointing")
                         if name in inspect.signature(TRLGRPOConfig).parameters)
    trl_args = stock_trl_config(config, extras={
        "output_dir": tempfile.mkdtemp(), "use_cpu": True, "save_strategy": "no", "disable_tqdm": True,
        checkpointing: args.trl_checkpointing == "on"})
    accumulation, rows = trl_args.gradient_accumulation_steps, config.G * config.prompts_per_step
    trainer = stock_trl_trainer(config, str(bundled_model_dir()), tokenizer, train_problems(config), trl_args)
    trainer.create_optimizer_and_scheduler(num_training_steps=10**6)
    batches = iter(trainer.get_train_dataloader())
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = accumulation  # set by Trainer's loop, which we step by hand
    side = Side(step=lambda: None)
    n_body, n_head = weight_counts(trainer.model)
    generate_seconds: list[float] = []
    reward_seconds: list[float] = []
    shapes: list[tuple[int, int, int]] = []
    generate = timed(trainer._generate, generate_seconds)

    def counted_generate(prompts: list[Any]) -> Any:
        out = generate(prompts)
        prompt_ids, completion_ids = out[0], out[1]
        shapes.append((max(map(len, prompt_ids)), max(map(len, completion_ids)), sum(map(len, completion_ids))))
        return out

    trainer._generate = counted_generate
    trainer._calculate_rewards = timed(trainer._calculate_rewards, reward_seconds)

    def step() -> None:
        start = time.perf_counter()
        batch = next(batches)                  # the step's rows; generated by the first call, then buffered
        for _ in range(accumulation):
            trainer.training_step(trainer.model, batch, None)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad()
        total = time.perf_counter() - start
        prompt_length, completion_length, tokens = shapes.pop()
        # TRL runs every row's prompt + completion whole and takes logits at the completion's positions + 1.
        positions, logits = rows * (prompt_length + completion_length), rows * (completion_length + 1)
        passes = 3 + (1 if args.beta > 0 else 0)
        side.flops.append(passes * forward_flops(n_body, n_head, positions, logits))
        side.tokens.append(tokens)
        sample, reward = generate_seconds.pop(), reward_seconds.pop()
        for part, seconds in (("sample", sample), ("reward", reward), ("sync", 0.0),
                              ("train", total - sample - reward), ("total", total)):
            side.parts[part].append(seconds)

    side.step = step
    return side


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--tokens", type=int, nargs="+", default=[32], help="completion budgets, measured together")
    parser.add_argument("--task", default="add1", help="gsm_symbolic: answers that use 32-128 tokens")
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--beta", type=float, default=0.04)
    parser.add_argument("--mask", choices=("off", "on"), default="off",
                        help="the loop's zero-variance mask (off: every group trains, as in TRL)")
    parser.add_argument("--micro-batch", type=int, default=None,
                        help="rows per forward on both sides (default: the whole step; the loop's memory guard may "
                             "still shrink it, and says so); must divide G·P")
    parser.add_argument("--sampler", choices=("hf", "vllm"), default="hf",
                        help="the loop's α: transformers (hf) or vLLM's engine (vllm: run in .venv-vllm)")
    parser.add_argument("--trl-checkpointing", choices=("on", "off"), default="on",
                        help="TRL's gradient checkpointing (on: its default; the loop never recomputes)")
    args = parser.parse_args()
    if args.micro_batch is not None and (args.G * args.prompts) % args.micro_batch:
        parser.error(f"--micro-batch {args.micro_batch} does not divide G·P = {args.G * args.prompts}")
    peak = gemm_peak()
    for tokens in args.tokens:  # one budget at a time: two trainers in memory, not two per budget
        torch.manual_seed(0)
        sides = {"grpo_lab": lab_side(args, tokens), "trl": trl_side(args, tokens)}
        for side in sides.values():  # a warm-up step each, not kept
            side.step()
            for values in (*side.parts.values(), side.tokens, side.flops):
                values.clear()
        for _ in range(args.steps):  # the two in turn, so machine noise hits both alike
            for side in sides.values():
                side.step()
        report(args, tokens, sides, peak)
        del sides
        gc.collect()


def report(args: argparse.Namespace, tokens: int, sides: dict[str, Side], peak: float) -> None:
    """One budget's table: each side's median parts, seconds per token and FLOP/s, and the P1 ratios."""
    median = statistics.median
    print(f"G={args.G}, P={args.prompts}, tokens={tokens} ({task_for(args, tokens)}), beta={args.beta}, "
          f"mask={args.mask}, micro-batch {args.micro_batch or 'whole step'}, TRL checkpointing "
          f"{args.trl_checkpointing}, {args.steps} steps each, {torch.get_num_threads()} torch threads, α's decoder "
          f"{sides['grpo_lab'].decoder}; float32 GEMM "
          f"peak {peak / 1e9:.1f} GFLOP/s")
    print(f"{'':18s} " + " ".join(f"{p:>7s}" for p in (*PARTS, "total"))
          + "   s/token  tokens  train GFLOP/s (of peak)")
    for name, side in sides.items():
        parts = {p: median(v) for p, v in side.parts.items()}
        per_token = median(t / n for t, n in zip(side.parts["total"], side.tokens, strict=True))
        rate = median(f / t for f, t in zip(side.flops, side.parts["train"], strict=True))
        print(f"{name:18s} " + " ".join(f"{parts[p]:7.2f}" for p in (*PARTS, "total"))
              + f"   {per_token:7.4f}  {median(side.tokens):6.0f}  {rate / 1e9:8.1f} ({rate / peak:.0%})")
    trl = sides.pop("trl")
    for name, lab in sides.items():
        step_ratio = median(lab.parts["total"]) / median(trl.parts["total"])
        token_ratio = (median(t / n for t, n in zip(lab.parts["total"], lab.tokens, strict=True))
                       / median(t / n for t, n in zip(trl.parts["total"], trl.tokens, strict=True)))
        print(f"P1 ratio {name} / trl: {step_ratio:.2f} per step, {token_ratio:.2f} per completion token "
              f"(target <= 0.5 per step)")


if __name__ == "__main__":
    main()
