"""The training path on a CUDA device: parity with the CPU, and the (v, i) loop end to end (a GPU check).

Runs where no model can be downloaded: the models are **built from a config** with random weights (the shapes of
SmolLM2-135M and of Qwen2.5-0.5B) and take the tokenizer of a local directory (``--tokenizer``: any model folder
with ``tokenizer.json``, e.g. the bundled SmolLM2's, :func:`grpo_lab.lm.models.bundled_model_dir`). Two checks:

1. **Parity.** One rollout sampled on the CPU (SmolLM2's shapes, fp32) is scored by π_θ on the CPU and on the
   device, with prompt sharing on and off; the report gives max |Δ log π| between them and the relative difference
   of the gradients of Σ A·log π (the policy-gradient term). fp32 on both devices should agree to float rounding;
   bf16 on the device is reported against fp32 for scale.
2. **The loop.** :func:`grpo_lab.lm.build.build_loop` on the device in bf16 (mixed precision: float32 weights,
   bfloat16 forwards), v = 4, with
   ``empty_step="skip_after_backward"`` (random weights earn no reward, so every group is zero-variance; this
   setting still runs the forward and backward), the sync proof and the behavioural probe on: the steps' seconds,
   the audit's verdicts, and the peak device memory the run added to π_θ's weights beside what the memory guard
   (:func:`grpo_lab.lm.memory.estimate_memory`) planned for it.

Prints one JSON object (and writes it to ``--out`` if given)::

    python benchmarks/cuda_check.py --tokenizer DIR [--steps 8] [--device cuda] [--out report.json]

``--device cpu`` runs the same code on the CPU in fp32 only (a dry run: ``--shapes smollm2-135m``).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from grpo_lab.lm.build import build_loop
from grpo_lab.lm.memory import Device, ModelShape, estimate_memory, longest_prompt
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.sampling import HFSampler
from grpo_lab.lm.tasks import Problem, build_prompt
from grpo_lab.lm.train_config import TrainConfig

SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
                         max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5),
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6),
}
"""Architectures of the two models the notebooks name, as their ``config.json`` gives them."""


def build_model(shape: str, tokenizer: Any, dtype: torch.dtype, device: str, seed: int = 0) -> torch.nn.Module:
    """A causal LM of ``shape`` with random weights (seeded), its special ids the tokenizer's."""
    fields = dict(SHAPES[shape])
    model_type = fields.pop("model_type")
    config = AutoConfig.for_model(model_type, **fields, bos_token_id=tokenizer.bos_token_id,
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=dtype).to(device)


def problems(n: int = 16) -> list[Problem]:
    """Sums of one-digit numbers, as the CPU recipe's ``add1`` asks them (no reasoning-gym needed)."""
    return [Problem(f"What is {a} + {b}?", str(a + b), f"check:{a}+{b}", "number")
            for a, b in ((k % 10, (3 * k + 1) % 10) for k in range(n))]


def parity(tokenizer: Any, device: str, tokens: int) -> dict[str, Any]:
    """Check 1 (module docstring): one CPU rollout scored on the CPU and on ``device``."""
    cpu = build_model("smollm2-135m", tokenizer, torch.float32, "cpu")
    sampler = HFSampler(LMPolicy(cpu), tokenizer, tokens, temperature=1.0)
    prompts = [build_prompt(p, tokenizer, None) for p in problems(4)]
    rollout = sampler.sample(prompts, 8, torch.Generator().manual_seed(0))
    rows = slice(0, rollout.completions.shape[0])
    advantage = torch.randn(rollout.completions.shape[0], 1, generator=torch.Generator().manual_seed(1))

    def score(model: torch.nn.Module, share_prompt: bool) -> tuple[torch.Tensor, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        logp = LMPolicy(model, share_prompt=share_prompt).logprobs(rollout, rows)
        (advantage * logp.float() * rollout.mask).sum().backward()
        grad = torch.cat([p.grad.float().flatten().cpu() for p in model.parameters()])
        return logp.detach().float().cpu(), grad

    def compare(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> dict[str, float]:
        mask = rollout.mask.bool()
        return {"max_abs_logp": float((a[0] - b[0])[mask].abs().max()),
                "grad_rel": float((a[1] - b[1]).norm() / b[1].norm())}

    reference = score(cpu, True)
    report: dict[str, Any] = {"tokens_scored": int(rollout.mask.sum()), "cpu_fp32_whole": compare(score(cpu, False),
                                                                                                   reference)}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))[:2 if device == "cuda" else 1]:
        moved = copy.deepcopy(cpu).to(dtype=dtype, device=device)
        report[f"{device}_{name}_packed"] = compare(score(moved, True), reference)
        report[f"{device}_{name}_whole"] = compare(score(moved, False), reference)
    return report


def loop_run(shape: str, tokenizer: Any, device: str, steps: int, tokens: int) -> dict[str, Any]:
    """Check 2 (module docstring): ``steps`` steps of the loop on ``device`` in bf16 at ``shape``."""
    dtype = "bfloat16" if device == "cuda" else "float32"
    config = TrainConfig(model=f"config:{shape}", device=device, dtype=dtype, G=8, prompts_per_step=4, v=4,
                         lr=1e-6, steps=steps, max_completion_length=tokens, temperature=1.0,
                         empty_step="skip_after_backward", eval_problems=1)
    model = build_model(shape, tokenizer, config.weights_dtype(), device)
    weights = torch.cuda.memory_allocated() if device == "cuda" else 0
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    loop = build_loop(config, model=model, tokenizer=tokenizer, problems=problems())
    prompt_length = longest_prompt(tokenizer, loop.task.prompt_of.values())
    estimate = estimate_memory(ModelShape.of(model, loop.policy.compute_dtype), loop.config, prompt_length,
                               loop.micro_batch_size, Device.of(device))  # the device's plan, at the loop's m
    records, seconds = [], []
    for _ in range(steps):
        start = time.perf_counter()
        records.append(loop.step())
        if device == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return {"shape": shape, "dtype": dtype, "steps": steps, "params": sum(p.numel() for p in model.parameters()),
            "step_seconds": [round(s, 4) for s in seconds],
            "peak_added_gib": (torch.cuda.max_memory_allocated() - weights) / 2**30 if device == "cuda" else None,
            "guard_estimate_gib": estimate.new / 2**30, "weights_gib": weights / 2**30,
            "synced_steps": [r.step for r in records if r.synced],
            "weights_audit": sorted({r.weights_audit for r in records if r.synced}),
            "probe_audit": sorted({r.probe_audit for r in records if r.synced}),
            "masked_frac": [r.masked_frac for r in records], "num_tokens": [r.num_tokens for r in records],
            "grad_norm": [r.grad_norm for r in records]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="a local folder with tokenizer.json")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32, help="max completion tokens")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch sees no CUDA device")

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    report = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "parity": parity(tokenizer, args.device, args.tokens),
              "loop": [loop_run(shape, tokenizer, args.device, args.steps, args.tokens) for shape in args.shapes]}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
