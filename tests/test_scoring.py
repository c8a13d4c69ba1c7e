"""Strict vs lenient scoring: the failure cases of the first CPU study, the finished flag of real
rollouts (cut to a smaller budget too), and evaluate() reporting both side by side."""

from __future__ import annotations

import pytest
import torch
from tiny_lm import EOS, PAD, PROMPTS, tiny_model, word_tokenizer
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from grpo_lab.lm.evaluate import EvalResult, evaluate
from grpo_lab.lm.models import bundled_model_dir
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.rewards import (
    answer_reward,
    finished_completions,
    lenient_reward,
    strict_answer,
    strict_reward,
)
from grpo_lab.lm.sampling import HFSampler, build_rollout
from grpo_lab.lm.tasks import Problem
from grpo_lab.lm.text_task import TextTask
from grpo_lab.lm.train_config import TrainConfig


@pytest.mark.parametrize("completion, finished, gold, answer_format, strict, lenient", [
    ("8", True, "8", "number", 1, 1),
    ("8.", True, "8", "number", 1, 1),
    (" 8\n", True, "8", "number", 1, 1),
    ("1,234", True, "1234", "number", 1, 1),
    ("8", False, "8", "number", 0, 1),                     # right, but cut at the budget
    ("6 + 2 = 8 +", False, "8", "number", 0, 1),           # run-on, truncated
    ("6 + 2 = 8 +", True, "8", "number", 0, 1),            # run-on, even if it had ended
    ("1 + 0. 1 =", False, "1", "number", 0, 1),            # operand echo
    ("3 + 4 = 8", True, "8", "number", 0, 1),              # wrong equation, right last number
    ("6 + 2 = 8", True, "8", "number", 0, 1),              # right equation, not "just the number"
    ("8 apples", True, "8", "number", 0, 1),
    ("6 2", True, "62", "number", 0, 0),
    ("8..", True, "8", "number", 0, 1),
    ("$8", True, "8", "number", 0, 1),
    ("\\boxed{8}", True, "8", "number", 0, 1),             # a box is not the number asked for
    ("7", True, "8", "number", 0, 0),
    ("so \\boxed{8}, and 8 + 1 = 9", True, "8", "boxed", 1, 1),
    ("so \\boxed{8}, and 8 + 1 = 9", True, "9", "boxed", 0, 0),   # no fallback to the last number
    ("so it is 8", True, "8", "boxed", 0, 1),
    ("\\boxed{8", True, "8", "boxed", 0, 1),
    ("so \\boxed{8}", False, "8", "boxed", 0, 1),
])
def test_strict_and_lenient_on_the_study_failure_cases(completion, finished, gold, answer_format, strict, lenient):
    assert strict_reward(completion, finished, gold, answer_format) == strict
    assert lenient_reward(completion, gold) == lenient
    assert answer_reward(completion, gold, answer_format, finished=finished) == strict
    assert answer_reward(completion, gold, answer_format, finished=finished, scoring="lenient") == lenient


def test_strict_answer_is_the_requested_form():
    assert [strict_answer(t, "number") for t in ("8", " 8.\n", "-3", "1,234.5", "1/2", "\u0668", "6 + 2 = 8", "")] == \
        ["8", "8", "-3", "1,234.5", None, None, None, None]   # decimal notation, ASCII digits: not a fraction
    assert strict_answer("a \\boxed{ 3 } b \\boxed{4}", "boxed") == "4"
    with pytest.raises(ValueError, match="answer_format must be one of.*got 'latex'"):
        strict_answer("8", "latex")


def test_format_credit_needs_a_finished_completion_under_strict():
    assert answer_reward("7", "8", format_weight=0.2) == 0.2
    assert answer_reward("7", "8", format_weight=0.2, finished=False) == 0.0
    assert answer_reward("7", "8", format_weight=0.2, finished=False, scoring="lenient") == 0.2
    assert answer_reward("it is 7", "8", format_weight=0.2) == 0.0
    with pytest.raises(ValueError, match="scoring must be one of.*got 'loose'"):
        answer_reward("8", "8", scoring="loose")
    with pytest.raises(ValueError, match="scoring must be one of.*got 'loose'"):
        TrainConfig(scoring="loose")
    assert TrainConfig().scoring == "strict"


def test_finished_comes_from_the_tokens_not_the_padding():
    """Pad = EOS (SmolLM2) after the mask must not count; an EOS in the last column must."""
    completions = torch.tensor([[5, 1, 1, 1], [5, 6, 7, 1], [5, 6, 7, 8], [1, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    assert finished_completions(completions, mask, [1]).tolist() == [True, True, False, True]
    assert finished_completions(completions[:, :2], mask[:, :2], [1]).tolist() == [True, False, False, True]
    with pytest.raises(ValueError, match="eos_token_ids is empty"):
        finished_completions(completions, mask, [])


def test_finished_flag_of_a_real_tiny_rollout_and_of_a_smaller_budget():
    """The tiny Llama ends some completions and runs others to T_max. Cut to b tokens, a rollout
    finishes exactly where sampling with budget b does (the task scan relies on it), and TextTask
    hands the same flags to its reward function."""
    tokenizer = word_tokenizer()
    policy = LMPolicy(tiny_model(), temperature=1.0)
    rollouts = {T: HFSampler(policy, tokenizer, T).sample(PROMPTS, 8, torch.Generator().manual_seed(3))
                for T in (4, 12)}
    long, short = rollouts[12], rollouts[4]
    finished = finished_completions(long.completions, long.mask, [EOS])
    lengths = long.mask.sum(1)
    by_hand = [EOS in row[:n].tolist() for row, n in zip(long.completions, lengths, strict=True)]
    assert finished.tolist() == by_hand
    assert 0 < int(finished.sum()) < len(finished), "the test needs both finished and truncated completions"
    assert all(n == long.completions.shape[1] for n, f in zip(lengths, finished, strict=True) if not f)
    cut = finished_completions(long.completions[:, :4], long.mask[:, :4], [EOS])
    assert torch.equal(short.completions, long.completions[:, :short.completions.shape[1]].masked_fill(
        ~short.mask, PAD))
    assert torch.equal(cut, finished_completions(short.completions, short.mask, [EOS]))
    assert int(cut.sum()) < int(finished.sum()), "some completions must end between 4 and 12 tokens"

    problems = [Problem(p, "0", f"t:{i}", "number") for i, p in enumerate(("w1", "w2"))]
    task = TextTask(problems, tokenizer, reward_fn=lambda text, problem, ended: float(ended), eos_token_ids=[EOS])
    rollout = HFSampler(policy, tokenizer, 12).sample(task.prompts(2, torch.Generator().manual_seed(0)), 8,
                                                      torch.Generator().manual_seed(5))
    flags = finished_completions(rollout.completions, rollout.mask, [EOS]).float().reshape(2, 8)
    assert torch.equal(task.rewards(rollout, torch.Generator()).float(), flags)


def test_vllm_shaped_rows_are_scored_like_hf_rows():
    """VLLMSampler pads its rows to the longest output and hands them to build_rollout, as HFSampler does:
    a row of exactly T_max tokens without EOS is truncated, one with its EOS last finished."""
    tokenizer = word_tokenizer()
    rows = torch.tensor([[5, 6, EOS, PAD], [5, 6, 7, 8], [5, 6, 7, EOS]])
    ids, mask = torch.ones(3, 1, dtype=torch.long), torch.ones(3, 1, dtype=torch.long)
    rollout = build_rollout(["w1"], ids, mask, rows, torch.zeros(3, 4), tokenizer, [EOS], PAD)
    assert finished_completions(rollout.completions, rollout.mask, [EOS]).tolist() == [True, False, True]


@pytest.fixture(scope="module")
def smollm_tokenizer():
    return AutoTokenizer.from_pretrained(bundled_model_dir())


ROWS = [  # (completion, ends with EOS) per question, T_max = 8 tokens of SmolLM2's tokenizer
    [("8", True), ("6 + 2 = 8", True), ("6 + 2 = 8 +", False), ("8.", True)],   # gold 8
    [("1 + 0. 1 =", False), ("5 + 7 = 12", False), ("1", True), ("2", True)],   # gold 1
]


def test_evaluate_reports_strict_lenient_truncated_and_accuracy_of_finished(smollm_tokenizer, monkeypatch):
    tok = smollm_tokenizer
    eos = tok.eos_token_id
    T = 8

    def fake_sample(self, prompts, group_size, generator):
        completions = torch.full((len(prompts) * group_size, T), tok.pad_token_id)
        for r, (text, ends) in enumerate(row for question in ROWS for row in question):
            ids = tok.encode(text, add_special_tokens=False) + ([eos] if ends else [])
            assert len(ids) == T or ends, f"a truncated row must fill all {T} tokens: {text!r}"
            completions[r, :len(ids)] = torch.tensor(ids)
        ids, mask = torch.ones(len(completions), 1, dtype=torch.long), torch.ones(len(completions), 1, dtype=torch.long)
        return build_rollout(prompts, ids, mask, completions, torch.zeros(completions.shape), tok, [eos],
                             tok.pad_token_id)

    monkeypatch.setattr(HFSampler, "sample", fake_sample)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, eos_token_id=eos,
                                         pad_token_id=tok.pad_token_id, tie_word_embeddings=True))
    problems = [Problem("6 + 2 = ?", "8", "t:0", "number"), Problem("1 + 0 = ?", "1", "t:1", "number")]
    result = evaluate(LMPolicy(model, 0.7), tok, problems, n=4, max_completion_length=T, progress=False)
    assert (result.correct, result.correct_lenient, result.truncated) == ([2, 1], [4, 2], [1, 2])
    assert result.pass_at(1) == result.pass_at(1, "strict") == pytest.approx(3 / 8)
    assert result.pass_at(1, "lenient") == pytest.approx(6 / 8)
    assert result.truncated_frac() == pytest.approx(3 / 8)
    assert result.accuracy_finished() == pytest.approx(3 / 5)
    assert result.pass_at(1) == pytest.approx((1 - result.truncated_frac()) * result.accuracy_finished())
    assert result.examples[0] == ("6 + 2 = ?", "8", "8", 1.0)
    with pytest.raises(ValueError, match="scoring must be one of.*got 'both'"):
        result.pass_at(1, "both")


def test_accuracy_of_finished_without_finished_completions():
    result = EvalResult(n=2, correct=[0], correct_lenient=[2], examples=[], truncated=[2])
    assert (result.accuracy_finished(), result.pass_at(1, "lenient")) == (0.0, 1.0)
