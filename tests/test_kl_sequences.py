"""KL estimators on sequences (docs/theory.md §3): what a per-token estimator estimates, and its gradient.

A two-token model over a vocabulary of 3 has 9 responses, so every expectation is an exact sum. Token 1 is
drawn from softmax(θ₁), token 2 from softmax(θ₂[y₁]); π_ref and α are models of the same form.
"""

import itertools

import torch

from grpo_lab.objective import kl_estimate

V = 3
RESPONSES = list(itertools.product(range(V), repeat=2))


def model(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(V, generator=g, dtype=torch.float64), torch.randn(V, V, generator=g, dtype=torch.float64)]


def token_logps(params: list[torch.Tensor], y: tuple[int, int]) -> torch.Tensor:
    """[log p(y₁), log p(y₂ | y₁)]."""
    return torch.stack([torch.log_softmax(params[0], -1)[y[0]], torch.log_softmax(params[1][y[0]], -1)[y[1]]])


def sequence_prob(params: list[torch.Tensor], y: tuple[int, int]) -> torch.Tensor:
    return token_logps(params, y).sum().exp()


def grad(value: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.flatten() for g in torch.autograd.grad(value, params)])


def expected_token_loss(pi: list[torch.Tensor], ref: list[torch.Tensor], sampler: list[torch.Tensor], kind: str,
                        weight: str = "none") -> torch.Tensor:
    """E_{y ~ sampler}[Σ_t w_t · k(token t)] with the samples (and the weights) detached, as in a loss:
    its gradient is the expected gradient of the per-token loss term. ``weight``: ``"none"``, ``"token"``
    (π(y_t|·)/α(y_t|·)) or ``"prefix"`` (Π_{s ≤ t} π(y_s|·)/α(y_s|·))."""
    total = torch.zeros((), dtype=torch.float64)
    for y in RESPONSES:
        logp, logp_ref, logp_s = token_logps(pi, y), token_logps(ref, y), token_logps(sampler, y)
        log_w = {"none": torch.zeros(2, dtype=torch.float64), "token": logp - logp_s,
                 "prefix": torch.cumsum(logp - logp_s, 0)}[weight].detach()
        total = total + logp_s.sum().exp().detach() * (log_w.exp() * kl_estimate(logp, logp_ref, kind)).sum()
    return total


def sequence_kl(pi: list[torch.Tensor], ref: list[torch.Tensor]) -> torch.Tensor:
    """KL(π ‖ π_ref) over whole responses."""
    return sum(sequence_prob(pi, y) * (token_logps(pi, y).sum() - token_logps(ref, y).sum()) for y in RESPONSES)


def per_position_kl(pi: list[torch.Tensor], ref: list[torch.Tensor], prefix: list[torch.Tensor]) -> torch.Tensor:
    """Σ_t E_{y_<t ~ prefix model (detached)} KL(π(·|y_<t) ‖ π_ref(·|y_<t))."""
    def kl(logits: torch.Tensor, logits_ref: torch.Tensor) -> torch.Tensor:
        logp, logq = torch.log_softmax(logits, -1), torch.log_softmax(logits_ref, -1)
        return (logp.exp() * (logp - logq)).sum()
    first = torch.softmax(prefix[0], -1).detach()
    return kl(pi[0], ref[0]) + sum(first[a] * kl(pi[1][a], ref[1][a]) for a in range(V))


def test_on_policy_per_token_k3_values_sum_to_the_sequence_kl():
    pi, ref = model(0), model(1)
    assert torch.allclose(expected_token_loss(pi, ref, pi, "k3"), sequence_kl(pi, ref), atol=1e-12)


def test_per_token_k2_gradient_is_the_per_position_kl_at_fixed_prefixes_not_the_sequence_kl():
    pi, ref = [p.requires_grad_() for p in model(0)], model(1)
    per_token = grad(expected_token_loss(pi, ref, pi, "k2"), pi)
    assert torch.allclose(per_token, grad(per_position_kl(pi, ref, pi), pi), atol=1e-12)
    sequence = grad(sequence_kl(pi, ref), pi)
    assert (per_token - sequence).abs().max() > 1e-2          # the cross terms s > t are missing
    # when the second token carries no KL (π = π_ref there), no cross term is left: one token, as in the bandit
    one = [pi[0], ref[1].clone().requires_grad_()]
    assert torch.allclose(grad(expected_token_loss(one, ref, one, "k2"), one), grad(sequence_kl(one, ref), one),
                          atol=1e-12)


def test_token_weights_correct_the_token_not_the_prefix():
    pi, ref, alpha = model(0), model(1), model(2)
    on_policy = expected_token_loss(pi, ref, pi, "k3")
    token_weighted = expected_token_loss(pi, ref, alpha, "k3", weight="token")
    assert abs(float(token_weighted - on_policy)) > 1e-3      # prefixes still α's
    assert torch.allclose(token_weighted, per_position_kl(pi, ref, alpha), atol=1e-12)
    assert torch.allclose(expected_token_loss(pi, ref, alpha, "k3", weight="prefix"), on_policy, atol=1e-12)
