"""Bad input is refused with an error that names the parameter and the value: every knob of
GRPOConfig and the primitives, and the catalogue of tests/bad_input_catalogue.py."""

import pytest
import torch
from bad_input_catalogue import CATALOGUE, CONFIG_CASES

from grpo_lab import GRPOConfig, SyncSchedule, aggregate_loss, clipped_surrogate, grpo_objective, kl_estimate, whiten
from grpo_lab.checks import require_reward_groups
from grpo_lab.exact.bandit import BanditProblem, improvement_lower_bound


@pytest.mark.parametrize("changes, message", CONFIG_CASES, ids=[str(c) for c, _ in CONFIG_CASES])
def test_config_rejects(changes, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**changes)


def test_config_replace_rejects_unknown_field():
    with pytest.raises(ValueError, match=r"unknown GRPOConfig field\(s\): \['vv'\]"):
        GRPOConfig().replace(vv=3)


@pytest.mark.parametrize("rewards, message", [
    (torch.tensor([[0.0, float("nan")]]), r"rewards\[0, 1\] = nan \(prompt 0, sample 1\)"),
    (torch.tensor([[0.0, 1.0], [1.5, 0.0]]), r"rewards\[1, 0\] = 1.5 \(prompt 1"),
    (torch.tensor([[-0.2, 1.0]]), r"rewards\[0, 0\] = -0.2"),
    (torch.tensor([[float("inf"), 1.0]]), r"rewards\[0, 0\] = inf"),
    (torch.zeros(0, 4), r"rewards is empty \(P = 0 prompts\)"),
    (torch.zeros(3, 1), "group size G must be >= 2 to whiten, got G = 1"),
    (torch.zeros(6), r"rewards must have shape \[P, G\], got shape \(6,\)"),
    ([[0.0, 1.0]], "rewards must be a torch.Tensor of shape \\[P, G\\], got list"),
])
def test_rewards_rejected(rewards, message):
    with pytest.raises(ValueError, match=message):
        require_reward_groups(rewards)


def test_primitive_arguments_rejected():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="eps must be a finite number .* got -1"):
        whiten(x, eps=-1)
    with pytest.raises(ValueError, match=r"rewards must have shape \[P, G\] with G >= 2, got \(2, 1\)"):
        whiten(torch.zeros(2, 1))
    with pytest.raises(ValueError, match="eps_low must be .* got -0.2"):
        clipped_surrogate(x, x, x, x, eps_low=-0.2)
    with pytest.raises(ValueError, match="eps_high must be .* got -0.1"):
        clipped_surrogate(x, x, x, x, eps_high=-0.1)
    with pytest.raises(ValueError, match="band must be one of .* got 'ppo'"):
        clipped_surrogate(x, x, x, x, band="ppo")
    with pytest.raises(ValueError, match=r"shape mismatch: .*'logp_k': \(2, 2\)"):
        clipped_surrogate(x, torch.zeros(2, 2), x, x)
    with pytest.raises(ValueError, match="kind must be one of .* got 'k5'"):
        kl_estimate(x, x, kind="k5")
    with pytest.raises(ValueError, match="loss_type must be one of .* got 'sum'"):
        aggregate_loss(x, x.bool(), "sum")
    with pytest.raises(ValueError, match=r"max_completion_length must be >= T = 3, got 2"):
        aggregate_loss(x, x.bool(), "dr_grpo", max_completion_length=2)
    with pytest.raises(ValueError, match=r"beta = 0.1 > 0 needs logp_ref"):
        grpo_objective(x, x, torch.zeros(2), x, beta=0.1)
    with pytest.raises(ValueError, match=r"advantages must have shape \[B\] = \[2\], got \(3,\)"):
        grpo_objective(x, x, torch.zeros(3), x)
    with pytest.raises(ValueError, match="v must be an integer >= 1, got 0"):
        SyncSchedule(0)


def test_bandit_inputs_rejected():
    with pytest.raises(ValueError, match="p must hold probabilities in \\[0, 1\\]"):
        BanditProblem(torch.tensor([[0.5, 1.2]]))
    with pytest.raises(ValueError, match="arms must be an integer >= 2, got 1"):
        BanditProblem.random(arms=1)
    pi = torch.full((1, 2), 0.5)
    with pytest.raises(ValueError, match=r"eps_std must be a finite number in \[0.0, 0.75\], got 0.9"):
        improvement_lower_bound(pi, pi, pi, torch.tensor([[0.2, 0.4]]), eps_std=0.9)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("case", CATALOGUE, ids=[c.name for c in CATALOGUE])
def test_bad_input_is_refused_clearly(case):
    with pytest.raises(case.error, match=case.pattern):
        case.call()


def test_probabilities_or_ratios_passed_as_log_probs_are_refused_by_name():
    """A log-probability is ≤ 0: the exercise's f(r, r′, A, ε) call order, or probabilities in place of their logs,
    fails loudly instead of returning wrong numbers; real log-probs, in float32 or cast to bfloat16, pass."""
    from grpo_lab.objective import ratios_as_log_probs
    from grpo_lab.viz.exercises import solution_f_eps
    r, r_prime, A = torch.tensor([1.3, 0.7, 1.0]), torch.tensor([1.1, 0.9, 1.0]), torch.tensor([1.0, -1.0, 0.5])
    with pytest.raises(ValueError, match=r"logp must hold log-probabilities .* got a value of 1\.3"):
        clipped_surrogate(r, r_prime, A, 0.2)                      # ratios where log-probs belong
    logits = torch.randn(4, 3, 50, generator=torch.Generator().manual_seed(0)) * 8
    logp = torch.log_softmax(logits, -1).amax(-1)                   # each row's likeliest token
    with pytest.raises(ValueError, match="logp_alpha must hold log-probabilities"):
        grpo_objective(logp, logp.exp(), torch.zeros(4), torch.ones(4, 3))   # probabilities for log α
    with pytest.raises(ValueError, match="logp_ref must hold log-probabilities"):
        grpo_objective(logp, logp, torch.zeros(4), torch.ones(4, 3), logp_ref=logp.exp(), beta=0.1)
    # real log-probs pass: float32, the same cast to bfloat16, the top token of a peaked row (log p ≈ −1e-30),
    # and float32 rounding above 0 well inside the tolerance
    peaked = torch.log_softmax(torch.tensor([[[80.0, 0.0, 0.0]]]), -1)[..., 0].expand(4, 3)
    for x in (logp, logp.to(torch.bfloat16).float(), peaked, torch.full((4, 3), 1e-6)):
        grpo_objective(x, x, torch.zeros(4), torch.ones(4, 3))
    # given ratios, ratios_as_log_probs gives log-probs whose f_ε is the exercise's
    torch.testing.assert_close(clipped_surrogate(*ratios_as_log_probs(r, r_prime), A, 0.2),
                               solution_f_eps(r, r_prime, A, 0.2))
