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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests not marked ``slow`` run first, in their files' order: ``make test`` runs both kinds in one
    session (one start and one collection) and still shows a quick failure before the minutes of real models."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is not None)
