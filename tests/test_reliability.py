"""Reliability: bad input, hostile answers, faults (crash mid-checkpoint, NaN/inf, interrupts in each
phase of a step), determinism and the memory guard — every fault recovered with nothing lost.

The catalogue (CATALOGUE), the answer fuzzer (completions, score_answer) and the fault scenarios
(SCENARIOS, each returning an :class:`Outcome`) live here so that ``benchmarks/reliability_report.py``
runs the very same checks, on more inputs and on the real SmolLM2.

Two kinds of run: ``bandit`` (the exact bandit through ``train``, milliseconds per step) and ``lm``
(a tiny random Llama with the bundled SmolLM2 tokenizer through ``build_loop``/``train``).
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import json
import math
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from grpo_lab import rewards
from grpo_lab.bandit import BanditProblem, build_bandit_loop, run_bandit, single_thread
from grpo_lab.checkpoint import load_checkpoint, save_checkpoint
from grpo_lab.experiment import TextTask, TrainConfig, build_loop, load_metrics, train
from grpo_lab.memory import BUDGET_FRACTION, ModelShape, available_memory, estimate_memory, guard_memory
from grpo_lab.models import bundled_gguf_path, bundled_model_dir, load_policy
from grpo_lab.policy import LMPolicy
from grpo_lab.rewards import answer_reward, extract_answer, format_reward
from grpo_lab.sampling import HFSampler, tokenize_prompts
from grpo_lab.tasks import Problem, build_prompt, load_problems, sample_problems

REPO = Path(__file__).resolve().parent.parent
TIMING = ("sample_seconds", "train_seconds", "sync_seconds")


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny tensors: one intra-op thread is ~10× faster on a busy 2-core machine, and every run
    compared bit for bit (including the crash child) uses the same thread count."""
    with single_thread():
        yield


# ----------------------------------------------------------------------------- two kinds of run

@functools.cache
def tokenizer() -> Any:
    tok = AutoTokenizer.from_pretrained(bundled_model_dir())
    tok.padding_side = "left"
    return tok


def tiny_model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    tok = tokenizer()
    return LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                        tie_word_embeddings=True))


@functools.cache
def problems() -> tuple[Problem, ...]:
    return tuple(load_problems("add1", 20, seed=0))


def even_length(text: str, problem: Problem) -> float:
    return float(len(text) % 2 == 0)


def train_config(kind: str, output_dir: Path | str, **changes: Any) -> TrainConfig:
    """A short run of each kind that exercises v > 1 and a periodic checkpoint (the bandit also i, β, π_ref resets)."""
    base = (dict(G=8, prompts_per_step=4, v=3, i=2, beta=0.05, ref_period=4, optimizer="adamw", lr=0.05, steps=10)
            if kind == "bandit" else
            dict(G=4, prompts_per_step=2, v=2, lr=1e-3, max_completion_length=6, train_problems=20, steps=5))
    return TrainConfig(**{**base, "checkpoint_every": 2, "seed": 0, "output_dir": str(output_dir), **changes})


def make_loop(kind: str, config: TrainConfig) -> Any:
    if kind == "bandit":
        return build_bandit_loop(BanditProblem.random(contexts=4, arms=3, seed=0), config, runs=2)
    loop = build_loop(config, tiny_model(), tokenizer(), list(problems()))
    loop.task.reward_fn = even_length
    return loop


def rows_of(history_or_rows: list[Any]) -> list[dict[str, Any]]:
    """Records without their wall-clock fields (what must be bit-identical)."""
    rows = [r if isinstance(r, dict) else r.to_dict() for r in history_or_rows]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def tensors_of(loop: Any) -> dict[str, torch.Tensor]:
    """π_θ, α and π_ref of a loop, by name."""
    out = {f"policy.{k}": v for k, v in loop.policy.state_dict().items()}
    out |= {f"sampler.{k}": v for k, v in loop.sampler.state_dict().items()}
    if loop.reference is not None:
        out |= {f"reference.{k}": v for k, v in loop.reference.state_dict().items()}
    return out


def same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@functools.cache
def reference_run(kind: str) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor]]:
    """The uninterrupted run of each kind: its metrics rows and final tensors (computed once)."""
    with tempfile.TemporaryDirectory() as tmp:
        config = train_config(kind, tmp)
        loop = train(config, make_loop(kind, config), progress=False)
        rows = rows_of(load_metrics(tmp))
    assert rows == rows_of(loop.history)
    return rows, {k: v.clone() for k, v in tensors_of(loop).items()}


# ----------------------------------------------------------------------------- 1. bad-input catalogue

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

    def reward(text: str, problem: Problem) -> Any:
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
    return guard_memory(config, tiny_model(), prompt_length=50, available=10**6)


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
    BadInput("dtype = 'fp8'", lambda: TrainConfig(dtype="fp8"), ValueError,
             r"dtype must be one of \('float32', 'bfloat16', 'float16'\), got 'fp8'"),
    BadInput("device = 'tpu'", lambda: TrainConfig(device="tpu"), ValueError,
             r"device must be one of \('auto', 'cpu', 'cuda'\), got 'tpu'"),
    BadInput("report_to = ('mlflow',)", lambda: TrainConfig(report_to=("mlflow",)), ValueError,
             r"report_to must be one of \('tensorboard', 'wandb'\), got 'mlflow'"),
    BadInput("report_to = 'wandb' (a string)", lambda: TrainConfig(report_to="wandb"), ValueError,
             r"report_to must be a list of logger names, got the string 'wandb'"),
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
             FileExistsError, r"File exists: '.*plain'"),
    BadInput("output_dir is a file", train_into_a_file, FileExistsError, r"File exists: '.*not_a_folder'"),
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
    BadInput("available < 0", lambda: guard_memory(TrainConfig(), tiny_model(), 10, available=-1), ValueError,
             r"available must be an integer >= 0, got -1"),
]


@pytest.mark.parametrize("case", CATALOGUE, ids=[c.name for c in CATALOGUE])
def test_bad_input_is_refused_clearly(case):
    with pytest.raises(case.error, match=case.pattern):
        case.call()


# ----------------------------------------------------------------------------- 2. fuzzed answers

PARENT_SLACK_S = 1.0
"""Parent-side work a reward may add to the math-verify timeout: extraction, exact arithmetic on a
100k-digit number (~0.3 s), the format check."""
LONG_PIECES = ["9", "\\boxed{", "{", "}", "1,", "a", "\\frac{1}{", "½", " ", "\\boxed {1} "]
NESTINGS = [("\\frac{", "}{2}"), ("\\sqrt{", "}"), ("{", "}"), ("\\boxed{", "}"), ("\\left(", "\\right)"), ("2^{", "}")]


def hostile_answers(max_depth: int) -> st.SearchStrategy[str]:
    """Random unicode, huge numbers, nested LaTeX up to ``max_depth``, empty and 100k-character strings."""
    huge = (st.builds(str.__add__, st.sampled_from("123456789"), st.text("0123456789", min_size=20, max_size=5000))
            | st.builds(lambda a, b: f"{a:,}.{b}", st.integers(10**6, 10**300), st.integers(0, 10**40))
            | st.builds(lambda a: f"-{a}/{a + 1}", st.integers(10**30, 10**400)))
    nested = st.builds(lambda d, pair: pair[0] * d + "1" + pair[1] * d, st.integers(1, max_depth),
                       st.sampled_from(NESTINGS))
    long = st.sampled_from(LONG_PIECES).map(lambda piece: piece * (100_000 // len(piece)))
    odd = st.sampled_from(["", " ", "\ud800", "\udfff\\boxed{1}", "\x00", "\\boxed{\x00}", "1e400", "NaN", "∞"])
    return st.text(max_size=200) | huge | nested | long | odd


def completions(max_depth: int) -> st.SearchStrategy[str]:
    part = hostile_answers(max_depth)
    return part | st.builds(lambda a, b: f"{a} so the answer is \\boxed{{{b}}}", part, part)


GOLDS = st.sampled_from(["72", "-3", "\\frac{1}{2}", "x^2+2x+1", "1,234", "0.5"])


@contextlib.contextmanager
def within(seconds: float, what: str) -> Iterator[None]:
    """Raise TimeoutError if the block runs longer than ``seconds`` (main thread, pure-Python work only)."""
    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"{what} took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def score_answer(completion: str, gold: str, timeout: float) -> tuple[float, float, bool]:
    """Reward of a hostile completion: ``(value, seconds, worker_was_warm)``.

    Extraction runs first under an alarm (it has no timeout of its own: a quadratic scan would
    hang the trainer); math-verify runs in its worker with ``timeout``.
    """
    what = f"extracting the answer of {completion[:40]!r}… ({len(completion)} characters)"
    with within(PARENT_SLACK_S, what):
        extract_answer(completion)
        format_reward(completion, "boxed")
    warm = rewards._VERIFIER.warm()
    start = time.perf_counter()
    value = answer_reward(completion, gold, "boxed", 0.1, timeout=timeout)
    return value, time.perf_counter() - start, warm


FUZZ_TIMEOUT_S = 1.0


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(completion=completions(max_depth=4), gold=GOLDS)
def test_hostile_answers_never_raise_and_respect_the_timeout(completion, gold):
    value, seconds, warm = score_answer(completion, gold, FUZZ_TIMEOUT_S)
    assert value in (0.0, 0.1, 1.0)
    bound = FUZZ_TIMEOUT_S + PARENT_SLACK_S + (0 if warm else rewards.STARTUP_TIMEOUT_S)
    assert seconds <= bound, f"{seconds:.2f} s > {bound} s on {completion[:60]!r}"


@pytest.mark.parametrize("piece", LONG_PIECES)
def test_answer_extraction_is_linear_on_100k_characters(piece):
    text = piece * (100_000 // len(piece))
    with within(PARENT_SLACK_S, f"extracting from {piece!r} × {len(text) // len(piece)}"):
        extract_answer(text)
        format_reward(text, "boxed")


# ----------------------------------------------------------------------------- 3–7. faults

@dataclass
class Outcome:
    """What a fault did: each check must hold; ``lost`` counts completed steps that are neither in
    the checkpoint nor redone identically (must be 0)."""

    fault: str
    checks: dict[str, bool] = field(default_factory=dict)
    lost: int = 0
    resumed: bool = False
    note: str = ""

    @property
    def ok(self) -> bool:
        return all(self.checks.values()) and self.lost == 0

    def failed(self) -> list[str]:
        return [name for name, ok in self.checks.items() if not ok] + ([f"lost {self.lost}"] if self.lost else [])


def resume_and_compare(kind: str, config: TrainConfig, outcome: Outcome, logged: list[dict[str, Any]]) -> None:
    """Resume ``config``'s run from its checkpoint with a fresh loop; compare with the uninterrupted run.

    ``logged``: rows written before the fault; each must be in the final metrics unchanged.
    """
    rows, tensors = reference_run(kind)
    loop = train(config, make_loop(kind, config), progress=False)
    final = rows_of(load_metrics(config.output_dir))
    outcome.resumed = True
    outcome.checks["resumed run = uninterrupted run (metrics, bit for bit)"] = final == rows
    outcome.checks["resumed run = uninterrupted run (π_θ, α, π_ref)"] = same_tensors(tensors_of(loop), tensors)
    outcome.lost += sum(row not in final for row in rows_of(logged))


CRASH_CHILD = r"""
import io, json, sys, time
import torch
spec = json.loads(sys.argv[1])
torch.set_num_threads(1)
sys.path.insert(0, spec["tests"])
import test_reliability as rel
real_save = torch.save

def save(obj, f, *args, **kwargs):
    if isinstance(obj, dict) and obj.get("k") == spec["kill_at"]:
        buffer = io.BytesIO()
        real_save(obj, buffer)
        f.write(buffer.getvalue()[: buffer.tell() // 2])
        f.flush()
        print("mid-save", flush=True)
        time.sleep(600)
    return real_save(obj, f, *args, **kwargs)

torch.save = save
config = rel.train_config(spec["kind"], spec["out"])
rel.train(config, rel.make_loop(spec["kind"], config), progress=False)
print("finished", flush=True)
"""


def crash_mid_checkpoint(tmp: Path, kind: str) -> Outcome:
    """SIGKILL a training process while it writes the checkpoint after step 4 (half the bytes written)."""
    outcome = Outcome(f"SIGKILL while writing a checkpoint ({kind})")
    config = train_config(kind, tmp / "run")
    spec = {"tests": str(Path(__file__).parent), "kind": kind, "out": config.output_dir, "kill_at": 4}
    child = subprocess.Popen([sys.executable, "-c", CRASH_CHILD, json.dumps(spec)], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([child.stdout], [], [], 300)
        line = child.stdout.readline() if ready else ""
        partial = list(Path(config.output_dir).glob(".checkpoint.pt.*.tmp"))
    finally:
        os.kill(child.pid, signal.SIGKILL)
        _, err = child.communicate()
    outcome.checks["killed in the middle of the write"] = line == "mid-save\n" and len(partial) == 1
    if line != "mid-save\n":
        outcome.note = err[-2000:]
        return outcome
    logged = load_metrics(config.output_dir)
    try:
        previous = torch.load(Path(config.output_dir) / "checkpoint.pt", weights_only=True)["k"]
    except Exception:  # noqa: BLE001 - an unreadable checkpoint is the failure being measured
        previous = None
    outcome.checks["the previous checkpoint (k = 2) still loads"] = previous == 2
    outcome.note = f"{len(partial)} partial temp file left beside it until the next save"
    resume_and_compare(kind, config, outcome, logged)
    outcome.checks["the next save removed the partial temp file"] = not list(
        Path(config.output_dir).glob(".checkpoint.pt.*.tmp"))
    return outcome


def poison_gradients(loop: Any, step: int, pass_index: int) -> None:
    """NaN in the gradient of π_θ's first parameter at (step, pass_index): one chunk per pass."""
    calls = itertools.count()
    parameter = next(loop.policy.parameters())

    def hook(grad: torch.Tensor) -> torch.Tensor:
        return grad * math.nan if loop.k == step and next(calls) == pass_index else grad

    parameter.register_hook(hook)


def snapshot(loop: Any) -> tuple[dict[str, torch.Tensor], bytes]:
    """π_θ, α, π_ref (cloned), and the optimiser state, k and history (serialised)."""
    state = loop.state_dict()
    other = io.BytesIO()
    torch.save({"optimizer": state["optimizer"], "k": state["k"], "history": state["history"]}, other)
    return {k: v.clone() for k, v in tensors_of(loop).items()}, other.getvalue()


def unchanged(before: tuple[dict[str, torch.Tensor], bytes], after: tuple[dict[str, torch.Tensor], bytes],
              skip: str = "~") -> bool:
    """Same tensors (except those whose name starts with ``skip``), same optimiser state, k and history."""
    keep = [k for k in before[0] if not k.startswith(skip)]
    return same_tensors({k: before[0][k] for k in keep}, {k: after[0][k] for k in keep}) and before[1] == after[1]


def nan_gradient(tmp: Path, kind: str, max_grad_norm: float | None = 1.0) -> Outcome:
    """NaN gradient in pass 0 of step 3: stops naming the step and the parameter, before the optimiser moves."""
    outcome = Outcome(f"NaN gradient, max_grad_norm = {max_grad_norm} ({kind})")
    config = train_config(kind, tmp / "run", max_grad_norm=max_grad_norm)
    loop = make_loop(kind, config)
    list(loop.run(3))
    before = snapshot(loop)
    poison_gradients(loop, step=3, pass_index=0)
    name = next(n for n, _ in loop.policy.named_parameters())
    try:
        loop.step()
        message = ""
    except FloatingPointError as exc:
        message = str(exc)
    outcome.checks["FloatingPointError naming step 3 and the parameter"] = (
        "non-finite gradient norm nan at step 3" in message and repr(name) in message)
    # on a sync step α ← π_θ is committed once sampling succeeded (consistent: π_θ did not move)
    outcome.checks["π_θ, π_ref, optimiser state, k and history untouched"] = unchanged(
        before, snapshot(loop), skip="sampler.")
    return outcome


def nan_loss(tmp: Path, kind: str) -> Outcome:
    """log π_θ turns inf at step 2: the loss is non-finite; stops naming step and pass, nothing applied."""
    outcome = Outcome(f"inf in log π_θ → non-finite loss ({kind})")
    loop = make_loop(kind, train_config(kind, tmp / "run"))
    list(loop.run(2))
    before = snapshot(loop)
    real = loop.policy.logprobs
    loop.policy.logprobs = lambda rollout, rows: real(rollout, rows) + (math.inf if loop.k == 2 else 0.0)
    try:
        loop.step()
        message = ""
    except FloatingPointError as exc:
        message = str(exc)
    outcome.checks["FloatingPointError naming the loss, step 2, pass 0"] = (
        message.startswith("non-finite loss") and "at step 2, pass 0" in message)
    # step 2 is a sync step (v = 2): α ← π_θ is committed once sampling succeeded, and π_θ is unchanged
    outcome.checks["π_θ, π_ref, optimiser state, k and history untouched"] = unchanged(
        before, snapshot(loop), skip="sampler.")
    return outcome


def poisoned_step_in_train(tmp: Path, kind: str) -> Outcome:
    """NaN gradient in the LAST pass of step 3 inside ``train`` (the bandit has i = 2, so pass 0 was
    applied): train stops, writes no checkpoint from that state, and the run resumes exactly."""
    outcome = Outcome(f"NaN gradient mid-step inside train ({kind})")
    config = train_config(kind, tmp / "run")
    loop = make_loop(kind, config)
    poison_gradients(loop, step=3, pass_index=config.i - 1)
    try:
        train(config, loop, progress=False)
        message = ""
    except FloatingPointError as exc:
        message = str(exc)
    outcome.checks["train raised FloatingPointError at step 3"] = "at step 3" in message
    if config.i > 1:  # pass 0 had moved π_θ: the state train must not save
        clean = make_loop(kind, config)
        list(clean.run(3))
        outcome.checks["π_θ in memory was half-updated"] = not same_tensors(clean.policy.state_dict(),
                                                                            loop.policy.state_dict())
    state = torch.load(Path(config.output_dir) / "checkpoint.pt", weights_only=True)
    outcome.checks["the checkpoint is the last good one (k = 2)"] = state["k"] == 2
    outcome.checks["no temp file left"] = not list(Path(config.output_dir).glob(".*.tmp"))
    resume_and_compare(kind, config, outcome, load_metrics(config.output_dir))
    return outcome


def interrupt_in_sampling(tmp: Path, kind: str) -> Outcome:
    """KeyboardInterrupt inside sampler.sample at a sync step: nothing of the step is kept."""
    outcome = Outcome(f"KeyboardInterrupt while sampling ({kind})")
    config = train_config(kind, tmp / "run")
    loop = make_loop(kind, config)
    step, real_sample, real_step = 2 * config.v, loop.sampler.sample, loop.step
    rng: list[torch.Tensor] = []

    def sample(*args: Any) -> Any:
        if loop.k == step and "interrupted" not in outcome.checks:
            outcome.checks["interrupted"] = True
            raise KeyboardInterrupt
        return real_sample(*args)

    def step_fn() -> Any:
        rng.append(loop.generator.get_state())
        return real_step()

    loop.sampler.sample, loop.step = sample, step_fn
    train(config, loop, progress=False)
    outcome.checks["stopped at the step, sync not committed"] = (
        loop.k == step and len(loop.history) == step and loop.schedule.last_sync == config.v)
    state = torch.load(Path(config.output_dir) / "checkpoint.pt", weights_only=True)
    outcome.checks["checkpoint holds k and the RNG from before the step"] = (
        state["k"] == step and torch.equal(state["generator"], rng[-1]))
    resume_and_compare(kind, config, outcome, load_metrics(config.output_dir))
    return outcome


def interrupt_in_training(tmp: Path, kind: str) -> Outcome:
    """SIGINT to this process during the optimiser passes of step 3: the step finishes, is recorded
    (history, metrics.jsonl, checkpoint), then the run stops."""
    outcome = Outcome(f"SIGINT during the optimiser passes ({kind})")
    config = train_config(kind, tmp / "run")
    loop = make_loop(kind, config)
    real, sent = loop.policy.logprobs, []

    def logprobs(rollout: Any, rows: slice) -> torch.Tensor:
        if loop.k == 3 and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)
        return real(rollout, rows)

    loop.policy.logprobs = logprobs
    train(config, loop, progress=False)
    rows, tensors = reference_run(kind)
    outcome.checks["signal sent"] = bool(sent)
    outcome.checks["step 3 fully applied and recorded"] = loop.k == 4 and rows_of(loop.history) == rows[:4]
    outcome.checks["metrics.jsonl has step 3"] = rows_of(load_metrics(config.output_dir)) == rows[:4]
    state = torch.load(Path(config.output_dir) / "checkpoint.pt", weights_only=True)
    outcome.checks["checkpoint at k = 4"] = state["k"] == 4
    resume_and_compare(kind, config, outcome, load_metrics(config.output_dir))
    return outcome


def alpha_and_theta(loop: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """α's tensors and π_θ's, in the same order (the pairs a sync copies)."""
    if isinstance(loop.sampler, HFSampler):
        model = loop.policy.model
        return list(loop.sampler._targets), [t for _, t in [*model.named_parameters(), *model.named_buffers()]]
    return [loop.sampler.logits], [loop.policy.logits.detach()]


def half_sync(loop: Any) -> None:
    """Copy only the first half of π_θ into α (an interrupted sync)."""
    alpha, theta = alpha_and_theta(loop)
    if len(alpha) == 1:
        alpha, theta = [alpha[0][:, : alpha[0].shape[1] // 2]], [theta[0][:, : theta[0].shape[1] // 2]]
    else:
        alpha, theta = alpha[: len(alpha) // 2], theta[: len(theta) // 2]
    torch._foreach_copy_(alpha, theta)


def interrupt_in_sync(tmp: Path, kind: str) -> Outcome:
    """KeyboardInterrupt halfway through α ← π_θ: the checkpoint holds a half-copied α, but the sync
    is not committed, so the resumed step syncs again and α is consistent."""
    outcome = Outcome(f"KeyboardInterrupt halfway through a sync ({kind})")
    config = train_config(kind, tmp / "run")
    loop = make_loop(kind, config)
    step, real = 2 * config.v, loop.sampler.sync

    def sync(policy: Any) -> int:
        if loop.k == step and "half copied" not in outcome.checks:
            old = [t.clone() for t in alpha_and_theta(loop)[0]]
            half_sync(loop)
            alpha, theta = alpha_and_theta(loop)
            outcome.checks["half copied"] = (not all(map(torch.equal, alpha, old))
                                             and not all(map(torch.equal, alpha, theta)))
            raise KeyboardInterrupt
        return real(policy)

    loop.sampler.sync = sync
    train(config, loop, progress=False)
    outcome.checks["stopped at the sync step, last_sync not updated"] = (
        loop.k == step and loop.schedule.last_sync == config.v)
    logged = load_metrics(config.output_dir)
    resume_and_compare(kind, config, outcome, logged)
    resumed_rows = rows_of(load_metrics(config.output_dir))
    outcome.checks["the resumed step synced (lag 0)"] = resumed_rows[step]["synced"] and resumed_rows[step]["lag"] == 0
    return outcome


SCENARIOS: dict[str, Callable[[Path, str], Outcome]] = {
    "crash_mid_checkpoint": crash_mid_checkpoint, "nan_gradient": nan_gradient,
    "nan_gradient_unclipped": lambda tmp, kind: nan_gradient(tmp, kind, max_grad_norm=None),
    "nan_loss": nan_loss, "poisoned_step_in_train": poisoned_step_in_train,
    "interrupt_in_sampling": interrupt_in_sampling, "interrupt_in_training": interrupt_in_training,
    "interrupt_in_sync": interrupt_in_sync,
}
FAST = [("crash_mid_checkpoint", "bandit"), ("nan_gradient", "bandit"), ("nan_gradient_unclipped", "bandit"),
        ("nan_gradient", "lm"), ("nan_loss", "lm"), ("poisoned_step_in_train", "bandit"),
        ("interrupt_in_sampling", "bandit"), ("interrupt_in_training", "bandit"), ("interrupt_in_sync", "bandit"),
        ("interrupt_in_sync", "lm")]


@pytest.mark.parametrize("name, kind", FAST, ids=[f"{n}-{k}" for n, k in FAST])
def test_fault_is_recovered_with_nothing_lost(name, kind, tmp_path):
    outcome = SCENARIOS[name](tmp_path, kind)
    assert outcome.ok, f"{outcome.fault}: failed {outcome.failed()} {outcome.note}"


# ----------------------------------------------------------------------------- 5. determinism

def lm_first_steps(seed: int, steps: int = 3) -> tuple[list[dict[str, Any]], list[torch.Tensor], dict]:
    with tempfile.TemporaryDirectory() as tmp:
        loop = make_loop("lm", train_config("lm", tmp, seed=seed))
        seen = []
        real = loop.sampler.sample
        loop.sampler.sample = lambda *args: seen.append(real(*args)) or seen[-1]
        list(loop.run(steps))
    return rows_of(loop.history), [r.completions for r in seen], tensors_of(loop)


def test_same_seed_same_lm_steps_other_seed_differs():
    rows, completions, tensors = lm_first_steps(0)
    rows_again, completions_again, tensors_again = lm_first_steps(0)
    assert rows == rows_again and same_tensors(tensors, tensors_again)
    assert all(torch.equal(a, b) for a, b in zip(completions, completions_again, strict=True))
    _, other, _ = lm_first_steps(1)
    assert not torch.equal(completions[0], other[0])


def test_same_seed_same_bandit_curves_other_seed_differs():
    def curves(seed: int) -> Any:
        run = run_bandit(BanditProblem.random(6, 4, seed=2), train_config("bandit", "unused", seed=seed, steps=40),
                         runs=3, track_bound=True)
        return run.J, run.bound, rows_of(run.records)

    J, bound, rows = curves(5)
    J_again, bound_again, rows_again = curves(5)
    assert (J == J_again).all() and (bound == bound_again).all() and rows == rows_again
    assert not (curves(6)[0] == J).all()


# ----------------------------------------------------------------------------- 6. memory guard

SHAPE = ModelShape(weights=1000, trainable=800, element_size=4, layers=2, hidden=8, intermediate=16, vocab=100,
                   heads=2, kv_heads=1, head_dim=4)


def test_memory_estimate_counts_each_copy_and_scales_with_the_batch():
    config = TrainConfig(G=4, prompts_per_step=2, max_completion_length=5)
    est = estimate_memory(SHAPE, config, prompt_length=7)
    assert (est.sampler, est.reference, est.gradients, est.optimizer) == (1000, 0, 800, 1600)
    assert estimate_memory(SHAPE, config.replace(beta=0.1), 7).reference == 1000
    assert estimate_memory(SHAPE, config.replace(optimizer="sgd", lr=0.1), 7).optimizer == 0
    assert est.training == estimate_memory(SHAPE, config, 7, micro_batch_size=8).training  # default: whole batch
    one, two = (estimate_memory(SHAPE, config, 7, micro_batch_size=m).training for m in (1, 2))
    assert 2 * one - 2 <= two <= 2 * one and one > 0
    double_batch = estimate_memory(SHAPE, config.replace(G=8), 7)
    assert 2 * est.sampling - 2 <= double_batch.sampling <= 2 * est.sampling
    assert estimate_memory(SHAPE, config.replace(max_completion_length=50), 7).new > est.new
    kept_scores = ModelShape(0, 0, 4, 0, 0, 0, 100, 1, 1, 1)   # only the vocabulary: generate's kept scores
    assert estimate_memory(kept_scores, config, 7).sampling == 4 * 8 * 5 * 100


def test_guard_shrinks_the_micro_batch_and_says_so(capsys):
    model, config = tiny_model(), TrainConfig(G=8, prompts_per_step=4, max_completion_length=6)
    shape = ModelShape.of(model)
    assert shape.vocab == len(tokenizer()) and shape.layers == 1 and shape.weights > 0
    need = estimate_memory(shape, config, 50, micro_batch_size=8).new
    available = math.ceil((need + 1) / BUDGET_FRACTION)
    assert guard_memory(config, model, 50, available=10 * available) is config
    shrunk = guard_memory(config, model, 50, available=available)
    assert shrunk.micro_batch_size == 8 and shrunk.replace(micro_batch_size=None) == config
    printed = capsys.readouterr().out
    assert "memory guard: micro_batch_size None → 8" in printed and "GiB" in printed


def test_build_loop_is_guarded(monkeypatch, tmp_path):
    import grpo_lab.memory

    copies = []
    real_init = HFSampler.__init__
    monkeypatch.setattr(HFSampler, "__init__", lambda self, *a, **k: copies.append(1) or real_init(self, *a, **k))
    monkeypatch.setattr(grpo_lab.memory, "available_memory", lambda device: 0)
    with pytest.raises(ValueError, match="memory guard: the run needs about"):
        make_loop("lm", train_config("lm", tmp_path))
    assert not copies                                            # refused before α was copied
    config = train_config("lm", tmp_path)
    model = tiny_model()
    need = estimate_memory(ModelShape.of(model), config, 60, micro_batch_size=2).new
    monkeypatch.setattr(grpo_lab.memory, "available_memory", lambda device: math.ceil(need / BUDGET_FRACTION))
    loop = build_loop(config, model, tokenizer(), list(problems()))
    assert 1 <= loop.config.micro_batch_size < config.G * config.prompts_per_step
    loop.task.reward_fn = even_length
    assert loop.step().step == 0


def test_available_memory_is_real():
    import psutil

    assert 0 < available_memory("cpu") <= psutil.virtual_memory().total
