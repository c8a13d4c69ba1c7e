"""Fixtures shared by test files."""

from collections.abc import Iterator

import pytest
import torch

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


@pytest.fixture(autouse=True)
def torch_threads_kept() -> Iterator[None]:
    """``grpo-lab train | eval`` set torch's thread count for their process (grpo_lab.threads); a test that calls
    the command line in this process gets the count back, so no later test runs on another."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
