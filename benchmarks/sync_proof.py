"""The weights' proof's cost against the sync it checks (target: ≤ 10 % of the sync).

Times, interleaved over the repeats so both see the same machine load, a sampler's ``sync(policy)`` and its
``prove_sync(policy, k)`` (:mod:`grpo_lab.fingerprint`: both sides' fingerprints and their comparison) on the
bundled SmolLM2-135M, float32 trainer, π_θ nudged before each sync so every sync moves real bytes. Prints the
medians and proof / sync. ``--sampler vllm`` needs vLLM (``.venv-vllm``, ``make setup-vllm``). On the HF sampler
every other sync also times the per-tensor path the one-gather comparison replaced (``prove`` of each side's
CRC-32s, :func:`grpo_lab.fingerprint.served_elements`), so the two are measured in one run::

    python benchmarks/sync_proof.py [--sampler hf|vllm] [--engine-dtype float32|bfloat16] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from grpo_lab.lm.models import bundled_model_dir, load_policy
from grpo_lab.lm.policy import LMPolicy

TARGET = 0.10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sampler", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--engine-dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    model, tokenizer = load_policy("smollm2-135m", dtype=torch.float32)
    policy = LMPolicy(model, 0.7)
    if args.sampler == "hf":
        from grpo_lab.lm.sampling import HFSampler

        sampler = HFSampler(policy, tokenizer, 8)
        label = f"HFSampler ({type(sampler.decoder).__name__})"
    else:
        from grpo_lab.lm.sampling_vllm import VLLMSampler

        sampler = VLLMSampler(policy, tokenizer, str(bundled_model_dir()), 8, dtype=args.engine_dtype,
                              engine_kwargs={"max_model_len": 128, "enforce_eager": True})
        label = f"VLLMSampler ({args.engine_dtype} engine)"
    syncs, proofs, per_tensor = [], [], []
    for k in range(2 * args.repeats if args.sampler == "hf" else args.repeats):
        with torch.no_grad():
            for p in policy.parameters():
                p.add_(1e-4 * p.abs().mean())
        start = time.perf_counter()
        sampler.sync(policy)
        syncs.append(time.perf_counter() - start)
        start = time.perf_counter()
        if k % 2 and args.sampler == "hf":
            prove_per_tensor(sampler, policy, k)
            per_tensor.append(time.perf_counter() - start)
        else:
            sampler.prove_sync(policy, k)
            proofs.append(time.perf_counter() - start)
    sync, proof = statistics.median(syncs), statistics.median(proofs)
    print(f"{label}, SmolLM2-135M fp32 trainer, {torch.get_num_threads()} torch threads, load "
          f"{os.getloadavg()[0]:.1f}: sync {sync * 1e3:.1f} ms, proof {proof * 1e3:.1f} ms (medians of "
          f"{len(proofs)}); proof / sync = {proof / sync:.2f} (target ≤ {TARGET})")
    if per_tensor:
        print(f"per-tensor path (CRC-32 a tensor a side): {statistics.median(per_tensor) * 1e3:.1f} ms = "
              f"{statistics.median(per_tensor) / sync:.2f} of the sync")


def prove_per_tensor(sampler: object, policy: LMPolicy, step: int) -> None:
    """The HF sampler's proof by :func:`prove` over both sides' per-tensor CRC-32s (the path before one gather)."""
    from grpo_lab.fingerprint import prove, served_elements
    from grpo_lab.lm.sampling import named_tensors

    sources = dict(named_tensors(policy.model, remove_duplicate=False))
    prove(served_elements(named_tensors(sampler.model, remove_duplicate=False), step), sources, step)


if __name__ == "__main__":
    main()
