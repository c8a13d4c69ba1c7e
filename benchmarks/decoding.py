"""Does α's decoding path show in a whole loop step? The model's plain forward against what the libraries
give, side by side in one run.

Loops of the same recipe and seed differ only in α's decoder:

- ``model``: :class:`~grpo_lab.lm.decoding.ModelDecoder`, the model's forward over a ``DynamicCache`` whose layers
  write into buffers sized for the rollout (the sampler's path; attention as the model loads, SDPA for the bundled
  model);
- ``dynamic``: the same forward over the cache the model makes itself (layers that concatenate at every step);
- ``static``: the same forward over transformers' ``StaticCache``, keys and values preallocated for the
  prompt and T_max tokens, the attention mask of that fixed width;
- ``compiled``: ``static`` with the decoding step's forward under ``torch.compile`` (dynamic shapes, so one
  compilation serves every prompt length; it happens in the warm-up step);
- ``packed``: the model's forward with its linear layers on oneDNN-packed weights during the steps;
- ``packed_static``: both.

``benchmarks/decoding_profile.py --decoder ARM`` splits one arm's decoding step and checks its draws against
``model``'s under one seed.

The loops step in turn (a rotating order), so the machine's noise hits every arm alike. Each loop step is
Algorithm 1's whole step (sync, sampling, rewards, train). Printed per completion budget and thread count:
median seconds per step and per sampling, the median tokens per step (the work: every arm draws from the
same weights, so their lengths agree up to a draw flipped by rounding), and each arm's median paired ratio
to ``model``. A path stays only if it saves ≥ 10 % of a whole step (ratio ≤ 0.90)::

    python benchmarks/decoding.py [--steps 6] [--threads 1 2] [--tokens 8 128] [--prompts 2]
                                  [--arms model dynamic packed static compiled]

``--tokens 8``: the CPU recipe (add1, 8 tokens). ``--tokens 128``: gsm_symbolic's chain of thought.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from grpo_lab.lm.decoding import ModelDecoder


class StaticCacheDecoder(ModelDecoder):
    """The model's forward over transformers' ``StaticCache`` (benchmark only): one preallocated cache of
    the prompt's length + T_max per rollout; ``compiled`` puts the step's forward under ``torch.compile``."""

    def __init__(self, model: torch.nn.Module, compiled: bool = False) -> None:
        super().__init__(model)
        self.forward = torch.compile(model.forward, dynamic=True) if compiled else model.forward
        self.width = 0

    def prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, positions: torch.Tensor,
                max_new_tokens: int) -> torch.Tensor:
        from transformers import StaticCache

        self.width = prompt_ids.shape[1] + max_new_tokens
        self.cache = StaticCache(config=self.model.config, max_cache_len=self.width)
        return self.model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions, use_cache=True,
                          logits_to_keep=1, **{self.cache_kwarg: self.cache}).logits[:, -1]

    def repeat(self, group_size: int) -> None:
        for layer in self.cache.layers:  # StaticLayer has no batch_repeat_interleave
            layer.keys = layer.keys.repeat_interleave(group_size, dim=0)
            layer.values = layer.values.repeat_interleave(group_size, dim=0)
            layer.batch_size *= group_size

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        mask = F.pad(key_mask, (0, self.width - key_mask.shape[1]))  # the cache's fixed width, 0 on empty slots
        return self.forward(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions[:, None],
                            use_cache=True, logits_to_keep=1, **{self.cache_kwarg: self.cache}).logits[:, -1]


class DynamicCacheDecoder(ModelDecoder):
    """The model's forward over the ``DynamicCache`` it makes itself (benchmark only: the sampler's path before
    :class:`~grpo_lab.lm.decoding.PreallocatedLayer`)."""

    def prefill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, positions: torch.Tensor,
                max_new_tokens: int) -> torch.Tensor:
        out = self.model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions,
                         use_cache=True, logits_to_keep=1)
        self.cache = getattr(out, self.cache_kwarg)
        return out.logits[:, -1]


class PackedDecoder(ModelDecoder):
    """The model's forward with every ``nn.Linear`` on a oneDNN-packed copy of its weight during the steps (benchmark
    only): packed once per rollout at :meth:`repeat`, so the steps read each weight once instead of re-packing it
    per call. Same size as the weights (MKL's own packed GEMM, ``torch.ops.mkl._mkl_linear``, gives equal floats but
    its copies are 2–21× the weights: 2.7 GB for SmolLM2-135M)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self.packed: list[tuple[torch.nn.Linear, torch.Tensor]] = []

    def repeat(self, group_size: int) -> None:
        super().repeat(group_size)
        rows = self.cache.layers[0].keys.shape[0]
        self.packed = [(m, torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), rows))
                       for m in self.model.modules() if isinstance(m, torch.nn.Linear)]

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        with self.packed_linears():
            return super().step(tokens, positions, key_mask)

    def release(self) -> None:
        super().release()
        self.packed = []

    @contextmanager
    def packed_linears(self) -> Iterator[None]:
        for module, packed in self.packed:
            module.forward = (lambda m, w: lambda x: torch.ops.mkldnn._linear_pointwise(x, w, m.bias, "none", [], ""))(
                module, packed)
        try:
            yield
        finally:
            for module, _ in self.packed:
                del module.forward


class PackedStaticDecoder(PackedDecoder, StaticCacheDecoder):
    """``static`` with the linear layers on MKL-packed weights (benchmark only)."""


DECODERS = {"model": ModelDecoder, "dynamic": DynamicCacheDecoder, "packed": PackedDecoder,
            "static": StaticCacheDecoder, "packed_static": PackedStaticDecoder,
            "compiled": lambda model: StaticCacheDecoder(model, compiled=True)}


def loops(tokens: int, arms: list[str], prompts: int | None = None) -> dict[str, Any]:
    """One loop per arm, the same recipe and seed: add1 at ≤ 8 tokens, gsm_symbolic above; P = ``prompts`` if
    given (P1's recipe draws 2, the CPU recipe 4). Each loop's ``drawn`` lists the completion tokens of its
    rollouts."""
    from grpo_lab.lm.build import build_loop
    from grpo_lab.lm.recipes import recipe

    task = {"task": "add1"} if tokens <= 8 else {"task": "gsm_symbolic"}
    built = {}
    for arm in arms:
        loop = build_loop(recipe("cpu_arith_smollm2", v=1, max_completion_length=tokens, steps=10**6,
                                 train_problems=200, micro_batch_size=4, **task,  # one m for every arm
                                 **({} if prompts is None else {"prompts_per_step": prompts})))
        loop.sampler.decoder = DECODERS[arm](loop.sampler.model)
        loop.drawn, sample = [], loop.sampler.sample
        loop.sampler.sample = lambda *a, loop=loop, sample=sample: loop.drawn.append(sample(*a)) or loop.drawn[-1]
        built[arm] = loop
    return built


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tokens", type=int, nargs="+", default=[8, 128])
    parser.add_argument("--arms", nargs="+", choices=list(DECODERS), default=list(DECODERS))
    parser.add_argument("--prompts", type=int, default=None, help="P (default: the recipe's 4; P1's recipe: 2)")
    args = parser.parse_args()
    arms = ["model", *[arm for arm in args.arms if arm != "model"]]
    for tokens in args.tokens:
        built = loops(tokens, arms, args.prompts)
        print(f"T_max {tokens}: attention {built['model'].sampler.model.config._attn_implementation}", flush=True)
        for threads in args.threads:
            torch.set_num_threads(threads)
            seconds: dict[str, list[float]] = {arm: [] for arm in arms}
            sampling: dict[str, list[float]] = {arm: [] for arm in arms}
            work: dict[str, list[int]] = {arm: [] for arm in arms}
            for k in range(args.steps + 1):  # step 0: the warm-up (and compilation), not kept
                for arm in arms[k % len(arms):] + arms[:k % len(arms)]:
                    start = time.perf_counter()
                    record = built[arm].step()
                    if k:
                        seconds[arm].append(time.perf_counter() - start)
                        sampling[arm].append(record.sample_seconds)
                        work[arm].append(int(built[arm].drawn[-1].mask.sum()))
            print(f"T_max {tokens:4d}, {threads} thread(s): " + ", ".join(
                f"{arm} {statistics.median(seconds[arm]):.2f} s/step (sampling {statistics.median(sampling[arm]):.2f}"
                f" s, {statistics.median(work[arm]):.0f} tokens)" for arm in arms), flush=True)
            for arm in arms[1:]:
                ratio = statistics.median(a / b for a, b in zip(seconds[arm], seconds["model"], strict=True))
                print(f"  {arm}/model = {ratio:.2f} per whole step (median of paired steps; "
                      f"{'pays' if ratio <= 0.9 else 'does not pay'}: a path stays at ≤ 0.90)", flush=True)


if __name__ == "__main__":
    main()
