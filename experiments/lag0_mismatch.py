"""The bfloat16 engine's mismatch at lag 0: a step behind, or rounding?

``results/offpolicy_split/split.json`` (vLLM bfloat16, v = 1, lr 1e-5) has ``mismatch_abs`` 0.038, 0.298 and
0.725 nats a token at steps 0–2, all at lag 0. This reruns that run (the CPU default, trainer in float32, α on
vLLM's CPU engine in bfloat16, v = 1) with the weights' proof on (``grpo_lab.fingerprint``: every sync proved or
``SyncError``), and per step, on the step's batch:

* ``mismatch``  mean |log π_k − log α|          π_k the trainer at the weights just pushed (lag 0)
* ``behind``    mean |log π_{k−1} − log α|      the trainer at the previous step's weights: ≈ 0 if the engine
                                                 still served them, and > ``mismatch`` if it serves π_k's
* ``emulated``  mean |log π_k^bf16 − log π_k|   the trainer's own model in bfloat16 (weights and activations):
                                                 the size rounding alone gives, without vLLM's kernels
* the three tokens with the largest |log π_k − log α| and their log-probs, and per layer the relative
  difference of the residual stream between the float32 and the bfloat16 forwards (the emulation), on the
  step with the largest mismatch: where rounding grows.

Needs vLLM (``.venv-vllm`` from ``make setup-vllm``)::

    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=1 \\
        .venv-vllm/bin/python experiments/lag0_mismatch.py [--steps 4] [--out results/offpolicy_split/lag0.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any


class KeepsBatch:
    """The sampler, keeping the last batch it sampled (everything else passes through)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.last = inner, None

    def sample(self, prompts: Any, group_size: int, generator: Any) -> Any:
        self.last = self.inner.sample(prompts, group_size, generator)
        return self.last

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("results/offpolicy_split/lag0.json"))
    args = parser.parse_args()

    import torch

    from grpo_lab.lm.build import build_loop
    from grpo_lab.lm.models import bundled_model_dir, load_policy
    from grpo_lab.lm.policy import LMPolicy
    from grpo_lab.lm.recipes import recipe
    from grpo_lab.lm.sampling_vllm import VLLMSampler

    config = recipe("cpu_arith_smollm2", steps=args.steps, prompts_per_step=2, dtype="float32", v=1,
                    sampler="vllm", offpolicy_split=True, sync_audit=True, checkpoint_every=0)
    model, tokenizer = load_policy(config.model, dtype=torch.float32)
    sampler = KeepsBatch(VLLMSampler(
        LMPolicy(model, config.temperature, share_prompt=config.share_prompt), tokenizer, str(bundled_model_dir()),
        config.max_completion_length, config.temperature, seed=config.seed, dtype="bfloat16",
        engine_kwargs={"max_model_len": 512, "enforce_eager": True}))
    loop = build_loop(config, sampler=sampler)
    emulator = copy.deepcopy(loop.policy).to(torch.bfloat16)  # π_k in bfloat16: weights and activations
    start, steps, previous = time.perf_counter(), [], None
    for _ in range(args.steps):
        before = {n: p.detach().clone() for n, p in loop.policy.model.state_dict().items()}
        record = loop.step()                                   # syncs (v = 1), proves, samples, trains
        batch, every = sampler.last, slice(None)
        with torch.no_grad():
            after = {n: p.detach().clone() for n, p in loop.policy.model.state_dict().items()}
            loop.policy.model.load_state_dict(before)          # π_k: the weights the sync pushed
            logp_k = loop.policy.logprobs(batch, every)
            emulator.model.load_state_dict(before)
            logp_bf16 = emulator.logprobs(batch, every).float()
            logp_prev = None
            if previous is not None:
                loop.policy.model.load_state_dict(previous)
                logp_prev = loop.policy.logprobs(batch, every)
            loop.policy.model.load_state_dict(after)
        mask = batch.mask
        gap = (logp_k - batch.logp_alpha)[mask].abs()
        top = gap.topk(min(3, gap.numel()))
        steps.append({
            "step": record.step, "lag": record.lag, "weights_audit": record.weights_audit,
            "probe_audit": record.probe_audit, "tokens": int(mask.sum()),
            "mismatch": float(gap.mean()), "mismatch_logged": record.mismatch_abs,
            "behind": None if logp_prev is None else float((logp_prev - batch.logp_alpha)[mask].abs().mean()),
            "emulated": float((logp_bf16 - logp_k)[mask].abs().mean()),
            "mismatch_without_top3": float((gap.sum() - top.values.sum()) / max(gap.numel() - len(top.values), 1)),
            "top_tokens": [{"gap": float(v), "log_pi_k": float(logp_k[mask][i]),
                            "log_alpha": float(batch.logp_alpha[mask][i])} for v, i in zip(top.values, top.indices)],
            "batch": batch})
        previous = before
        print({k: v for k, v in steps[-1].items() if k != "batch"}, flush=True)
    worst = max(steps, key=lambda s: s["mismatch"])
    layers = layer_gaps(loop.policy, emulator, worst["batch"])
    print(f"residual-stream relative difference fp32 vs bf16 per layer (step {worst['step']}):",
          [round(x, 4) for x in layers], flush=True)
    result = {"command": shlex.join([Path(sys.executable).name, *sys.argv]), "date": time.strftime("%Y-%m-%d"),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads",
              "seconds": round(time.perf_counter() - start),
              "settings": {"model": config.model, "task": config.task, "G": config.G, "P": config.prompts_per_step,
                           "max_completion_length": config.max_completion_length, "lr": config.lr, "v": 1,
                           "trainer_dtype": "float32", "engine_dtype": "bfloat16"},
              "steps": [{k: v for k, v in s.items() if k != "batch"} for s in steps],
              "layer_relative_difference": {"step": worst["step"], "per_layer": layers}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


def layer_gaps(policy: Any, emulator: Any, batch: Any) -> list[float]:
    """Per layer ℓ (embedding = 0, then each block), ‖h_ℓ^bf16 − h_ℓ^fp32‖ / ‖h_ℓ^fp32‖ over the batch's
    prompt + completion tokens, the bfloat16 model at π_θ's current weights (cast)."""
    import torch

    emulator.model.load_state_dict(policy.model.state_dict())
    ids = torch.cat([batch.extra["prompt_ids"], batch.completions], dim=1)
    attention = torch.cat([batch.extra["prompt_mask"], batch.mask.long()], dim=1)
    with torch.no_grad():
        full = policy.model(input_ids=ids, attention_mask=attention, output_hidden_states=True).hidden_states
        half = emulator.model(input_ids=ids, attention_mask=attention, output_hidden_states=True).hidden_states
    keep = attention.bool()[..., None]
    return [float(((h.float() - f) * keep).norm() / (f * keep).norm()) for f, h in zip(full, half, strict=True)]


if __name__ == "__main__":
    main()
