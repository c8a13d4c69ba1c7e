"""The exact bandit (docs/theory.md §4): Theorem 1 holds, L_α matches sampling, runs are reproducible
and batched exactly."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_lab import GRPOConfig, grpo_objective, kl_estimate, plan_step, zero_variance_mask
from grpo_lab.exact.bandit import (
    BanditProblem,
    LaggedTabularSampler,
    TabularPolicy,
    bandit_config,
    bound_weight,
    improvement_lower_bound,
    kl_expected_gradient,
    run_bandit,
    sigma_alpha,
    surrogate_L,
    true_improvement,
    tv,
)
from grpo_lab.objective import KL_KINDS


def table(weights: list[float], contexts: int, arms: int) -> torch.Tensor:
    """Rows of non-negative weights normalised to probabilities (an all-zero row becomes uniform)."""
    w = torch.tensor(weights, dtype=torch.float64).reshape(contexts, arms)
    w = torch.where(w.sum(-1, keepdim=True) > 0, w, torch.ones_like(w))
    return w / w.sum(-1, keepdim=True)


@st.composite
def bandit_tables(draw):
    C, K = draw(st.integers(1, 3)), draw(st.integers(2, 5))
    unit = st.floats(0.0, 1.0)
    p = torch.tensor(draw(st.lists(st.one_of(unit, st.sampled_from([0.0, 1.0])), min_size=C * K, max_size=C * K)),
                     dtype=torch.float64).reshape(C, K)
    pi, pi_k, alpha = (table(draw(st.lists(unit, min_size=C * K, max_size=C * K)), C, K) for _ in range(3))
    eps_std = draw(st.floats(1e-8, 0.75))
    return p, pi, pi_k, alpha, eps_std


@settings(max_examples=300, deadline=None)
@given(bandit_tables())
def test_theorem_1_is_never_violated(tables):
    p, pi, pi_k, alpha, eps_std = tables
    bound = improvement_lower_bound(pi, pi_k, alpha, p, eps_std)
    gain = true_improvement(pi, pi_k, p)
    assert (gain >= bound - 1e-9 * (1 + bound.abs())).all(), (gain, bound)
    # the notebook's reading: bound <= TV(π, α)(2σ − 1)/σ − 2 TV(π_k, α), so it is <= 0 whenever σ <= ½
    sigma = sigma_alpha(alpha, p, eps_std)
    ceiling = tv(pi, alpha) * (2 * sigma - 1) / sigma - 2 * tv(pi_k, alpha)
    assert (bound <= ceiling + 1e-9 * (1 + ceiling.abs())).all()


def test_the_stated_bound_can_be_positive_for_0_1_rewards():
    """The counterexample to "the theorem as stated is never positive for 0/1 rewards": p = (1, 0),
    α = π_k = (½, ½), π = (0.6, 0.4), ε_std = 1e-4. μ_α(1 − μ_α) = ¼ > ¼ − ε_std, so σ > ½ and the bound is
    TV(π, α)·(2 − 1/σ) > 0 (J(π) − μ_α = TV(π, α) and TV(π_k, α) = 0 here): +4.0e-5, just under 4·ε_std·TV."""
    eps_std = 1e-4
    p = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    alpha = torch.tensor([[0.5, 0.5]], dtype=torch.float64)
    pi = torch.tensor([[0.6, 0.4]], dtype=torch.float64)
    bound = float(improvement_lower_bound(pi, alpha, alpha, p, eps_std))
    sigma, drift = (0.25 + eps_std) ** 0.5, 0.5 * (0.1 + 0.1)
    assert bound > 0
    assert bound == pytest.approx(drift * (2 - 1 / sigma), rel=1e-9)
    assert bound <= 4 * eps_std * drift and bound == pytest.approx(4 * eps_std * drift, rel=1e-3)
    assert float(true_improvement(pi, alpha, p)) >= bound  # and it still holds


def corrected_statement_holds(p, pi, pi_k, alpha, eps_std):
    """docs/theory.md §4, for 0/1 rewards: the stated bound is ≤ 0 unless μ_α(1 − μ_α) > ¼ − ε_std (σ > ½),
    and everywhere ≤ (2 − 1/σ)·TV(π, α) ≤ 4·ε_std·TV(π, α). Returns the mask of the window."""
    bound = improvement_lower_bound(pi, pi_k, alpha, p, eps_std)
    mu = (alpha * p).sum(-1)
    window = mu * (1 - mu) > 0.25 - eps_std
    tol = 1e-12 * (1 + bound.abs())
    assert (bound[~window] <= tol[~window]).all(), (bound, mu, eps_std)
    assert (bound <= 4 * eps_std * tv(pi, alpha) + tol).all(), (bound, tv(pi, alpha), eps_std)
    return window, bound


@settings(max_examples=300, deadline=None)
@given(bandit_tables())
def test_the_stated_bound_is_at_most_zero_outside_the_window_and_4_eps_tv_inside(tables):
    corrected_statement_holds(*tables)


@pytest.mark.parametrize("eps_std", [1e-4, 1e-2, 0.2])
def test_the_stated_bound_is_positive_only_inside_the_window(eps_std):
    """A sweep through μ_α ∈ [0, 1] on one two-armed context p = (1, 0), with π moving either way and π_k = α or
    not: the corrected statement holds at every point (≤ 0, to rounding, outside the window), and the bound is
    positive somewhere inside it."""
    a = torch.linspace(0.0, 1.0, 101, dtype=torch.float64)
    grid = torch.stack(torch.meshgrid(a, a, indexing="ij"), -1).reshape(-1, 2)            # (α_0, π_0)
    alpha = torch.stack([grid[:, 0], 1 - grid[:, 0]], -1)
    pi = torch.stack([grid[:, 1], 1 - grid[:, 1]], -1)
    p = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    corrected_statement_holds(p, pi, (alpha + pi) / 2, alpha, eps_std)
    window, bound = corrected_statement_holds(p, pi, alpha, alpha, eps_std)
    assert (bound[window] > 1e-9).any() and window.float().mean() < 1


def test_surrogate_L_equals_a_monte_carlo_estimate():
    """L_α(π) = E_{y~α, r~Bernoulli(p)}[π/α · (r − μ_α)/σ_α] with the exact μ_α, σ_α."""
    g = torch.Generator().manual_seed(0)
    C, K, N, eps_std = 3, 4, 200_000, 0.25
    p = torch.rand(C, K, generator=g, dtype=torch.float64)
    alpha = torch.softmax(torch.randn(C, K, generator=g, dtype=torch.float64), -1)
    pi = torch.softmax(torch.randn(C, K, generator=g, dtype=torch.float64), -1)
    y = torch.multinomial(alpha, N, replacement=True, generator=g)                    # [C, N]
    r = torch.bernoulli(p.gather(1, y), generator=g)
    mu = (alpha * p).sum(-1, keepdim=True)
    sigma = (mu * (1 - mu) + eps_std).sqrt()
    samples = pi.gather(1, y) / alpha.gather(1, y) * (r - mu) / sigma
    estimate, stderr = samples.mean(1), samples.std(1) / N ** 0.5
    exact = surrogate_L(pi, alpha, p, eps_std)
    assert ((estimate - exact).abs() < 4 * stderr).all(), (estimate, exact, stderr)
    assert not torch.allclose(exact, torch.zeros_like(exact), atol=0.05)             # a real, non-trivial value


def test_alpha_equal_pi_k_gives_the_on_policy_corollary():
    g = torch.Generator().manual_seed(1)
    p = torch.rand(4, 5, generator=g, dtype=torch.float64)
    pi_k = torch.softmax(torch.randn(4, 5, generator=g, dtype=torch.float64), -1)
    pi = torch.softmax(torch.randn(4, 5, generator=g, dtype=torch.float64), -1)
    eps_std = 1e-3
    mu = (pi_k * p).sum(-1)
    sigma = (mu * (1 - mu) + eps_std).sqrt()
    L = ((pi * p).sum(-1) - mu) / sigma
    corollary = L - 2 * (1 - sigma) / sigma * 0.5 * (pi - pi_k).abs().sum(-1)
    assert torch.allclose(improvement_lower_bound(pi, pi_k, pi_k, p, eps_std), corollary, rtol=1e-12, atol=1e-12)
    assert torch.allclose(bound_weight(pi_k, p, eps_std), (1 - sigma) / sigma)


def test_same_seed_same_curves_different_seed_differs():
    problem = BanditProblem.random(contexts=6, arms=4, seed=2)
    a, b = (run_bandit(problem, bandit_config(steps=30, seed=5), runs=2) for _ in range(2))
    c = run_bandit(problem, bandit_config(steps=30, seed=6), runs=2)
    assert np.array_equal(a.J, b.J) and np.array_equal(a.masked_frac, b.masked_frac)
    assert not np.array_equal(a.J, c.J)


def test_per_run_gradient_equals_the_run_alone():
    """R stacked runs normalise the loss per run: each run's gradient is what it gets alone on its rows."""
    g = torch.Generator().manual_seed(3)
    runs, P, G, C, K = 3, 4, 6, 5, 4
    p = torch.rand(C, K, generator=g, dtype=torch.float64)
    p[0] = 0.0                                                          # context 0: always an all-wrong group
    policy, sampler = TabularPolicy(runs, C, K), LaggedTabularSampler(runs, C, K)
    with torch.no_grad():
        policy.logits.copy_(torch.randn(runs, C, K, generator=g, dtype=torch.float64))
    sampler.logits.copy_(policy.logits.detach() + 0.3 * torch.randn(runs, C, K, generator=g, dtype=torch.float64))
    prompts = torch.randint(C, (runs * P,), generator=g)
    prompts[::P] = 0                                                    # each run has a masked group
    rollout = sampler.sample(prompts, G, g)
    rewards = torch.bernoulli(p[rollout.extra["context"], rollout.completions[:, 0]], generator=g).reshape(-1, G)
    keep = zero_variance_mask(rewards)
    assert not keep.all() and keep.any()

    def loss_of(pol, roll, rew, kept, run_ids=None):
        logp = pol.logprobs(roll, slice(None))
        plan = plan_step(rew, roll.mask, GRPOConfig(G=G), run_ids, dtype=logp.dtype)
        assert torch.equal(plan.keep, kept)
        loss, _ = grpo_objective(logp, roll.logp_alpha, plan.advantages, plan.weights, eps_low=0.2)
        return loss

    loss_of(policy, rollout, rewards, keep, torch.arange(runs).repeat_interleave(P * G)).backward()
    for r in range(runs):
        rows, groups = slice(r * P * G, (r + 1) * P * G), slice(r * P, (r + 1) * P)
        alone = TabularPolicy(1, C, K)
        with torch.no_grad():
            alone.logits.copy_(policy.logits[r:r + 1])
        sub = type(rollout)(prompts=prompts[groups], completions=rollout.completions[rows],
                            logp_alpha=rollout.logp_alpha[rows], mask=rollout.mask[rows],
                            extra={"run": torch.zeros(P * G, dtype=torch.long),
                                   "context": rollout.extra["context"][rows]})
        loss_of(alone, sub, rewards[groups], keep[groups]).backward()
        assert torch.allclose(policy.logits.grad[r], alone.logits.grad[0], rtol=1e-12, atol=1e-14)
        assert alone.logits.grad.abs().sum() > 0


def test_v4_lag_cycles_and_syncs_every_fourth_step_and_the_bound_holds():
    run = run_bandit(BanditProblem.random(contexts=6, arms=4, seed=4), bandit_config(v=4, steps=10), runs=2,
                     track_bound=True)
    assert run.lag.tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert [r.step for r in run.records if r.synced] == [0, 4, 8]
    assert run.bound.shape == run.improvement.shape == (10, 2, 6)
    assert (run.improvement >= run.bound - 1e-12).all()
    assert (run.tv_pik_alpha[run.lag == 0] == 0).all() and (run.tv_pik_alpha[run.lag > 0] > 0).any()


def test_default_config_raises_J():
    run = run_bandit(BanditProblem.random(), bandit_config(steps=150), runs=4)
    assert run.J.shape == (151, 4)
    assert (run.J[-1] > run.J[0] + 0.03).all(), run.J[[0, -1]]


@pytest.mark.parametrize("eps_std", [-0.1, 0.8])
def test_track_bound_rejects_eps_std_outside_the_theorem(eps_std):
    with pytest.raises(ValueError, match="eps_std"):
        run_bandit(BanditProblem.random(contexts=2, arms=2), bandit_config(steps=1, eps_std=eps_std), runs=1,
                   track_bound=True)


def _tables(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    pi_ref, alpha = (torch.softmax(2 * torch.randn(3, 5, generator=g, dtype=torch.float64), -1) for _ in range(2))
    return logits, pi_ref, alpha


@pytest.mark.parametrize("kind", KL_KINDS)
@pytest.mark.parametrize("weighted", [False, True])
def test_kl_expected_gradient_is_autograd_of_the_expected_loss_term(kind, weighted):
    """Σ_y α(y)·w(y)·k̂(y) with y and w detached, differentiated by autograd, against the closed form."""
    logits, pi_ref, alpha = _tables(0)
    pi = torch.softmax(logits, -1)
    w = pi.detach() / alpha if weighted else torch.ones_like(alpha)
    loss = (alpha * w * kl_estimate(torch.log_softmax(logits, -1), pi_ref.log(), kind)).sum()
    (grad,) = torch.autograd.grad(loss, logits)
    torch.testing.assert_close(kl_expected_gradient(pi.detach(), pi_ref, alpha, kind, weighted), grad,
                               rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kind", KL_KINDS)
def test_kl_expected_gradient_with_a_differentiable_weight_is_autograd_of_the_loss_term(kind):
    """Σ_y α(y)·w(y)·k̂(y) with w = π/α keeping its gradient (TRL's ``coef_1``), by autograd, against the closed
    form; and grpo_objective's term (``kl_weight_differentiable``) on one-token rows is the same term."""
    logits, pi_ref, alpha = _tables(4)
    logp = torch.log_softmax(logits, -1)
    loss = (alpha * (logp.exp() / alpha) * kl_estimate(logp, pi_ref.log(), kind)).sum()
    (grad,) = torch.autograd.grad(loss, logits)
    pi = torch.softmax(logits, -1).detach()
    torch.testing.assert_close(kl_expected_gradient(pi, pi_ref, alpha, kind, differentiable=True), grad,
                               rtol=1e-12, atol=1e-14)
    # the loss's own term: every arm of every context as a one-token row, weighted by α(y) (the expectation)
    C, K = pi.shape
    rows = torch.log_softmax(logits, -1).reshape(-1, 1)
    weights = alpha.reshape(-1, 1)                                  # Σ_rows w·(term) = Σ_x Σ_y α·(term)
    term, _ = grpo_objective(rows, alpha.log().reshape(-1, 1), torch.zeros(C * K), weights, logp_ref=pi_ref.log()
                             .reshape(-1, 1), beta=1.0, kl_kind=kind, kl_weight_differentiable=True)
    (objective_grad,) = torch.autograd.grad(term, logits)
    torch.testing.assert_close(objective_grad, grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_differentiable_kl_weight_gives_the_reverse_kl_gradient_for_k1_and_k3_at_every_alpha(seed):
    """With w = π/α differentiable the expected gradient is ∇E_π[k̂]: ∇KL(π ‖ π_ref) (the reverse KL) for k1 and k3,
    from any sampler α, π itself included (on-policy, where w = 1 in value, it is not k3's forward-KL gradient);
    for k2 it is ∇E_π[d²/2]."""
    logits, pi_ref, alpha = _tables(seed)
    pi, logp = torch.softmax(logits, -1), torch.log_softmax(logits, -1)
    (reverse,) = torch.autograd.grad((pi * (logp - pi_ref.log())).sum(), logits, retain_graph=True)
    (forward,) = torch.autograd.grad((pi_ref * (pi_ref.log() - logp)).sum(), logits, retain_graph=True)
    (k2_value,) = torch.autograd.grad((pi * 0.5 * (pi_ref.log() - logp) ** 2).sum(), logits)
    pi = pi.detach()
    for sampler in (pi, alpha):
        grads = {kind: kl_expected_gradient(pi, pi_ref, sampler, kind, differentiable=True) for kind in KL_KINDS}
        torch.testing.assert_close(grads["k1"], reverse, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(grads["k3"], reverse, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(grads["k2"], k2_value, rtol=1e-12, atol=1e-14)
        assert (grads["k3"] - forward).abs().max() > 0.05


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_kl_estimator_gradients_are_those_of_the_exact_kls(seed):
    """On-policy, or lagged and weighted by π/α: k1 → 0, k2 → ∇KL(π‖π_ref), k3 → ∇KL(π_ref‖π) (the forward KL)."""
    logits, pi_ref, alpha = _tables(seed)
    pi, logp = torch.softmax(logits, -1), torch.log_softmax(logits, -1)
    (reverse,) = torch.autograd.grad((pi * (logp - pi_ref.log())).sum(), logits, retain_graph=True)
    (forward,) = torch.autograd.grad((pi_ref * (pi_ref.log() - logp)).sum(), logits)
    pi = pi.detach()
    assert (reverse - forward).abs().max() > 0.05                     # two different directions
    for sampler, weighted in [(pi, False), (alpha, True)]:
        grads = {kind: kl_expected_gradient(pi, pi_ref, sampler, kind, weighted) for kind in KL_KINDS}
        torch.testing.assert_close(grads["k1"], torch.zeros_like(pi), rtol=0, atol=1e-15)
        torch.testing.assert_close(grads["k2"], reverse, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(grads["k3"], forward, rtol=1e-12, atol=1e-14)
    # lagged and unweighted: k1 pushes π away from α (gradient α − π of the loss), k3 no longer the forward KL
    torch.testing.assert_close(kl_expected_gradient(pi, pi_ref, alpha, "k1"), alpha - pi, rtol=1e-12, atol=1e-14)
    assert (kl_expected_gradient(pi, pi_ref, alpha, "k3") - forward).abs().max() > 0.01
