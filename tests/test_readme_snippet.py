"""README's *Use the primitives* block runs as written and computes what it says."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from grpo_lab.exact.bandit import BanditProblem, sample_bandit_group

README = Path(__file__).resolve().parents[1] / "README.md"


def primitives_block() -> str:
    """The first ```python block under README's *Use the primitives* heading."""
    section = README.read_text().split("## Use the primitives", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_primitives_snippet_samples_whitens_and_differentiates(capsys):
    namespace: dict = {}
    exec(compile(primitives_block(), str(README), "exec"), namespace)
    group, A, theta, f = namespace["group"], namespace["A"], namespace["theta"], namespace["f"]
    assert group.arms.shape == group.logp_alpha.shape == group.rewards.shape == (8,)
    # α is uniform over 3 answers: every log α is log 1/3; rewards are 0/1 and the group is not all alike
    torch.testing.assert_close(group.logp_alpha, torch.full((8,), -math.log(3), dtype=group.logp_alpha.dtype))
    assert set(group.rewards.tolist()) == {0.0, 1.0}
    # whitened: mean 0, population variance var/(var + 1e-4)
    assert abs(float(A.mean())) < 1e-6
    var = float(group.rewards.var(unbiased=False))
    assert float(A.pow(2).mean()) == pytest.approx(var / (var + 1e-4), rel=1e-5)
    # first pass: f = r·A with r = π_θ/α, and the gradient of mean f in the logits is mean_j r_j A_j ∇log π(y_j)
    pi = torch.softmax(theta.detach(), 0)
    r = pi[group.arms] / group.logp_alpha.exp()
    torch.testing.assert_close(f[:, 0].detach(), r * A)
    expected = sum(r[j] * A[j] * (torch.nn.functional.one_hot(group.arms[j], 3) - pi) for j in range(8)) / 8
    torch.testing.assert_close(theta.grad, expected.to(theta.grad.dtype))
    assert str(group.arms.tolist()) in capsys.readouterr().out


def test_sample_bandit_group_is_the_loops_sampler_and_task():
    problem = BanditProblem(torch.tensor([[0.9, 0.5, 0.1], [0.0, 1.0, 0.0]], dtype=torch.float64))
    logits = torch.tensor([[0.0, 0.0, 0.0], [2.0, -1.0, 0.5]], dtype=torch.float64)
    group = sample_bandit_group(problem, logits, 1, 4000, torch.Generator().manual_seed(3))
    # context 1 pays exactly on arm 1; arm frequencies follow α = softmax(logits[1])
    assert torch.equal(group.rewards, (group.arms == 1).to(group.rewards.dtype))
    alpha = torch.softmax(logits[1], 0)
    freq = torch.bincount(group.arms, minlength=3).double() / 4000
    assert (freq - alpha).abs().max() < 4 * (0.25 / 4000) ** 0.5
    torch.testing.assert_close(group.logp_alpha, alpha.log()[group.arms])
    with pytest.raises(ValueError, match=r"logits must have the problem's shape \[C, K\] = \[2, 3\], got \[3\]"):
        sample_bandit_group(problem, logits[0], 0, 8, torch.Generator())
    with pytest.raises(ValueError, match="context must be an integer in \\[0, 2\\), got 2"):
        sample_bandit_group(problem, logits, 2, 8, torch.Generator())
    with pytest.raises(ValueError, match="G must be an integer >= 2, got 1"):
        sample_bandit_group(problem, logits, 0, 1, torch.Generator())
