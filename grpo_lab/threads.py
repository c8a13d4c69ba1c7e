"""How many threads torch computes on: the cores that are free now, not every core the machine has.

A torch thread that waits for a core another process holds slows every step, since the other threads of an
operation wait for it. So, unless told otherwise, the notebooks and ``grpo-lab`` take the machine's cores minus
its 1-minute load average (at least 1). ``OMP_NUM_THREADS``, or a number passed in, overrides that.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

THREADS_ENV = "OMP_NUM_THREADS"


@dataclass(frozen=True)
class ThreadChoice:
    """The number of torch threads picked, and why, in words a learner can act on."""

    threads: int
    reason: str

    def __str__(self) -> str:
        return f"torch threads: {self.threads} ({self.reason})"


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system reports one, as in a container)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def choose_threads(requested: int | None = None, *, cores: int | None = None, load: float | None = None,
                   environ: Mapping[str, str] | None = None) -> ThreadChoice:
    """The thread count to use: ``requested`` if given, else ``OMP_NUM_THREADS`` if set to a positive whole number,
    else the free cores, ``cores`` minus the 1-minute ``load`` average rounded, at least 1.

    ``cores``, ``load`` and ``environ`` default to this machine's (:func:`available_cores`, ``os.getloadavg``,
    ``os.environ``); tests pass their own.
    """
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise ValueError(f"threads must be a whole number >= 1, got {requested!r}")
        return ThreadChoice(requested, "as asked")
    environ = os.environ if environ is None else environ
    given = environ.get(THREADS_ENV, "").strip()
    if given.isdigit() and int(given) >= 1:
        return ThreadChoice(int(given), f"{THREADS_ENV}={given}")
    cores = available_cores() if cores is None else cores
    load = os.getloadavg()[0] if load is None else load
    threads = max(1, round(cores - load))
    ignored = f"{THREADS_ENV}={given!r} is not a whole number >= 1, so ignored; " if given else ""
    return ThreadChoice(threads, f"{ignored}{cores} cores minus the 1-minute load {load:.2f}, at least 1; "
                                 f"{THREADS_ENV} sets it instead")


def use_threads(requested: int | None = None) -> ThreadChoice:
    """Set torch's thread count to :func:`choose_threads`'s and return the choice (print it: one line)."""
    import torch

    choice = choose_threads(requested)
    torch.set_num_threads(choice.threads)
    return choice
