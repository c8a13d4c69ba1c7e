"""The two kinds of run the reliability tests drive, and how to compare runs bit for bit.

``bandit``: the exact bandit through ``train`` (milliseconds per step). ``lm``: a tiny random Llama
with the bundled SmolLM2 tokenizer through ``build_loop``/``train``. Shared by the fault, determinism
and memory-guard tests, the bad-input catalogue and ``tests/reliability_report.py``.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from grpo_lab.exact.bandit import BanditProblem, build_bandit_loop
from grpo_lab.lm.build import build_loop
from grpo_lab.lm.models import bundled_model_dir
from grpo_lab.lm.tasks import Problem, load_problems
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.lm.training import load_metrics, train

REPO = Path(__file__).resolve().parent.parent
TIMING = ("sample_seconds", "train_seconds", "sync_seconds", "audit_seconds", "probe_audit")
"""The fields two identical runs may differ in: wall-clock times, and the probe's verdict (a resumed run's probe
takes a new reference at its first sync, so a sync the uninterrupted run judged is "not judged yet" there)."""



@functools.cache
def tokenizer() -> Any:
    tok = AutoTokenizer.from_pretrained(bundled_model_dir())
    tok.padding_side = "left"
    return tok


def tiny_model(seed: int = 0, layers: int = 1) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    tok = tokenizer()
    return LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                        tie_word_embeddings=True))


@functools.cache
def problems() -> tuple[Problem, ...]:
    return tuple(load_problems("add1", 20, seed=0))


def even_length(text: str, problem: Problem, finished: bool) -> float:
    return float(len(text) % 2 == 0)


def train_config(kind: str, output_dir: Path | str, **changes: Any) -> TrainConfig:
    """A short run of each kind that exercises v > 1 and a periodic checkpoint (the bandit also i, β, π_ref resets)."""
    base = (dict(G=8, prompts_per_step=4, v=3, i=2, beta=0.05, ref_period=4, optimizer="adamw", lr=0.05, steps=10)
            if kind == "bandit" else
            dict(G=4, prompts_per_step=2, v=2, lr=1e-3, max_completion_length=6, train_problems=20, steps=5))
    return TrainConfig(**{**base, "checkpoint_every": 2, "seed": 0, "output_dir": str(output_dir), **changes})


def make_loop(kind: str, config: TrainConfig, checkpoint: Path | None = None, layers: int = 1) -> Any:
    """The run of ``kind`` on the tiny LM (of ``layers`` blocks) or the bandit; ``checkpoint``: the LM's disk
    guard checks room for it."""
    if kind == "bandit":
        return build_bandit_loop(BanditProblem.random(contexts=4, arms=3, seed=0), config, runs=2)
    loop = build_loop(config, tiny_model(layers=layers), tokenizer(), list(problems()), checkpoint=checkpoint)
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
