"""The GPU acceptance check: one step of each route of the GSM8K recipe on one device, and what must hold there.

At the shapes of ``grpo_lab/configs/gsm8k_qwen05b_offpolicy_v10.yaml`` (read from it: P = 16, G = 8, T = 512,
micro-batch 16, v, lr, β, ε; bfloat16 mixed precision) on Qwen2.5-0.5B's architecture with random weights, it runs
one step of each route (``--routes``): ``hf``, the loop (:func:`grpo_lab.lm.build.build_loop`) with the in-process
sampler; ``vllm``, the loop with vLLM's engine as α (in this process); ``trl``, the TRL adapter with vLLM colocated,
in a process of its own as in a run. The JSON's ``checks`` hold, by part and route, numbers and a verdict:

- ``step``: the step trained, its sync was proved, and a vLLM engine ran in the compute dtype;
- ``sync_proof``: after α ← π_θ the weights' proof passes; after π_θ moves without a sync it fails;
- ``log_alpha``: max and mean |log α − log π| per token, log α from the sampler and log π from the trainer's forward
  of the same weights, within the compute dtype's :data:`LOGP_TOLERANCE`;
- ``memory`` (the loop's routes): the memory plan keeps the recipe's micro-batch, and the bytes the run added at
  its peak (``torch.cuda.max_memory_allocated`` on a GPU, peak RSS on a CPU) stay within the plan ``build_loop``
  made (:func:`memory_check`: its device, and α where it samples: vLLM's share of a GPU, a CPU engine's terms).

Nothing is downloaded: the model is built from its config; the tokenizer is byte-level, with Qwen2.5's ChatML
specials at its ids and a token for every other id (whatever a random model samples decodes); each prompt is a sum
repeated to :data:`PROMPT_TOKENS` (assumed for a long GSM8K prompt: random weights only see the length); the reward
is made up (:func:`made_up_reward`) so that groups vary and the step trains. It writes one JSON file (provenance,
the commit from git, else ``$GRPO_LAB_COMMIT``; shapes; checks; seconds per part) and exits 1 if a check failed.
On a GPU (about 10 minutes of an 80 GB card)::

    python benchmarks/gpu_acceptance.py --out $OUT/gpu_acceptance.json

with the ``gpu`` extra installed (``pip install -e ".[llm,trl,gpu]"``: CUDA torch, transformers, TRL, vLLM,
datasets, accelerate); ``--routes hf`` needs only torch, transformers, PyYAML and psutil. Without CUDA (or with
``--small``) the same code runs at small shapes (:data:`SMALL_RUN`, :data:`SMALL_MODEL`) on the CPU, as CI does
(``tests/test_gpu_acceptance.py``, ``make test-vllm``); there TRL's engine gets ``VLLM_CPU_KVCACHE_SPACE=1``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's grpo_lab, installed or not (a GPU machine may hold only the copy)
    sys.path.insert(0, str(ROOT))

from grpo_lab.lm.memory import longest_prompt  # noqa: E402
from grpo_lab.lm.recipes import recipe  # noqa: E402
from grpo_lab.lm.tasks import Problem, build_prompt  # noqa: E402
from grpo_lab.lm.train_config import DTYPES, TrainConfig  # noqa: E402
from grpo_lab.sync_audit import SyncError  # noqa: E402

RECIPE = "gsm8k_qwen05b_offpolicy_v10"
QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
                  rms_norm_eps=1e-6, tie_word_embeddings=True)
"""Qwen2.5-0.5B-Instruct's architecture, as its ``config.json`` gives it."""
SMALL_MODEL = {**QWEN25_05B, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
               "num_attention_heads": 2, "num_key_value_heads": 1}
"""Small mode: Qwen2.5's vocabulary and head size (64) in two narrow layers."""
SMALL_RUN = dict(prompts_per_step=2, G=4, max_completion_length=8, micro_batch_size=4)
"""Small mode: the recipe with these fields changed (two micro-batches a step; the recipe has eight)."""
PROMPT_TOKENS = {"full": 192, "small": 96}
SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LOGP_TOLERANCE = {torch.float32: (1e-4, 2e-3), torch.bfloat16: (0.1, 1.5)}
"""(mean, max) |log α − log π| per token allowed at equal weights, by compute dtype: the real-engine tests'
(tests/test_vllm_engine.py; measured there: float32 mean 1.5e-5, max 2e-4; bfloat16 mean 0.03–0.06, max ~0.5)."""
UNSYNCED_MOVE = 1e-2
"""Added to every weight of π_θ, without a sync, before the proof that must then fail."""
TRL_SECONDS = 900
"""The TRL route's process is stopped after this long (a hung engine must not take the whole GPU session)."""
ROUTES = ("hf", "vllm", "trl")
PARTS = ("step", "sync_proof", "log_alpha", "memory")


def made_up_reward(text: str) -> float:
    """The last bit of the CRC-32 of a completion's text: a fair coin per text, so a group of random completions
    almost always holds both rewards."""
    return float(zlib.crc32(text.encode()) % 2)


def write_model(directory: Path, shape: dict[str, Any]) -> int:
    """A Qwen2 causal LM of ``shape`` with random weights (seed 0) and the byte-level tokenizer (module docstring),
    saved in ``directory`` as a run loads a model (float32 safetensors). Returns its parameter count."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # the 256 bytes, then tokens of 2 and 3 bytes
    words = itertools.chain(*(map("".join, itertools.product(alphabet, repeat=n)) for n in (1, 2, 3)))
    ids = (i for i in range(shape["vocab_size"]) if i not in SPECIALS.values())
    tokenizer = Tokenizer(models.BPE({**dict(zip(words, ids, strict=False)), **SPECIALS}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"], padding_side="left")
    fast.chat_template = CHATML
    fast.save_pretrained(directory)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**shape, bos_token_id=SPECIALS["<|endoftext|>"],
                                         eos_token_id=SPECIALS["<|im_end|>"], pad_token_id=SPECIALS["<|endoftext|>"]))
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def problems(model_dir: Path, n: int, prompt_tokens: int) -> list[Problem]:
    """``n`` sums in GSM8K's answer format, each question repeated until its prompt is ``prompt_tokens`` long."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    overhead = len(tokenizer(build_prompt(Problem("", "", ""), tokenizer))["input_ids"])
    out = [Problem((f"What is {k % 10} + {3 * k % 10}? " * prompt_tokens)[:prompt_tokens - overhead],
                   str(k % 10 + 3 * k % 10), f"sum:{k}") for k in range(n)]
    if longest_prompt(tokenizer, [build_prompt(p, tokenizer) for p in out]) != prompt_tokens:
        raise RuntimeError(f"the prompts are not {prompt_tokens} tokens long")
    return out


def run_config(small: bool, model_dir: Path, output_dir: Path) -> TrainConfig:
    """The recipe, one step long, on this model and device (:data:`SMALL_RUN` applied when ``small``)."""
    return recipe(RECIPE, model=str(model_dir), device="cuda" if torch.cuda.is_available() else "cpu", steps=1,
                  checkpoint_every=0, output_dir=str(output_dir), **(SMALL_RUN if small else {}))


class PeakMemory:
    """Bytes added at the peak since construction: torch's allocator on a GPU, the resident set on a CPU (its
    high-water mark reset through ``/proc/self/clear_refs``)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            Path("/proc/self/clear_refs").write_text("5")
            self.base = self._status("VmRSS")

    def added(self) -> int:
        if self.cuda:
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - self.base
        return self._status("VmHWM") - self.base

    @staticmethod
    def _status(field: str) -> int:
        line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
        return int(line.split()[1]) * 1024


def memory_check(loop: Any, config: TrainConfig, added: int) -> dict[str, Any]:
    """The memory plan ``build_loop`` made, at the loop's micro-batch: on the loop's device, with α where the loop
    samples it (:func:`~grpo_lab.lm.build.sampler_layout`: in torch, in vLLM's share of the GPU, or in a CPU
    engine), against the bytes the run added. π_θ's weights, loaded while measured, count on both sides, and so does
    a GPU engine's share: its weights and KV cache are allocated through torch."""
    from grpo_lab.lm.build import sampler_layout
    from grpo_lab.lm.memory import Device, ModelShape, estimate_memory

    policy = loop.policy
    shape = ModelShape.of(policy.model, policy.compute_dtype)
    prompt_tokens = longest_prompt(loop.task.tokenizer, loop.task.prompt_of.values())
    device, layout = Device.of(policy.device), sampler_layout(config, policy, prompt_tokens)
    estimate = estimate_memory(shape, config, prompt_tokens, loop.micro_batch_size, device, layout)
    planned = shape.weights + estimate.new + math.ceil(layout.vllm_share * device.memory)
    checks = {"recipe_micro_batch": loop.micro_batch_size == config.micro_batch_size, "within_plan": added <= planned}
    return {"passed": all(checks.values()), "checks": checks, "micro_batch_size": loop.micro_batch_size,
            "device": device.name, "layout": str(layout), "plan": estimate.summary(),
            "planned_gib": planned / 2**30, "measured_gib": added / 2**30, "measured_over_planned": added / planned}


def gap_check(gaps: torch.Tensor, dtype: torch.dtype) -> dict[str, Any]:
    """|log α − log π| of the sampled tokens (1-D) against :data:`LOGP_TOLERANCE` of ``dtype``."""
    gaps = gaps.detach().double().abs().cpu()
    mean_tol, max_tol = LOGP_TOLERANCE[dtype]
    mean, most = (float(gaps.mean()), float(gaps.max())) if gaps.numel() else (math.nan, math.nan)
    return {"passed": bool(gaps.numel()) and mean <= mean_tol and most <= max_tol, "tokens": gaps.numel(),
            "mean_abs": mean, "max_abs": most, "tolerance": {"dtype": str(dtype), "mean": mean_tol, "max": max_tol}}


def sync_proof(sync: Callable[[], Any], prove: Callable[[int], bool], parameters: Iterable[torch.Tensor],
               k: int) -> dict[str, Any]:
    """α ← π_θ, and the weights' proof at step k passes (``prove``: True when it proved, a SyncError when the
    weights differ); then π_θ moves by :data:`UNSYNCED_MOVE` without a sync, and the proof at k + 1 must raise."""
    start = time.perf_counter()
    sync()
    synced = time.perf_counter()
    proved = prove(k)
    proof_seconds = time.perf_counter() - synced
    with torch.no_grad():
        for p in parameters:
            p.add_(UNSYNCED_MOVE)
    try:
        prove(k + 1)
        caught = False  # it passed weights that differ, or could not run
    except SyncError:
        caught = True
    return {"passed": proved and caught, "checks": {"proved_after_sync": proved, "caught_unsynced_move": caught},
            "sync_seconds": synced - start, "proof_seconds": proof_seconds}


def loop_route(config: TrainConfig, prompts: list[Problem], found: dict[str, Any]) -> None:
    """Route 1 or 2 (``config.sampler``): one step of the loop, then its memory, log α and the sync proof."""
    from grpo_lab.lm.build import build_loop

    if config.sampler == "vllm":
        from grpo_lab.lm.sampling_vllm import import_vllm

        import_vllm()  # the import's memory is not the run's
    meter = PeakMemory(config.torch_device())
    loop = build_loop(config, problems=prompts)
    loop.task.reward_fn = lambda text, problem, finished: made_up_reward(text)
    rollouts, sample = [], loop.sampler.sample
    loop.sampler.sample = lambda *args: rollouts.append(sample(*args)) or rollouts[-1]  # the step's batch, kept
    start = time.perf_counter()
    record = loop.step()
    seconds = time.perf_counter() - start
    found["memory"] = memory_check(loop, config, meter.added())
    dtype, engine = loop.policy.compute_dtype, getattr(loop.sampler, "llm", None)
    engine_dtype = None if engine is None else engine.llm_engine.model_config.dtype
    checks = {"trained": not record.skipped and record.grad_norm > 0 and math.isfinite(record.loss),
              "sync_proved": record.weights_audit == "proved"}
    if engine is not None:
        checks["engine_dtype"] = engine_dtype == dtype
    found["step"] = {"passed": all(checks.values()), "checks": checks, "step_seconds": seconds,
                     "engine_dtype": str(engine_dtype), **{name: getattr(record, name) for name in (
                         "reward_mean", "masked_frac", "loss", "grad_norm", "num_tokens", "ratio_k_max",
                         "log_ratio_k_abs", "weights_audit", "probe_audit", "sample_seconds", "train_seconds",
                         "sync_seconds", "audit_seconds")}}
    rollout, size = rollouts[0], loop.micro_batch_size
    with torch.no_grad():  # α's weights, scored by the trainer's forward
        recomputed = torch.cat([loop.sampler.synced_logprobs(rollout, slice(s, s + size))
                                for s in range(0, rollout.completions.shape[0], size)])
    found["log_alpha"] = gap_check((rollout.logp_alpha - recomputed)[rollout.mask], dtype)

    def prove(k: int) -> bool:
        loop.sampler.prove_sync(loop.policy, k)  # returns only if it proved
        return True

    found["sync_proof"] = sync_proof(lambda: loop.sampler.sync(loop.policy), prove, loop.policy.parameters(), loop.k)


def trl_route(config: TrainConfig, prompts: list[Problem], found: dict[str, Any]) -> None:
    """Route 3: one step of the TRL adapter, colocated, as ``scale.launch`` builds it; then log α and the proof."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from grpo_lab.scale.launch import trl_args
    from grpo_lab.scale.trl import OffPolicyGRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(config.model)
    texts = [build_prompt(p, tokenizer) for p in prompts]
    extras = dict(use_vllm=True, vllm_mode="colocate", vllm_enforce_eager=config.device == "cpu", disable_tqdm=True,
                  vllm_max_model_length=longest_prompt(tokenizer, texts) + config.max_completion_length)
    meter = PeakMemory(config.torch_device())
    trainer = OffPolicyGRPOTrainer(
        model=config.model, args=trl_args(config, extras, num_processes=1), train_dataset=Dataset.from_dict(
            {"prompt": texts}), reward_funcs=lambda completions, **_: [made_up_reward(c) for c in completions])
    gaps, compute_loss = [], trainer._compute_loss

    def loss_and_gap(model: torch.nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        with torch.no_grad():  # one step: every micro-batch is scored at the weights α was synced to
            logp = trainer._logps(model, inputs)
        alpha = inputs["sampling_per_token_logps"]
        gaps.append((alpha - logp)[inputs["sampled_mask"].bool() & torch.isfinite(alpha)])
        return compute_loss(model, inputs)

    trainer._compute_loss = loss_and_gap
    start = time.perf_counter()
    trainer.train()
    seconds, added = time.perf_counter() - start, meter.added()
    log = next(row for row in trainer.state.log_history if "loss" in row)
    dtype, engine_dtype = DTYPES[config.dtype], trainer.vllm_generation.llm.llm_engine.model_config.dtype
    checks = {"trained": math.isfinite(log["loss"]) and log.get("grad_norm", 0.0) > 0,
              "sync_proved": trainer.sync_steps == [0] and log.get("off_policy/sync_proved") == 1.0,
              "engine_dtype": engine_dtype == dtype}
    found["step"] = {"passed": all(checks.values()), "checks": checks, "step_seconds": seconds,
                     "engine_dtype": str(engine_dtype), "peak_added_gib": added / 2**30,
                     **{k: v for k, v in log.items() if isinstance(v, (int, float))}}
    found["log_alpha"] = gap_check(torch.cat(gaps), dtype)
    found["sync_proof"] = sync_proof(trainer._sync_sampler, lambda k: trainer._prove_sync(k) == 1.0,  # 0: not run
                                     trainer.model.parameters(), trainer._k)


def trl_in_own_process(model_dir: Path, small: bool, found: dict[str, Any]) -> None:
    """Route 3 in a child process (TRL's colocated engine builds its own process group, as in a run)."""
    out = model_dir.parent / "trl.json"
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", **os.environ}
    if not torch.cuda.is_available():
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # TRL's CPU engine would take a share of the host's memory
    command = [sys.executable, __file__, "--trl-worker", str(model_dir), "--out", str(out)]
    try:
        done = subprocess.run(command + (["--small"] if small else []), env=env, check=False, timeout=TRL_SECONDS)
    except subprocess.TimeoutExpired as error:
        raise RuntimeError(f"the TRL route's process ran past {TRL_SECONDS} s and was stopped") from error
    if not out.is_file():
        raise RuntimeError(f"the TRL route's process exited {done.returncode} without a result (its output is above)")
    found.update(json.loads(out.read_text()))


def run_route(route: Callable[..., None], *args: Any) -> dict[str, Any]:
    """``route(*args, found)``; each part it did not reach gets the error that stopped it, and the next route runs."""
    found: dict[str, Any] = {}
    start = time.perf_counter()
    try:
        route(*args, found)
    except Exception as error:
        traceback.print_exc()
        for part in PARTS if route is loop_route else PARTS[:3]:  # the TRL route has no memory plan to check
            found.setdefault(part, {"passed": False, "error": f"{type(error).__name__}: {error}"[:2000]})
    found["seconds"] = time.perf_counter() - start
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return found


def provenance() -> dict[str, Any]:
    """Commit, device and versions (None: not installed)."""
    def run(*command: str) -> str | None:
        done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
        return done.stdout.strip() if done.returncode == 0 else None

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    cpu = next((x.split(":")[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines()
                if x.startswith("model name")), "cpu")
    status = run("git", "status", "--porcelain")
    return {"commit": run("git", "rev-parse", "HEAD") or os.environ.get("GRPO_LAB_COMMIT"),
            "uncommitted_changes": None if status is None else bool(status),
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else f"{cpu}, {os.cpu_count()} cores",
            "cuda": torch.version.cuda, "python": sys.version.split()[0], "torch": torch.__version__,
            **{name: version(name) for name in ("transformers", "trl", "accelerate")},
            "vllm": version("vllm") or version("vllm-cpu")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="the JSON file to write")
    parser.add_argument("--small", action="store_true", help="small shapes (the default without a CUDA device)")
    parser.add_argument("--routes", nargs="+", choices=ROUTES, default=list(ROUTES))
    parser.add_argument("--trl-worker", type=Path, help=argparse.SUPPRESS)  # the child of trl_in_own_process
    args = parser.parse_args(argv)
    small = args.small or not torch.cuda.is_available()
    mode = "small" if small else "full"
    if args.trl_worker is not None:
        config = run_config(small, args.trl_worker, args.trl_worker.parent / "trl")
        prompts = problems(args.trl_worker, 2 * config.prompts_per_step, PROMPT_TOKENS[mode])
        args.out.write_text(json.dumps(run_route(trl_route, config, prompts)))
        return 0

    start, shape = time.perf_counter(), SMALL_MODEL if small else QWEN25_05B
    with tempfile.TemporaryDirectory(prefix="gpu_acceptance_") as tmp:
        model_dir = Path(tmp) / "model"
        parameters = write_model(model_dir, shape)
        seconds = {"model": time.perf_counter() - start}
        config = run_config(small, model_dir, Path(tmp) / "run")
        prompts = problems(model_dir, 2 * config.prompts_per_step, PROMPT_TOKENS[mode])
        results = {}
        if "trl" in args.routes:  # first: before this process holds any of the GPU
            results["trl"] = run_route(trl_in_own_process, model_dir, small)
        for route in ("hf", "vllm"):
            if route in args.routes:
                results[route] = run_route(loop_route, config.replace(sampler=route), prompts)
    seconds.update({route: found.pop("seconds") for route, found in results.items()})
    seconds["total"] = time.perf_counter() - start
    checks = {part: {route: found[part] for route, found in results.items() if part in found} for part in PARTS}
    failed = [f"{part}.{route}" for part, on in checks.items() for route, check in on.items() if not check["passed"]]
    report = {"provenance": provenance(),
              "run": {"recipe": RECIPE, "mode": mode, "device": config.device, "dtype": config.dtype,
                      "routes": [r for r in ROUTES if r in results], "not_run": [r for r in ROUTES if r not in results],
                      "P": config.prompts_per_step, "G": config.G, "T": config.max_completion_length,
                      "prompt_tokens": PROMPT_TOKENS[mode], "micro_batch_size": config.micro_batch_size, "v": config.v,
                      "i": config.i, "lr": config.lr, "beta": config.beta, "eps_low": config.eps_low,
                      "eps_high": config.eps_high, "temperature": config.temperature, "model": shape,
                      "parameters": parameters},
              "checks": checks, "seconds": seconds, "failed": failed, "passed": not failed}
    text = json.dumps(report, indent=1, default=str)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    print(f"gpu_acceptance, {mode} shapes on {report['provenance']['device']}: "
          + (f"FAILED {', '.join(failed)}" if failed else "every check passed"), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
