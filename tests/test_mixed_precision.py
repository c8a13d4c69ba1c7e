"""Mixed precision (``TrainConfig.dtype = "bfloat16"``): π_θ's weights stay float32 and AdamW steps them, while
every forward — π_θ's scoring, α's decoding, π_ref's — computes in bfloat16 under ``torch.autocast``; the memory
guard counts autocast's weight copies; a run resumes bit for bit."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from reliability_runs import make_loop, problems, rows_of, same_tensors, tensors_of, tiny_model, tokenizer, train_config
from tiny_lm import EvenTokenTask, word_tokenizer
from tiny_lm import tiny_model as sharp_model

from grpo_lab import GRPOConfig, GRPOLoop
from grpo_lab.lm.build import build_loop
from grpo_lab.lm.memory import ModelShape, estimate_memory
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.sampling import HFSampler
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.lm.training import load_metrics, train
from grpo_lab.sync_audit import AUDIT_TOLERANCE, LAG0_MISMATCH

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["1 + 2 =", "3 + 4 =", "5 + 1 ="]


def rollout_of(policy: LMPolicy):
    return HFSampler(policy, tokenizer(), 6).sample(PROMPTS, 4, torch.Generator().manual_seed(0))


def moved_where_trained(model: torch.nn.Module, policy: LMPolicy, rollout) -> float:
    """The share of the weights with a non-zero gradient that one AdamW step of lr = 1e-6 changes."""
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    (-(policy.logprobs(rollout, slice(None)) * rollout.mask).sum()).backward()
    graded = [p.grad != 0 for p in model.parameters()]
    optimizer.step()
    moved = sum(int(((p.detach() != b) & g).sum()) for p, b, g in zip(model.parameters(), before, graded, strict=True))
    return moved / sum(int(g.sum()) for g in graded)


def test_the_forward_computes_in_bfloat16_and_adamw_steps_the_float32_weights():
    model = tiny_model()
    mixed = LMPolicy(model, compute_dtype=torch.bfloat16)
    full = LMPolicy(copy.deepcopy(model))
    rollout = rollout_of(full)
    logp = mixed.logprobs(rollout, slice(None))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        by_hand = full.logprobs(rollout, slice(None))
    assert torch.equal(logp.detach(), by_hand)                                 # autocast's forward, exactly
    assert not torch.allclose(logp.detach(), full.logprobs(rollout, slice(None)).detach(), atol=1e-5)
    assert mixed.compute_dtype == torch.bfloat16 and {p.dtype for p in model.parameters()} == {torch.float32}
    assert moved_where_trained(model, mixed, rollout) > 0.99                   # float32 weights: lr 1e-6 moves them
    half = tiny_model().to(torch.bfloat16)
    assert moved_where_trained(half, LMPolicy(half), rollout) < 0.1            # bfloat16 weights: it rounds away


def test_a_policy_computes_no_wider_than_its_weights():
    """A bfloat16 model under a float32 (or float16) compute dtype computes in bfloat16, and the sync audit's τ
    with it; float32 weights under bfloat16 are mixed precision."""
    half = tiny_model().to(torch.bfloat16)
    for given in (None, torch.float32, torch.float16):
        assert LMPolicy(half, compute_dtype=given).compute_dtype == torch.bfloat16
    assert LMPolicy(tiny_model(), compute_dtype=torch.bfloat16).compute_dtype == torch.bfloat16
    assert LMPolicy(tiny_model(), compute_dtype=torch.float32).compute_dtype == torch.float32
    with pytest.raises(ValueError, match="compute_dtype must be a floating torch.dtype or None, got torch.int8"):
        LMPolicy(tiny_model(), compute_dtype=torch.int8)


def cache_dtypes_while_decoding(sampler: HFSampler) -> set[torch.dtype]:
    """The dtypes of the value cache's first layer at every decoding step of one batch (the sampler releases the
    cache once the batch is decoded)."""
    seen, step = set(), sampler.decoder.step

    def spy(*args, **kwargs):
        seen.add(sampler.decoder.cache.layers[0].values.dtype)
        return step(*args, **kwargs)

    sampler.decoder.step = spy
    sampler.sample(PROMPTS, 2, torch.Generator().manual_seed(0))
    assert sampler.decoder.cache is None and seen
    return seen


def test_alpha_decodes_in_the_policys_compute_dtype():
    """α (HFSampler's copy of π_θ) decodes under π_θ's autocast: its KV cache's values come out of v_proj in
    bfloat16 (its keys leave the rotary embedding in float32 either way)."""
    mixed = HFSampler(LMPolicy(tiny_model(), compute_dtype=torch.bfloat16), tokenizer(), 6)
    assert cache_dtypes_while_decoding(mixed) == {torch.bfloat16}                # v_proj ran in bfloat16
    assert cache_dtypes_while_decoding(HFSampler(LMPolicy(tiny_model()), tokenizer(), 6)) == {torch.float32}


def test_build_loop_under_bfloat16_keeps_float32_weights_and_bfloat16_forwards():
    config = TrainConfig(prompts_per_step=2, G=2, beta=0.04, dtype="bfloat16", device="cpu")
    assert (config.weights_dtype(), config.compute_dtype()) == (torch.float32, torch.bfloat16)
    loop = build_loop(config, tiny_model(), tokenizer(), list(problems()))
    for policy in (loop.policy, loop.sampler._scorer, loop.reference):
        assert policy.compute_dtype == torch.bfloat16
        assert {p.dtype for p in policy.parameters()} == {torch.float32}
    assert loop.audit.tolerance == AUDIT_TOLERANCE[torch.bfloat16]


def test_the_memory_guard_counts_autocasts_weight_copies_and_bfloat16_activations():
    """Autocast's bfloat16 copies of the weights are added; the KV cache and the activations are counted at the
    2 bytes a bfloat16 forward holds them in, as for a model whose weights are bfloat16."""
    model = tiny_model()
    config = TrainConfig(prompts_per_step=2, G=2)
    plain, mixed = (estimate_memory(ModelShape.of(model, dtype), config, 20) for dtype in (None, torch.bfloat16))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert (plain.autocast, mixed.autocast) == (0, 2 * trainable)
    half = estimate_memory(dataclasses.replace(ModelShape.of(model), element_size=2), config, 20)
    assert (mixed.sampling, mixed.training) == (half.sampling, half.training)
    assert mixed.sampling < plain.sampling and mixed.training < plain.training
    assert mixed.new == plain.new + 2 * trainable - (plain.sampling - half.sampling) - (plain.training - half.training)


def test_a_mixed_precision_run_resumes_bit_for_bit(tmp_path):
    config = train_config("lm", tmp_path / "full", dtype="bfloat16")
    full = train(config, make_loop("lm", config), progress=False)
    part = train_config("lm", tmp_path / "part", dtype="bfloat16")
    train(part.replace(steps=3), make_loop("lm", part.replace(steps=3)), progress=False)
    resumed = train(part, make_loop("lm", part), progress=False)
    assert resumed.k == full.k == config.steps
    assert rows_of(load_metrics(part.output_dir)) == rows_of(load_metrics(config.output_dir))
    assert same_tensors(tensors_of(resumed), tensors_of(full))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_right_after_a_sync_r_prime_is_one_up_to_the_dtypes_rounding(dtype):
    """Notebook 02's checks on the steps at lag 0 (v = 1: every step) of a run with α in process: every sync proved
    and the mean |log r′| a token under LAG0_MISMATCH of the compute dtype. In bfloat16 α decodes under π_θ's
    autocast from the same weights, yet rounds otherwise (a sharp tiny Llama: r′ up to ~1.06), so r′ = 1 to 1e-3,
    the check float32 meets, fails there."""
    config = GRPOConfig(G=4, prompts_per_step=2, max_completion_length=8, lr=1e-2, steps=3, seed=0, v=1)
    policy = LMPolicy(sharp_model(), config.temperature, compute_dtype=dtype)
    loop = GRPOLoop(policy, HFSampler(policy, word_tokenizer(), 8), EvenTokenTask(), config)
    records = [r for r in loop.run() if not r.skipped]
    assert records and all(r.lag == 0 and r.weights_audit == "proved" for r in records)
    assert all(r.log_ratio_k_abs < LAG0_MISMATCH[dtype] for r in records)
    float32_check = all(abs(r.ratio_k_max - 1) < 1e-3 for r in records)
    assert float32_check == (dtype == torch.float32), [r.ratio_k_max for r in records]
