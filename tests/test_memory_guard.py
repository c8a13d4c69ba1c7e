"""The memory guard: its estimate counts each copy and scales with the batch; it shrinks the
micro-batch or refuses the run before α is copied."""

from __future__ import annotations

import math

import pytest
from reliability_runs import (
    even_length,
    make_loop,
    problems,
    tiny_model,
    tokenizer,
    train_config,
)

from grpo_lab.lm.build import build_loop
from grpo_lab.lm.memory import BUDGET_FRACTION, ModelShape, available_memory, estimate_memory, guard_memory
from grpo_lab.lm.sampling import HFSampler
from grpo_lab.lm.train_config import TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")


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
    import grpo_lab.lm.memory

    copies = []
    real_init = HFSampler.__init__
    monkeypatch.setattr(HFSampler, "__init__", lambda self, *a, **k: copies.append(1) or real_init(self, *a, **k))
    monkeypatch.setattr(grpo_lab.lm.memory, "available_memory", lambda device: 0)
    with pytest.raises(ValueError, match="memory guard: the run needs about"):
        make_loop("lm", train_config("lm", tmp_path))
    assert not copies                                            # refused before α was copied
    config = train_config("lm", tmp_path)
    model = tiny_model()
    need = estimate_memory(ModelShape.of(model), config, 60, micro_batch_size=2).new
    monkeypatch.setattr(grpo_lab.lm.memory, "available_memory", lambda device: math.ceil(need / BUDGET_FRACTION))
    loop = build_loop(config, model, tokenizer(), list(problems()))
    assert 1 <= loop.config.micro_batch_size < config.G * config.prompts_per_step
    loop.task.reward_fn = even_length
    assert loop.step().step == 0


def test_available_memory_is_real():
    import psutil

    assert 0 < available_memory("cpu") <= psutil.virtual_memory().total
