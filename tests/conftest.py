"""Fixtures shared by test files."""

from collections.abc import Iterator

import pytest

from grpo_lab.exact.bandit import single_thread


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny tensors: one intra-op thread is ~10× faster on a busy 2-core machine, and every run
    compared bit for bit (including the crash child) uses the same thread count."""
    with single_thread():
        yield
