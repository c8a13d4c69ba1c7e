"""Staleness vs mismatch: log r′ = log(π_k/π_sync) + log(π_sync/α) along short runs, per step (notebook 03 §3).

π_sync is the trainer's forward at the weights of the last sync (``GRPOConfig.offpolicy_split``): the first
term is what the lag adds (π_θ moved since the sync), the second what the engine adds at equal weights (its
kernels, its dtype). Runs of the CPU default (bundled SmolLM2-135M on one-digit additions, T = 0.7, lr 1e-5)
with the trainer in float32 and α on vLLM's CPU engine in bfloat16 and in float32, at v = 1 and v = 4, and
on the in-process HF sampler in float32; every run with the sync audit on. Writes
``results/offpolicy_split/split.json`` (:func:`grpo_lab.scale.throughput.split_path`), which the notebook
draws. Needs vLLM for the engine runs (``.venv-vllm`` from ``make test-vllm``); one thread is the faster on a
shared 2-core machine::

    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 OMP_NUM_THREADS=1 \\
        .venv-vllm/bin/python experiments/offpolicy_split.py [--steps 8] [--prompts 2] [--samplers vllm hf]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

RECORD_KEYS = ("step", "lag", "synced", "skipped", "staleness_abs", "mismatch_abs", "staleness_share",
               "log_ratio_k_abs")
"""What each step's record keeps (no timings: this measures log-probs, and a shared machine's seconds say little)."""
VS = (1, 4)
ENGINE_DTYPES = ("bfloat16", "float32")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=2, help="P, prompts per step (G = 8)")
    parser.add_argument("--samplers", nargs="+", default=["vllm", "hf"], choices=["vllm", "hf"])
    parser.add_argument("--out", type=Path, default=None, help="default: results/offpolicy_split/split.json")
    args = parser.parse_args()

    import torch

    from grpo_lab.lm.build import build_loop
    from grpo_lab.lm.models import bundled_model_dir, load_policy
    from grpo_lab.lm.policy import LMPolicy
    from grpo_lab.lm.recipes import recipe
    from grpo_lab.scale.throughput import split_path, split_summary

    out = args.out or split_path()
    base = recipe("cpu_arith_smollm2", steps=args.steps, prompts_per_step=args.prompts, dtype="float32",
                  offpolicy_split=True, sync_audit=True, checkpoint_every=0)
    plan = [("vllm", dtype, v) for dtype in ENGINE_DTYPES for v in VS if "vllm" in args.samplers]
    plan += [("hf", "float32", v) for v in VS if "hf" in args.samplers]
    runs, engines, start = [], {}, time.perf_counter()
    for sampler_name, engine_dtype, v in plan:
        config = base.replace(v=v, sampler=sampler_name)
        name = f"{'vLLM' if sampler_name == 'vllm' else 'HF'} {engine_dtype}, v={v}"
        if sampler_name == "vllm" and engine_dtype not in engines:
            engines.clear()
            gc.collect()  # one engine at a time: vLLM keeps one set of process groups per process
            from grpo_lab.lm.sampling_vllm import VLLMSampler

            model, tokenizer = load_policy(config.model, dtype=torch.float32)
            policy = LMPolicy(model, config.temperature, share_prompt=config.share_prompt)
            engines[engine_dtype] = VLLMSampler(
                policy, tokenizer, str(bundled_model_dir()), config.max_completion_length, config.temperature,
                seed=config.seed, dtype=engine_dtype, engine_kwargs={"max_model_len": 512, "enforce_eager": True})
        loop = build_loop(config, sampler=engines.get(engine_dtype) if sampler_name == "vllm" else None)
        records = [{key: getattr(r, key) for key in RECORD_KEYS} for r in loop.run()]
        summary = split_summary(records)
        runs.append({"name": name, "sampler": sampler_name, "engine_dtype": engine_dtype, "v": v,
                     "records": records, "summary": summary})
        print(f"{name:22} mismatch {summary['mismatch_abs']:.2e}; staleness at lag ≥ 1 "
              f"{summary['staleness_abs_lagged'] or 0:.2e} (share {summary['staleness_share_lagged'] or 0:.2f})",
              flush=True)
        del loop
        gc.collect()
    engines.clear()
    settings = {key: getattr(base, key) for key in ("model", "task", "G", "prompts_per_step", "max_completion_length",
                                                     "temperature", "lr", "steps", "seed")}
    result = {"command": shlex.join([Path(sys.executable).name, *sys.argv]), "date": time.strftime("%Y-%m-%d"),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads",
              "seconds": round(time.perf_counter() - start),
              "settings": {**settings, "trainer_dtype": "float32"}, "runs": runs}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out} ({result['seconds']} s)")


if __name__ == "__main__":
    main()
