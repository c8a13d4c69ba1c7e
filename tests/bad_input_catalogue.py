"""The bad-input catalogue: every entry a call that must raise a named error with a message naming
the parameter and the value (TrainConfig knobs, model names, datasets, prompts, checkpoint paths,
reward functions, the memory guard), and GRPOConfig's own cases (CONFIG_CASES).

``tests/test_bad_input.py`` runs each entry; ``tests/reliability_report.py`` times them.
"""

from __future__ import annotations

import functools
import io
import itertools
import json
import math
import os
import pickle
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple
from unittest import mock

import torch
from reliability_runs import (
    make_loop,
    problems,
    tiny_model,
    tokenizer,
    train_config,
)

from grpo_lab.exact.bandit import BanditProblem, build_bandit_loop
from grpo_lab.files import DiskError
from grpo_lab.lm.build import build_loop
from grpo_lab.lm.checkpoint import load_checkpoint, save_checkpoint
from grpo_lab.lm.memory import plan_memory
from grpo_lab.lm.models import bundled_gguf_path, load_policy
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.sampling import HFSampler, tokenize_prompts
from grpo_lab.lm.tasks import Problem, build_prompt, load_problems, sample_problems
from grpo_lab.lm.text_task import TextTask
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.lm.training import train

CONFIG_CASES = [
    (dict(v=0), "v must be an integer >= 1, got 0"),
    (dict(v=2.5), "v must be an integer >= 1, got 2.5"),
    (dict(i=0), "i must be an integer >= 1, got 0"),
    (dict(G=1), "G must be an integer >= 2, got 1"),
    (dict(prompts_per_step=0), "prompts_per_step must be an integer >= 1, got 0"),
    (dict(eps_low=-0.1), r"eps_low must be a finite number in \[0.0, inf\], got -0.1"),
    (dict(eps_high=float("nan")), "eps_high must be a finite number .* got nan"),
    (dict(beta=-1.0), "beta must be a finite number .* got -1.0"),
    (dict(eps_std=-1e-3), "eps_std must be a finite number .* got -0.001"),
    (dict(lr=0.0), r"lr must be a finite number in \(0.0, inf\], got 0.0"),
    (dict(lr=float("inf")), "lr must be a finite number .* got inf"),
    (dict(band="wide"), "band must be one of \\('additive', 'multiplicative'\\), got 'wide'"),
    (dict(loss_type="mean"), "loss_type must be one of .* got 'mean'"),
    (dict(kl_kind="k4"), "kl_kind must be one of .* got 'k4'"),
    (dict(level="word"), "level must be one of .* got 'word'"),
    (dict(eps_placement="inside"), "eps_placement must be one of .* got 'inside'"),
    (dict(empty_step="adam"),
     "empty_step must be one of \\('skip', 'optimizer_step', 'skip_kl_only', 'skip_after_backward'\\), got 'adam'"),
    (dict(sync="sometimes"), "sync must be one of .* got 'sometimes'"),
    (dict(sync_threshold=0.0), "sync_threshold must be a finite number .* got 0.0"),
    (dict(ref_period=-1), "ref_period must be an integer >= 0, got -1"),
    (dict(ref_period=5, beta=0.0), "ref_period = 5 resets π_ref, but beta = 0"),
    (dict(micro_batch_size=0), "micro_batch_size must be an integer >= 1, got 0"),
    (dict(temperature=0.0), "temperature must be a finite number .* got 0.0"),
    (dict(max_grad_norm=-1.0), "max_grad_norm must be a finite number .* got -1.0"),
    (dict(optimizer="lion"), "optimizer must be one of .* got 'lion'"),
    (dict(steps=-5), "steps must be an integer >= 0, got -5"),
    (dict(seed=True), "seed must be an integer >= 0, got True"),
]
"""GRPOConfig(**changes) must raise a ValueError matching the message."""


class BadInput(NamedTuple):
    """Calling ``call`` must raise ``error`` with a message matching ``pattern`` (naming parameter and value)."""

    name: str
    call: Callable[[], Any]
    error: type[BaseException]
    pattern: str


@functools.cache
def scratch_folder() -> tempfile.TemporaryDirectory:
    """The catalogue's folder, kept (cached) until the process ends, then removed."""
    return tempfile.TemporaryDirectory(prefix="grpo_lab_bad_input_")


def scratch() -> Path:
    return Path(scratch_folder().name)


def scratch_file(name: str, data: str | bytes) -> str:
    path = scratch() / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(path)


def bandit_checkpoint() -> bytes:
    loop = make_loop("bandit", train_config("bandit", scratch() / "unused"))
    list(loop.run(2))
    return save_checkpoint(loop, scratch() / "good.pt").read_bytes()


def load_into_bandit(data: bytes, name: str, **changes: Any) -> Any:
    loop = make_loop("bandit", train_config("bandit", scratch() / "unused", **changes))
    return load_checkpoint(loop, scratch_file(name, data))


def half(data: bytes) -> bytes:
    return data[: len(data) // 2]


def tensor_file() -> bytes:
    buffer = io.BytesIO()
    torch.save(torch.zeros(3), buffer)
    return buffer.getvalue()


def offline_hub_model() -> Any:
    with mock.patch.dict(os.environ, HF_HUB_OFFLINE="1"):
        return load_policy("nobody-xyz/no-such-model")


def step_stops_cleanly(loop: Any) -> None:
    """``loop.step()``, which must raise — and leave k, the history, the RNG and π_θ as they were."""
    before = [p.detach().clone() for p in loop.policy.parameters()]
    rng, k = loop.generator.get_state(), loop.k
    try:
        loop.step()
    finally:
        assert loop.k == k and len(loop.history) == k and torch.equal(loop.generator.get_state(), rng)
        assert all(torch.equal(a, b) for a, b in zip(before, loop.policy.parameters(), strict=True))


def lm_reward_case(value: Any) -> None:
    """A reward function that returns ``value`` (or raises it) for completion 5 = prompt 1 of G = 4."""
    calls = itertools.count()

    def reward(text: str, problem: Problem, finished: bool) -> Any:
        if next(calls) != 5:
            return 0.0
        if isinstance(value, BaseException):
            raise value
        return value

    loop = make_loop("lm", train_config("lm", scratch() / "unused"))
    loop.task.reward_fn = reward
    step_stops_cleanly(loop)


def bandit_task_case(rewards_fn: Callable[[Any], Any]) -> None:
    """A task whose ``rewards`` returns ``rewards_fn(rollout)`` (P = 4 prompts × G = 8, one run)."""
    config = train_config("bandit", scratch() / "unused")
    loop = build_bandit_loop(BanditProblem.random(contexts=4, arms=3, seed=0), config, runs=1)
    loop.task.rewards = lambda rollout, generator: rewards_fn(rollout)
    step_stops_cleanly(loop)


def inf_at(p: int, g: int) -> torch.Tensor:
    r = torch.zeros(4, 8)
    r[p, g] = math.inf
    return r


def no_prompts_case() -> None:
    loop = make_loop("bandit", train_config("bandit", scratch() / "unused"))
    loop.task.prompts = lambda n, generator: torch.zeros(0, dtype=torch.long)
    step_stops_cleanly(loop)


def tiny_sampler(**kwargs: Any) -> HFSampler:
    return HFSampler(LMPolicy(tiny_model()), tokenizer(), **{"max_completion_length": 4, **kwargs})


def oversized_run() -> Any:
    config = TrainConfig(G=64, prompts_per_step=64, max_completion_length=4096)
    return plan_memory(config, tiny_model(), prompt_length=50, available=10**6)


def model_dir_without_config() -> Any:
    (scratch() / "empty_model").mkdir(exist_ok=True)
    return load_policy(str(scratch() / "empty_model"))


def gsm8k_rows(rows: list[dict[str, str]], name: str) -> str:
    return scratch_file(name, "\n".join(json.dumps(r) for r in rows))


def train_into_a_file() -> Any:
    config = train_config("bandit", scratch_file("not_a_folder", "x"))
    return train(config, make_loop("bandit", config), progress=False)


CATALOGUE: list[BadInput] = [
    # TrainConfig knobs (GRPOConfig's own are in tests/test_bad_input.py)
    BadInput("train_problems = 0", lambda: TrainConfig(train_problems=0), ValueError,
             r"train_problems must be an integer >= 1, got 0"),
    BadInput("eval_problems = -1", lambda: TrainConfig(eval_problems=-1), ValueError,
             r"eval_problems must be an integer >= 1, got -1"),
    BadInput("eval_samples = 0", lambda: TrainConfig(eval_samples=0), ValueError,
             r"eval_samples must be an integer >= 1, got 0"),
    BadInput("eval_every = -1", lambda: TrainConfig(eval_every=-1), ValueError,
             r"eval_every must be an integer >= 0, got -1"),
    BadInput("checkpoint_every = 1.5", lambda: TrainConfig(checkpoint_every=1.5), ValueError,
             r"checkpoint_every must be an integer >= 0, got 1.5"),
    BadInput("format_weight = 1.5", lambda: TrainConfig(format_weight=1.5), ValueError,
             r"format_weight must be a finite number in \[0.0, 1.0\], got 1.5"),
    BadInput("memory_budget_gib = 0", lambda: TrainConfig(memory_budget_gib=0), ValueError,
             r"memory_budget_gib must be a finite number in \(0.0, inf\], got 0"),
    BadInput("dtype = 'fp8'", lambda: TrainConfig(dtype="fp8"), ValueError,
             r"dtype must be one of \('float32', 'bfloat16', 'float16'\), got 'fp8'"),
    BadInput("device = 'tpu'", lambda: TrainConfig(device="tpu"), ValueError,
             r"device must be one of \('auto', 'cpu', 'cuda'\), got 'tpu'"),
    BadInput("report_to = ('mlflow',)", lambda: TrainConfig(report_to=("mlflow",)), ValueError,
             r"report_to must be one of \('tensorboard', 'wandb'\), got 'mlflow'"),
    BadInput("report_to = 'wandb' (a string)", lambda: TrainConfig(report_to="wandb"), ValueError,
             r"report_to must be a list of logger names, got the string 'wandb'"),
    BadInput("top_p = 0", lambda: TrainConfig(top_p=0.0), ValueError,
             r"top_p must be a finite number in \(0.0, 1.0\], got 0.0"),
    BadInput("top_k = -1", lambda: TrainConfig(top_k=-1), ValueError, r"top_k must be an integer >= 0, got -1"),
    BadInput("max_completion_length = 0", lambda: TrainConfig(max_completion_length=0), ValueError,
             r"max_completion_length must be an integer >= 1, got 0"),
    BadInput("task = 'gsm9k' (caught before the model loads)", lambda: TrainConfig(task="gsm9k"), ValueError,
             r"task must be one of \('add1', .*\), got 'gsm9k'"),
    BadInput("eval_task = 'math5000'", lambda: TrainConfig(eval_task="math5000"), ValueError,
             r"eval_task must be one of .* got 'math5000'"),
    # model names
    BadInput("model = ''", lambda: TrainConfig(model=""), ValueError,
             r"model must be a model name, directory or hub id, got ''"),
    BadInput("load_policy('  ')", lambda: load_policy("  "), ValueError,
             r"name_or_path must be a model name, directory or hub id, got '  '"),
    BadInput("load_policy(missing path)", lambda: load_policy("./no/such/model"), FileNotFoundError,
             r"name_or_path './no/such/model' is not a model directory"),
    BadInput("load_policy(folder without config.json)", model_dir_without_config, ValueError,
             r"name_or_path '.*empty_model' is a directory without config.json"),
    BadInput("load_policy(unknown hub id, offline)", offline_hub_model, FileNotFoundError,
             r"model 'nobody-xyz/no-such-model' is neither bundled .* nor found in the Hugging Face cache"),
    BadInput("load_policy(dtype = torch.int8)", lambda: load_policy("smollm2-135m", dtype=torch.int8), ValueError,
             r"dtype must be a floating torch.dtype, got torch.int8"),
    BadInput("bundled model 'smollm2-9b'", lambda: bundled_gguf_path("smollm2-9b"), ValueError,
             r"name must be one of the bundled models \('smollm2-135m',\), got 'smollm2-9b'"),
    # datasets
    BadInput("task name 'gsm9k'", lambda: load_problems("gsm9k", 5), ValueError,
             r"task name must be one of \(.*'gsm8k'.*\), got 'gsm9k'"),
    BadInput("generated task without n", lambda: load_problems("add1"), ValueError,
             r"n \(number of problems to generate\) is required for task 'add1'"),
    BadInput("n = 0", lambda: load_problems("add1", 0), ValueError, r"n must be an integer >= 1, got 0"),
    BadInput("seed = -1", lambda: load_problems("add1", 5, seed=-1), ValueError,
             r"seed must be an integer >= 0, got -1"),
    BadInput("split for a generated task", lambda: load_problems("add1", 5, split="test"), ValueError,
             r"task 'add1' is generated: it takes no split or data_files, got split='test'"),
    BadInput("reasoning-gym min_digits > max_digits", lambda: load_problems("add1", 5, min_digits=3, max_digits=1),
             ValueError, r"bad reasoning-gym config for task 'add1': .*'min_digits': 3.*max_digits must be >= min"),
    BadInput("overrides for a dataset", lambda: load_problems("gsm8k", 5, max_digits=2), ValueError,
             r"task 'gsm8k' is a dataset and takes no config overrides, got \['max_digits'\]"),
    BadInput("data_files missing", lambda: load_problems("gsm8k", data_files=str(scratch() / "missing.jsonl")),
             FileNotFoundError, r"data_files not found: \['.*missing.jsonl'\]"),
    BadInput("data_files of type .txt", lambda: load_problems("gsm8k", data_files=scratch_file("rows.txt", "1")),
             ValueError, r"data_files must be files of one type among .*, got \['.*rows.txt'\]"),
    BadInput("empty data file", lambda: load_problems("gsm8k", data_files=scratch_file("empty.jsonl", "")),
             ValueError, r"dataset 'gsm8k' from .*empty.jsonl could not be read or has no rows"),
    BadInput("data file without the question column",
             lambda: load_problems("gsm8k", data_files=gsm8k_rows([{"prompt": "1+1", "answer": "#### 2"}], "c.jsonl")),
             ValueError, r"dataset 'gsm8k' needs one of the columns \('question',\), has \['prompt', 'answer'\]"),
    BadInput("GSM8K answer without ####",
             lambda: load_problems("gsm8k",
                                   data_files=gsm8k_rows([{"question": "1+1?", "answer": "just 2"}], "h.jsonl")),
             ValueError, r"GSM8K answer has no '####' line: 'just 2'"),
    BadInput("more prompts per step than problems", lambda: sample_problems(problems()[:3], 5, torch.Generator()),
             ValueError, r"n must be <= the number of problems \(3\), got 5"),
    BadInput("prompts_per_step > problems in build_loop",
             lambda: build_loop(TrainConfig(prompts_per_step=30), tiny_model(), tokenizer(), list(problems())),
             ValueError, r"prompts_per_step = 30 exceeds the 20 problems"),
    BadInput("no problems", lambda: TextTask([], tokenizer()), ValueError, r"problems is empty"),
    # prompts
    BadInput("answer_format 'latex'", lambda: build_prompt(Problem("1+1?", "2", "t:0", "latex"), tokenizer()),
             ValueError, r"answer_format must be one of \('number', 'boxed'\), got 'latex'"),
    BadInput("no prompts", lambda: tokenize_prompts(tokenizer(), []), ValueError,
             r"prompts must be a non-empty sequence of strings, got \[\]"),
    BadInput("a prompt that is not a string", lambda: tokenize_prompts(tokenizer(), ["1 + 1", 3]), ValueError,
             r"prompts must be a non-empty sequence of strings, got \['1 \+ 1', 3\]"),
    BadInput("an empty prompt", lambda: tokenize_prompts(tokenizer(), ["1 + 1", ""]), ValueError,
             r"every prompt must have at least one token"),
    BadInput("task returns no prompts", no_prompts_case, ValueError, r"task returned no prompts at step 0"),
    BadInput("sampler temperature != policy's", lambda: tiny_sampler(temperature=0.5), ValueError,
             r"temperature = 0.5 must equal the policy's \(1.0\)"),
    BadInput("sampler top_p = 1.5", lambda: tiny_sampler(top_p=1.5), ValueError,
             r"top_p must be a finite number in \(0.0, 1.0\], got 1.5"),
    BadInput("sampler max_completion_length = 0", lambda: tiny_sampler(max_completion_length=0), ValueError,
             r"max_completion_length must be an integer >= 1, got 0"),
    BadInput("group_size = 0", lambda: tiny_sampler().sample(["hi"], 0, torch.Generator()), ValueError,
             r"group_size must be an integer >= 1, got 0"),
    BadInput("policy temperature = 0", lambda: LMPolicy(tiny_model(), temperature=0), ValueError,
             r"temperature must be a finite number in \(0.0, inf\], got 0"),
    # checkpoint paths
    BadInput("checkpoint path is a folder",
             lambda: load_checkpoint(make_loop("bandit", train_config("bandit", scratch())), scratch()),
             FileNotFoundError, r"checkpoint path '.*' does not exist or is not a file"),
    BadInput("truncated checkpoint", lambda: load_into_bandit(half(bandit_checkpoint()), "half.pt"), ValueError,
             r"checkpoint '.*half.pt' is truncated or corrupt \((RuntimeError|OSError)"),
    BadInput("empty checkpoint", lambda: load_into_bandit(b"", "empty.pt"), ValueError,
             r"checkpoint '.*empty.pt' is truncated or corrupt \(EOFError"),
    BadInput("random bytes", lambda: load_into_bandit(bytes(range(256)) * 4, "noise.pt"), pickle.UnpicklingError,
             r"checkpoint '.*noise.pt' refused by weights_only loading"),
    BadInput("a tensor, not a checkpoint", lambda: load_into_bandit(tensor_file(), "tensor.pt"), ValueError,
             r"checkpoint '.*tensor.pt' is not a grpo_lab checkpoint"),
    BadInput("checkpoint of another config", lambda: load_into_bandit(bandit_checkpoint(), "v2.pt", v=2), ValueError,
             r"checkpoint was written with a different config \(saved, current\): \{'v': \(3, 2\)\}"),
    BadInput("save under a file", lambda: save_checkpoint(make_loop("bandit", train_config("bandit", scratch())),
                                                          Path(scratch_file("plain", "x")) / "ckpt.pt"),
             DiskError, r"could not write the checkpoint of step 0 to '.*ckpt.pt': '.*plain' is a file, not a folder"),
    BadInput("output_dir is a file", train_into_a_file, DiskError,
             r"could not write '.*not_a_folder': '.*not_a_folder' is a file, not a folder; check"),
    # reward functions (the step stops before any update: k, RNG and π_θ unchanged)
    BadInput("reward NaN", lambda: lm_reward_case(math.nan), ValueError,
             r"reward nan for prompt 1 \(completion 5\) must be a real number in \[0, 1\]"),
    BadInput("reward 1.5", lambda: lm_reward_case(1.5), ValueError, r"reward 1.5 for prompt 1 \(completion 5\)"),
    BadInput("reward -0.5", lambda: lm_reward_case(-0.5), ValueError, r"reward -0.5 for prompt 1 \(completion 5\)"),
    BadInput("reward inf", lambda: lm_reward_case(math.inf), ValueError, r"reward inf for prompt 1 \(completion 5\)"),
    BadInput("reward '1' (a string)", lambda: lm_reward_case("1"), ValueError, r"reward '1' for prompt 1"),
    BadInput("reward None", lambda: lm_reward_case(None), ValueError, r"reward None for prompt 1 \(completion 5\)"),
    BadInput("reward function raises", lambda: lm_reward_case(KeyError("gold")), ValueError,
             r"reward function raised KeyError: 'gold' for prompt 1 \(completion 5"),
    BadInput("task rewards of the wrong length", lambda: bandit_task_case(lambda r: torch.zeros(4, 7)), ValueError,
             r"rewards must have shape \[P, G\] = \[4, 8\], got \(4, 7\)"),
    BadInput("task rewards flat", lambda: bandit_task_case(lambda r: torch.zeros(32)), ValueError,
             r"rewards must have shape \[P, G\], got shape \(32,\)"),
    BadInput("task rewards as a list", lambda: bandit_task_case(lambda r: [[0.0] * 8] * 4), ValueError,
             r"rewards must be a torch.Tensor of shape \[P, G\], got list"),
    BadInput("task reward inf", lambda: bandit_task_case(lambda r: inf_at(2, 3)), ValueError,
             r"rewards\[2, 3\] = inf \(prompt 2, sample 3\)"),
    # the memory guard
    BadInput("run too big for memory", oversized_run, ValueError,
             r"memory guard: the run needs about .* even with micro_batch_size = 1, but only 0.00 GiB is available"),
    BadInput("available < 0", lambda: plan_memory(TrainConfig(), tiny_model(), 10, available=-1), ValueError,
             r"available must be an integer >= 0, got -1"),
]
