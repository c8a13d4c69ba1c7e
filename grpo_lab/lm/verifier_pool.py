"""math-verify in a worker process: the one verifier pool of a process (:mod:`grpo_lab.lm.rewards` asks it).

Why a worker process: math-verify bounds its own work with ``signal.alarm``,
which raises off the main thread, and without it a pathological answer (a power
tower) runs unbounded. Here math-verify runs in one persistent child process
per parent process, on the child's main thread with its own timeouts off; the
parent waits at most ``timeout`` seconds, then kills the child (reward 0,
counted in :func:`verifier_stats`) and hands the next call to a spare child
that has already imported math-verify (and starts a new spare).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections import Counter

STARTUP_TIMEOUT_S = 60.0  # for the worker to import math-verify (slow on a loaded CI machine)


_WORKER = r"""
import json, logging, sys
logging.disable(logging.CRITICAL)  # math-verify logs every unparsable string
from math_verify import parse, verify

def check(pred, gold):
    try:
        return verify(parse("$" + gold + "$", parsing_timeout=None), parse("$" + pred + "$", parsing_timeout=None),
                      timeout_seconds=None)
    except Exception:
        return False

try:
    check("(x+1)^2", "x^2+2x+1")  # warm up sympy so that the first real call is not slower
    sys.stdout.write("ready\n"); sys.stdout.flush()
    for line in sys.stdin:
        sys.stdout.write("1\n" if check(*json.loads(line)) else "0\n"); sys.stdout.flush()
except (BrokenPipeError, KeyboardInterrupt):  # the parent went away
    pass
"""


class _Worker:
    """One math-verify child process: started at once, ready once it has printed ``ready``."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, bufsize=0)
        self.ready = False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def readline(self, timeout: float) -> bytes | None:
        ready, _, _ = select.select([self.proc.stdout], [], [], max(timeout, 0.0))
        return self.proc.stdout.readline() if ready else None

    def wait_ready(self, timeout: float) -> bool:
        """Whether the worker has imported math-verify, waiting at most ``timeout`` seconds for it."""
        if not self.ready:
            self.ready = self.readline(timeout) == b"ready\n"
        return self.ready

    def detach(self) -> None:
        """Close this end of the pipes without killing the process (a forked child's copy)."""
        self.proc.stdin.close()
        self.proc.stdout.close()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.detach()


class _Verifier:
    """One math-verify worker per parent process, calls serialised by a lock.

    After the first kill (a timeout or a crash) a spare worker is kept started, so the
    call after a kill does not wait for math-verify's import (seconds) on top of its own time.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.lock = threading.Lock()
        self.worker: _Worker | None = None
        self.spare: _Worker | None = None
        self.stats: Counter[str] = Counter()

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's workers (without killing them) and the lock."""
        for worker in (self.worker, self.spare):
            if worker is not None:
                worker.detach()
        self._reset()

    def _start(self) -> _Worker:
        self.stats["starts"] += 1
        return _Worker()

    def _take_spare(self) -> _Worker:
        """The spare worker if it is alive (it is no longer the spare), else a new worker."""
        spare, self.spare = self.spare, None
        return spare if spare is not None and spare.alive() else self._start()

    def warm(self) -> bool:
        """Whether the next call is answered by a worker that has already imported math-verify."""
        return self.worker is not None and self.worker.alive() and self.worker.wait_ready(0.0)

    def verify(self, pred: str, gold: str, timeout: float) -> bool:
        with self.lock:
            if self.worker is None or not self.worker.alive():
                self.worker = self._take_spare()
            if not self.worker.wait_ready(STARTUP_TIMEOUT_S):
                self.worker.kill()
                self.worker = None
                raise RuntimeError("the math-verify worker did not start; is math-verify installed?")
            self.stats["calls"] += 1
            start = time.perf_counter()
            try:
                self.worker.proc.stdin.write((json.dumps([pred, gold]) + "\n").encode())
                answer = self.worker.readline(timeout)
            except BrokenPipeError:
                answer = b""
            if answer in (b"1\n", b"0\n"):
                self.stats["max_ms"] = max(self.stats["max_ms"], round(1000 * (time.perf_counter() - start)))
                return answer == b"1\n"
            self.stats["timeouts" if answer is None else "crashes"] += 1
            self.worker.kill()
            self.worker = self._take_spare()
            self.spare = self._start()
            return False

    def close(self) -> None:
        with self.lock:
            for worker in (self.worker, self.spare):
                if worker is not None:
                    worker.kill()
            self.worker = self.spare = None


_VERIFIER = _Verifier()
os.register_at_fork(after_in_child=_VERIFIER.forget_after_fork)
atexit.register(_VERIFIER.close)


def verifier_stats() -> dict[str, int]:
    """Counts of this process's math-verify worker: ``calls``, ``timeouts``,
    ``crashes``, ``starts`` and the slowest answered call ``max_ms``."""
    return {key: _VERIFIER.stats[key] for key in ("calls", "timeouts", "crashes", "starts", "max_ms")}


def verify(pred: str, gold: str, timeout: float) -> bool:
    """Whether math-verify says ``pred`` equals ``gold``, within ``timeout`` seconds (a timeout or a crash of
    the worker is a mismatch, counted in :func:`verifier_stats`)."""
    return _VERIFIER.verify(pred, gold, timeout)
