"""α's KV cache: the preallocated layers give the same floats as transformers' growing ``DynamicCache``, on a tiny
random Llama and GPT-2 (seconds on CPU)."""

import pytest
import torch
from tiny_lm import PROMPTS, tiny_model, word_tokenizer

from grpo_lab.lm import decoding
from grpo_lab.lm.decoding import PreallocatedLayer
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.sampling import HFSampler


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer()


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_the_preallocated_cache_draws_what_the_growing_one_draws(tokenizer, kind, top_p, monkeypatch):
    """Under one seed: the same tokens and the same log α, bit for bit, as with the model's own DynamicCache."""
    sampler = HFSampler(LMPolicy(tiny_model(seed=2, kind=kind), 0.8), tokenizer, max_completion_length=12, top_p=top_p)
    seen = []
    step = sampler.decoder.step

    def spy(*args):
        seen.append({type(layer) for layer in sampler.decoder.cache.layers})
        return step(*args)

    sampler.decoder.step = spy
    preallocated = sampler.sample(PROMPTS, 4, torch.Generator().manual_seed(7))
    assert seen and all(types == {PreallocatedLayer} for types in seen)
    monkeypatch.setattr(decoding, "preallocated_cache", lambda model, capacity: None)   # the model's own cache
    seen.clear()
    growing = sampler.sample(PROMPTS, 4, torch.Generator().manual_seed(7))
    assert seen and all(PreallocatedLayer not in types for types in seen)
    assert torch.equal(preallocated.completions, growing.completions)
    assert torch.equal(preallocated.logp_alpha, growing.logp_alpha)
    assert int(growing.mask.sum()) > 4 * len(PROMPTS)  # rows that decoded, not ended at once


def test_a_preallocated_layer_refuses_to_overflow():
    layer = PreallocatedLayer(capacity=3)
    keys = torch.zeros(1, 2, 2, 4)
    layer.update(keys, keys)
    assert layer.keys.shape[-2] == 2 and layer.get_seq_length() == 2
    with pytest.raises(ValueError, match="holds 3 positions; 4 were written"):
        layer.update(keys, keys)


def test_repeating_rows_keeps_room_for_the_completions():
    layer = PreallocatedLayer(capacity=4)
    keys = torch.arange(2 * 1 * 2 * 1, dtype=torch.float32).reshape(2, 1, 2, 1)
    layer.update(keys, -keys)
    layer.batch_repeat_interleave(3)
    assert torch.equal(layer.keys, keys.repeat_interleave(3, dim=0))
    assert torch.equal(layer.values, -keys.repeat_interleave(3, dim=0))
    step = torch.full((6, 1, 1, 1), 9.0)
    layer.update(step, step)
    assert layer.keys.shape == (6, 1, 3, 1) and bool((layer.keys[:, :, 2] == 9).all())
