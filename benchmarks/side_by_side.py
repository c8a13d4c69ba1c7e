"""What the side-by-side benchmarks share: timing a call, and two samplers of one model taking turns.

``huge_pages.py`` and ``decode_gemm.py`` compare the default :class:`HFSampler` of the bundled
SmolLM2 (float32, CPU, as ``build_loop`` makes it) with one of the same weights built with other
arguments: the same prompts, the same seed per round, one sampler after the other, so machine
noise hits both alike. Imported by the scripts of this folder (Python puts a script's folder on
its path).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from grpo_lab.build import build_loop
from grpo_lab.sampling import HFSampler
from grpo_lab.train_config import TrainConfig


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
