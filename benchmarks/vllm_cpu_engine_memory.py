"""The fixed memory cost of vLLM's CPU engine as the loop builds it: what the memory plan counts as
``VLLM_CPU_ENGINE_FIXED`` (``grpo_lab/lm/memory.py``).

In a fresh process per repeat, with vLLM imported first (its import is not the run's): a Qwen2 model with random
weights (float32, bfloat16 forwards, as the GPU recipes), then :func:`grpo_lab.lm.build.vllm_sampler` as
``build_loop`` calls it (the engine, its KV cache sized to one step, α's scorer copy, the first sync) and one
step's sampling. The resident set's high-water mark above the resident set before the sampler, less the terms the
plan counts by size (α's scorer copy W, the engine's weights in bfloat16, its KV cache), is the engine's fixed cost.
Two model sizes tell a fixed cost from one that grows with the weights. Run it in ``.venv-vllm`` (vLLM's CPU
build)::

    VLLM_ENABLE_V1_MULTIPROCESSING=0 OMP_NUM_THREADS=2 python benchmarks/vllm_cpu_engine_memory.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from gpu_acceptance import SMALL_MODEL, SMALL_RUN, problems, write_model  # noqa: E402

MODELS = {"small": SMALL_MODEL,
          "mid": {**SMALL_MODEL, "hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 12,
                  "num_attention_heads": 6, "num_key_value_heads": 2},
          "wide": {**SMALL_MODEL, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                   "num_attention_heads": 9, "num_key_value_heads": 3}}
"""The acceptance script's small model (20M parameters), one four times its weights, and one ten times (SmolLM2-135M's
layers on Qwen2.5's vocabulary)."""
PROMPT_TOKENS = 96


def resident(field: str) -> int:
    """``VmRSS`` or ``VmHWM`` of this process, bytes."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def measure(model_dir: Path) -> dict[str, float]:
    """One repeat, in this process: the sampler's peak above the loaded policy, and its parts."""
    import torch

    from grpo_lab.lm.build import vllm_sampler
    from grpo_lab.lm.memory import ModelShape, longest_prompt
    from grpo_lab.lm.models import load_policy
    from grpo_lab.lm.policy import LMPolicy
    from grpo_lab.lm.recipes import recipe
    from grpo_lab.lm.sampling_vllm import import_vllm, vllm_cpu_kv_cache_bytes
    from grpo_lab.lm.tasks import build_prompt

    import_vllm()
    config = recipe("gsm8k_qwen05b_offpolicy_v10", model=str(model_dir), device="cpu", sampler="vllm", **SMALL_RUN)
    model, tokenizer = load_policy(config.model, dtype=config.weights_dtype(), device="cpu")
    policy = LMPolicy(model, temperature=config.temperature, compute_dtype=config.compute_dtype())
    prompts = [build_prompt(p, tokenizer) for p in problems(model_dir, config.prompts_per_step, PROMPT_TOKENS)]
    prompt_tokens = longest_prompt(tokenizer, prompts)
    shape = ModelShape.of(model, policy.compute_dtype)
    Path("/proc/self/clear_refs").write_text("5")
    base = resident("VmRSS")
    sampler = vllm_sampler(config, policy, tokenizer, prompt_tokens)
    sampler.sample(prompts, config.G, torch.Generator().manual_seed(0))
    added = resident("VmHWM") - base
    engine_weights = shape.weights // shape.element_size * shape.compute_bytes
    kv_cache = vllm_cpu_kv_cache_bytes(shape, config.prompts_per_step * config.G,
                                       prompt_tokens + config.max_completion_length)
    return {"weights_mib": shape.weights / 2**20, "added_mib": added / 2**20,
            "file_pages_mib": resident("RssFile") / 2**20,
            "scorer_mib": shape.weights / 2**20, "engine_weights_mib": engine_weights / 2**20,
            "kv_cache_mib": kv_cache / 2**20,
            "fixed_mib": (added - shape.weights - engine_weights - kv_cache) / 2**20}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", choices=tuple(MODELS), default=list(MODELS))
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child)))
        return 0
    if "VLLM_CPU_KVCACHE_SPACE" in os.environ:
        raise SystemExit("unset VLLM_CPU_KVCACHE_SPACE: it overrides the KV cache the loop sizes")
    rows = []
    with tempfile.TemporaryDirectory(prefix="vllm_cpu_engine_") as tmp:
        for name in args.models:
            model_dir = Path(tmp) / name
            write_model(model_dir, MODELS[name])
            for repeat in range(args.repeats):
                done = subprocess.run([sys.executable, __file__, "--child", str(model_dir)], check=True,
                                      capture_output=True, text=True)
                rows.append({"model": name, "repeat": repeat, **json.loads(done.stdout.strip().splitlines()[-1])})
                print(json.dumps(rows[-1]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
