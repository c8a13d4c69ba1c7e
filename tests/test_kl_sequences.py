"""KL estimators and token ratios on sequences (docs/theory.md §3): what a per-token term estimates, and its gradient.

A two-token model over a vocabulary of 3 has 9 responses, so every expectation is an exact sum. Token 1 is
drawn from softmax(θ₁), token 2 from softmax(θ₂[y₁]); π_ref and α are models of the same form.
"""

import itertools

import torch

from grpo_lab.objective import clipped_surrogate, kl_estimate

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


def first_pass_gradient(pi: list[torch.Tensor], sampler: list[torch.Tensor], advantage: torch.Tensor,
                        weight: str) -> torch.Tensor:
    """∇ of E_{y ~ sampler}[Σ_t f_ε(r_t, r′_t, A(y))] at π_θ = π_k = ``pi`` (the first pass), exact over the 9
    responses. ``weight="ratio"``: the kit's per-token surrogate (``clipped_surrogate``, r_t = π_θ/α per token), so
    Σ_t r′_t A ∇log π(y_t|·); ``"sequence"``: the sequence weight Π_t r′_t (detached) on A·Σ_t ∇log π(y_t|·)."""
    total = torch.zeros((), dtype=torch.float64)
    for y, a in zip(RESPONSES, advantage, strict=True):
        logp, logp_s = token_logps(pi, y), token_logps(sampler, y).detach()
        if weight == "ratio":
            term = clipped_surrogate(logp[None], logp.detach()[None], logp_s[None], a.view(1, 1)).sum()
        else:
            term = (logp.detach() - logp_s).sum().exp() * a * logp.sum()
        total = total + logp_s.sum().exp() * term
    return grad(total, pi)


def test_token_ratios_are_a_partial_correction_on_sequences_the_sequence_weight_is_exact():
    """The first-pass gradient under ``is_correction="ratio"`` keeps α's prefixes and α's suffixes (which decide A):
    it is not the on-policy gradient E_π[A ∇log π(y)]. Under the sequence weight Π_t r′_t it is, exactly."""
    pi, alpha = [p.requires_grad_() for p in model(0)], model(2)
    g = torch.Generator().manual_seed(3)
    reward = torch.rand(len(RESPONSES), generator=g, dtype=torch.float64)
    advantage = reward - reward.mean()  # any A(y) fixed during the step; a constant baseline adds no gradient
    on_policy = grad(sum(sequence_prob(pi, y).detach() * a * token_logps(pi, y).sum()
                         for y, a in zip(RESPONSES, advantage, strict=True)), pi)
    ratio = first_pass_gradient(pi, alpha, advantage, "ratio")
    assert (ratio - on_policy).abs().max() > 1e-2
    assert torch.allclose(first_pass_gradient(pi, alpha, advantage, "sequence"), on_policy, atol=1e-12)
    assert torch.allclose(first_pass_gradient(pi, pi, advantage, "ratio"), on_policy, atol=1e-12)  # lag 0: exact


def test_notebook_02_says_what_the_token_correction_is_on_sequences():
    """The test above is why notebook 02 §2 may not call the token-corrected step an unbiased estimate for π_k: it
    corrects each token given α's prefix, and only the whole answer's Π_t r′_t is unbiased."""
    import json
    from pathlib import Path

    notebook = Path(__file__).resolve().parents[1] / "notebooks" / "02_lag_frontier.ipynb"
    cells = json.loads(notebook.read_text())["cells"]
    text = " ".join(" ".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown").split())
    assert "The correction makes the step an unbiased estimate for π_k" not in text
    assert ("reweights each token for its own conditional given α's prefix (only a weight of the whole answer, "
            "Π_t r′_t, would make the step an unbiased estimate for π_k") in text
