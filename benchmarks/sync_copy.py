"""Sync cost: does ``HFSampler.sync`` (α ← π_θ) cost what copying its bytes costs?

A sync (α ← π_θ) is what v amortises (docs/theory.md §5, §7). In process it should be
nothing but a memory copy; this measures it side by side with two plain
``torch`` copies of the same bytes, interleaved over the repeats so that both
see the same machine load:

* ``flat``    — one preallocated flat tensor ``dst.copy_(src)`` of equal size (the floor);
* ``foreach`` — ``torch._foreach_copy_`` over per-parameter clones (the same tensor layout).

It prints the medians and ``sync / flat`` (target ≤ 1.3×). The model is the
bundled SmolLM2-135M (``grpo_lab.lm.models.load_policy``) when it loads offline,
else a random Llama of the same shape (~135M parameters); the output says which.

    python benchmarks/sync_copy.py [--repeats 20] [--device cpu|cuda] [--dtype float32|bfloat16] [--threads N]

On a CPU shared with other work, per-tensor copies with several threads stall
on each parallel region; ``--threads 1`` shows the copy without that noise.
"""

from __future__ import annotations

import argparse
import statistics
import time
import types
from collections.abc import Callable

import torch

from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.sampling import HFSampler

TARGET_RATIO = 1.3


def load_model(dtype: torch.dtype, device: str) -> tuple[torch.nn.Module, object, str]:
    """SmolLM2-135M if it loads offline, else a random Llama of its shape; returns (model, tokenizer, label)."""
    try:
        from grpo_lab.lm.models import load_policy
        model, tokenizer = load_policy("smollm2-135m", dtype=dtype, device=device)
        return model, tokenizer, "bundled SmolLM2-135M-Instruct (dequantised GGUF)"
    except (ImportError, FileNotFoundError, OSError, ValueError) as exc:
        from transformers import LlamaConfig, LlamaForCausalLM
        config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                             num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                             bos_token_id=1, eos_token_id=2, pad_token_id=2)
        model = LlamaForCausalLM(config).to(device=device, dtype=dtype)
        # sync never tokenises: a stand-in with the ids HFSampler reads is enough
        tokenizer = types.SimpleNamespace(pad_token_id=2, eos_token_id=2)
        return model, tokenizer, f"random Llama of SmolLM2-135M's shape (bundled model unavailable: {exc!r:.80})"


def timer(device: str) -> Callable[[Callable[[], object]], float]:
    def run(fn: Callable[[], object]) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)

    model, tokenizer, label = load_model(dtype, args.device)
    policy = LMPolicy(model)
    sampler = HFSampler(policy, tokenizer, max_completion_length=1)
    tensors = [*policy.model.parameters(), *policy.model.buffers()]
    with torch.no_grad():  # write once, as the first optimiser step does: loaded weights may be a
        for t in tensors:  # copy-on-write map of the safetensors file, slower to read until written
            t.mul_(1)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    src = torch.empty(nbytes, dtype=torch.uint8, device=args.device).random_()
    dst = torch.empty_like(src)
    clones_src = [t.detach().clone() for t in tensors]
    clones_dst = [t.detach().clone() for t in tensors]

    measure = timer(args.device)
    cases = {
        "sync": lambda: sampler.sync(policy),
        "flat": lambda: dst.copy_(src),
        "foreach": lambda: torch._foreach_copy_(clones_dst, clones_src),
    }
    for fn in cases.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, fn in cases.items():
            times[name].append(measure(fn))
    assert sampler.sync(policy) == nbytes

    median = {name: statistics.median(t) for name, t in times.items()}
    print(f"model: {label}")
    print(f"device {args.device}, dtype {args.dtype}, {torch.get_num_threads()} CPU threads, "
          f"{len(tensors)} tensors, {nbytes / 2**20:.1f} MiB, {args.repeats} repeats (medians)")
    for name, seconds in median.items():
        print(f"  {name:8s} {seconds * 1e3:9.3f} ms   {nbytes / seconds / 2**30:7.2f} GiB/s   "
              f"(min {min(times[name]) * 1e3:.3f} ms)")
    ratio = median["sync"] / median["flat"]
    verdict = "met" if ratio <= TARGET_RATIO else "NOT met"
    print(f"sync / flat copy = {ratio:.2f}x (target <= {TARGET_RATIO}x: {verdict})")


if __name__ == "__main__":
    main()
