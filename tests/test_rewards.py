"""Rewards: answer extraction, exact/symbolic matching, a real timeout, validation."""

from __future__ import annotations

import math
import multiprocessing
import threading
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_lab.lm.rewards import (
    answer_reward,
    answers_match,
    as_number,
    compute_rewards,
    extract_answer,
    format_reward,
    lenient_reward,
    require_reward_values,
)
from grpo_lab.lm.verifier_pool import _VERIFIER, STARTUP_TIMEOUT_S, _Worker, verifier_stats

POWER_TOWER = "2^{2^{2^{2^{2^{2}}}}}"  # math-verify spends ~5 s on it, then says False


@pytest.mark.parametrize("completion, expected", [
    ("The answer is \\boxed{72}.", "72"),
    ("\\boxed{1} then \\boxed{\\frac{1}{2}} at last", "\\frac{1}{2}"),
    ("nested \\boxed{\\sqrt{\\frac{a}{b}}}", "\\sqrt{\\frac{a}{b}}"),
    ("ok \\boxed{3} broken \\boxed{4", "3"),
    ("she has 1,234,567 coins", "1,234,567"),
    ("lists 3,4 and 10", "10"),
    ("4 + 5 = 9.", "9"),
    ("it drops to -3", "-3"),
    ("pi is about 3.14", "3.14"),
    ("no digits here", None),
    ("", None),
])
def test_extract_answer(completion, expected):
    assert extract_answer(completion) == expected


@pytest.mark.parametrize("text, value", [
    ("72", Fraction(72)), (" -3 ", Fraction(-3)), ("1,234", Fraction(1234)), ("$5$", Fraction(5)),
    ("0.50", Fraction(1, 2)), ("1/2", Fraction(1, 2)), ("-6/4", Fraction(-3, 2)), ("72.", Fraction(72)),
    ("1/0", None), ("1,23", None), ("x", None), ("\\frac{1}{2}", None), ("1e5", None), ("", None),
])
def test_as_number(text, value):
    assert as_number(text) == value


def test_as_number_has_no_digit_limit():
    big = "9" * 4301  # int(str) refuses this many digits; math-verify parses it to nothing
    assert as_number(big) == 10 ** 4301 - 1
    assert lenient_reward(f"\\boxed{{{big}}}", big) == 1.0
    assert lenient_reward(f"\\boxed{{{big[:-1]}8}}", big) == 0.0


@pytest.mark.parametrize("completion, gold, expected", [
    ("The answer is \\boxed{72}.", "72", 1.0),
    ("The answer is \\boxed{71}.", "72", 0.0),
    ("In total 1,234 apples", "1234", 1.0),
    ("so the result is -3", "-3", 1.0),
    ("so the result is 3", "-3", 0.0),
    ("4 + 4 = 8", "8", 1.0),
    ("8 is wrong, it is 9", "8", 0.0),
    ("\\boxed{0.5}", "1/2", 1.0),            # exact fast path
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),   # math-verify
    ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
    ("\\boxed{(x+1)^2}", "x^2+2x+1", 1.0),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", 1.0),
    ("\\boxed{\\text{(C)}}", "C", 1.0),
    ("\\boxed{}", "0", 0.0),
    ("nothing", "3", 0.0),
])
def test_lenient_reward(completion, gold, expected):
    assert lenient_reward(completion, gold) == expected


def test_format_reward_and_answer_reward():
    assert format_reward(" 8 ", "number") == 1.0
    assert format_reward("8 apples", "number") == 0.0
    assert format_reward("so \\boxed{8}", "boxed") == 1.0
    assert format_reward("so 8", "boxed") == 0.0
    assert answer_reward(" 8 ", "8") == 1.0  # reasoning-gym would give 0.33 here
    assert answer_reward("the sum is 8", "8", format_weight=0.2) == 0.0  # strict: not just the number
    assert answer_reward("the sum is 8", "8", format_weight=0.2, scoring="lenient") == 1.0
    assert answer_reward("7", "8", format_weight=0.2) == 0.2
    assert answer_reward("it is 7", "8", format_weight=0.2) == 0.0
    assert answer_reward("\\boxed{7}", "8", answer_format="boxed", format_weight=0.1) == 0.1
    with pytest.raises(ValueError, match="format_weight"):
        answer_reward("7", "8", format_weight=1.5)
    with pytest.raises(ValueError, match="answer_format"):
        format_reward("7", "latex")


def recorded_waits(monkeypatch) -> list[float]:
    """The seconds each wait for a worker's line is allowed, appended as the waits happen."""
    waits, readline = [], _Worker.readline
    monkeypatch.setattr(_Worker, "readline",
                        lambda self, timeout: waits.append(timeout) or readline(self, timeout))
    return waits


def test_pathological_answer_is_cut_at_the_timeout(monkeypatch):
    """The answer is waited for with the caller's timeout, no longer; then the worker is killed."""
    assert answers_match("\\frac{1}{2}", "0.5")  # worker up and warm
    before, cut = verifier_stats(), _VERIFIER.worker
    waits = recorded_waits(monkeypatch)
    assert answers_match(POWER_TOWER, "5", timeout=0.5) is False
    assert waits == [0.5] and not cut.alive()
    after = verifier_stats()
    assert after["timeouts"] == before["timeouts"] + 1
    assert after["starts"] > before["starts"]  # killed and replaced (plus a spare after the first kill)
    assert answers_match("\\frac{2}{4}", "0.5")  # the new worker answers


def test_the_call_after_a_kill_does_not_wait_for_a_worker_start():
    assert answers_match(POWER_TOWER, "5", timeout=0.3) is False  # a kill: from now on a spare is kept
    spare = _VERIFIER.spare
    assert spare.wait_ready(STARTUP_TIMEOUT_S)                     # it imports while training goes on
    assert answers_match(POWER_TOWER, "5", timeout=0.3) is False  # the spare takes over at once …
    assert _VERIFIER.worker is spare and _VERIFIER.warm()  # … math-verify already imported
    starts = verifier_stats()["starts"]
    assert answers_match("\\frac{3}{6}", "0.5")                   # … and answers, no worker started for it
    assert _VERIFIER.worker is spare and verifier_stats()["starts"] == starts


def test_overlong_answer_is_a_mismatch_without_parsing():
    calls = verifier_stats()["calls"]
    assert lenient_reward("\\boxed{" + "x+" * 2000 + "1}", "1") == 0.0
    assert verifier_stats()["calls"] == calls


def test_works_from_a_thread(monkeypatch):
    results: list[object] = []

    def work():
        try:
            results.append((answers_match("\\frac{1}{2}", "0.5"), answers_match(POWER_TOWER, "5", timeout=0.5)))
        except BaseException as exc:  # noqa: BLE001 - carried to the main thread
            results.append(exc)

    timeouts, waits = verifier_stats()["timeouts"], recorded_waits(monkeypatch)
    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=300)                                      # a hang guard only
    assert not thread.is_alive()
    assert results == [(True, False)]
    assert waits[-1] == 0.5 and verifier_stats()["timeouts"] == timeouts + 1  # cut at its timeout from a thread


def test_works_from_forked_processes():
    assert answers_match("\\frac{1}{2}", "0.5")  # the parent has a live worker before the fork
    parent_worker = _VERIFIER.worker.proc
    calls = [("\\frac{1}{2}", "0.5", 3.0), ("(x+1)^2", "x^2+2x+1", 3.0), ("\\frac{1}{3}", "0.5", 3.0),
             (POWER_TOWER, "5", 1.0)]
    with multiprocessing.get_context("fork").Pool(2) as pool:
        results = pool.starmap(answers_match, calls)
    assert results == [True, True, False, False]
    assert _VERIFIER.worker.proc is parent_worker and parent_worker.poll() is None  # children left it alone
    assert answers_match("\\sqrt{4}", "2")


def test_check_rewards_accepts_good_values():
    out = require_reward_values([0, 1.0, 0.25, torch.tensor(0.5), True], [0, 0, 1, 1, 2])
    assert out.dtype == torch.float32
    assert out.tolist() == [0.0, 1.0, 0.25, 0.5, 1.0]


@pytest.mark.parametrize("values, pattern", [
    ([0.0, math.nan], r"nan for prompt 7"),
    ([0.0, "1"], r"'1' for prompt 7"),
    ([0.0, None], r"None for prompt 7"),
    ([1.5, 0.0], r"1.5 for prompt 3"),
    ([0.0, -0.1], r"-0.1 for prompt 7"),
    ([0.0, math.inf], r"inf for prompt 7"),
    ([0.0], r"1 rewards for 2 completions: no reward for completion 1 \(prompt 7\)"),
    ([0.0, 1.0, 0.5], r"3 rewards for 2 completions: extra value 0.5"),
    ("01", r"sequence of numbers"),
])
def test_check_rewards_names_prompt_and_value(values, pattern):
    with pytest.raises(ValueError, match=pattern):
        require_reward_values(values, [3, 7])


def test_compute_rewards_names_the_prompt_of_a_failing_reward():
    def fragile(completion: str, gold: str) -> float:
        if "boom" in completion:
            raise KeyError("boom")
        return lenient_reward(completion, gold)

    out = compute_rewards(fragile, ["2", "3", "\\boxed{4}"], ["2", "2", "4"], [0, 0, 1])
    assert out.tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match=r"KeyError.*prompt 5 \(completion 1"):
        compute_rewards(fragile, ["2", "boom"], ["2", "2"], [4, 5])
    with pytest.raises(ValueError, match=r"2.0 for prompt 9"):
        compute_rewards(lambda c, g: 2.0, ["2"], ["2"], [9])
    with pytest.raises(ValueError, match="one length"):
        compute_rewards(fragile, ["2"], ["2", "3"], [0])


_PIECES = list("0123456789-+.,/ ^{}()\\$xabc") + ["\\boxed{", "\\frac", "\\sqrt", "}"]
_TEXT = st.lists(st.sampled_from(_PIECES), max_size=30).map("".join) | st.text(max_size=40)


@settings(max_examples=150, deadline=None)
@given(completion=_TEXT, gold=_TEXT, weight=st.sampled_from([0.0, 0.3]))
def test_fuzz_rewards_never_raise(completion, gold, weight):
    value = answer_reward(completion, gold, format_weight=weight, timeout=2.0)
    assert value in (0.0, weight, 1.0)
