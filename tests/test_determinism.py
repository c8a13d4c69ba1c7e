"""Same seed, same steps (records, completions, weights); another seed differs."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
import torch
from reliability_runs import (
    make_loop,
    rows_of,
    same_tensors,
    tensors_of,
    train_config,
)

from grpo_lab.exact.bandit import BanditProblem, run_bandit

pytestmark = pytest.mark.usefixtures("one_thread")


def lm_first_steps(seed: int, steps: int = 3) -> tuple[list[dict[str, Any]], list[torch.Tensor], dict]:
    with tempfile.TemporaryDirectory() as tmp:
        loop = make_loop("lm", train_config("lm", tmp, seed=seed))
        seen = []
        real = loop.sampler.sample
        loop.sampler.sample = lambda *args: seen.append(real(*args)) or seen[-1]
        list(loop.run(steps))
    return rows_of(loop.history), [r.completions for r in seen], tensors_of(loop)


def test_same_seed_same_lm_steps_other_seed_differs():
    rows, completions, tensors = lm_first_steps(0)
    rows_again, completions_again, tensors_again = lm_first_steps(0)
    assert rows == rows_again and same_tensors(tensors, tensors_again)
    assert all(torch.equal(a, b) for a, b in zip(completions, completions_again, strict=True))
    _, other, _ = lm_first_steps(1)
    assert not torch.equal(completions[0], other[0])


def test_same_seed_same_bandit_curves_other_seed_differs():
    def curves(seed: int) -> Any:
        run = run_bandit(BanditProblem.random(6, 4, seed=2), train_config("bandit", "unused", seed=seed, steps=40),
                         runs=3, track_bound=True)
        return run.J, run.bound, rows_of(run.records)

    J, bound, rows = curves(5)
    J_again, bound_again, rows_again = curves(5)
    assert (J == J_again).all() and (bound == bound_again).all() and rows == rows_again
    assert not (curves(6)[0] == J).all()
