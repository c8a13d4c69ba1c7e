"""The weights' proof on the real vLLM CPU engine (``make test-vllm``, marker ``vllm``): every sync fault of
tests/sync_faults.py caught with the tensor named, on an engine that fuses q/k/v and gate/up and repacks its
matrices; and a bfloat16 engine fed a float32 trainer's weights proved at every one of 200 real steps.

A small config-built Llama (SmolLM2's tokenizer and vocabulary, 2 layers of width 256, tied embeddings) keeps
each step short (head size 64: the CPU attention kernels take no smaller); one engine at a time (see
tests/test_vllm_engine.py)."""

import gc

import pytest
import torch
from sync_faults import FAULTS, nudge, pushed
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from grpo_lab import GRPOConfig, GRPOLoop
from grpo_lab.lm.models import bundled_model_dir
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.sampling_vllm import VLLMSampler, load_weights_into_vllm
from grpo_lab.sync_audit import SyncError

pytestmark = pytest.mark.vllm

ENGINE = {"enforce_eager": True, "max_model_len": 128}
PROMPTS = ["<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A small Llama saved with SmolLM2's tokenizer, for vLLM to build."""
    folder = tmp_path_factory.mktemp("small_llama")
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir())
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.bos_token_id, torch_dtype="float32")
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def make(checkpoint, dtype: str) -> tuple[LMPolicy, VLLMSampler]:
    gc.collect()
    model = LlamaForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    policy = LMPolicy(model, 1.0)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    return policy, VLLMSampler(policy, tokenizer, str(checkpoint), 8, dtype=dtype, engine_kwargs=ENGINE)


_live: dict[str, tuple[LMPolicy, VLLMSampler]] = {}


def engine(checkpoint, dtype: str) -> tuple[LMPolicy, VLLMSampler]:
    """The module's one live engine in ``dtype`` (the other released first), π_θ reset to the checkpoint and
    pushed."""
    if dtype not in _live:
        _live.clear()
        gc.collect()
        _live[dtype] = make(checkpoint, dtype)
    policy, sampler = _live[dtype]
    policy.model.load_state_dict(LlamaForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).state_dict())
    sampler.sync(policy)
    return policy, sampler


@pytest.fixture(scope="module", autouse=True)
def release_engines():
    yield
    _live.clear()
    gc.collect()


def untie_lm_head(model: torch.nn.Module) -> None:
    """The engine's LM head on a copy of its embedding as it is now, re-processed: what vLLM's reload alone leaves
    where the head's GEMM packs a copy of its own (oneDNN: float32 here, bfloat16 with AVX-512). Where oneDNN has
    no bfloat16 matmul (AVX2 only), the engine falls back to torch's linear on the head's own Parameter, which is
    the embedding's, and the reload alone leaves the head tied: the fault is set up here so it exists on both."""
    model.lm_head.weight = torch.nn.Parameter(model.model.embed_tokens.weight.detach().clone(), requires_grad=False)
    model.lm_head.quant_method.process_weights_after_loading(model.lm_head)


def vllm_faulty_sync(sampler: VLLMSampler, policy: LMPolicy, fault: str) -> None:
    """α ← π_θ as a sync with ``fault`` pushes it: nothing, a list without a tensor or under swapped names, or
    every tensor by vLLM's reload alone into an engine whose LM head no longer shares the embedding."""
    named = pushed(policy.model.named_parameters(), fault)
    if fault == "leaves a tied LM head behind":
        sampler.llm.apply_model(untie_lm_head)
        sampler.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": named, "is_checkpoint_format": True})
    elif named:
        load_weights_into_vllm(sampler.llm, named)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_engine_faults_are_caught_with_the_tensor_named(checkpoint, dtype, fault):
    policy, sampler = engine(checkpoint, dtype)
    sampler.prove_sync(policy, step=0)                                   # a real sync: proved
    nudge(policy.model, scale=0.05)
    vllm_faulty_sync(sampler, policy, fault)
    with pytest.raises(SyncError, match=rf"step 7 did not take: {FAULTS[fault]}"):
        sampler.prove_sync(policy, step=7)
    sampler.sync(policy)                                                 # a real sync after it: proved
    sampler.prove_sync(policy, step=8)


def test_a_bf16_engine_fed_fp32_weights_is_proved_at_each_of_200_real_steps(checkpoint):
    """GRPO at v = 1, lr 1e-5 (one step moves few bf16 roundings, the hard case for a tolerance): every sync
    proved, none failed; and every matrix did change in bf16 along the run (the proof compared something)."""
    policy, sampler = engine(checkpoint, "bfloat16")
    config = GRPOConfig(G=2, prompts_per_step=2, max_completion_length=8, lr=1e-5, steps=200, seed=0, v=1)

    class Prompts:
        def prompts(self, n, generator):
            return [PROMPTS[int(i)] for i in torch.randint(len(PROMPTS), (n,), generator=generator)]

        def rewards(self, rollout, generator):
            return torch.rand(len(rollout.prompts), config.G, generator=generator)

    start = {n: p.detach().to(torch.bfloat16).clone() for n, p in policy.model.named_parameters()}
    records = list(GRPOLoop(policy, sampler, Prompts(), config).run())
    assert [r.weights_audit for r in records] == ["proved"] * 200
    unmoved = {n for n, p in policy.model.named_parameters() if torch.equal(p.to(torch.bfloat16), start[n])}
    assert unmoved == {n for n in start if "norm" in n}  # norms sit near 1, where a bf16 step is 2⁻⁷: 200 × 1e-5 short
