"""Primitives of docs/theory.md §2–§3: hand-computed cases, plain-loop references, properties."""

import math
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_lab import (
    GRPOConfig,
    aggregate_loss,
    clip_bounds,
    clipped_surrogate,
    grpo_objective,
    kl_estimate,
    loss_weights,
    plan_step,
    tv_terms,
    whiten,
    zero_variance_mask,
)
from grpo_lab.advantages import masking_probability


@pytest.fixture(autouse=True, scope="module")
def float64_default():
    """Exact arithmetic checks in float64, restored afterwards (other modules load real models)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


# ----------------------------------------------------------------------------- whitening and mask

def test_whiten_hand_computed():
    # group [1, 0, 0, 1]: mean 0.5, population var 0.25, sqrt(0.25 + 0) = 0.5 → A = ±1
    # group [1, 0, 0, 0]: mean 0.25, var = (0.75² + 3·0.25²)/4 = 0.1875 → A = 0.75/√0.1875 = √3, −0.25/√0.1875 = −1/√3
    r = torch.tensor([[1.0, 0, 0, 1], [1, 0, 0, 0]])
    A = whiten(r, eps=0.0)
    assert torch.allclose(A[0], torch.tensor([1.0, -1, -1, 1]))
    assert torch.allclose(A[1], torch.tensor([math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)]))
    # eps under the root: (1 − 0.5)/sqrt(0.25 + 0.75) = 0.5
    assert torch.allclose(whiten(r, eps=0.75)[0], torch.tensor([0.5, -0.5, -0.5, 0.5]))
    # TRL's form std + eps: 0.5 / (0.5 + 0.5) = 0.5 as well here; differs for group 2: 0.75/(√0.1875 + 0.5)
    assert torch.allclose(whiten(r, eps=0.5, eps_placement="added_to_std")[1, 0],
                          torch.tensor(0.75 / (math.sqrt(0.1875) + 0.5)))
    # sample variance /(G−1): group 1 var = 1/3 → A = 0.5/√(1/3)
    assert torch.allclose(whiten(r, eps=0.0, unbiased=True)[0, 0], torch.tensor(0.5 * math.sqrt(3)))


def test_whiten_constant_group_is_zero_not_nan():
    r = torch.tensor([[1.0, 1, 1], [0, 0, 0]])
    for eps in (0.0, 1e-4):
        A = whiten(r, eps=eps)
        assert torch.equal(A, torch.zeros_like(r))


@pytest.mark.parametrize("eps, placement, unbiased", [(0.0, "under_sqrt", False), (1e-4, "under_sqrt", False),
                                                       (1e-4, "added_to_std", True), (0.0, "added_to_std", True)])
@pytest.mark.parametrize("value", [0.1, 0.3, 0.7, 1 / 3])
def test_whiten_gives_an_agreeing_group_advantage_zero_whatever_its_rounding(value, eps, placement, unbiased):
    """Rewards that are not dyadic (partial format credit): the float mean of G equal values may differ from
    them in the last bit, so the computed r − μ need not be 0, and dividing by σ of the same order made it −1
    at eps = 0. An agreeing group's advantages are 0 exactly, by construction, beside a group that disagrees."""
    for G in (3, 8, 16):
        r = torch.stack([torch.full((G,), value), torch.tensor([0.0, 1.0] * (G // 2) + [0.5] * (G % 2))])
        for dtype in (torch.float32, torch.float64):
            A = whiten(r.to(dtype), eps=eps, unbiased=unbiased, eps_placement=placement)
            assert torch.equal(A[0], torch.zeros(G, dtype=dtype)), (G, dtype, A[0])
            assert (A[1, :2 * (G // 2)] != 0).all()


def test_whiten_of_a_constant_non_dyadic_group_is_zero_not_minus_one():
    """The case that failed, in float32 (this module's default dtype is float64): ``whiten(full((1, 8), 0.1),
    eps=0)`` was −1 for every member, and −7.5e-7 at the default ε_std."""
    rewards = torch.full((1, 8), 0.1, dtype=torch.float32)
    assert torch.equal(whiten(rewards, eps=0.0), torch.zeros(1, 8, dtype=torch.float32))
    assert torch.equal(whiten(rewards), torch.zeros(1, 8, dtype=torch.float32))


def test_whiten_matches_plain_loop():
    g = torch.Generator().manual_seed(0)
    r = torch.rand(7, 5, generator=g)
    for unbiased in (False, True):
        for placement in ("under_sqrt", "added_to_std"):
            A = whiten(r, eps=1e-3, unbiased=unbiased, eps_placement=placement)
            for p in range(7):
                vals = [float(x) for x in r[p]]
                mu = sum(vals) / len(vals)
                var = sum((x - mu) ** 2 for x in vals) / (len(vals) - (1 if unbiased else 0))
                scale = math.sqrt(var + 1e-3) if placement == "under_sqrt" else math.sqrt(var) + 1e-3
                for j, x in enumerate(vals):
                    assert A[p, j].item() == pytest.approx((x - mu) / scale, rel=1e-12, abs=1e-12)


@given(st.lists(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=2, max_size=6), min_size=1, max_size=5)
       .filter(lambda rows: len({len(r) for r in rows}) == 1))
def test_whitened_groups_have_mean_zero(rows):
    A = whiten(torch.tensor(rows))
    assert torch.allclose(A.mean(dim=1), torch.zeros(len(rows)), atol=1e-12)


def test_zero_variance_mask():
    r = torch.tensor([[1.0, 1, 1], [0, 0, 0], [0, 1, 0], [0.5, 0.5, 0.5000001]])
    assert zero_variance_mask(r).tolist() == [False, False, True, True]


# ----------------------------------------------------------------------------- clipped surrogate

def test_masking_probability_matches_the_mask_on_sampled_groups():
    """p^G + (1 − p)^G against zero_variance_mask on 200 000 simulated groups (4 standard errors)."""
    assert masking_probability(0.05, 8).item() == pytest.approx(0.95 ** 8 + 0.05 ** 8) and 0.66 < 0.95 ** 8 < 0.67
    g = torch.Generator().manual_seed(14)
    n = 200_000
    for p, G in [(0.05, 8), (0.3, 4), (0.5, 2), (0.9, 16)]:
        rewards = torch.bernoulli(torch.full((n, G), p), generator=g)
        observed = 1 - zero_variance_mask(rewards).double().mean().item()
        expected = masking_probability(p, G).item()
        assert abs(observed - expected) < 4 * (expected * (1 - expected) / n) ** 0.5 + 1e-12
    with pytest.raises(ValueError, match="p must lie in"):
        masking_probability(1.5, 8)


def test_clipped_surrogate_hand_computed():
    # r = exp(log 1.5) = 1.5, r′ = exp(log 1.2) = 1.2, ε = 0.2
    # additive band [1.0, 1.4]: A = +1 → min(1.5, 1.4) = 1.4; A = −1 → min(−1.5, −1.4) = −1.5
    # multiplicative band [0.96, 1.44]: A = +1 → 1.44
    # log α = −1 (any log α ≤ −log 1.5 would do): log-probs are ≤ 0, and only the ratios enter f_ε
    logp, logp_k, logp_a = (x - 1 for x in (torch.log(torch.tensor([1.5, 1.5])), torch.log(torch.tensor([1.2, 1.2])),
                                            torch.zeros(2)))
    adv = torch.tensor([1.0, -1.0])
    f_add = clipped_surrogate(logp, logp_k, logp_a, adv, eps_low=0.2, band="additive")
    f_mul = clipped_surrogate(logp, logp_k, logp_a, adv, eps_low=0.2, band="multiplicative")
    assert torch.allclose(f_add, torch.tensor([1.4, -1.5]))
    assert torch.allclose(f_mul, torch.tensor([1.44, -1.5]))
    # r′ = 0.1: additive lower bound max(0.1 − 0.2, 0) = 0; r = 0.05, A = −1 → min(−0.05, −0.05) = −0.05
    f = clipped_surrogate(torch.log(torch.tensor([0.05])), torch.log(torch.tensor([0.1])), torch.zeros(1),
                          torch.tensor([-1.0]), eps_low=0.2)
    assert torch.allclose(f, torch.tensor([-0.05]))
    # asymmetric: ε_low = 0.2, ε_high = 0.28 → upper 1 + 0.28
    f = clipped_surrogate(torch.log(torch.tensor([2.0])) - 1, -torch.ones(1), -torch.ones(1), torch.tensor([1.0]),
                          eps_low=0.2, eps_high=0.28)
    assert torch.allclose(f, torch.tensor([1.28]))


def test_clipped_surrogate_matches_plain_loop():
    g = torch.Generator().manual_seed(1)
    B, T = 6, 5
    logp, logp_k, logp_a = (torch.randn(B, T, generator=g) * 0.3 - 2 for _ in range(3))
    adv = torch.randn(B, 1, generator=g)
    for band in ("additive", "multiplicative"):
        f = clipped_surrogate(logp, logp_k, logp_a, adv, eps_low=0.15, eps_high=0.25, band=band)
        for b in range(B):
            for t in range(T):
                r = math.exp(logp[b, t] - logp_a[b, t])
                rk = math.exp(logp_k[b, t] - logp_a[b, t])
                lo, hi = (max(rk - 0.15, 0), rk + 0.25) if band == "additive" else (rk * 0.85, rk * 1.25)
                a = adv[b, 0].item()
                expected = min(r * a, min(max(r, lo), hi) * a)
                assert f[b, t].item() == pytest.approx(expected, rel=1e-12, abs=1e-12)


finite = st.floats(-4.0, 0.0, allow_nan=False)   # log-probabilities


@given(logp=finite, logp_a=finite, adv=st.floats(-3, 3, allow_nan=False), eps=st.floats(0.0, 0.5))
def test_both_bands_equal_ppo_clip_on_policy(logp, logp_a, adv, eps):
    # α = π_k ⇒ r′ = 1: both bands are PPO's min(r A, clip(r, 1 − ε, 1 + ε) A)
    lp, la, a = torch.tensor([logp]), torch.tensor([logp_a]), torch.tensor([adv])
    r = math.exp(logp - logp_a)
    ppo = min(r * adv, min(max(r, 1 - eps), 1 + eps) * adv)
    for band in ("additive", "multiplicative"):
        f = clipped_surrogate(lp, la, la, a, eps_low=eps, band=band)
        assert f.item() == pytest.approx(ppo, rel=1e-9, abs=1e-12)


@given(logp=finite, logp_a=finite, adv=st.floats(-3, 3, allow_nan=False), eps=st.floats(0.0, 0.5),
       band=st.sampled_from(["additive", "multiplicative"]))
def test_gradient_at_pi_k_is_importance_weighted_policy_gradient(logp, logp_a, adv, eps, band):
    # logp = logp_k ⇒ r = r′ is inside the band; ∂f/∂logp = r′ · A (i = 1: importance-weighted PG)
    lp = torch.tensor([logp], requires_grad=True)
    f = clipped_surrogate(lp, lp.detach(), torch.tensor([logp_a]), torch.tensor([adv]), eps_low=eps, band=band)
    f.sum().backward()
    assert lp.grad.item() == pytest.approx(math.exp(logp - logp_a) * adv, rel=1e-9, abs=1e-12)


def test_clip_bounds_bands():
    rk = torch.tensor([0.1, 1.0, 2.0])
    lo, hi = clip_bounds(rk, 0.2, 0.3, "additive")
    assert torch.allclose(lo, torch.tensor([0.0, 0.8, 1.8])) and torch.allclose(hi, torch.tensor([0.4, 1.3, 2.3]))
    lo, hi = clip_bounds(rk, 0.2, 0.3, "multiplicative")
    assert torch.allclose(lo, torch.tensor([0.08, 0.8, 1.6])) and torch.allclose(hi, torch.tensor([0.13, 1.3, 2.6]))


# ----------------------------------------------------------------------------- KL

def test_kl_estimators_hand_computed():
    # d = log π_ref − log π = log 0.5 − log 0.25 = log 2
    logp, logp_ref = torch.log(torch.tensor([0.25])), torch.log(torch.tensor([0.5]))
    d = math.log(2)
    assert kl_estimate(logp, logp_ref, "k1").item() == pytest.approx(-d)
    assert kl_estimate(logp, logp_ref, "k2").item() == pytest.approx(d * d / 2)
    assert kl_estimate(logp, logp_ref, "k3").item() == pytest.approx(2 - d - 1)


@given(st.floats(-20, 20), st.floats(-20, 20))
def test_k3_is_non_negative(a, b):
    assert kl_estimate(torch.tensor([a]), torch.tensor([b]), "k3").item() >= 0


def test_k1_and_k3_are_unbiased_on_policy():
    # exact expectations over a 4-outcome π: E_π[k1] = E_π[k3] = KL(π‖π_ref)
    pi, ref = torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([0.25, 0.25, 0.25, 0.25])
    kl = (pi * (pi / ref).log()).sum()
    for kind in ("k1", "k3"):
        assert (pi * kl_estimate(pi.log(), ref.log(), kind)).sum().item() == pytest.approx(kl.item(), rel=1e-12)


# ----------------------------------------------------------------------------- aggregation

def test_aggregate_loss_hand_computed():
    # two sequences: lengths 2 and 1 (T = 3); per-token values 1, 3 | 5
    x = torch.tensor([[1.0, 3.0, 100.0], [5.0, 100.0, 100.0]])
    m = torch.tensor([[True, True, False], [True, False, False]])
    assert aggregate_loss(x, m, "grpo").item() == pytest.approx(((1 + 3) / 2 + 5) / 2)   # mean of means = 3.5
    assert aggregate_loss(x, m, "bnpo").item() == pytest.approx((1 + 3 + 5) / 3)          # token mean = 3
    assert aggregate_loss(x, m, "dapo").item() == pytest.approx(3.0)
    assert aggregate_loss(x, m, "dr_grpo").item() == pytest.approx(9 / (2 * 3))          # sum/(B·T)
    assert aggregate_loss(x, m, "dr_grpo", max_completion_length=6).item() == pytest.approx(9 / 12)


def test_aggregate_loss_matches_plain_loop():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 4, generator=g)
    m = torch.rand(5, 4, generator=g) > 0.3
    m[2] = False  # a fully masked sequence drops out of every denominator
    rows = [[x[b, t].item() for t in range(4) if m[b, t]] for b in range(5)]
    kept = [r for r in rows if r]
    tokens = sum(len(r) for r in kept)
    expected = {
        "grpo": sum(sum(r) / len(r) for r in kept) / len(kept),
        "bnpo": sum(sum(r) for r in kept) / tokens,
        "dr_grpo": sum(sum(r) for r in kept) / (len(kept) * 4),
    }
    for loss_type, value in expected.items():
        assert aggregate_loss(x, m, loss_type).item() == pytest.approx(value, rel=1e-12)


def test_masked_groups_contribute_exactly_zero():
    g = torch.Generator().manual_seed(3)
    B, T = 6, 3
    logp = torch.randn(B, T, generator=g).sub(5).requires_grad_(True)    # log-probs: ≤ 0
    logp_a = torch.randn(B, T, generator=g) - 5
    rewards = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])          # group 1 has zero variance
    adv = whiten(rewards).reshape(-1)
    keep = zero_variance_mask(rewards)
    mask = torch.ones(B, T, dtype=torch.bool)
    plan = plan_step(rewards, mask, GRPOConfig(G=2, beta=0.5, mask_normalize="unmasked"), dtype=torch.float64)
    assert torch.equal(plan.advantages, adv) and torch.equal(plan.keep, keep)
    loss, _ = grpo_objective(logp, logp_a, plan.advantages, plan.weights, logp_ref=logp_a + 0.1, beta=0.5)
    # the same batch with the masked group's rows removed
    rows = torch.tensor([0, 1, 4, 5])
    loss_drop, _ = grpo_objective(logp[rows], logp_a[rows], adv[rows], loss_weights(mask[rows], dtype=torch.float64),
                                  logp_ref=(logp_a + 0.1)[rows], beta=0.5)
    assert loss.item() == pytest.approx(loss_drop.item(), rel=1e-12)
    loss.backward()
    assert torch.equal(logp.grad[2:4], torch.zeros(2, T))                 # no gradient, KL included
    assert plan.masked_frac == pytest.approx(1 / 3)
    w = loss_weights(mask & keep.repeat_interleave(2)[:, None], "bnpo", dtype=torch.float64)
    assert w[2:4].sum() == 0 and w.sum().item() == pytest.approx(1.0)   # out of the denominator too


@pytest.mark.parametrize("beta", [0.0, 0.4])
def test_batch_normalisation_is_unmasked_times_the_kept_fraction(beta):
    """The paper's E_x[m(x)·(…)]: masked groups stay in the denominator as zeros. For ``grpo`` that is the
    ``unmasked`` loss (and gradient) times the kept fraction of sequences; for ``bnpo`` of tokens."""
    g = torch.Generator().manual_seed(11)
    P, G, T = 5, 4, 3
    logp = torch.randn(P * G, T, generator=g, dtype=torch.float64).sub(5).requires_grad_(True)    # log-probs: ≤ 0
    logp_a, logp_k = (torch.randn(P * G, T, generator=g, dtype=torch.float64) - 5 for _ in range(2))
    rewards = torch.tensor([[1.0, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0], [0, 1, 1, 1], [1, 1, 1, 1]])
    keep = zero_variance_mask(rewards)
    mask = torch.rand(P * G, T, generator=g) > 0.2
    mask[:, 0] = True
    kw = dict(logp_k=logp_k, logp_ref=logp_a + 0.2, beta=beta)
    rows_kept = keep.repeat_interleave(G)
    for loss_type, kept_frac in [("grpo", float(rows_kept.double().mean())),
                                 ("bnpo", float(mask[rows_kept].sum() / mask.sum()))]:
        grads = {}
        for normalize in ("batch", "unmasked"):
            logp.grad = None
            plan = plan_step(rewards, mask, GRPOConfig(G=G, beta=beta, loss_type=loss_type, mask_normalize=normalize),
                             dtype=torch.float64)
            loss, _ = grpo_objective(logp, logp_a, plan.advantages, plan.weights, **kw)
            loss.backward()
            grads[normalize] = (loss.detach(), logp.grad.clone())
        assert 0 < kept_frac < 1
        torch.testing.assert_close(grads["batch"][0], grads["unmasked"][0] * kept_frac, rtol=1e-12, atol=0)
        torch.testing.assert_close(grads["batch"][1], grads["unmasked"][1] * kept_frac, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
def test_with_beta_zero_the_mask_under_batch_changes_nothing(loss_type):
    """Masked groups have A = 0 exactly, so with β = 0 and the paper's normalisation the mask is a no-op."""
    g = torch.Generator().manual_seed(12)
    logp = torch.randn(12, 3, generator=g, dtype=torch.float64).sub(5).requires_grad_(True)    # log-probs: ≤ 0
    logp_a = torch.randn(12, 3, generator=g, dtype=torch.float64) - 5
    rewards = torch.tensor([[1.0, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]])
    mask = torch.ones(12, 3, dtype=torch.bool)
    results = []
    for mask_zero_variance in (True, False):
        logp.grad = None
        plan = plan_step(rewards, mask, GRPOConfig(G=4, loss_type=loss_type, mask_zero_variance=mask_zero_variance),
                         dtype=torch.float64)
        loss, _ = grpo_objective(logp, logp_a, plan.advantages, plan.weights)
        loss.backward()
        results.append((loss.item(), logp.grad.clone()))
    assert results[0][0] == results[1][0] and torch.equal(results[0][1], results[1][1])


def test_bad_weights_and_mask_normalize_are_named():
    with pytest.raises(ValueError, match="mask_normalize"):
        GRPOConfig(mask_normalize="mean")
    with pytest.raises(ValueError, match="weights must be float token weights .* got dtype torch.bool"):
        grpo_objective(torch.zeros(2, 1), torch.zeros(2, 1), torch.zeros(2), torch.ones(2, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match="denominator_mask must contain"):
        loss_weights(torch.ones(2, 1, dtype=torch.bool), denominator_mask=torch.zeros(2, 1, dtype=torch.bool))


def test_tv_terms_hand_computed_and_zero_after_a_sync():
    logp_a = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.25, 0.5, 1.0]], dtype=torch.float64))
    logp_k = torch.log(torch.tensor([[0.25, 0.4, 0.1], [0.5, 0.5, 0.3]], dtype=torch.float64))
    mask = torch.tensor([[True, True, False], [True, True, True]])
    # r′_0 = (0.25/0.5)·(0.4/0.2) = 1 (third token is padding); r′_1 = 2 · 1 · 0.3
    torch.testing.assert_close(tv_terms(logp_k, logp_a, mask), torch.tensor([0.0, 0.5 * 0.4], dtype=torch.float64))
    assert torch.equal(tv_terms(logp_a, logp_a, mask), torch.zeros(2, dtype=torch.float64))


def test_an_engines_mismatch_puts_the_tv_estimate_above_0_at_lag_0():
    """At lag 0 with an engine whose token log-ratios are independent normal with mean |log r′| = 0.032 nats,
    log r′_b ~ N(0, s²), s² = L·σ², σ = 0.032·√(π/2), and E[½|r′_b − 1|] = ½·e^{s²/2}·erf(s/√2): 0.045 at 8 tokens,
    0.19 at 128 (docs/theory.md §3, docs/metrics.md), by tv_terms on 100 000 sampled sequences and in closed form.
    With log α = log π_k bit for bit it is exactly 0."""
    from grpo_lab.objective import tv_terms
    sigma = 0.032 * math.sqrt(math.pi / 2)
    g = torch.Generator().manual_seed(3)
    for length, quoted in ((8, 0.045), (128, 0.19)):
        s = sigma * math.sqrt(length)
        closed = 0.5 * math.exp(s * s / 2) * math.erf(s / math.sqrt(2))
        assert round(closed, 3 if length == 8 else 2) == quoted
        logp_k = torch.full((100_000, length), -1.0, dtype=torch.float64)
        logp_alpha = logp_k + sigma * torch.randn(logp_k.shape, generator=g, dtype=torch.float64)
        mask = torch.ones_like(logp_k, dtype=torch.bool)
        assert float((logp_k - logp_alpha).abs().mean()) == pytest.approx(0.032, rel=2e-3)
        assert float(tv_terms(logp_k, logp_alpha, mask).mean()) == pytest.approx(closed, rel=2e-2)
        assert float(tv_terms(logp_k, logp_k.clone(), mask).abs().max()) == 0.0


def test_tv_estimate_is_unbiased_for_the_sequence_tv():
    """E_{y~α} of ½|r′(y) − 1| over every two-token sequence equals TV(π_k, α) of the sequence distributions."""
    g = torch.Generator().manual_seed(13)
    alpha, pi_k = torch.softmax(torch.randn(2, 3, generator=g, dtype=torch.float64), -1), \
        torch.softmax(torch.randn(2, 3, generator=g, dtype=torch.float64), -1)
    seqs = torch.cartesian_prod(torch.arange(3), torch.arange(3))                 # [9, 2]
    token = torch.arange(2)
    logp_a, logp_k = alpha.log()[token, seqs], pi_k.log()[token, seqs]            # [9, 2]
    weight_alpha = logp_a.sum(1).exp()
    estimate = (weight_alpha * tv_terms(logp_k, logp_a, torch.ones(9, 2, dtype=torch.bool))).sum()
    exact = 0.5 * (logp_k.sum(1).exp() - weight_alpha).abs().sum()
    assert weight_alpha.sum().item() == pytest.approx(1.0, rel=1e-14)
    assert estimate.item() == pytest.approx(exact.item(), rel=1e-12) and exact > 0.05


def test_all_masked_batch_gives_exact_zero_loss():
    logp = torch.full((4, 2), float("nan"), requires_grad=True)
    rewards = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    plan = plan_step(rewards, torch.ones(4, 2, dtype=torch.bool), GRPOConfig(G=2), dtype=torch.float64)
    loss, metrics = grpo_objective(logp, torch.zeros(4, 2), plan.advantages, plan.weights)
    assert loss.item() == 0.0 and not math.isnan(loss.item())
    assert plan.masked_frac == 1.0 and metrics["num_tokens"] == 0 and plan.empty and plan.skipped


def test_run_ids_normalise_each_run_separately():
    # two runs stacked: the gradient of run 0's rows equals run 0 computed alone
    g = torch.Generator().manual_seed(4)
    logp = torch.randn(8, 3, generator=g).sub(5).requires_grad_(True)    # log-probs: ≤ 0
    logp_a, adv = torch.randn(8, 3, generator=g) - 5, torch.randn(8, generator=g)
    mask = torch.rand(8, 3, generator=g) > 0.2
    run_ids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    for loss_type in ("grpo", "bnpo", "dr_grpo"):
        logp.grad = None
        loss, _ = grpo_objective(logp, logp_a, adv, loss_weights(mask, loss_type, run_ids=run_ids, dtype=logp.dtype))
        loss.backward()
        stacked = logp.grad[:4].clone()
        alone = logp.detach()[:4].clone().requires_grad_(True)
        loss0, _ = grpo_objective(alone, logp_a[:4], adv[:4], loss_weights(mask[:4], loss_type, dtype=logp.dtype))
        loss0.backward()
        assert torch.allclose(stacked, alone.grad, rtol=1e-12, atol=1e-15)


def test_micro_batches_with_global_weights_are_exact():
    g = torch.Generator().manual_seed(5)
    logp = torch.randn(6, 4, generator=g).sub(5).requires_grad_(True)    # log-probs: ≤ 0
    logp_a, adv = torch.randn(6, 4, generator=g) - 5, torch.randn(6, generator=g)
    mask = torch.rand(6, 4, generator=g) > 0.3
    for loss_type in ("grpo", "bnpo", "dr_grpo"):
        w = loss_weights(mask, loss_type, dtype=torch.float64)
        full, _ = grpo_objective(logp, logp_a, adv, w, logp_ref=logp_a, beta=0.1)
        parts = sum(grpo_objective(logp[s], logp_a[s], adv[s], w[s], logp_ref=logp_a[s], beta=0.1)[0]
                    for s in (slice(0, 4), slice(4, 6)))
        assert parts.item() == pytest.approx(full.item(), rel=1e-12)


def test_sequence_level_ratio_is_length_normalised():
    # one sequence of 2 tokens: log-ratio per token 0.2 and 0.4 against log α = −1 → sequence ratio exp(0.3)
    logp = torch.tensor([[-0.8, -0.6]], requires_grad=True)
    logp_a = torch.full((1, 2), -1.0)
    weights = loss_weights(torch.ones(1, 2, dtype=torch.bool), dtype=logp.dtype)    # ½ each: the token mean
    loss, _ = grpo_objective(logp, logp_a, torch.tensor([1.0]), weights, logp_k=logp.detach(), level="sequence",
                             eps_low=0.5)
    assert loss.item() == pytest.approx(-math.exp(0.3))
    loss.backward()
    assert torch.allclose(logp.grad, torch.full((1, 2), -math.exp(0.3) / 2))


def test_objective_metrics_hand_computed():
    # r′ = 1 (α = π_k); r = 1.5 with A = +1 (above 1.2 → clipped high), r = 0.5 with A = −1 (below 0.8 → clipped low)
    logp = torch.log(torch.tensor([[1.5], [0.5], [1.0], [1.0]])) - 1     # against log α = log π_k = −1
    logp_k = torch.full((4, 1), -1.0)
    _, m = grpo_objective(logp, logp_k.clone(), torch.tensor([1.0, -1.0, 1.0, -1.0]),
                          loss_weights(torch.ones(4, 1, dtype=torch.bool), dtype=logp.dtype),
                          logp_k=logp_k, eps_low=0.2)
    assert m["clip_high_frac"] == 0.25 and m["clip_low_frac"] == 0.25
    assert m["ratio_k_mean"] == 1.0 and m["ratio_k_max"] == 1.0 and m["log_ratio_k_abs"] == 0.0


@settings(max_examples=30)
@given(st.integers(0, 2**31 - 1))
def test_importance_weighted_kl_is_unbiased_off_policy(seed):
    # exact expectation over α: E_α[(π/α) k3] = KL(π‖π_ref), while E_α[k3] is not in general
    g = torch.Generator().manual_seed(seed)
    pi, alpha, ref = (torch.softmax(torch.randn(5, generator=g), 0) for _ in range(3))
    kl = (pi * (pi / ref).log()).sum()
    weighted = (alpha * (pi / alpha) * kl_estimate(pi.log(), ref.log(), "k3")).sum()
    assert weighted.item() == pytest.approx(kl.item(), rel=1e-9)


# The correction knob (docs/theory.md §3) and the ratio diagnostics (docs/metrics.md)

ALPHA, PI_K = torch.tensor([[0.5, 0.2, 0.4]]), torch.tensor([[0.4, 0.5, 0.1]])  # r′ = π_k/α = [0.8, 2.5, 0.25]


def correction_loss(is_correction, shift=(0.0, 0.0, 0.0), band="additive", is_cap=2.0):
    """One sequence of 3 tokens, A = 1.5, grpo weights 1/3; log π_θ = log π_k + shift (with gradient)."""
    logp = (PI_K.log() + torch.tensor([shift])).requires_grad_(True)
    weights = torch.full((1, 3), 1 / 3)
    from grpo_lab.objective import grpo_objective as objective
    loss, metrics = objective(logp, ALPHA.log(), torch.tensor([1.5]), weights, logp_k=PI_K.log(), eps_low=0.2,
                              band=band, is_correction=is_correction, is_cap=is_cap)
    loss.backward()
    return float(loss.detach()), logp.grad[0], metrics


@pytest.mark.parametrize("is_correction, weight", [("ratio", [0.8, 2.5, 0.25]), ("truncated", [0.8, 2.0, 0.25]),
                                                   ("none", [1.0, 1.0, 1.0])])
def test_each_correction_gradient_at_pi_k_hand_computed(is_correction, weight):
    """At π_θ = π_k, ∂loss/∂log π_t = −w·c_t·r_t·A with c·r = r′, min(r′, C = 2) or 1."""
    loss, grad, _ = correction_loss(is_correction)
    expected = -(1 / 3) * 1.5 * torch.tensor(weight)
    torch.testing.assert_close(grad, expected, rtol=1e-6, atol=1e-7)
    assert loss == pytest.approx(float(expected.sum()), rel=1e-6)


@pytest.mark.parametrize("band", ["additive", "multiplicative"])
def test_truncated_and_none_clip_pi_theta_over_pi_k_hand_computed(band):
    """Off π_k (a second pass): r = π_θ/π_k = e^shift, clipped to PPO's [0.8, 1.2] whatever the band;
    token 2 (r = e^0.5 > 1.2, A > 0) is clipped. truncated scales each token by min(r′, 2)."""
    shift = (0.1, 0.5, -0.05)
    r = torch.tensor(shift).exp()
    for is_correction, c in (("truncated", torch.tensor([0.8, 2.0, 0.25])), ("none", torch.ones(3))):
        loss, grad, metrics = correction_loss(is_correction, shift, band)
        clipped = torch.tensor([r[0], 1.2, r[2]])
        assert loss == pytest.approx(float(-(1 / 3) * 1.5 * (c * clipped).sum()), rel=1e-6)
        torch.testing.assert_close(grad, -(1 / 3) * 1.5 * c * r * torch.tensor([1.0, 0.0, 1.0]), rtol=1e-6, atol=1e-7)
        assert metrics["clip_high_frac"] == pytest.approx(1 / 3)
        assert metrics["ratio_k_max"] == pytest.approx(2.5)  # r′ against α, whatever the correction


def test_truncated_is_trls_token_truncate():
    """TRL 1.16 ``_compute_loss`` with ``vllm_importance_sampling_mode="token_truncate"``, written out:
    −min(coef_1·A, clamp(coef_1, 1 − ε, 1 + ε)·A) · clamp(π_old/α, max=C), + β·k3·coef_1, grpo mean.
    (TRL's KL weight coef_1 keeps its gradient; the lab's π_θ/base is detached, so the replica detaches it.)"""
    g = torch.Generator().manual_seed(0)
    B, T, C, eps, beta = 4, 5, 1.5, 0.2, 0.04
    logp_alpha, logp_k, logp_ref = (-1 - torch.rand(3, B, T, generator=g)).unbind()
    logp = (logp_k + 0.3 * torch.randn(B, T, generator=g)).requires_grad_(True)
    adv = torch.randn(B, generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 3:] = False
    coef_1 = torch.exp(logp - logp_k)
    coef_2 = torch.clamp(coef_1, 1 - eps, 1 + eps)
    per_token = -torch.min(coef_1 * adv[:, None], coef_2 * adv[:, None])
    per_token = per_token * torch.clamp(torch.exp(logp_k - logp_alpha), max=C)
    kl = torch.exp(logp_ref - logp) - (logp_ref - logp) - 1
    per_token = per_token + beta * kl * coef_1.detach()
    trl_loss = ((per_token * mask).sum(-1) / mask.sum(-1)).mean()
    (trl_grad,) = torch.autograd.grad(trl_loss, logp)
    from grpo_lab.objective import grpo_objective as objective
    from grpo_lab.objective import loss_weights
    loss, _ = objective(logp, logp_alpha, adv, loss_weights(mask), logp_k=logp_k, logp_ref=logp_ref, beta=beta,
                        eps_low=eps, band="multiplicative", kl_importance_weighted=True, is_correction="truncated",
                        is_cap=C)
    (grad,) = torch.autograd.grad(loss, logp)
    assert float(loss) == pytest.approx(float(trl_loss), rel=1e-6)
    torch.testing.assert_close(grad, trl_grad, rtol=1e-5, atol=1e-7)


def test_bad_correction_cap_and_floor_are_named():
    from grpo_lab.objective import is_correction_terms
    with pytest.raises(ValueError, match="is_correction must be one of .* got 'tis'"):
        GRPOConfig(is_correction="tis")
    for bad in (1.0, 0.5, float("inf"), "2"):
        with pytest.raises(ValueError, match=r"is_cap must be a finite number in \(1.0"):
            GRPOConfig(is_cap=bad)
    with pytest.raises(ValueError, match="is_correction must be one of"):
        is_correction_terms(PI_K.log(), ALPHA.log(), "clipped")
    for bad in (0, 0.0, -0.5, 1.0, 3.0, float("nan"), "0.5", True):  # ≤ 0, ≥ 1 (so ≥ any floor the cap allows)
        with pytest.raises(ValueError, match=rf"is_floor must be None .* got {re.escape(repr(bad))}"):
            GRPOConfig(is_correction="icepop", is_floor=bad)
        with pytest.raises(ValueError, match="is_floor"):
            is_correction_terms(PI_K.log(), ALPHA.log(), "icepop", 2.0, bad)
    assert GRPOConfig(is_correction="icepop", is_floor=None).is_floor is None  # no floor: TRL's clip_min None


def plain_weight(rho: float, is_correction: str, cap: float, floor: float | None) -> float | None:
    """c of one ratio ρ, written out for each value (None: c = 1 against α, ``ratio``)."""
    if is_correction == "ratio":
        return None
    if is_correction == "none":
        return 1.0
    if is_correction == "truncated":
        return min(rho, cap)
    low = 1 / cap if is_correction == "mask" else (0.0 if floor is None else floor)
    return rho if low <= rho <= cap else 0.0


@pytest.mark.parametrize("level, is_level", [("token", None), ("sequence", None), ("token", "sequence"),
                                             ("sequence", "token")])
@pytest.mark.parametrize("is_correction, cap, floor", [("ratio", 2.0, 0.5), ("truncated", 1.5, 0.5),
                                                        ("mask", 1.5, 0.5), ("icepop", 2.5, 0.7),
                                                        ("icepop", 3.0, None), ("none", 2.0, 0.5)])
def test_every_correction_loss_against_a_plain_loop(is_correction, cap, floor, level, is_level):
    """grpo_objective's loss off π_k (a second pass: π_θ ≠ π_k) equals a loop over sequences and tokens in plain
    Python floats: loss = Σ_{b,t} w_{b,t} · (−c · min(r·A, clip(r)·A)), with r, r′ per ``level`` (the clip's)

        token:    the token's ratios;   sequence: the ratios of the length-normalised log-probs (GSPO)

    and c = ``plain_weight(ρ)`` per ``is_level`` (the weight's; None: ``level``'s)

        token:    ρ_t = π_k/α of the token;   sequence: ρ_b = exp(Σ_t log π_k/α), TRL's sum.

    The two set apart (TRL's default clips per token and weighs per sequence) only where there is a weight c:
    ``ratio`` and ``none`` refuse it. The draws put ρ on both sides of every bound (asserted), so a wrong bound, a
    mean in place of the sum, a cap in place of a mask, or the weight's level taken from the clip's fails."""
    from grpo_lab.objective import grpo_objective, loss_weights
    g = torch.Generator().manual_seed(5)
    B, T, eps = 12, 5, 0.2
    logp_alpha = -5 - torch.rand(B, T, generator=g, dtype=torch.float64)
    logp_k = logp_alpha + 0.9 * torch.randn(B, T, generator=g, dtype=torch.float64)
    logp = logp_k + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    lengths = [2 + b % 4 for b in range(B)]
    mask = torch.tensor([[t < lengths[b] for t in range(T)] for b in range(B)])
    weights = loss_weights(mask, "grpo", dtype=torch.float64)
    knobs = dict(logp_k=logp_k, eps_low=eps, level=level, is_correction=is_correction, is_cap=cap, is_floor=floor,
                 is_level=is_level)
    if is_level not in (None, level) and is_correction in ("ratio", "none"):
        with pytest.raises(ValueError, match=f"is_level = '{is_level}' differs from level = '{level}'"):
            grpo_objective(logp, logp_alpha, adv, weights, **knobs)
        return
    loss, _ = grpo_objective(logp, logp_alpha, adv, weights, **knobs)

    expected, rhos = 0.0, []
    for b in range(B):
        toks = range(lengths[b])
        lp, lk, la = ([float(x[b, t]) for t in toks] for x in (logp, logp_k, logp_alpha))
        a = float(adv[b])
        token_rhos = [math.exp(k - al) for k, al in zip(lk, la)]
        rho_seq = math.prod(token_rhos)
        if level == "sequence":
            mean = [sum(x) / lengths[b] for x in (lp, lk, la)]
            lp, lk, la = ([m] * lengths[b] for m in mean)
        for t in toks:
            rho = rho_seq if (is_level or level) == "sequence" else token_rhos[t]
            rhos.append(rho)
            c = plain_weight(rho, is_correction, cap, floor)
            base = la[t] if c is None else lk[t]
            r, r_k = math.exp(lp[t] - base), math.exp(lk[t] - base)
            clipped = min(max(r, max(r_k - eps, 0.0)), r_k + eps)             # the additive band around r′
            expected += float(weights[b, t]) * -(1.0 if c is None else c) * min(r * a, clipped * a)
    assert float(loss) == pytest.approx(expected, rel=1e-10, abs=1e-12)
    bounds = {"truncated": [cap], "mask": [1 / cap, cap], "icepop": [cap] + ([floor] if floor else [])}
    for bound in bounds.get(is_correction, []):
        assert min(rhos) < bound < max(rhos), (bound, min(rhos), max(rhos))   # the bound acts on this batch
    if is_level not in (None, level):   # setting the levels apart changes the loss: the weight's level is read
        assert float(loss) != pytest.approx(float(grpo_objective(logp, logp_alpha, adv, weights,
                                                                 **knobs | {"is_level": None})[0]), rel=1e-6)


def test_trls_default_levels_give_the_sequence_levels_first_pass_and_part_from_the_second():
    """TRL's default clips π_θ/π_old per token and weighs each answer by its ρ = Π_t r′_t (``level="token"``,
    ``is_level="sequence"``). At the first pass (π_θ = π_k) no clip acts at either level and the gradient is
    c_b·A·∇log π on every token either way, so it equals the kit's ``icepop`` at ``level="sequence"``; from the
    second pass on, where π_θ ≠ π_k and the clip binds, it does not."""
    from grpo_lab.objective import grpo_objective, loss_weights
    g = torch.Generator().manual_seed(11)
    B, T = 8, 4
    logp_alpha = -1 - torch.rand(B, T, generator=g, dtype=torch.float64)
    logp_k = logp_alpha + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = torch.tensor([[t < 2 + b % 3 for t in range(T)] for b in range(B)])
    trl_default = dict(is_correction="icepop", is_cap=3.0, is_floor=None, is_level="sequence")

    def gradient(start: torch.Tensor, level: str) -> torch.Tensor:
        logp = start.clone().requires_grad_(True)
        for loss_type in ("grpo", "dapo"):
            loss, _ = grpo_objective(logp, logp_alpha, adv, loss_weights(mask, loss_type, dtype=torch.float64),
                                     logp_k=logp_k, level=level, **trl_default)
            loss.backward()
        return logp.grad

    assert torch.allclose(gradient(logp_k, "token"), gradient(logp_k, "sequence"), rtol=1e-12, atol=1e-14)
    second = logp_k + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    assert not torch.allclose(gradient(second, "token"), gradient(second, "sequence"), rtol=1e-3)


def test_a_sequence_weight_is_the_product_of_its_token_ratios_not_their_geometric_mean():
    """TRL's ``sequence_*`` log-ratio is Σ_t (log π_old − log α): two tokens at r′ = 1.5 each give ρ = 2.25,
    over C = 2 (masked, or capped to 2), where their geometric mean 1.5 would pass."""
    from grpo_lab.objective import is_correction_terms, sequence_log_ratio
    logp_alpha = torch.log(torch.tensor([[0.2, 0.2, 0.5]]))
    logp_k = logp_alpha + math.log(1.5) * torch.tensor([[1.0, 1.0, 7.0]])   # a padded token, off the mask
    mask = torch.tensor([[True, True, False]])
    log_rho = sequence_log_ratio(logp_k, logp_alpha, mask)
    assert log_rho.shape == (1, 1) and float(log_rho.exp()) == pytest.approx(2.25)
    assert float(is_correction_terms(logp_k, logp_alpha, "mask", 2.0, log_ratio=log_rho)[1]) == 0.0
    assert float(is_correction_terms(logp_k, logp_alpha, "truncated", 2.0, log_ratio=log_rho)[1]) == 2.0
    assert float(is_correction_terms(logp_k, logp_alpha, "mask", 2.5, log_ratio=log_rho)[1]) == pytest.approx(2.25)


def test_ratio_diagnostics_hand_computed():
    """Sequence 0: r′ = [1, 2] (+ a padded token); sequence 1: r′ = [0.5, 4, 1.5]."""
    from grpo_lab.objective import ratio_diagnostics
    ratio = torch.tensor([[1.0, 2.0, 100.0], [0.5, 4.0, 1.5]], dtype=torch.float64)
    logp_alpha = torch.full((2, 3), -2.0, dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    d = ratio_diagnostics(logp_alpha + ratio.log(), logp_alpha, mask, "truncated", 3.0)
    assert d["ess_token"] == pytest.approx(9.0 ** 2 / (5 * 23.5))      # Σw = 9, Σw² = 23.5
    assert d["ess_seq"] == pytest.approx(5.0 ** 2 / (2 * (4 + 9)))       # w_b = 2, 3
    assert d["log_ratio_k_min"] == pytest.approx(math.log(0.5))
    assert d["log_ratio_k_p50"] == pytest.approx(math.log(1.5))
    assert d["log_ratio_k_p99"] == pytest.approx(math.log(2) + 0.96 * (math.log(4) - math.log(2)))
    assert d["log_ratio_k_max"] == pytest.approx(math.log(4))
    assert d["cap_frac"] == pytest.approx(1 / 5)                         # only r′ = 4 lies above C = 3
    # applied under truncated: [1, 2, 0.5, 3, 1.5], Σ = 8, Σ² = 16.5
    assert d["ess_token_applied"] == pytest.approx(8.0 ** 2 / (5 * 16.5))
    assert d["log_weight_min"] == pytest.approx(math.log(0.5)) and d["log_weight_max"] == pytest.approx(math.log(3))
    assert d["log_weight_p50"] == pytest.approx(math.log(1.5))
    assert d["log_weight_p99"] == pytest.approx(math.log(2) + 0.96 * (math.log(3) - math.log(2)))
    ratio_applied = ratio_diagnostics(logp_alpha + ratio.log(), logp_alpha, mask)    # "ratio": applied = raw
    assert ratio_applied["cap_frac"] == 0 and ratio_applied["ess_token_applied"] == pytest.approx(d["ess_token"])
    assert ratio_applied["log_weight_max"] == pytest.approx(math.log(4))
    none = ratio_diagnostics(logp_alpha + ratio.log(), logp_alpha, mask, "none")     # every applied weight 1
    assert none["ess_token_applied"] == pytest.approx(1.0) and none["log_weight_min"] == none["log_weight_max"] == 0
    assert d["drop_frac"] == ratio_applied["drop_frac"] == none["drop_frac"] == 0       # only the masks drop


def test_ratio_diagnostics_count_what_the_masks_drop_hand_computed():
    """The tokens of test_ratio_diagnostics_hand_computed, r′ = [1, 2] and [0.5, 4, 1.5]; sequence ratios 2 and 3."""
    from grpo_lab.objective import ratio_diagnostics
    ratio = torch.tensor([[1.0, 2.0, 100.0], [0.5, 4.0, 1.5]], dtype=torch.float64)
    logp_alpha = torch.full((2, 3), -2.0, dtype=torch.float64)
    logp_k, mask = logp_alpha + ratio.log(), torch.tensor([[True, True, False], [True, True, True]])
    masked = ratio_diagnostics(logp_k, logp_alpha, mask, "mask", 3.0)          # band [1/3, 3]: drops r′ = 4
    assert masked["drop_frac"] == pytest.approx(1 / 5) and masked["cap_frac"] == pytest.approx(1 / 5)
    assert masked["ess_token_applied"] == pytest.approx(5.0 ** 2 / (5 * 7.5))   # [1, 2, 0.5, 0, 1.5]
    assert masked["log_weight_max"] == pytest.approx(math.log(2)) and masked["log_weight_min"] == pytest.approx(
        math.log(0.5))                                                          # over the kept tokens
    icepop = ratio_diagnostics(logp_k, logp_alpha, mask, "icepop", 3.0, 0.6)   # [0.6, 3]: drops 0.5 and 4
    assert icepop["drop_frac"] == pytest.approx(2 / 5) and icepop["cap_frac"] == pytest.approx(1 / 5)
    assert icepop["log_weight_min"] == 0.0 and icepop["ess_token_applied"] == pytest.approx(4.5 ** 2 / (5 * 7.25))
    no_floor = ratio_diagnostics(logp_k, logp_alpha, mask, "icepop", 3.0, None)
    assert no_floor["drop_frac"] == pytest.approx(1 / 5)
    # level sequence: ρ_b = 2 and 3, so C = 2.5 drops sequence 1, three of the five tokens
    sequences = ratio_diagnostics(logp_k, logp_alpha, mask, "mask", 2.5, level="sequence")
    assert sequences["drop_frac"] == pytest.approx(3 / 5)
    assert sequences["log_weight_min"] == sequences["log_weight_max"] == pytest.approx(math.log(2))
    truncated = ratio_diagnostics(logp_k, logp_alpha, mask, "truncated", 2.5, level="sequence")
    assert truncated["drop_frac"] == 0 and truncated["log_weight_max"] == pytest.approx(math.log(2.5))
    everything = ratio_diagnostics(logp_k, logp_alpha, mask, "icepop", 1.1, 0.95, level="sequence")
    assert everything["drop_frac"] == 1 and everything["ess_token_applied"] == 0 and everything["log_weight_max"] == 0


def test_ratio_diagnostics_at_sequence_level_report_the_sequence_weights_applied():
    """``level="sequence"``: ``truncated`` acts on the sequence's ρ_b = Π_t r′_{b,t} (TRL's sum of log-ratios) and
    ``ratio`` on its length-normalised r′_b = exp(mean_t log r′_{b,t}), so each sampled token's applied weight is
    its sequence's. Sequence 0: r′ = [1, 4] (+ padding), ρ_b = 4, r′_b = 2; sequence 1: r′ = [¼, 1, 64],
    ρ_b = 16, r′_b = 2^(4/3) ≈ 2.52. Raw values stay per token."""
    from grpo_lab.objective import ratio_diagnostics
    C = 5.0
    ratio = torch.tensor([[1.0, 4.0, 100.0], [0.25, 1.0, 64.0]], dtype=torch.float64)
    logp_alpha = torch.full((2, 3), -3.0, dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    logp_k = logp_alpha + ratio.log()
    r1 = 2.0 ** (4 / 3)

    def ess(w):
        w = torch.tensor(w, dtype=torch.float64)
        return float(w.sum() ** 2 / (w.numel() * (w * w).sum()))

    token = ratio_diagnostics(logp_k, logp_alpha, mask, "truncated", C)
    seq = ratio_diagnostics(logp_k, logp_alpha, mask, "truncated", C, level="sequence")
    for raw in ("ess_token", "ess_seq", "log_ratio_k_min", "log_ratio_k_p50", "log_ratio_k_p99", "log_ratio_k_max"):
        assert seq[raw] == token[raw]
    applied = [4.0, 4.0, C, C, C]                                          # min(ρ_b, C) on each sampled token
    assert seq["ess_token_applied"] == pytest.approx(ess(applied))
    assert seq["log_weight_min"] == pytest.approx(math.log(4)) and seq["log_weight_max"] == pytest.approx(math.log(C))
    assert seq["cap_frac"] == pytest.approx(3 / 5)                          # sequence 1's three tokens: ρ_b > C
    assert token["cap_frac"] == pytest.approx(1 / 5)                        # per token: only r′ = 64
    assert token["ess_token_applied"] == pytest.approx(ess([1.0, 4.0, 0.25, 1.0, C]))
    ratio_seq = ratio_diagnostics(logp_k, logp_alpha, mask, "ratio", C, level="sequence")
    assert ratio_seq["ess_token_applied"] == pytest.approx(ess([2.0, 2.0, r1, r1, r1]))
    assert ratio_seq["log_weight_max"] == pytest.approx(math.log(r1)) and ratio_seq["cap_frac"] == 0.0
    none_seq = ratio_diagnostics(logp_k, logp_alpha, mask, "none", C, level="sequence")
    assert none_seq["ess_token_applied"] == pytest.approx(1.0) and none_seq["log_weight_max"] == 0.0


def test_cap_frac_is_the_share_of_sampled_tokens_with_r_prime_above_c_only():
    """``cap_frac`` counts r′ > C and nothing below: a token with r′ < 1/C (what a top-p cut gives at lag 0, r′ =
    the kept mass) is not counted, neither is r′ = C itself, and padding is not a sampled token. Under
    ``ratio`` and ``none`` no cap binds: 0."""
    from grpo_lab.objective import ratio_diagnostics
    C = 2.0
    ratio = torch.tensor([[0.1, 0.3, 1.0, 2.0], [5.0, 0.2, 3.0, 9.0]], dtype=torch.float64)  # 1/C = 0.5
    logp_alpha = torch.full((2, 4), -1.5, dtype=torch.float64)
    mask = torch.tensor([[True, True, True, True], [True, True, True, False]])      # r′ = 9 is padding
    above = ((ratio > C) & mask).sum() / mask.sum()
    below = ((ratio < 1 / C) & mask).sum() / mask.sum()
    d = ratio_diagnostics(logp_alpha + ratio.log(), logp_alpha, mask, "truncated", C)
    assert d["cap_frac"] == pytest.approx(float(above)) == pytest.approx(2 / 7)     # r′ = 5 and 3
    assert float(above + below) == pytest.approx(5 / 7) != pytest.approx(d["cap_frac"])  # not "outside [1/C, C]"
    kept_masses = torch.tensor([[0.1, 0.3, 0.45, 0.2]], dtype=torch.float64)       # lag 0 under a cut: r′ ≤ 1
    lag0 = ratio_diagnostics(logp_alpha[:1] + kept_masses.log(), logp_alpha[:1], mask[:1], "truncated", C)
    assert lag0["cap_frac"] == 0.0
    for other in ("ratio", "none"):
        assert ratio_diagnostics(logp_alpha + ratio.log(), logp_alpha, mask, other, C)["cap_frac"] == 0.0


def test_ess_is_one_when_every_ratio_is_one_and_scale_free():
    from grpo_lab.objective import ratio_diagnostics
    logp = -torch.rand(6, 4, generator=torch.Generator().manual_seed(2)) * 3
    mask = torch.rand(6, 4, generator=torch.Generator().manual_seed(3)) > 0.3
    d = ratio_diagnostics(logp, logp.clone(), mask, "truncated", 2.0)
    assert d == {"ess_token": pytest.approx(1.0), "ess_seq": pytest.approx(1.0),
                 "ess_token_applied": pytest.approx(1.0),
                 **{f"{kind}_{q}": 0.0 for kind in ("log_ratio_k", "log_weight") for q in ("min", "p50", "p99", "max")},
                 "cap_frac": 0.0, "drop_frac": 0.0}
    # a constant shift of every log r′ leaves ESS/n unchanged, even one that would overflow exp
    shifted = ratio_diagnostics(logp + 800.0, logp, torch.ones(6, 4, dtype=torch.bool))
    assert shifted["ess_token"] == pytest.approx(1.0) and shifted["ess_seq"] == pytest.approx(1.0)
