"""Every knob rejects bad values with a ValueError that names the parameter and the value."""

import pytest
import torch

from grpo_lab import GRPOConfig, SyncSchedule, aggregate_loss, clipped_surrogate, grpo_objective, kl_estimate, whiten
from grpo_lab.bandit import BanditProblem, improvement_lower_bound
from grpo_lab.checks import require_rewards

CONFIG_CASES = [
    (dict(v=0), "v must be an integer >= 1, got 0"),
    (dict(v=2.5), "v must be an integer >= 1, got 2.5"),
    (dict(i=0), "i must be an integer >= 1, got 0"),
    (dict(G=1), "G must be an integer >= 2, got 1"),
    (dict(prompts_per_step=0), "prompts_per_step must be an integer >= 1, got 0"),
    (dict(eps_low=-0.1), r"eps_low must be a finite number in \[0.0, inf\], got -0.1"),
    (dict(eps_high=float("nan")), "eps_high must be a finite number .* got nan"),
    (dict(beta=-1.0), "beta must be a finite number .* got -1.0"),
    (dict(eps_std=-1e-3), "eps_std must be a finite number .* got -0.001"),
    (dict(lr=0.0), r"lr must be a finite number in \(0.0, inf\], got 0.0"),
    (dict(lr=float("inf")), "lr must be a finite number .* got inf"),
    (dict(band="wide"), "band must be one of \\('additive', 'multiplicative'\\), got 'wide'"),
    (dict(loss_type="mean"), "loss_type must be one of .* got 'mean'"),
    (dict(kl_kind="k4"), "kl_kind must be one of .* got 'k4'"),
    (dict(level="word"), "level must be one of .* got 'word'"),
    (dict(eps_placement="inside"), "eps_placement must be one of .* got 'inside'"),
    (dict(sync="sometimes"), "sync must be one of .* got 'sometimes'"),
    (dict(sync_threshold=0.0), "sync_threshold must be a finite number .* got 0.0"),
    (dict(ref_period=-1), "ref_period must be an integer >= 0, got -1"),
    (dict(ref_period=5, beta=0.0), "ref_period = 5 resets π_ref, but beta = 0"),
    (dict(micro_batch_size=0), "micro_batch_size must be an integer >= 1, got 0"),
    (dict(temperature=0.0), "temperature must be a finite number .* got 0.0"),
    (dict(max_grad_norm=-1.0), "max_grad_norm must be a finite number .* got -1.0"),
    (dict(optimizer="lion"), "optimizer must be one of .* got 'lion'"),
    (dict(steps=-5), "steps must be an integer >= 0, got -5"),
    (dict(seed=True), "seed must be an integer >= 0, got True"),
]


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
        require_rewards(rewards)


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
        grpo_objective(x, x, torch.zeros(2), x.bool(), beta=0.1)
    with pytest.raises(ValueError, match=r"advantages must have shape \[B\] = \[2\], got \(3,\)"):
        grpo_objective(x, x, torch.zeros(3), x.bool())
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
