"""Every fault is recovered with nothing lost: the run stops clearly and resumes bit for bit."""

from __future__ import annotations

import pytest
from fault_scenarios import SCENARIOS

pytestmark = pytest.mark.usefixtures("one_thread")


FAST = [("crash_mid_checkpoint", "bandit"), ("nan_gradient", "bandit"), ("nan_gradient_unclipped", "bandit"),
        ("nan_gradient", "lm"), ("nan_loss", "lm"), ("poisoned_step_in_train", "bandit"),
        ("interrupt_in_sampling", "bandit"), ("interrupt_in_training", "bandit"), ("interrupt_in_sync", "bandit"),
        ("interrupt_in_sync", "lm")]


@pytest.mark.parametrize("name, kind", FAST, ids=[f"{n}-{k}" for n, k in FAST])
def test_fault_is_recovered_with_nothing_lost(name, kind, tmp_path):
    outcome = SCENARIOS[name](tmp_path, kind)
    assert outcome.ok, f"{outcome.fault}: failed {outcome.failed()} {outcome.note}"
