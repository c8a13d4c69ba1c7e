"""Hostile completions for the answer reward: hypothesis strategies (random unicode, huge numbers,
nested LaTeX, empty and 100k-character strings) and :func:`score_answer`, which times one reward.

``tests/test_hostile_answers.py`` fuzzes with them; ``tests/reliability_report.py`` fuzzes more.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from typing import Any

from hypothesis import strategies as st

from grpo_lab.lm import verifier_pool
from grpo_lab.lm.rewards import answer_reward, extract_answer, format_reward

PARENT_SLACK_S = 1.0
"""Parent-side work a reward may add to the math-verify timeout: extraction, exact arithmetic on a
100k-digit number (~0.3 s), the format check."""
LONG_PIECES = ["9", "\\boxed{", "{", "}", "1,", "a", "\\frac{1}{", "½", " ", "\\boxed {1} "]
NESTINGS = [("\\frac{", "}{2}"), ("\\sqrt{", "}"), ("{", "}"), ("\\boxed{", "}"), ("\\left(", "\\right)"), ("2^{", "}")]


def hostile_answers(max_depth: int) -> st.SearchStrategy[str]:
    """Random unicode, huge numbers, nested LaTeX up to ``max_depth``, empty and 100k-character strings."""
    huge = (st.builds(str.__add__, st.sampled_from("123456789"), st.text("0123456789", min_size=20, max_size=5000))
            | st.builds(lambda a, b: f"{a:,}.{b}", st.integers(10**6, 10**300), st.integers(0, 10**40))
            | st.builds(lambda a: f"-{a}/{a + 1}", st.integers(10**30, 10**400)))
    nested = st.builds(lambda d, pair: pair[0] * d + "1" + pair[1] * d, st.integers(1, max_depth),
                       st.sampled_from(NESTINGS))
    long = st.sampled_from(LONG_PIECES).map(lambda piece: piece * (100_000 // len(piece)))
    odd = st.sampled_from(["", " ", "\ud800", "\udfff\\boxed{1}", "\x00", "\\boxed{\x00}", "1e400", "NaN", "∞"])
    return st.text(max_size=200) | huge | nested | long | odd


def completions(max_depth: int) -> st.SearchStrategy[str]:
    part = hostile_answers(max_depth)
    return part | st.builds(lambda a, b: f"{a} so the answer is \\boxed{{{b}}}", part, part)


GOLDS = st.sampled_from(["72", "-3", "\\frac{1}{2}", "x^2+2x+1", "1,234", "0.5"])


@contextlib.contextmanager
def within(seconds: float, what: str) -> Iterator[None]:
    """Raise TimeoutError if the block runs longer than ``seconds`` (main thread, pure-Python work only)."""
    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"{what} took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def score_answer(completion: str, gold: str, timeout: float) -> tuple[float, float, bool]:
    """Reward of a hostile completion: ``(value, seconds, worker_was_warm)``.

    Extraction runs first under an alarm (it has no timeout of its own: a quadratic scan would
    hang the trainer); math-verify runs in its worker with ``timeout``.
    """
    what = f"extracting the answer of {completion[:40]!r}… ({len(completion)} characters)"
    with within(PARENT_SLACK_S, what):
        extract_answer(completion)
        format_reward(completion, "boxed")
    warm = verifier_pool._VERIFIER.warm()
    start = time.perf_counter()
    value = answer_reward(completion, gold, "boxed", 0.1, timeout=timeout)
    return value, time.perf_counter() - start, warm
