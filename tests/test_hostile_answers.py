"""Hostile answers never raise and respect the math-verify timeout; extraction is linear in length."""

from __future__ import annotations

import pytest
from hostile_answers import GOLDS, LONG_PIECES, PARENT_SLACK_S, completions, score_answer, within
from hypothesis import HealthCheck, given, settings

from grpo_lab.lm import verifier_pool
from grpo_lab.lm.rewards import extract_answer, format_reward, strict_answer

pytestmark = pytest.mark.usefixtures("one_thread")


FUZZ_TIMEOUT_S = 1.0


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(completion=completions(max_depth=4), gold=GOLDS)
def test_hostile_answers_never_raise_and_respect_the_timeout(completion, gold):
    value, seconds, warm = score_answer(completion, gold, FUZZ_TIMEOUT_S)
    assert value in (0.0, 0.1, 1.0)
    bound = FUZZ_TIMEOUT_S + PARENT_SLACK_S + (0 if warm else verifier_pool.STARTUP_TIMEOUT_S)
    assert seconds <= bound, f"{seconds:.2f} s > {bound} s on {completion[:60]!r}"


@pytest.mark.parametrize("piece", LONG_PIECES)
def test_answer_extraction_is_linear_on_100k_characters(piece):
    text = piece * (100_000 // len(piece))
    with within(PARENT_SLACK_S, f"extracting from {piece!r} × {len(text) // len(piece)}"):
        extract_answer(text)
        format_reward(text, "boxed")
        strict_answer(text, "number")
