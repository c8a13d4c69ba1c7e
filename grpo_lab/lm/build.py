"""``build_loop``: a language model's run wired into the one (v, i) loop::

    load_policy(model) ─► LMPolicy (π_θ) ─► HFSampler, GenerateSampler or VLLMSampler (α, ``sampler``) ─┐
    train_problems(config) ─► TextTask (prompts, verifiable rewards) ───────────────────────────────────┴─► GRPOLoop

The config's ``sampler`` chooses α's engine.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..loop import GRPOLoop
from .tasks import Problem
from .text_task import TextTask, train_problems
from .train_config import TrainConfig

if TYPE_CHECKING:
    from .memory import Layout


def build_loop(config: TrainConfig, model: Any = None, tokenizer: Any = None,
               problems: Sequence[Problem] | None = None, sampler: Any = None,
               checkpoint: Path | None = None) -> GRPOLoop:
    """π_θ, α, the task and the loop of a run (loading the model and problems unless given).

    Before α is copied, the memory guard plans the micro-batch that fits (:func:`~grpo_lab.lm.memory.plan_memory`,
    with α where it will sample, :func:`sampler_layout`: the loop takes it; the config is left as given)
    and, given the ``checkpoint`` path the run will write, the disk guard checks that its checkpoints fit
    (:func:`~grpo_lab.lm.disk_guard.guard_disk`, a DiskError otherwise).
    A given ``sampler`` (e.g. another run's engine, built once) is synced to this run's π_θ first.
    """
    from .disk_guard import estimate_run_checkpoint, guard_disk
    from .memory import Layout, longest_prompt, plan_memory
    from .models import load_policy
    from .policy import LMPolicy
    from .sampling import GenerateSampler, HFSampler, stop_and_pad_ids

    if config.sampler == "vllm" and sampler is None:
        from .sampling_vllm import import_vllm

        import_vllm()  # not installed: say so before loading anything
    if model is None:
        model, tokenizer = load_policy(config.model, dtype=config.weights_dtype(), device=config.torch_device(),
                                       trust_remote_code=config.trust_remote_code)
    if problems is None:
        problems = train_problems(config)
    if config.prompts_per_step > len(problems):
        raise ValueError(f"prompts_per_step = {config.prompts_per_step} exceeds the {len(problems)} problems")
    model.requires_grad_(True)
    warn_if_updates_round_away(model, config.lr)
    task = TextTask(problems, tokenizer, config.system_prompt, format_weight=config.format_weight,
                    scoring=config.scoring, eos_token_ids=stop_and_pad_ids(model, tokenizer, None)[0])
    policy = LMPolicy(model, temperature=config.temperature, share_prompt=config.share_prompt,
                      compute_dtype=config.compute_dtype())
    prompt_tokens = longest_prompt(tokenizer, task.prompt_of.values())
    # a given sampler holds its memory already (the plan reads what is left); one built below is planned for
    layout = Layout() if sampler is not None else sampler_layout(config, policy, prompt_tokens)
    memory = plan_memory(config, model, prompt_tokens, compute_dtype=policy.compute_dtype, layout=layout)
    if checkpoint is not None:
        guard_disk(config, estimate_run_checkpoint(config, model, config.steps), Path(checkpoint))
    if sampler is not None:
        drawn = (sampler.max_completion_length, sampler.temperature, sampler.top_p, sampler.top_k)
        needed = (config.max_completion_length, config.temperature, config.top_p, config.top_k)
        if drawn != needed:
            raise ValueError("the given sampler draws {} tokens at T = {}, top_p = {}, top_k = {}; this run needs "
                             "{} at T = {}, top_p = {}, top_k = {}".format(*drawn, *needed))
        sampler.sync(policy)
    elif config.sampler == "vllm":
        sampler = vllm_sampler(config, policy, tokenizer, prompt_tokens)
    else:
        engine = GenerateSampler if config.sampler == "hf_generate" else HFSampler
        sampler = engine(policy, tokenizer, config.max_completion_length, config.temperature,
                         top_p=config.top_p, top_k=config.top_k)
    return GRPOLoop(policy, sampler, task, config, micro_batch_size=memory.micro_batch_size)


HALF_PRECISION_MOVED_SHARE = 0.5
"""Below this share of π_θ's weights moved by an update of size lr, :func:`build_loop` warns."""


def moved_share(model: torch.nn.Module, lr: float) -> float:
    """The share of ``model``'s trainable weights that an update of size ``lr`` changes in their own dtype.

    AdamW moves each weight by about lr a step; a weight stored in bfloat16 (8 significant bits) changes only if
    lr is at least half its spacing, ~|w|·2⁻⁹, so at lr = 1e-6 a weight above ~5e-4 in size rounds back to
    itself every step. AdamW steps π_θ's own weights, so for weights stored in half precision (a model given to
    :func:`build_loop` so; it loads its own in float32 under a half-precision ``dtype``) this share is the part of
    the model that can train at all."""
    moved = total = 0
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                moved += int(((p + lr) != p).sum())   # in p's dtype: the sum rounded once, as AdamW stores it
                total += p.numel()
    return moved / total if total else 1.0


def warn_if_updates_round_away(model: torch.nn.Module, lr: float) -> None:
    """Warn when π_θ is in half precision and an update of size ``lr`` moves under
    :data:`HALF_PRECISION_MOVED_SHARE` of its weights (:func:`moved_share`): the run would barely train."""
    dtype = next(model.parameters()).dtype
    if dtype not in (torch.bfloat16, torch.float16):
        return
    share = moved_share(model, lr)
    if share < HALF_PRECISION_MOVED_SHARE:
        warnings.warn(f"π_θ's weights are in {dtype} and AdamW moves each weight by about lr = {lr:g} a step: an "
                      f"update of that size changes {share:.1%} of them, the rest round back, so the run will barely "
                      "train. Give build_loop the model in float32 (TrainConfig.dtype = 'bfloat16' then computes in "
                      "bfloat16 over float32 weights: mixed precision), or a larger lr.", stacklevel=3)


def sampler_layout(config: TrainConfig, policy: Any, prompt_tokens: int) -> Layout:
    """The :class:`~grpo_lab.lm.memory.Layout` the memory guard plans the loop with: α in torch (the default), or
    in the vLLM engine :func:`vllm_sampler` builds for ``config``: on a GPU its share of the card
    (:data:`~grpo_lab.lm.sampling_vllm.GPU_MEMORY_UTILIZATION`), on a CPU its KV cache as the engine will allocate
    it (:func:`~grpo_lab.lm.sampling_vllm.vllm_cpu_engine_kv_bytes`: the size :func:`vllm_cpu_kv_cache_request`
    asks for, or ``VLLM_CPU_KVCACHE_SPACE``'s)."""
    from .memory import Layout

    if config.sampler != "vllm":
        return Layout()
    from .sampling_vllm import GPU_MEMORY_UTILIZATION, vllm_cpu_engine_kv_bytes

    if policy.device.type == "cuda":
        return Layout(vllm_share=GPU_MEMORY_UTILIZATION)
    return Layout(vllm_cpu_kv_cache=vllm_cpu_engine_kv_bytes(vllm_cpu_kv_cache_request(config, policy,
                                                                                        prompt_tokens)))


def vllm_cpu_kv_cache_request(config: TrainConfig, policy: Any, prompt_tokens: int) -> int:
    """The ``kv_cache_memory_bytes`` :func:`vllm_sampler` gives a CPU engine: one step's P·G completions of up to
    ``prompt_tokens`` + T tokens (:func:`~grpo_lab.lm.sampling_vllm.vllm_cpu_kv_cache_bytes`)."""
    from .memory import ModelShape
    from .sampling_vllm import vllm_cpu_kv_cache_bytes

    return vllm_cpu_kv_cache_bytes(ModelShape.of(policy.model, policy.compute_dtype),
                                   config.prompts_per_step * config.G, prompt_tokens + config.max_completion_length)


def vllm_sampler(config: TrainConfig, policy: Any, tokenizer: Any, prompt_tokens: int) -> Any:
    """α in a ``vllm.LLM`` built from the checkpoint ``config.model`` names (the bundled model's converted
    directory for ``smollm2-135m``), sized to the run: ``max_model_len`` = longest prompt + T_max. On a CPU
    the engine runs eagerly (no inductor warm-up, minutes on two cores) with a KV cache for one step's
    P·G completions (:func:`vllm_cpu_kv_cache_request`; ``VLLM_CPU_KVCACHE_SPACE``, when set, overrides it), and
    the tracebacks vLLM keeps from its optional imports are dropped once it is built
    (:func:`~grpo_lab.lm.sampling_vllm.drop_stored_import_tracebacks`: they held this call's frames, and the run's
    π_θ and optimiser with them)."""
    from .models import BUNDLED, bundled_model_dir
    from .sampling_vllm import VLLMSampler, drop_stored_import_tracebacks

    path = str(bundled_model_dir(config.model)) if config.model in BUNDLED else config.model
    engine_kwargs = {"max_model_len": prompt_tokens + config.max_completion_length,
                     "enforce_eager": policy.device.type == "cpu", "trust_remote_code": config.trust_remote_code}
    if policy.device.type == "cpu":
        engine_kwargs["kv_cache_memory_bytes"] = vllm_cpu_kv_cache_request(config, policy, prompt_tokens)
    sampler = VLLMSampler(policy, tokenizer, path, config.max_completion_length, config.temperature,
                          top_p=config.top_p, top_k=config.top_k, seed=config.seed, engine_kwargs=engine_kwargs)
    drop_stored_import_tracebacks()
    return sampler
