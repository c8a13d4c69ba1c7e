"""Truncated sampling (top-k, top-p): the cut by hand, draws against the truncated distribution, log α′ of
HFSampler's tokens, and what the cut does to r′ = π_k/α′ at lag 0 (docs/theory.md §3, *Truncated sampling*)."""

import math

import pytest
import torch
from tiny_lm import PROMPTS, VOCAB, EvenTokenTask, tiny_model, truncated_scores, word_tokenizer
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from grpo_lab import GRPOConfig, GRPOLoop, Rollout
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.sampling import HFSampler, sample_next, truncate_logprobs
from grpo_lab.lm.train_config import TrainConfig

# Probabilities out of order, so that the cut cannot lean on token ids: sorted they are .5 .2 .15 .1 .05.
PROBS = torch.tensor([0.1, 0.5, 0.05, 0.2, 0.15], dtype=torch.float64)


def cut(probs: torch.Tensor, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    return truncate_logprobs(probs.log()[None], top_p, top_k)[0].exp()


@pytest.mark.parametrize("top_p, top_k, kept", [
    (1.0, 2, [1, 3]),            # the two most probable: .5 + .2
    (0.8, 0, [1, 3, 4]),         # .5 + .2 = .7 < .8, then .15: .85 reaches it
    (0.75, 0, [1, 3, 4]),        # on the full distribution .7 < .75 still needs the .15
    (0.75, 3, [1, 3]),           # top-3 first (.5 .2 .15, renormalised .588 .235 .176), then .824 ≥ .75
    (0.45, 0, [1]),              # the most probable alone already reaches it
    (1e-9, 0, [1]), (1e-9, 1, [1]), (1.0, 1, [1]),  # at least one token is kept
    (1.0, 5, [0, 1, 2, 3, 4]), (1.0, 50, [0, 1, 2, 3, 4]),  # k ≥ V: no cut
])
def test_truncation_by_hand(top_p, top_k, kept):
    """Kept tokens keep their probabilities renormalised on the kept set; the others get probability 0."""
    expected = torch.zeros_like(PROBS)
    expected[kept] = PROBS[kept] / PROBS[kept].sum()
    assert torch.allclose(cut(PROBS, top_p, top_k), expected, atol=1e-12)


def test_ties_are_kept_whole_whatever_the_order():
    """A tie at the cut is kept whole, for either order of the tied tokens (top-p and top-k alike)."""
    tie = torch.tensor([0.3, 0.4, 0.3], dtype=torch.float64)
    for probs in (tie, tie.flip(0)):
        assert torch.allclose(cut(probs, top_p=0.5), probs)            # .4 < .5: the next .3 and its twin
        assert torch.allclose(cut(probs, top_k=2), probs)              # the 2nd largest value is tied
        assert torch.equal(cut(probs, top_p=0.35) > 0, probs == 0.4)   # .4 alone reaches .35: the tie is cut whole
    low = torch.tensor([0.2, 0.6, 0.2], dtype=torch.float64)
    assert torch.equal(cut(low, top_p=0.5) > 0, low == 0.6)


def test_both_off_return_the_input_itself():
    logp = torch.randn(3, 11).log_softmax(-1)
    assert truncate_logprobs(logp) is logp and truncate_logprobs(logp, 1.0, 0) is logp
    assert truncate_logprobs(logp, 1.0, 11) is logp  # k = V keeps every token


@pytest.mark.parametrize("top_p, top_k", [(0.9, 0), (0.5, 0), (0.01, 0), (0.999, 0), (1.0, 7), (0.9, 40),
                                          (0.6, 3), (0.95, 200)])
@pytest.mark.parametrize("vocab", [50, 300, 5000])
def test_the_cut_is_hugging_faces_on_untied_logits(top_p, top_k, vocab):
    """Against transformers' TopKLogitsWarper then TopPLogitsWarper (what ``generate`` and TRL's in-process
    route run; vLLM's ``apply_top_k_top_p`` is the same cut): the same kept set, the same renormalised
    log-probs, on float32 logits flat and sharp (wide nuclei make the search widen to the whole vocabulary)."""
    torch.manual_seed(vocab + int(100 * top_p) + top_k)
    for scale in (0.3, 1.0, 4.0):
        logits = torch.randn(16, vocab) * scale
        ours = truncate_logprobs(logits.log_softmax(-1), top_p, top_k)
        scores = TopKLogitsWarper(top_k)(None, logits.clone()) if top_k else logits.clone()
        theirs = (TopPLogitsWarper(top_p)(None, scores) if top_p < 1 else scores).log_softmax(-1)
        assert torch.equal(ours.isinf(), theirs.isinf()), (scale, top_p, top_k)
        assert float((ours - theirs)[~theirs.isinf()].abs().max()) < 1e-5


def test_the_cut_is_decided_on_the_renormalised_row():
    """float32 log-probs sum to 1 only within log_softmax's error; the cut reads the row renormalised. Here the
    exact mass above the last token is 0.9989997 < top_p = 0.999 (kept), while the row as given, summing to
    1 + 3.5e-7, puts it at 0.99900005 (cut): a margin a float32 log_softmax of 5,000 logits can produce."""
    probs = torch.tensor([0.6, 0.3989997, 0.0010003], dtype=torch.float64)
    logp = (probs.log() + math.log1p(3.5e-7)).float()
    assert float(logp.double().exp()[:2].sum()) >= 0.999                  # unnormalised: at the threshold
    kept = truncate_logprobs(logp, top_p=0.999)
    assert not kept.isinf().any()
    assert torch.allclose(kept.double().exp(), probs, atol=1e-6)


@pytest.mark.parametrize("bad", [{"top_p": 0.0}, {"top_p": 1.5}, {"top_p": math.nan}, {"top_p": "0.9"},
                                 {"top_k": -1}, {"top_k": 2.0}, {"top_k": True}])
def test_bad_truncation_is_named(bad):
    name = next(iter(bad))
    tokenizer = word_tokenizer()
    with pytest.raises(ValueError, match=rf"^{name} must"):
        truncate_logprobs(torch.zeros(1, 4).log_softmax(-1), **bad)
    with pytest.raises(ValueError, match=rf"^{name} must"):
        HFSampler(LMPolicy(tiny_model()), tokenizer, 4, **bad)
    with pytest.raises(ValueError, match=rf"^{name} must"):
        TrainConfig(**bad)


def test_the_ratio_gradient_scores_cut_tokens_at_the_baseline():
    """One-token responses, exactly (docs/theory.md §3): with α′ the top-p cut of α = π_k and whitened
    advantages under α′, the expected ``ratio`` gradient E_α′[r′ A ∇log π] is ∇[(Σ_S r π + μ π(S^c))/σ],
    not the full policy gradient ∇Σ r π / σ; ``none`` (r′ = 1) is it divided by α(S)."""
    torch.manual_seed(0)
    theta = torch.randn(8, dtype=torch.float64, requires_grad=True)
    reward = torch.rand(8, dtype=torch.float64)
    alpha = theta.detach().softmax(-1)                                    # lag 0: α = π_k = π_θ
    alpha_cut = cut(alpha, top_p=0.7)
    kept = alpha_cut > 0
    assert 1 < int(kept.sum()) < 8
    mu = float((alpha_cut * reward).sum())
    sigma = float((alpha_cut * (reward - mu) ** 2).sum().sqrt())
    advantage = (reward - mu) / sigma

    def gradient(objective: torch.Tensor) -> torch.Tensor:
        return torch.autograd.grad(objective, theta)[0]

    log_pi = theta.log_softmax(-1)
    r_prime = torch.where(kept, alpha / alpha_cut, torch.zeros_like(alpha))
    ratio = gradient((alpha_cut * r_prime * advantage * log_pi)[kept].sum())
    pi = theta.softmax(-1)
    baseline_tail = gradient(((reward * pi)[kept].sum() + mu * pi[~kept].sum()) / sigma)
    assert torch.allclose(ratio, baseline_tail, atol=1e-12)
    assert not torch.allclose(ratio, gradient((reward * theta.softmax(-1)).sum() / sigma), atol=1e-3)
    none = gradient((alpha_cut * advantage * theta.log_softmax(-1))[kept].sum())
    assert torch.allclose(none, ratio / alpha[kept].sum(), atol=1e-12)


# ----------------------------------------------------------------------------- draws

@pytest.mark.parametrize("top_p, top_k", [(0.8, 0), (1.0, 3), (0.95, 0), (0.9, 6), (0.5, 0)])  # 4, 3, 6, 5, 2 kept
def test_draws_follow_the_truncated_distribution(top_p, top_k):
    """200k draws through the sampler's own step (:func:`sample_next`: logits / T, the cut, the draw) from a
    fixed 10-token distribution: every kept token within 4.5 binomial standard errors of its truncated,
    renormalised probability, no cut token ever drawn, and log α′ returned for each draw. The untruncated
    probabilities miss that bound (the test would catch a sampler that ignores the cut)."""
    torch.manual_seed(0)
    T, n = 0.7, 200_000
    logits = torch.tensor([[2.0, 0.5, 1.7, -1.0, 0.9, 1.2, -0.3, 0.1, 1.4, -2.0]])
    full = torch.softmax(logits.double() / T, -1)[0]
    scores = TopKLogitsWarper(top_k)(None, logits.double() / T) if top_k else logits.double() / T
    truncated = torch.softmax(TopPLogitsWarper(top_p)(None, scores) if top_p < 1 else scores, -1)[0]
    tokens, logp = sample_next(logits.repeat(n, 1), T, top_p, top_k)
    freq = torch.bincount(tokens, minlength=10).double() / n
    bound = 4.5 * (truncated * (1 - truncated) / n).sqrt() + 1e-12
    assert ((freq - truncated).abs() <= bound).all(), (freq, truncated)
    assert (freq[truncated == 0] == 0).all() and (truncated == 0).any()
    assert torch.allclose(logp.double(), truncated[tokens].log(), atol=1e-5)
    assert not ((freq - full).abs() <= 4.5 * (full * (1 - full) / n).sqrt()).all()
    print(f"top_p={top_p}, top_k={top_k}: TV(draws, α′) = {0.5 * (freq - truncated).abs().sum():.4f}, "
          f"TV(draws, α) = {0.5 * (freq - full).abs().sum():.4f}")


# ----------------------------------------------------------------------------- HFSampler

@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer()


def sample(sampler: HFSampler, G: int = 4, seed: int = 0) -> Rollout:
    return sampler.sample(PROMPTS, G, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("top_p, top_k", [(0.8, 0), (1.0, 10), (0.7, 20)])
def test_log_alpha_is_the_truncated_log_prob_of_the_drawn_token(tokenizer, top_p, top_k):
    """HFSampler's log α equals log α′ of each drawn token recomputed apart (whole forward, Hugging Face's
    warpers); every drawn token is one the cut kept; and log α′ ≥ log π (renormalised), above it by
    −log α(S) > 0 on many tokens."""
    T = 0.8
    policy = LMPolicy(tiny_model(seed=2), T)
    rollout = sample(HFSampler(policy, tokenizer, 10, top_p=top_p, top_k=top_k))
    log_alpha, log_kept = truncated_scores(policy.model, rollout, T, top_p, top_k)
    mask = rollout.mask
    assert torch.isfinite(rollout.logp_alpha).all() and torch.isfinite(log_alpha).all()
    assert float((rollout.logp_alpha - log_alpha)[mask].abs().max()) < 1e-4
    with torch.no_grad():
        logp = policy.logprobs(rollout, slice(None))
    gap = (rollout.logp_alpha - logp)[mask]
    assert torch.allclose(gap, -log_kept[mask], atol=1e-4)  # log α′ − log α = −log α(S)
    assert float(gap.min()) > -1e-4 and float((gap > 0.05).double().mean()) > 0.3


def test_untruncated_sampler_is_unchanged(tokenizer):
    """top_p = 1, top_k = 0 (the defaults) or top_k = V: the same rollout, bit for bit, and log α = log π."""
    policy = LMPolicy(tiny_model(seed=2), 0.8)
    a = sample(HFSampler(policy, tokenizer, 10), seed=5)
    for sampler in (HFSampler(policy, tokenizer, 10, top_p=1.0, top_k=0),
                    HFSampler(policy, tokenizer, 10, top_k=VOCAB)):
        b = sample(sampler, seed=5)
        assert torch.equal(a.completions, b.completions) and torch.equal(a.logp_alpha, b.logp_alpha)
    with torch.no_grad():
        assert float((policy.logprobs(a, slice(None)) - a.logp_alpha)[a.mask].abs().max()) < 1e-4


# ----------------------------------------------------------------------------- r′ at lag 0

class Recording:
    """A sampler that keeps the last rollout it drew; everything else is the wrapped sampler's."""

    def __init__(self, sampler: HFSampler) -> None:
        self.sampler, self.rollout = sampler, None

    def sample(self, prompts, group_size, generator):
        self.rollout = self.sampler.sample(prompts, group_size, generator)
        return self.rollout

    def __getattr__(self, name):
        return getattr(self.sampler, name)


@pytest.mark.parametrize("top_p, top_k", [(0.7, 0), (1.0, 5)])
def test_at_lag_0_the_cut_shows_in_the_ratio_diagnostics(tokenizer, top_p, top_k):
    """Right after a sync α = π_k, yet r′ = π_k/α′ = α(S) on every sampled token: log r′ = log α(S) ≤ 0.
    Recomputed apart from the loop (whole forwards of α, Hugging Face's warpers), the kept masses give the
    step's logged ESS and quantiles, not 1 and 0; the same step untruncated logs ESS 1 and log r′ = 0."""
    config = GRPOConfig(G=4, prompts_per_step=4, max_completion_length=8, v=1, steps=1, seed=0, temperature=0.9)
    records, rollouts, alphas = [], [], []
    for p, k in ((top_p, top_k), (1.0, 0)):
        policy = LMPolicy(tiny_model(seed=1), config.temperature)
        sampler = Recording(HFSampler(policy, tokenizer, config.max_completion_length, top_p=p, top_k=k))
        record = GRPOLoop(policy, sampler, EvenTokenTask(), config).step()
        assert record.lag == 0 and record.synced and not record.skipped
        records.append(record)
        rollouts.append(sampler.rollout)
        alphas.append(sampler.sampler.model)  # α's weights: π_k of this step (v = 1, no sync after it)
    truncated, plain = records
    _, log_kept = truncated_scores(alphas[0], rollouts[0], config.temperature, top_p, top_k)
    log_r = log_kept[rollouts[0].mask].double()
    w = log_r.exp()
    expected = {"ess_token": float(w.sum() ** 2 / (w.numel() * (w * w).sum())),
                "log_ratio_k_p50": float(log_r.quantile(0.5)), "log_ratio_k_p99": float(log_r.quantile(0.99)),
                "log_ratio_k_max": float(log_r.max())}
    print(f"top_p={top_p}, top_k={top_k}, lag 0: logged", {k: round(getattr(truncated, k), 4) for k in expected},
          "predicted", {k: round(v, 4) for k, v in expected.items()}, f"ratio_k_mean {truncated.ratio_k_mean:.4f}")
    for name, value in expected.items():
        assert abs(getattr(truncated, name) - value) < 1e-4, (name, getattr(truncated, name), value)
    assert truncated.ess_token < 0.99 and truncated.log_ratio_k_p50 < -0.01 and truncated.log_ratio_k_max < 1e-4
    assert truncated.ratio_k_mean < 0.99 and truncated.ratio_k_max < 1 + 1e-4 and truncated.tv_estimate > 0.01
    assert abs(plain.ess_token - 1) < 1e-6 and abs(plain.log_ratio_k_p50) < 1e-5 and plain.tv_estimate < 1e-4
