"""GenerateSampler, α decoded through ``model.generate`` one row per completion (TRL's way without vLLM), on a tiny
random Llama: its log α against a plain recomputation, the distribution generate draws from, its layout, and the
loop choosing it by ``sampler="hf_generate"``."""

import pytest
import torch
from reliability_runs import problems
from reliability_runs import tiny_model as tiny_smollm_shaped
from reliability_runs import tokenizer as smollm_tokenizer
from tiny_lm import PROMPTS, perturb, tiny_model, truncated_scores, word_tokenizer

from grpo_lab.lm.build import build_loop
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.sampling import GenerateSampler, HFSampler, LogAlphaProcessor
from grpo_lab.lm.train_config import TrainConfig


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer()


def sample(sampler, G=4, seed=0, prompts=PROMPTS):
    return sampler.sample(prompts, G, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), [(1.0, 1.0, 0), (0.7, 1.0, 0), (0.8, 0.7, 0),
                                                             (1.0, 1.0, 5)])
def test_log_alpha_is_a_plain_recomputation_of_the_drawn_tokens(tokenizer, one_thread, temperature, top_p, top_k):
    """log α of every drawn token equals the same token's log-prob recomputed apart from the sampler: one whole
    forward of prompt + completion per row (no padding, no cache), logits / T cut by Hugging Face's warpers."""
    policy = LMPolicy(tiny_model(), temperature)
    policy.model.generation_config.update(top_k=3, repetition_penalty=1.5)  # must not reach the draw
    sampler = GenerateSampler(policy, tokenizer, max_completion_length=10, top_p=top_p, top_k=top_k)
    perturb(policy)
    sampler.sync(policy)
    rollout = sample(sampler)
    expected, _ = truncated_scores(sampler.model, rollout, temperature, top_p, top_k)
    mask = rollout.mask
    assert float((rollout.logp_alpha - expected)[mask].abs().max()) < 1e-4
    assert float(expected[mask].std()) > 0.5                       # sharp: a shifted log-prob would show
    assert torch.equal(rollout.logp_alpha[~mask], torch.zeros(int((~mask).sum())))
    if top_p == 1.0 and top_k == 0:                                # untruncated: π_θ's log-probs at the sync
        with torch.no_grad():
            assert float((policy.logprobs(rollout, slice(None)) - rollout.logp_alpha)[mask].abs().max()) < 1e-4


def test_generate_draws_from_the_distribution_whose_log_alpha_it_keeps(tokenizer, one_thread, monkeypatch):
    """Every distribution generate hands to ``torch.multinomial`` is exp(log α′) as the processor returned it: no
    warper of generate's own runs after it (the model's own config asks for top-k 3 and top-p 0.5)."""
    policy = LMPolicy(tiny_model(seed=2), 0.8)
    policy.model.generation_config.update(top_k=3, top_p=0.5)
    sampler = GenerateSampler(policy, tokenizer, max_completion_length=6, top_p=0.9)
    drawn_from, returned = [], []
    multinomial, process = torch.multinomial, LogAlphaProcessor.__call__

    def spy_draw(probs, *args, **kwargs):
        drawn_from.append(probs.clone())
        return multinomial(probs, *args, **kwargs)

    def spy_process(self, input_ids, scores):
        returned.append(process(self, input_ids, scores))
        return returned[-1]

    monkeypatch.setattr(torch, "multinomial", spy_draw)
    monkeypatch.setattr(LogAlphaProcessor, "__call__", spy_process)
    rollout = sample(sampler, G=3)
    assert len(drawn_from) == len(returned) == rollout.completions.shape[1]
    for probs, log_alpha in zip(drawn_from, returned, strict=True):
        assert torch.allclose(probs, log_alpha.exp(), atol=1e-6)
    assert max(int((p > 0).sum(1).max()) for p in drawn_from) > 3   # the model's top-k 3 did not cut


def test_every_completion_is_its_own_row_from_the_prefill_on(tokenizer, one_thread):
    """TRL's layout: the prefill runs P·G rows (each prompt repeated G times), not P; the rollout's layout is
    HFSampler's (prompt ids repeated, completions right-padded after EOS)."""
    policy = LMPolicy(tiny_model())
    sampler = GenerateSampler(policy, tokenizer, max_completion_length=5, eos_token_ids=[127])
    shapes = []
    sampler.model.get_input_embeddings().register_forward_hook(lambda _, args, out: shapes.append(tuple(args[0].shape)))
    G, Lp = 3, max(len(p.split()) for p in PROMPTS)
    rollout = sample(sampler, G=G)
    assert shapes[0] == (len(PROMPTS) * G, Lp)
    assert shapes[1:] == [(len(PROMPTS) * G, 1)] * (rollout.completions.shape[1] - 1)
    reference = sample(HFSampler(policy, tokenizer, max_completion_length=5, eos_token_ids=[127]), G=G)
    assert torch.equal(rollout.extra["prompt_ids"], reference.extra["prompt_ids"])
    assert rollout.completions.shape[0] == reference.completions.shape[0] == len(PROMPTS) * G
    assert torch.equal(sample(sampler, G=G).completions, rollout.completions)   # the same generator, the same draw


def test_the_loop_chooses_it_by_the_config_and_trains(one_thread):
    config = TrainConfig(G=2, prompts_per_step=2, lr=1e-3, max_completion_length=3, train_problems=20, seed=0,
                         sampler="hf_generate", empty_step="optimizer_step", sync_audit=True)
    loop = build_loop(config, model=tiny_smollm_shaped(), tokenizer=smollm_tokenizer(), problems=problems())
    assert type(loop.sampler) is GenerateSampler
    records = [loop.step() for _ in range(2)]
    assert [r.weights_audit for r in records] == ["proved", "proved"]
    assert all(abs(r.log_ratio_k_abs) < 1e-4 for r in records)      # v = 1: α is π_k, log α taken right
    with pytest.raises(ValueError, match="sampler"):
        TrainConfig(sampler="generate")
