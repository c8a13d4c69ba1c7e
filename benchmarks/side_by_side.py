"""What the side-by-side benchmarks share: timing a call, and two samplers of one model taking turns.

``huge_pages.py``, ``decode_gemm.py`` and ``lean_decoder.py`` compare the default :class:`HFSampler` of the bundled
SmolLM2 (float32, CPU, as ``build_loop`` makes it) with one of the same weights built with other
arguments: the same prompts, the same seed per round, one sampler after the other, so machine
noise hits both alike. Imported by the scripts of this folder (Python puts a script's folder on
its path).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from grpo_lab.lm.build import build_loop
from grpo_lab.lm.sampling import HFSampler
from grpo_lab.lm.train_config import TrainConfig


def sampling_parser(doc: str) -> argparse.ArgumentParser:
    """The options of the sampling benchmarks (the P1 batch by default), described by the first
    paragraph of the script's docstring ``doc``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    return parser


def timed_once(function: Callable[[], Any]) -> float:
    """Seconds one call of ``function`` took."""
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def two_samplers(G: int, prompts: int, tokens: int, **variant: Any) -> tuple[HFSampler, HFSampler, list[str]]:
    """The default sampler, one of the same weights built with ``variant`` (HFSampler keywords), and
    ``prompts`` problems of the task to sample."""
    config = TrainConfig(G=G, prompts_per_step=prompts, max_completion_length=tokens, train_problems=50,
                         temperature=1.0)
    loop = build_loop(config)
    other = HFSampler(loop.policy, loop.sampler.tokenizer, tokens, **variant)
    return loop.sampler, other, loop.task.prompts(prompts, torch.Generator().manual_seed(0))


def sample_in_turn(samplers: dict[str, HFSampler], batch: list[str], G: int,
                   repeats: int) -> dict[str, list[tuple[float, torch.Tensor]]]:
    """For each sampler, (seconds, completions) of ``repeats`` rounds; round r draws with seed r, and a
    warm-up round before them is not returned."""
    rounds: dict[str, list[tuple[float, torch.Tensor]]] = {name: [] for name in samplers}
    for repeat in range(repeats + 1):
        for name, sampler in samplers.items():
            start = time.perf_counter()
            rollout = sampler.sample(batch, G, torch.Generator().manual_seed(repeat))
            if repeat:
                rounds[name].append((time.perf_counter() - start, rollout.completions))
    return rounds


def per_decoding_step(rounds: dict[str, list[tuple[float, torch.Tensor]]], title: str) -> dict[str, float]:
    """Print and return each sampler's median seconds per decoding step over :func:`sample_in_turn`'s
    rounds, with the share of tokens the first two drew alike (float sums in another order can flip a
    draw at a boundary of the CDF, and a flipped completion may end sooner)."""
    first, second = list(rounds)[:2]
    same = total = 0
    for (_, a), (_, b) in zip(rounds[first], rounds[second], strict=True):
        if a.shape == b.shape:
            same, total = same + int((a == b).sum()), total + a.numel()
    per_step = {name: [s / drawn.shape[1] for s, drawn in values] for name, values in rounds.items()}
    median = {name: statistics.median(t) for name, t in per_step.items()}
    print(f"{title}: ms per decoding step, median of {len(rounds[first])}; identical tokens {same}/{total}")
    for name, values in per_step.items():
        print(f"  {name:14s}: {median[name] * 1e3:.0f} ms  ({', '.join(f'{v * 1e3:.0f}' for v in values)})")
    print(f"  ratio {first} / {second}: {median[first] / median[second]:.2f}")
    return median
