"""LMPolicy and HFSampler on a tiny random Llama (seconds on CPU, nothing downloaded)."""

import copy
import math

import pytest
import torch
from tiny_lm import EOS, PAD, PROMPTS, EvenTokenTask, check_state_dict_round_trip, perturb, tiny_model, word_tokenizer
from transformers import PreTrainedTokenizerFast

from grpo_lab import GRPOConfig, GRPOLoop, Rollout
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.sampling import HFSampler, completion_mask, draw_tokens, tokenize_prompts


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return word_tokenizer()


def sample(sampler: HFSampler, prompts=PROMPTS, G: int = 4, seed: int = 0) -> Rollout:
    return sampler.sample(prompts, G, torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- layout helpers

def test_completion_mask_through_first_eos():
    completions = torch.tensor([[5, 1, 7, 1], [1, 3, 3, 3], [4, 4, 4, 4], [4, 9, 4, 1]])
    expected = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    assert torch.equal(completion_mask(completions, [1, 9]), expected)
    assert torch.equal(completion_mask(completions, [1])[3], torch.ones(4, dtype=torch.bool))


def test_tokenize_prompts_left_pads(tokenizer):
    ids, mask = tokenize_prompts(tokenizer, ["w1 w2 w3", "w5"])
    assert ids.tolist() == [[4, 5, 6], [PAD, PAD, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    with pytest.raises(ValueError, match="prompts"):
        tokenize_prompts(tokenizer, [])


# ----------------------------------------------------------------------------- log α = log π at sync

@pytest.mark.parametrize("share_prompt", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_log_alpha_of_drawn_tokens_matches_logprobs_after_sync(tokenizer, temperature, share_prompt):
    policy = LMPolicy(tiny_model(), temperature, share_prompt=share_prompt)
    # A generation config that truncates must not leak into sampling (log α would be another distribution).
    policy.model.generation_config.update(top_k=5, top_p=0.5, min_p=0.2, repetition_penalty=1.5)
    sampler = HFSampler(policy, tokenizer, max_completion_length=12)
    perturb(policy)
    sampler.sync(policy)
    rollout = sample(sampler)
    with torch.no_grad():
        logp = policy.logprobs(rollout, slice(None))
    mask = rollout.mask
    diff = float((logp - rollout.logp_alpha)[mask].abs().max())
    print(f"T={temperature}, share_prompt={share_prompt}: "
          f"max |log α (sampler) − log π (LMPolicy)| = {diff:.2e}")
    assert diff < 1e-4
    assert float(logp[mask].std()) > 0.5  # sharp distributions: the test could see a shift or a truncation
    assert torch.isfinite(logp).all() and torch.isfinite(rollout.logp_alpha).all()


def test_each_prompt_is_prefilled_once_then_decoded_one_token_per_row(tokenizer):
    sampler = HFSampler(LMPolicy(tiny_model()), tokenizer, max_completion_length=5, eos_token_ids=[127])
    shapes = []  # the token ids each forward embeds
    sampler.model.get_input_embeddings().register_forward_hook(lambda _, args, out: shapes.append(tuple(args[0].shape)))
    G, Lp = 6, max(len(p.split()) for p in PROMPTS)
    rollout = sample(sampler, G=G)
    assert shapes[0] == (len(PROMPTS), Lp)  # the prefill: one row per prompt, not per completion
    assert shapes[1:] == [(len(PROMPTS) * G, 1)] * (rollout.completions.shape[1] - 1)



def test_the_kv_cache_is_released_once_a_batch_is_decoded(tokenizer):
    """The decoder drops its cache after each batch, and after a decode that failed, so that the keys and values
    are not held while π_θ trains on the batch."""
    sampler = HFSampler(LMPolicy(tiny_model()), tokenizer, max_completion_length=5, eos_token_ids=[127])
    sample(sampler, G=2)
    assert sampler.decoder.cache is None

    def fail(*args, **kwargs):
        raise RuntimeError("decoding failed")

    sampler.decoder.step = fail
    with pytest.raises(RuntimeError, match="decoding failed"):
        sample(sampler, G=2)
    assert sampler.decoder.cache is None

@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_tokens_are_drawn_from_alpha(tokenizer, temperature):
    """The first token's empirical frequencies over 4000 draws match softmax(logits / T) of α
    (log α agreeing with LMPolicy cannot show this: it holds for tokens drawn from anywhere)."""
    policy = LMPolicy(tiny_model(seed=4), temperature)
    sampler = HFSampler(policy, tokenizer, max_completion_length=1)
    G = 4000
    rollout = sample(sampler, prompts=PROMPTS[:1], G=G, seed=3)
    ids, mask = tokenize_prompts(tokenizer, PROMPTS[:1])
    with torch.no_grad():
        probs = torch.softmax(policy.model(input_ids=ids, attention_mask=mask).logits[0, -1] / temperature, -1)
    freq = torch.bincount(rollout.completions[:, 0], minlength=probs.numel()).double() / G
    # Every token's frequency within 4.5 binomial standard errors (and 0.01) of its probability.
    bound = 4.5 * (probs.double() * (1 - probs.double()) / G).sqrt() + 0.01
    assert ((freq - probs.double()).abs() <= bound).all()
    assert float(probs.max()) > 0.1  # a distribution sharp enough that drawing from another one would show


def test_draw_tokens_follows_the_probabilities():
    """Inverse-CDF draws: frequencies within 4.5 binomial standard errors of exp(logp) over 200k draws
    per row, and never a token of probability 0 (first, middle or last in the vocabulary)."""
    torch.manual_seed(0)
    logits = torch.randn(3, 7) * 2
    logits[0, 0] = logits[1, 3] = logits[2, 6] = -math.inf
    logp = torch.log_softmax(logits, -1)
    n = 200_000
    drawn = draw_tokens(logp.repeat_interleave(n, dim=0)).view(3, n)
    assert drawn.dtype == torch.long and drawn.shape == (3, n)
    freq = torch.stack([torch.bincount(row, minlength=7) for row in drawn]).double() / n
    probs = logp.exp().double()
    assert ((freq - probs).abs() <= 4.5 * (probs * (1 - probs) / n).sqrt() + 1e-12).all(), (freq, probs)
    assert freq[0, 0] == freq[1, 3] == freq[2, 6] == 0


def test_completions_are_masked_and_padded_after_eos(tokenizer):
    sampler = HFSampler(LMPolicy(tiny_model(seed=3)), tokenizer, max_completion_length=30)
    rollout = sample(sampler, G=8)
    B, T = rollout.completions.shape
    assert B == len(PROMPTS) * 8 and T <= 30
    lengths = rollout.mask.sum(dim=1)
    assert (lengths < T).any() and (lengths == T).any()  # some rows stopped at EOS, some ran to the end
    for row, keep, logp, text, n in zip(rollout.completions, rollout.mask, rollout.logp_alpha,
                                        rollout.extra["texts"], lengths, strict=True):
        assert keep[:n].all() and not keep[n:].any()
        assert (row[:n - 1] != EOS).all()
        assert n == T or row[n - 1] == EOS
        assert (row[n:] == PAD).all() and (logp[n:] == 0).all()
        assert text == " ".join(f"w{t - 3}" for t in row[:n].tolist() if t >= 3)  # special tokens dropped


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_left_padding_gives_the_logprobs_of_each_prompt_alone(tokenizer, kind):
    policy = LMPolicy(tiny_model(kind=kind))
    sampler = HFSampler(policy, tokenizer, max_completion_length=10)
    G = 3
    rollout = sample(sampler, G=G)
    assert (rollout.extra["prompt_mask"] == 0).any()  # left padding is present
    with torch.no_grad():
        batched = policy.logprobs(rollout, slice(None))
        for p, prompt in enumerate(PROMPTS):
            rows = slice(p * G, (p + 1) * G)
            ids, mask = tokenize_prompts(tokenizer, [prompt])
            alone = Rollout(prompts=[prompt], completions=rollout.completions[rows],
                            logp_alpha=rollout.logp_alpha[rows], mask=rollout.mask[rows],
                            extra={"prompt_ids": ids.repeat(G, 1), "prompt_mask": mask.repeat(G, 1)})
            single = policy.logprobs(alone, slice(None))
            keep = rollout.mask[rows]
            assert torch.allclose(single[keep], batched[rows][keep], atol=1e-5)
            assert torch.allclose(single[keep], rollout.logp_alpha[rows][keep], atol=1e-4)


# ----------------------------------------------------------------------------- sync, lag, seeds

def test_sync_copies_in_place_and_counts_bytes(tokenizer):
    policy = LMPolicy(tiny_model())
    sampler = HFSampler(policy, tokenizer, max_completion_length=4)
    alpha = sampler.model
    assert alpha.lm_head.weight is alpha.model.embed_tokens.weight  # tied in the copy too
    pointers = {name: t.data_ptr() for name, t in alpha.state_dict().items()}
    perturb(policy)
    assert not torch.equal(alpha.lm_head.weight, policy.model.lm_head.weight)
    moved = sampler.sync(policy)
    assert {name: t.data_ptr() for name, t in alpha.state_dict().items()} == pointers
    for (name, a), (_, b) in zip(alpha.state_dict().items(), policy.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
        assert not a.requires_grad
    unique = [*policy.model.parameters(), *policy.model.buffers()]
    assert moved == sum(t.numel() * t.element_size() for t in unique)
    assert moved < sum(t.numel() * t.element_size() for t in policy.model.state_dict().values())  # tie once
    with pytest.raises(ValueError, match="do not match"):
        sampler.sync(LMPolicy(tiny_model(layers=1)))


def test_sampler_lags_until_sync(tokenizer):
    policy = LMPolicy(tiny_model())
    sampler = HFSampler(policy, tokenizer, max_completion_length=8)
    before = sample(sampler, seed=5)
    frozen = copy.deepcopy(sampler.state_dict())
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    for _ in range(2):
        optimizer.zero_grad()
        (-policy.logprobs(before, slice(None))[before.mask].sum()).backward()
        optimizer.step()
    assert all(torch.equal(frozen[k], v) for k, v in sampler.state_dict().items())
    during = sample(sampler, seed=5)
    assert torch.equal(during.completions, before.completions)
    assert torch.equal(during.logp_alpha, before.logp_alpha)
    sampler.sync(policy)
    after = sample(sampler, seed=5)
    assert not torch.equal(after.logp_alpha, before.logp_alpha)


def test_sampler_state_dict_round_trip(tokenizer):
    policy = LMPolicy(tiny_model())
    sampler = HFSampler(policy, tokenizer, max_completion_length=6)
    check_state_dict_round_trip(sampler, policy, lambda: sample(sampler, seed=2), lambda: perturb(policy))


def test_same_generator_seed_same_rollout(tokenizer):
    sampler = HFSampler(LMPolicy(tiny_model()), tokenizer, max_completion_length=8)
    global_state = torch.random.get_rng_state()
    a, b, c = sample(sampler, seed=7), sample(sampler, seed=7), sample(sampler, seed=8)
    assert torch.equal(torch.random.get_rng_state(), global_state)  # fork_rng: caller's RNG untouched
    assert torch.equal(a.completions, b.completions) and torch.equal(a.logp_alpha, b.logp_alpha)
    assert a.extra["texts"] == b.extra["texts"]
    assert not torch.equal(a.completions, c.completions)


def test_sampler_rejects_bad_arguments(tokenizer):
    policy = LMPolicy(tiny_model(), temperature=0.7)
    with pytest.raises(ValueError, match="temperature"):
        HFSampler(policy, tokenizer, max_completion_length=4, temperature=1.0)
    with pytest.raises(ValueError, match="max_completion_length"):
        HFSampler(policy, tokenizer, max_completion_length=0)
    with pytest.raises(ValueError, match="temperature"):
        LMPolicy(tiny_model(), temperature=0.0)
    with pytest.raises(ValueError, match="group_size"):
        HFSampler(policy, tokenizer, max_completion_length=4).sample(PROMPTS, 0, torch.Generator())


def test_the_sampler_decodes_a_bfloat16_model(tokenizer):
    """α decodes through its model's own forward in the model's dtype: log α in float32, finite."""
    rollout = sample(HFSampler(LMPolicy(tiny_model().to(torch.bfloat16)), tokenizer, 4))
    assert rollout.logp_alpha.dtype == torch.float32 and torch.isfinite(rollout.logp_alpha).all()
    assert (rollout.logp_alpha[rollout.mask] < 0).all()


# ----------------------------------------------------------------------------- gradients and the loop

def test_gradient_flows_through_logprobs(tokenizer):
    policy = LMPolicy(tiny_model(), temperature=0.7)
    rollout = sample(HFSampler(policy, tokenizer, max_completion_length=6))
    logp = policy.logprobs(rollout, slice(2, 9))
    assert logp.shape == (7, rollout.completions.shape[1]) and logp.requires_grad
    logp[rollout.mask[2:9]].sum().backward()
    for name, p in policy.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def build_loop(tokenizer, **changes) -> GRPOLoop:
    config = GRPOConfig(**{**dict(G=4, prompts_per_step=2, max_completion_length=8, lr=1e-2, steps=4, seed=0),
                           **changes})
    policy = LMPolicy(tiny_model(), config.temperature)
    sampler = HFSampler(policy, tokenizer, config.max_completion_length)
    return GRPOLoop(policy, sampler, EvenTokenTask(), config)


def test_loop_end_to_end_with_lagged_sampler(tokenizer):
    loop = build_loop(tokenizer, v=2, beta=0.04, temperature=0.9)
    records = list(loop.run())
    assert [r.synced for r in records] == [True, False, True, False]
    assert [r.lag for r in records] == [0, 1, 0, 1]
    assert all(r.sync_bytes > 0 for r in records if r.synced)
    for r in records:
        assert not r.skipped
        for key, value in r.to_dict().items():
            assert not isinstance(value, float) or math.isfinite(value), key
    # Right after a sync α = π_k (log α = log π); one step later they differ.
    assert [r.log_ratio_k_abs < 1e-4 for r in records] == [True, False, True, False]


def test_micro_batches_give_the_whole_batch_gradient(tokenizer):
    deltas = []
    for micro in (None, 2):
        loop = build_loop(tokenizer, micro_batch_size=micro, optimizer="sgd", lr=1.0, max_grad_norm=None)
        before = [p.detach().clone() for p in loop.policy.parameters()]
        record = loop.step()
        assert not record.skipped
        deltas.append([b - p.detach() for b, p in zip(before, loop.policy.parameters(), strict=True)])
    assert any(d.abs().max() > 0 for d in deltas[0])
    for whole, micro in zip(*deltas, strict=True):  # float32 sums in another order: equal to 1e-5 relative
        assert (whole - micro).norm() <= 1e-5 * whole.norm()
