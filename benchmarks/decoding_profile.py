"""Where one decoding step of α goes, against its floors, measured in one run.

α samples G = 8 completions of P = 2 prompts (``benchmarks/trl_step_ratio.py``'s recipe: T = 1, no cut;
``gsm_symbolic`` at 128 tokens by default). The decoding loop (after the prefill) is timed plain, then run again
under the same seed with clocks on its parts (hooks cost a little: the parts are given per step of the clocked
run, next to the plain step):

- *layer GEMMs*: the decoder layers' q, k, v, o, gate, up and down projections;
- *KV-cache updates*: the cache's ``update`` (a ``DynamicCache`` concatenates each layer's keys and values);
- *rest of the layers*: attention, norms, rotary, activations and the Python between them;
- *forward outside the layers*: embedding, the attention-mask build, rotary tables, final norm, output wrapping;
- *LM head*: the vocabulary projection at the last position;
- *log-softmax*, and *temperature, cut and draw*: :func:`~grpo_lab.lm.sampling.sample_next` split in two;
- *loop glue*: the rest of the loop (stop test, mask growth, token bookkeeping).

The floors, from this run's own measurements: *compute* = 2 · N · B FLOP at the float32 GEMM peak (N: the weights
one token multiplies, LM head included; B rows); *memory* = the float32 weights read once at the read bandwidth
(a sum over 1 GiB). *Dispatch* is the aten operators one step launches (counted by ``torch.profiler``) times the
cost of one small operator here: what a step costs that no arithmetic needs.

    python benchmarks/decoding_profile.py [--tokens 128] [--task gsm_symbolic] [--threads 2] [--decoder model]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from decoding import DECODERS

from grpo_lab.lm import sampling
from grpo_lab.lm.decoding import PreallocatedLayer

PARTS = ("layer GEMMs", "KV-cache updates", "rest of the layers", "forward outside the layers", "LM head",
         "log-softmax", "temperature, cut and draw", "loop glue")


def build_sampler(tokens: int, task: str) -> tuple[Any, list[str]]:
    """The P1 recipe's sampler and its first P = 2 prompts."""
    from grpo_lab.lm.build import build_loop
    from grpo_lab.lm.train_config import TrainConfig

    config = TrainConfig(G=8, prompts_per_step=2, v=1, i=1, beta=0.0, lr=1e-6, temperature=1.0,
                         max_completion_length=tokens, train_problems=200, steps=10**6, task=task, seed=0)
    loop = build_loop(config)
    return loop.sampler, [loop.task.prompt_of[id(p)] for p in loop.task.problems[:config.prompts_per_step]]


def seconds(function: Callable[[], Any]) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def gemm_peak(size: int = 2048, repeats: int = 5) -> float:
    """float32 matmul FLOP/s: the best of ``repeats`` [size × size] products."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    return 2.0 * size**3 / min(seconds(lambda: torch.mm(a, b)) for _ in range(repeats))


def read_bandwidth(gib: float = 1.0, repeats: int = 5) -> float:
    """Bytes/s read by a sum over ``gib`` GiB of float32 (the best of ``repeats``)."""
    x = torch.ones(int(gib * 2**30 / 4))
    x.sum()
    return x.numel() * 4 / min(seconds(x.sum) for _ in range(repeats))


def small_op_seconds(repeats: int = 20_000) -> float:
    """Seconds one small aten operator costs here (an add of two [16, 1, 576] tensors): dispatch, not arithmetic."""
    a, b = torch.randn(16, 1, 576), torch.randn(16, 1, 576)
    for _ in range(1000):
        torch.add(a, b)
    return seconds(lambda: [torch.add(a, b) for _ in range(repeats)]) / repeats


class Clocks:
    """Seconds per part, summed while ``running`` (the decoding loop, after the prefill)."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.running = False

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.running:
                self.total[name] += time.perf_counter() - start

    def wrap(self, function: Callable[..., Any], part: str) -> Callable[..., Any]:
        def clocked(*args: Any, **kwargs: Any) -> Any:
            with self.part(part):
                return function(*args, **kwargs)
        return clocked

    def hook(self, module: torch.nn.Module, part: str) -> list[Any]:
        """Hooks adding ``module``'s forward time to ``part``."""
        starts: list[float] = []

        def post(*_: Any) -> None:
            if self.running:
                self.total[part] += time.perf_counter() - starts[-1]
            starts.pop()

        return [module.register_forward_pre_hook(lambda *_: starts.append(time.perf_counter())),
                module.register_forward_hook(post)]


def sample_with(sampler: Any, prompts: list[str], seed: int, clocks: Clocks) -> Any:
    """One sampling call with ``clocks`` running from the end of the prefill's repeat to the loop's end."""
    decoder, decode = sampler.decoder, sampler._decode
    repeat = decoder.repeat

    started: list[float] = []

    def repeat_then_run(*args: Any) -> None:
        repeat(*args)
        clocks.running = True
        started.append(time.perf_counter())

    def decode_and_stop(*args: Any) -> Any:
        try:
            return decode(*args)
        finally:
            clocks.total["loop"] += time.perf_counter() - started.pop()
            clocks.running = False

    decoder.repeat, sampler._decode = repeat_then_run, decode_and_stop
    try:
        return sampler.sample(prompts, 8, torch.Generator().manual_seed(seed))
    finally:
        del decoder.repeat, sampler._decode


def plain_loop_seconds(sampler: Any, prompts: list[str], seed: int) -> tuple[float, int]:
    """The decoding loop's seconds (nothing but the end marks) and the steps it ran (tokens per row)."""
    clocks = Clocks()
    rollout = sample_with(sampler, prompts, seed, clocks)
    return clocks.total["loop"], rollout.completions.shape[1]


def ops_per_step(sampler: Any, prompts: list[str], seed: int, tokens: int = 8) -> float:
    """Top-level aten operators a decoding step launches: one forward's plus one draw's (``torch.profiler`` over a
    rollout of ``tokens`` tokens: its events take ~0.1 GB a step, and a step's operators do not depend on length)."""
    decoder, next_token = sampler.decoder, sampling.sample_next
    step, budget = decoder.step, sampler.max_completion_length

    def marked(function: Callable[..., Any], name: str) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            with torch.profiler.record_function(name):
                return function(*args)
        return run

    decoder.step, sampling.sample_next = marked(step, "forward"), marked(next_token, "draw")
    sampler.max_completion_length = tokens
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            sampler.sample(prompts, 8, torch.Generator().manual_seed(seed))
    finally:
        del decoder.step
        sampling.sample_next = next_token
        sampler.max_completion_length = budget

    def region(event: Any) -> str | None:
        parent = event.cpu_parent
        while parent is not None and parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        return None if parent is None else parent.name

    events = prof.events()
    calls = {name: sum(e.name == name for e in events) for name in ("forward", "draw")}
    top = [region(e) for e in events if e.name.startswith("aten::")
           and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    return sum(top.count(name) / calls[name] for name in calls)


def clocked_parts(sampler: Any, prompts: list[str], seed: int, steps: int) -> dict[str, float]:
    """Seconds per decoding step of each part of :data:`PARTS`, from a clocked run (same seed)."""
    from transformers import cache_utils

    clocks = Clocks()
    model, decoder = sampler.model, sampler.decoder
    layers = model.model.layers
    hooks = [h for layer in layers for m in layer.modules() if isinstance(m, torch.nn.Linear)
             for h in clocks.hook(m, "layer GEMMs")]
    hooks += [h for layer in layers for h in clocks.hook(layer, "layers")]
    hooks += clocks.hook(model.lm_head, "LM head")
    cache_layers = (cache_utils.DynamicLayer, cache_utils.StaticLayer, PreallocatedLayer)
    updates = [layer.update for layer in cache_layers]
    next_token, logits_seen = sampling.sample_next, []
    for layer, update in zip(cache_layers, updates, strict=True):
        layer.update = clocks.wrap(update, "KV-cache updates")
    decoder.step = clocks.wrap(decoder.step, "forward")
    sampling.sample_next = clocks.wrap(lambda logits, *a: logits_seen.append(logits) or next_token(logits, *a),
                                       "sample_next")
    try:
        sample_with(sampler, prompts, seed, clocks)
    finally:
        for h in hooks:
            h.remove()
        for layer, update in zip(cache_layers, updates, strict=True):
            layer.update = update
        del decoder.step
        sampling.sample_next = next_token
    t = clocks.total
    logits = logits_seen[len(logits_seen) // 2]
    log_softmax = min(seconds(lambda: torch.log_softmax(logits.float() / sampler.temperature, -1)) for _ in range(20))
    draws = len(logits_seen) - 1  # the first token is drawn from the prefill's logits, before the clocks run
    parts = {
        "layer GEMMs": t["layer GEMMs"],
        "KV-cache updates": t["KV-cache updates"],
        "rest of the layers": t["layers"] - t["layer GEMMs"] - t["KV-cache updates"],
        "forward outside the layers": t["forward"] - t["layers"] - t["LM head"],
        "LM head": t["LM head"],
        "log-softmax": log_softmax * draws,
        "temperature, cut and draw": t["sample_next"] - log_softmax * draws,
        "loop glue": t["loop"] - t["forward"] - t["sample_next"],
    }
    return {part: value / steps for part, value in parts.items()} | {"clocked step": t["loop"] / steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--task", default="gsm_symbolic")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="plain loops timed (the median is kept)")
    parser.add_argument("--decoder", choices=list(DECODERS), default="model", help="as in benchmarks/decoding.py")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sampler, prompts = build_sampler(args.tokens, args.task)
    sampler.sample(prompts, 8, torch.Generator().manual_seed(1))  # warm-up of the model's forward
    reference = sampler.sample(prompts, 8, torch.Generator().manual_seed(0)) if args.decoder != "model" else None
    sampler.decoder = DECODERS[args.decoder](sampler.model)
    plain = sorted(plain_loop_seconds(sampler, prompts, 0) for _ in range(args.repeats))[args.repeats // 2]
    loop_seconds, steps = plain
    parts = clocked_parts(sampler, prompts, 0, steps)
    ops = ops_per_step(sampler, prompts, 0)
    model = sampler.model
    n_weights = sum(p.numel() for p in model.model.layers.parameters()) + model.lm_head.weight.numel()
    rows = 8 * len(prompts)
    peak, bandwidth, small_op = gemm_peak(), read_bandwidth(), small_op_seconds()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    step = loop_seconds / steps
    floors = {"compute": 2.0 * n_weights * rows / peak, "memory": weight_bytes / bandwidth,
              "dispatch": ops * small_op}
    print(f"{args.task}, {args.tokens} tokens, B = {rows} rows, {steps} decoding steps, {args.threads} torch threads; "
          f"GEMM peak {peak / 1e9:.0f} GFLOP/s, read bandwidth {bandwidth / 1e9:.0f} GB/s, "
          f"small op {small_op * 1e6:.1f} µs")
    print(f"decoding step, plain: {step * 1e3:.1f} ms; clocked: {parts.pop('clocked step') * 1e3:.1f} ms")
    for part in PARTS:
        print(f"  {part:28s} {parts[part] * 1e3:7.2f} ms")
    if reference is not None:  # the arm's draws against the model's forward, same seed
        drawn = sampler.sample(prompts, 8, torch.Generator().manual_seed(0))
        same = (drawn.completions == reference.completions).all(1)
        gap = (drawn.logp_alpha - reference.logp_alpha)[same].abs().max().item() if same.any() else float("nan")
        print(f"against the model's forward, seed 0: {int(same.sum())}/{len(same)} rows drew the same tokens; "
              f"max |Δ log α| on them {gap:.1e}")
    for name, floor in floors.items():
        extra = f" ({ops:.0f} aten ops a step)" if name == "dispatch" else ""
        print(f"floor, {name:9s} {floor * 1e3:7.2f} ms; plain step = {step / floor:.1f}× it{extra}")


if __name__ == "__main__":
    main()
