"""Launch a recipe at scale: ``accelerate launch … -m grpo_lab.scale.launch --config R``.

A recipe (``grpo_lab/configs/*.yaml``, read by :func:`~grpo_lab.lm.recipes.load_launch_recipe`) holds
:class:`~grpo_lab.lm.train_config.TrainConfig` fields, an optional ``trl:`` mapping of extra
:class:`~grpo_lab.scale.trl.OffPolicyGRPOConfig` fields (vLLM mode, tensor parallelism, memory share) and
an optional ``orz_data_files:`` path. :func:`trl_args` maps the theory's
names onto TRL's; :func:`launch` trains with :class:`~grpo_lab.scale.trl.OffPolicyGRPOTrainer` on the
process group ``accelerate`` started and writes ``throughput.json``: steps k over the seconds of training proper
(:class:`TrainingClock`: model loading, the accelerator's and DeepSpeed's initialisation and the vLLM engine's start
left out), the final reward and where it ran. :mod:`grpo_lab.scale.repeats` repeats launches per v and sets their
rates side by side.

In TRL's server mode (``trl: {use_vllm: true, vllm_mode: server}``) α runs in a vLLM server on GPUs of its own:
``--print-vllm-serve`` prints the ``trl vllm-serve`` line that serves the recipe (:func:`vllm_serve_command`);
start it first, then the trainer (docs/recipes.md, "Past one node").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from transformers import TrainerCallback

from ..checks import require_choice, require_int_at_least
from ..lm.memory import Device, Layout, MemoryPlan, ModelShape, available_memory, longest_prompt, plan_for
from ..lm.recipes import CONFIG_DIR, LaunchRecipe, load_launch_recipe, recipe_arg
from ..lm.tasks import chat_messages, load_orz
from ..lm.text_task import train_problems
from ..lm.train_config import TrainConfig

if TYPE_CHECKING:
    from .trl import OffPolicyGRPOConfig

ROOT = CONFIG_DIR.parents[1]
"""The checkout above the package (an editable install): where the recipes' relative ``output_dir`` and the
commands' relative paths are read from, and whose commit a result records."""
COLOCATE_RECIPES = {1: "qwen7b_orz_colocate_v1", 10: "qwen7b_orz_colocate_v10"}
"""The paper's 7B colocate throughput runs (docs/theory.md §6), by lag v."""
ACCELERATE_CONFIGS = tuple(sorted(path.stem for path in (CONFIG_DIR / "accelerate").glob("*.yaml")))
"""The bundled ``accelerate`` configs (``grpo_lab/configs/accelerate/<name>.yaml``): ``gpu8_ddp``, ``gpu8_zero3``, …"""
RESULT_FILE = "throughput.json"


def launch_command(name: str, accelerate_config: str = "gpu8_ddp", trl: Sequence[str] = ()) -> str:
    """The shell line that launches recipe ``name`` on the TRL route under ``accelerate`` (docs/recipes.md), paths
    relative to the checkout; ``trl``: ``key=value`` settings of TRL fields, each passed as ``--trl``."""
    require_choice("accelerate_config", accelerate_config, ACCELERATE_CONFIGS)
    config = recipe_arg(name)
    accelerate = f"{config.rsplit('/', 1)[0]}/accelerate/{accelerate_config}.yaml"
    return shlex.join(["accelerate", "launch", "--config_file", accelerate, "-m", "grpo_lab.scale.launch",
                       "--config", config, *(word for setting in trl for word in ("--trl", setting))])


FREE_SHARE = 0.9
"""The least share of every GPU's memory that must be free before :func:`require_free_gpus` lets a launch start."""


def require_free_gpus(count: int, share: float = FREE_SHARE) -> None:
    """Raise unless torch sees ``count`` CUDA devices or more and each of the first ``count`` has ``share`` of its
    memory free, every process's use counted (``torch.cuda.mem_get_info``): a multi-GPU launch from a process that
    may still hold a GPU (notebook 03's vLLM engine) would otherwise fail later, or share a card unseen. The error
    names the device and what is in use."""
    import torch

    require_int_at_least("count", count, 1)
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found < count:
        raise RuntimeError(f"the launch needs {count} CUDA devices; torch sees {found}")
    for device in range(count):
        free, total = torch.cuda.mem_get_info(device)
        if free < share * total:
            raise RuntimeError(f"cuda:{device} has {(total - free) / 2**30:.1f} of {total / 2**30:.1f} GiB in use "
                               f"(at most {1 - share:.0%} may be): free it (an engine or model still held in this "
                               "process, another program) before the launch")


def _now() -> float:
    """``time.perf_counter`` after the device's queued work has finished (CUDA runs kernels asynchronously)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


class TrainingClock(TrainerCallback):
    """The seconds of training proper: from the start of the first optimiser step (before its batch is generated)
    to the end of the last, each read by :func:`_now`. ``Trainer.train`` prepares the model (the accelerator,
    DeepSpeed) before its first step and the vLLM engine starts with the trainer, so neither is counted; logging
    and saving after the last step are not counted either. Each process keeps its own clock; the steps of a
    data-parallel run end together (their gradients are reduced every step)."""

    def __init__(self) -> None:
        self.start: float | None = None
        self.end: float | None = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.start is None:
            self.start = _now()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.end = _now()

    @property
    def seconds(self) -> float:
        if self.start is None or self.end is None:
            raise ValueError("the clock saw no whole optimiser step: train for at least one step first")
        return self.end - self.start


def model_path(config: TrainConfig) -> str:
    """What TRL (and a vLLM server) load for ``config.model``: a bundled model's converted directory, else the
    hub id or directory as given."""
    from ..lm.models import BUNDLED, bundled_model_dir

    return str(bundled_model_dir(config.model)) if config.model in BUNDLED else config.model


def vllm_serve_command(launch_recipe: LaunchRecipe, host: str = "0.0.0.0") -> list[str]:
    """``trl vllm-serve`` for a server-mode recipe, listening on ``host`` at the port the trainer dials.

    From the recipe: the model (:func:`model_path`), the compute dtype (``bfloat16`` in the GPU recipes, as the
    paper), and from its ``trl:`` mapping vLLM's ``vllm_tensor_parallel_size``, ``vllm_gpu_memory_utilization`` and
    ``vllm_max_model_length`` (fields TRL's trainer reads only when colocated; here the server takes them) and
    ``vllm_server_port``. What the mapping leaves out keeps the default of TRL's ``vllm-serve`` (a whole GPU's
    0.9 share of memory) or of ``trl.GRPOConfig`` (the port). TRL adds ``--logprobs-mode processed_logprobs`` itself,
    which the trainer checks at start (log α at the sampling temperature, as log π). Run it on GPUs the trainer
    does not use (``CUDA_VISIBLE_DEVICES``)."""
    import dataclasses

    from trl import GRPOConfig as TRLGRPOConfig
    from trl.scripts.vllm_serve import ScriptArguments

    extras = launch_recipe.trl
    if not extras.get("use_vllm") or extras.get("vllm_mode") != "server":
        raise ValueError(f"the recipe samples with use_vllm={extras.get('use_vllm')!r}, "
                         f"vllm_mode={extras.get('vllm_mode')!r}; a vLLM server needs --trl use_vllm=true "
                         "--trl vllm_mode=server")
    served = {f.name: f.default for f in dataclasses.fields(ScriptArguments)}
    config = launch_recipe.config
    command = ["trl", "vllm-serve", "--model", model_path(config), "--host", host,
               "--port", str(extras.get("vllm_server_port", TRLGRPOConfig.vllm_server_port)),
               "--tensor_parallel_size", str(extras.get("vllm_tensor_parallel_size", served["tensor_parallel_size"])),
               "--gpu_memory_utilization",
               str(extras.get("vllm_gpu_memory_utilization", served["gpu_memory_utilization"])),
               "--dtype", config.dtype]
    if extras.get("vllm_max_model_length") is not None:
        command += ["--max_model_len", str(extras["vllm_max_model_length"])]
    if config.trust_remote_code:
        command += ["--trust_remote_code", "true"]
    return command


def trl_args(config: TrainConfig, extras: Mapping[str, Any], num_processes: int) -> OffPolicyGRPOConfig:
    """The :class:`~grpo_lab.scale.trl.OffPolicyGRPOConfig` of a recipe (:func:`trl_values_of_run`), then ``extras``
    on top."""
    from .trl import OffPolicyGRPOConfig

    return OffPolicyGRPOConfig(**{**trl_values_of_run(config, num_processes), **extras})


STOCK_TRL_SETTINGS = {"scale_rewards": "group", "disable_dropout": True}
"""What stock TRL must be told to train as the kit does where its defaults differ: rewards whitened per group,
dropout off (the kit's π_θ runs without dropout)."""


def stock_trl_config(config: TrainConfig, extras: Mapping[str, Any] | None = None, num_processes: int = 1) -> Any:
    """Stock ``trl.GRPOConfig`` for a recipe: every value of :func:`trl_values_of_run` that stock TRL has a field
    for, :data:`STOCK_TRL_SETTINGS`, then ``extras``. The kit's own fields (v, the band, the zero-variance mask,
    the correction, ``eps_std``, …) have no stock field, so stock TRL runs v = 1 with its own whitening and loss
    terms: the peer the studies and the benchmarks compare against, built in this one place."""
    import dataclasses

    from trl import GRPOConfig as TRLGRPOConfig

    names = {f.name for f in dataclasses.fields(TRLGRPOConfig)}
    values = {k: v for k, v in trl_values_of_run(config, num_processes).items() if k in names}
    return TRLGRPOConfig(**{**values, **STOCK_TRL_SETTINGS, "data_seed": config.seed, **(extras or {})})


def stock_trl_trainer(config: TrainConfig, model: Any, tokenizer: Any, problems: Sequence[Any], args: Any,
                      callbacks: Sequence[Any] = ()) -> Any:
    """Stock ``trl.GRPOTrainer`` on a recipe's ``problems`` (text prompts) with the strict reward, where a completion
    has finished if it ends in one of the trainer's EOS ids; ``args``: its :func:`stock_trl_config`. ``model``: a
    loaded model or a name TRL loads. The peer the studies and the benchmarks time and train against."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from ..lm.rewards import strict_reward
    from ..lm.tasks import build_prompt

    if config.scoring != "strict":
        raise ValueError(f"stock TRL here scores strictly, so the recipe must too, got scoring={config.scoring!r}")
    stop_ids: set[int] = set()

    def reward(completions: list[str], completion_ids: list[list[int]], answer: list[str],
               answer_format: list[str], **kwargs: Any) -> list[float]:
        return [strict_reward(text, bool(ids) and ids[-1] in stop_ids, gold, form)
                for text, ids, gold, form in zip(completions, completion_ids, answer, answer_format, strict=True)]

    data = Dataset.from_dict({"prompt": [build_prompt(p, tokenizer, config.system_prompt) for p in problems],
                              "answer": [p.answer for p in problems],
                              "answer_format": [p.answer_format for p in problems]})
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tokenizer,
                          callbacks=list(callbacks))
    stop_ids.update(trainer.eos_token_ids)
    return trainer


def trl_values_of_run(config: TrainConfig, num_processes: int) -> dict[str, Any]:
    """A recipe's values under TRL's names: the knobs (:data:`~grpo_lab.scale.knobs.KNOBS`) and what is derived.

    Every knob with a TRL field comes from :data:`~grpo_lab.scale.knobs.KNOBS` (G → num_generations,
    v → vllm_sync_interval, …). The rest (:data:`~grpo_lab.scale.knobs.NOT_ONE_TO_ONE`) is derived here:

    ================================================= =================================================
    TRL field                                         from
    ================================================= =================================================
    ``per_device_train_batch_size``                   ``micro_batch_size`` (None: P·G / processes)
    ``gradient_accumulation_steps`` =                 P·G / (micro-batch · processes): one step k is
    ``steps_per_generation``                          P·G completions over all processes
    ``max_steps``                                     steps · i (TRL counts optimiser passes)
    ``sync_ref_model``, ``ref_model_sync_steps``      ref_period > 0, ref_period · i
    (none)                                            kl_kind: TRL computes k3 only, others are refused
    (none)                                            offpolicy_split: refused (``NOT_ONE_TO_ONE`` says why)
    ================================================= =================================================

    and from the run's fields: ``output_dir``, dtype → ``bf16``/``fp16``, device → ``use_cpu``,
    ``checkpoint_every`` · i → ``save_steps``, ``report_to``, ``top_p``, ``top_k`` (TRL's own fields: α's
    truncation, docs/theory.md §3); a constant learning rate, a log every step.
    """
    from .knobs import NOT_ONE_TO_ONE, trl_values

    require_choice("kl_kind", config.kl_kind, ("k3",))
    if config.offpolicy_split:
        raise ValueError("offpolicy_split = True is not available on the TRL route: "
                         + NOT_ONE_TO_ONE["offpolicy_split"])
    rows = config.prompts_per_step * config.G
    micro = config.micro_batch_size or max(rows // num_processes, 1)
    if rows % (micro * num_processes):
        raise ValueError(f"prompts_per_step·G = {rows} must be a multiple of micro_batch_size·processes = "
                         f"{micro}·{num_processes}")
    accumulation = rows // (micro * num_processes)
    return dict(
        trl_values(config), per_device_train_batch_size=micro, gradient_accumulation_steps=accumulation,
        steps_per_generation=accumulation, max_steps=config.steps * config.i, sync_ref_model=config.ref_period > 0,
        ref_model_sync_steps=max(config.ref_period, 1) * config.i, output_dir=config.output_dir,
        bf16=config.dtype == "bfloat16", fp16=config.dtype == "float16", use_cpu=config.device == "cpu",
        save_strategy="steps" if config.checkpoint_every else "no",
        save_steps=max(config.checkpoint_every, 1) * config.i, report_to=list(config.report_to) or "none",
        top_p=config.top_p, top_k=config.top_k,
        lr_scheduler_type="constant", logging_steps=1)


def training_dataset(launch_recipe: LaunchRecipe) -> Any:
    """The training problems as TRL rows: ``prompt`` (the chat of :func:`~grpo_lab.lm.tasks.chat_messages`,
    as :func:`~grpo_lab.lm.tasks.build_prompt` renders it), ``answer`` and ``answer_format`` for the reward."""
    from datasets import Dataset

    config = launch_recipe.config
    problems = (train_problems(config) if launch_recipe.orz_data_files is None
                else load_orz(launch_recipe.orz_data_files, config.train_problems))
    return Dataset.from_list([{"prompt": chat_messages(p, config.system_prompt), "answer": p.answer,
                               "answer_format": p.answer_format} for p in problems])


def verifiable_reward(format_weight: float = 0.0, scoring: str = "strict", eos_token_ids: Sequence[int] = ()) -> Any:
    """TRL reward function: :func:`~grpo_lab.lm.rewards.answer_reward` of each completion under ``scoring``, in [0, 1].

    Strict scoring needs to know which completions finished: TRL hands reward functions each completion's
    token ids (``completion_ids``, cut after the first EOS), and one finished when its last id is one of
    ``eos_token_ids`` (TRL's own stop ids: :func:`stop_token_ids`).
    """
    from ..lm.rewards import SCORINGS, answer_reward

    stops = {int(e) for e in eos_token_ids}
    if require_choice("scoring", scoring, SCORINGS) == "strict" and not stops:
        raise ValueError("strict scoring needs eos_token_ids (the ids that end a completion, stop_token_ids(model)) "
                         "to tell finished completions from truncated ones")

    def answer_correct(completions: list, answer: list[str], answer_format: list[str],
                       completion_ids: list[list[int]] | None = None, **kwargs: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        if scoring == "lenient":
            finished = [True] * len(texts)
        elif completion_ids is None:
            raise ValueError("strict scoring needs completion_ids (TRL passes them to reward functions)")
        else:
            finished = [len(ids) > 0 and int(ids[-1]) in stops for ids in completion_ids]
        return [answer_reward(t, a, f, format_weight, finished=d, scoring=scoring)
                for t, a, f, d in zip(texts, answer, answer_format, finished, strict=True)]

    return answer_correct


def stop_token_ids(model: str, trust_remote_code: bool = False) -> list[int]:
    """The ids at which TRL ends a completion of ``model`` (a directory or hub id), as ``GRPOTrainer`` builds
    its ``eos_token_ids``: the tokenizer's EOS, then the generation config's (the model config's where the
    checkpoint has no generation config)."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model).eos_token_id
    except OSError:
        eos = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code).eos_token_id
    ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    first = AutoTokenizer.from_pretrained(model, trust_remote_code=trust_remote_code).eos_token_id
    return ids if first is None or first in ids else [first, *ids]


def trl_layout(args: OffPolicyGRPOConfig, device: Device) -> Layout:
    """How a TRL-route run of ``args`` uses ``device`` (N alike, one process each), for the memory plan: DeepSpeed
    ZeRO-3 (the plugin the trainer's accelerator takes from ``args``, set by ``accelerate launch``'s config) splits
    weights, gradients and optimiser over all N; DDP or one process, none. α colocated in vLLM
    (``use_vllm``, ``vllm_mode: colocate``) takes ``vllm_gpu_memory_utilization`` u of each card, or on a CPU a KV
    cache of u of the host's memory (what TRL asks the engine for; ``VLLM_CPU_KVCACHE_SPACE`` overrides it). In
    server mode α is on GPUs of its own; without vLLM it samples in torch."""
    from ..lm.sampling_vllm import vllm_cpu_engine_kv_bytes

    plugin = args.deepspeed_plugin
    shards = device.count if plugin is not None and plugin.zero_stage == 3 else 1
    u = args.vllm_gpu_memory_utilization
    if not args.use_vllm:
        return Layout("trl", shards)
    if args.vllm_mode == "server":
        return Layout("trl", shards, vllm_server=True)
    if device.kind == "cuda":
        return Layout("trl", shards, vllm_share=u)
    return Layout("trl", shards, vllm_cpu_kv_cache=vllm_cpu_engine_kv_bytes(math.ceil(u * device.memory)))


def plan_launch(config: TrainConfig, args: OffPolicyGRPOConfig, prompt_length: int, device: Device,
                free: int | None = None) -> MemoryPlan:
    """The memory guard of a TRL-route run, before π_θ is loaded: :func:`~grpo_lab.lm.memory.plan_for` π_θ's shape
    read from its config (:meth:`~grpo_lab.lm.memory.ModelShape.of_checkpoint`: no weight loaded; in the dtype TRL
    loads it in, float32 unless ``model_init_kwargs`` say otherwise, forwards in the recipe's) on ``device`` laid out
    as :func:`trl_layout` says, with ``free`` bytes a process before the load (None: a recorded device's). A
    ValueError names the figure that does not fit, or the micro-batch that would: the route does not change it
    (P·G stays micro_batch_size × processes × accumulation steps)."""
    layout = trl_layout(args, device)
    dtype = (args.model_init_kwargs or {}).get("dtype", "float32")
    shape = ModelShape.of_checkpoint(model_path(config), dtype, config.compute_dtype(), config.trust_remote_code)
    available = None if free is None else max(free - math.ceil(shape.weights / layout.shards), 0)
    return plan_for(shape, config, prompt_length, device, layout, available)


def launch(launch_recipe: LaunchRecipe, save_final: bool = True) -> dict[str, Any]:
    """Train a recipe with the TRL adapter on this process group; the main process writes
    ``<output_dir>/throughput.json`` and returns it:

    ==================== ================================================================================
    ``v``, ``seed``      the recipe's
    ``steps``            steps k trained (TRL's optimiser steps / i)
    ``seconds``          :class:`TrainingClock`'s seconds of training proper
    ``steps_per_second`` steps / seconds
    ``syncs``            α ← π_θ pushes
    ``final_reward``     mean logged reward over the last 10 % of the logged steps
    ``world_size``       processes in the group
    the rest             :func:`~grpo_lab.provenance.provenance`: commit, CPU and GPU models, versions
    ==================== ================================================================================

    Before π_θ is loaded the memory guard plans the run on this process's device (:func:`plan_launch`: a CUDA card,
    else the host, shared by its processes) and stops it, naming the figure, if it does not fit.

    ``save_final``: also save the trained model to ``<output_dir>/final``."""
    from accelerate import PartialState
    from transformers import AutoTokenizer

    from ..provenance import provenance
    from .trl import OffPolicyGRPOTrainer

    config, state = launch_recipe.config, PartialState()
    model = model_path(config)
    args = trl_args(config, launch_recipe.trl, state.num_processes)
    dataset = training_dataset(launch_recipe)
    tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=config.trust_remote_code)
    prompts = tokenizer.apply_chat_template(list(dataset["prompt"]), add_generation_prompt=True, tokenize=False)
    device = dataclasses.replace(Device.of(state.device), count=state.num_processes)
    free = available_memory(state.device) // (state.num_processes if device.kind == "cpu" else 1)
    plan_launch(config, args, longest_prompt(tokenizer, prompts), device, free)
    reward = verifiable_reward(config.format_weight, config.scoring, stop_token_ids(model, config.trust_remote_code))
    clock = TrainingClock()
    trainer = OffPolicyGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset,
                                   callbacks=[clock])
    trainer.train()
    rewards = [row["reward"] for row in trainer.state.log_history if "reward" in row]
    tail = rewards[-max(len(rewards) // 10, 1):]
    steps = trainer.state.global_step // config.i
    result = {"v": config.v, "seed": config.seed, "steps": steps, "seconds": clock.seconds,
              "steps_per_second": steps / clock.seconds, "syncs": len(trainer.sync_steps),
              "final_reward": float(np.mean(tail)), "world_size": trainer.accelerator.num_processes,
              **provenance(ROOT)}
    if save_final:
        trainer.save_model(str(Path(config.output_dir) / "final"))
    if trainer.accelerator.is_main_process:
        (Path(config.output_dir) / RESULT_FILE).write_text(json.dumps(result, indent=2))
    return result


def argument_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m grpo_lab.scale.launch``."""
    parser = argparse.ArgumentParser(prog="python -m grpo_lab.scale.launch",
                                     description="Train a recipe with the TRL adapter (under accelerate launch).")
    parser.add_argument("--config", required=True, help="recipe YAML: TrainConfig fields, optional trl: mapping "
                        "and orz_data_files: path")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe field")
    parser.add_argument("--trl", action="append", default=[], metavar="KEY=VALUE", help="set a TRL config field")
    parser.add_argument("--print-vllm-serve", action="store_true", help="print the `trl vllm-serve` line of a "
                        "server-mode recipe (vllm_mode: server) and exit; start it before the trainer")
    parser.add_argument("--no-final-model", action="store_true", help="do not save the trained model (a timing run)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = argument_parser().parse_args(argv)
    launch_recipe = load_launch_recipe(args.config, args.set, args.trl)
    if args.print_vllm_serve:
        print(shlex.join(vllm_serve_command(launch_recipe)))
        return 0
    print(json.dumps(launch(launch_recipe, save_final=not args.no_final_model)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
