"""α's decoders: the MKL-packed one draws what the model's own forward draws, follows every sync, leaves α's layers
as it found them, and stands aside where it does not apply (tiny random Llama and GPT-2, seconds on CPU)."""

import copy

import pytest
import torch
from tiny_lm import PROMPTS, perturb, tiny_model, word_tokenizer

from grpo_lab.lm import decoding
from grpo_lab.lm.decoding import ModelDecoder, PackedDecoder, decoder_for
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.sampling import HFSampler

pytestmark = pytest.mark.skipif(not decoding.packing_available(), reason="this torch build has no oneDNN")


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer()


def rollouts(sampler: HFSampler, decoder_type: type, seed: int = 0, G: int = 4):
    sampler.decoder = decoder_type(sampler.model)
    return sampler.sample(PROMPTS, G, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_packed_decoder_draws_the_plain_forwards_tokens_and_log_alpha(tokenizer, kind, top_p):
    """Under one seed, the same tokens, and log α within 1e-5 (oneDNN sums in another order than ``F.linear``);
    GPT-2 has no ``nn.Linear`` in its blocks (Conv1D), so only its head is packed."""
    sampler = HFSampler(LMPolicy(tiny_model(seed=2, kind=kind), 0.8), tokenizer, max_completion_length=12, top_p=top_p)
    plain, packed = rollouts(sampler, ModelDecoder, seed=7), rollouts(sampler, PackedDecoder, seed=7)
    assert torch.equal(packed.completions, plain.completions)
    assert torch.allclose(packed.logp_alpha, plain.logp_alpha, rtol=0, atol=1e-5)
    assert int(plain.mask.sum()) > 4 * len(PROMPTS)  # rows that decoded, not ended at once


def test_packed_decoder_follows_each_sync(tokenizer):
    """Packed afresh at every rollout: after a sync, what α draws is the new weights' draw."""
    policy = LMPolicy(tiny_model(seed=3))
    sampler = HFSampler(policy, tokenizer, max_completion_length=10)
    before = rollouts(sampler, PackedDecoder, seed=5)
    perturb(policy, scale=0.3)
    sampler.sync(policy)
    after_packed = rollouts(sampler, PackedDecoder, seed=5)
    after_plain = rollouts(sampler, ModelDecoder, seed=5)
    assert not torch.equal(after_packed.logp_alpha, before.logp_alpha)
    assert torch.equal(after_packed.completions, after_plain.completions)
    assert torch.allclose(after_packed.logp_alpha, after_plain.logp_alpha, rtol=0, atol=1e-5)


def test_packed_decoder_restores_the_layers_and_drops_its_copies(tokenizer):
    """After a rollout, and after a step that raised (an interrupted cell), every linear layer runs its own forward
    again and the packed copies are gone."""
    sampler = HFSampler(LMPolicy(tiny_model()), tokenizer, max_completion_length=6)
    rollouts(sampler, PackedDecoder)
    linears = [m for m in sampler.model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all("forward" not in vars(m) for m in linears)
    assert sampler.decoder.packed == []

    calls = []
    step = PackedDecoder.step

    def interrupted(self, *args):
        with self._packed_linears():
            calls.append(bool(self.packed) and all("forward" in vars(m) for m, _ in self.packed))
            raise KeyboardInterrupt

    PackedDecoder.step = interrupted
    try:
        with pytest.raises(KeyboardInterrupt):
            sampler.sample(PROMPTS, 2, torch.Generator().manual_seed(0))
    finally:
        PackedDecoder.step = step
    assert calls == [True]
    assert all("forward" not in vars(m) for m in linears) and sampler.decoder.packed == []
    assert sampler.sample(PROMPTS, 2, torch.Generator().manual_seed(0)).mask.any()  # and it samples again


def test_decoder_for_picks_the_plain_forward_where_packing_does_not_apply(tokenizer, monkeypatch):
    model = tiny_model()
    assert isinstance(decoder_for(model, autocast=False), PackedDecoder)
    assert type(decoder_for(model, autocast=True)) is ModelDecoder
    assert type(decoder_for(copy.deepcopy(model).to(torch.bfloat16), autocast=False)) is ModelDecoder
    monkeypatch.setattr(decoding, "packing_available", lambda: False)
    assert type(decoder_for(model, autocast=False)) is ModelDecoder


def test_the_sampler_packs_float32_and_not_under_mixed_precision(tokenizer):
    assert isinstance(HFSampler(LMPolicy(tiny_model()), tokenizer, 4).decoder, PackedDecoder)
    mixed = LMPolicy(tiny_model(), compute_dtype=torch.bfloat16)
    assert type(HFSampler(mixed, tokenizer, 4).decoder) is ModelDecoder


def test_the_packed_copies_are_what_the_memory_guard_counts(tokenizer):
    """At SmolLM2-135M's layer shapes (one layer here), oneDNN's packed weights take the bytes of the weights they
    copy: W_lin of the memory guard (much smaller shapes are padded to oneDNN's blocks)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from grpo_lab.lm.memory import ModelShape
    from grpo_lab.lm.sampling import tokenize_prompts

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=576, intermediate_size=1536, num_hidden_layers=1,
                                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                                         pad_token_id=0, eos_token_id=1, bos_token_id=None)).float()
    decoder = PackedDecoder(model)
    ids, mask = tokenize_prompts(tokenizer, PROMPTS)
    with torch.no_grad():
        decoder.prefill(ids, mask, mask.long().cumsum(1) - 1, 4)
        decoder.repeat(3)
    held = sum(torch.ops.mkldnn._nbytes(packed) for _, packed in decoder.packed)
    assert held == ModelShape.of(model).packed_linears > 0
    assert ModelShape.of(model, torch.bfloat16).packed_linears == 0        # autocast: decoded unpacked
