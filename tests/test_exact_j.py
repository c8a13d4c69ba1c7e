"""Exact strict J(π) (grpo_lab.exact.strict_j): against brute-force enumeration on a tiny model, its certified
bound under pruning, its acceptance rule against strict_reward, and against Monte Carlo on SmolLM2-135M."""

import itertools
import math

import numpy as np
import pytest
import torch
from tiny_lm import BYTE_STOPS as STOPS
from tiny_lm import SPACE_BYTE_WORDS, byte_tokenizer, flat_model
from transformers import LogitsProcessorList
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from grpo_lab.exact.strict_answers import StrictAnswers
from grpo_lab.exact.strict_j import (
    MULTI_BYTE_SPACES,
    Sampling,
    answer_tokens,
    exact_evaluate,
    extend_bytes,
    may_be_part_of_a_space,
    strict_j,
    token_bytes,
)
from grpo_lab.lm.rewards import strict_reward


_BRUTE_FORCE_J: dict[tuple, float] = {}
"""brute_force_j's results without ``only``, by (model, tokenizer, prompt, gold, sampling): tests that compare
against the same enumeration share it."""


@torch.no_grad()
def brute_force_j(model, tokenizer, prompt: str, gold: str, sampling: Sampling, only=None) -> float:
    """Σ over every token sequence of at most T_max tokens ending in a stop of its probability × strict_reward of
    its decoded text: whole forwards (no cache), Hugging Face's top-k/top-p warpers, the tokenizer's decode.
    ``only``: count only the decoded texts it holds true for."""
    key = (model, tokenizer, prompt, gold, sampling)
    if only is None and key in _BRUTE_FORCE_J:
        return _BRUTE_FORCE_J[key]
    warpers = LogitsProcessorList(([TopKLogitsWarper(sampling.top_k)] if sampling.top_k else [])
                                  + ([TopPLogitsWarper(sampling.top_p)] if sampling.top_p < 1 else []))
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    vocab = model.config.vocab_size
    prefixes, total = [((), 1.0)], 0.0
    for depth in range(sampling.max_tokens):
        ids = torch.tensor([prompt_ids + list(p) for p, _ in prefixes])
        logits = model(input_ids=ids).logits[:, -1].float() / sampling.temperature
        probs = warpers(ids, logits).softmax(-1).double()
        grown = []
        for (prefix, p), row in zip(prefixes, probs.tolist(), strict=True):
            for token in range(vocab):
                q = p * row[token]
                if token in STOPS:
                    text = tokenizer.decode(list(prefix), skip_special_tokens=True)
                    if only is None or only(text):
                        total += q * strict_reward(text, True, gold, "number")
                elif depth + 1 < sampling.max_tokens and q > 0:
                    grown.append(((*prefix, token), q))
        prefixes = grown
    if only is None:
        _BRUTE_FORCE_J[key] = total
    return total


@pytest.fixture(scope="module")
def tiny():
    tokenizer = byte_tokenizer()
    return flat_model(len(tokenizer)), tokenizer


PROMPTS = ["a 1", "a a"]


@pytest.mark.parametrize("sampling", [Sampling(1.0, 1.0, 0, 3), Sampling(0.7, 0.9, 0, 3), Sampling(1.3, 1.0, 12, 3)],
                         ids=["T1", "T0.7-top_p", "T1.3-top_k"])
def test_equals_brute_force_enumeration_on_a_tiny_model(tiny, sampling):
    model, tokenizer = tiny
    for gold in ("1", "8", "0"):
        j_low, pruned, _ = strict_j(model, tokenizer, PROMPTS, [gold, gold], sampling, threshold=0.0,
                                    eos_token_ids=STOPS)
        truth = [brute_force_j(model, tokenizer, p, gold, sampling) for p in PROMPTS]
        assert max(truth) > 1e-4, truth  # accepted completions carry mass: the comparison means something
        np.testing.assert_allclose(j_low, truth, rtol=1e-5, atol=1e-12)  # float32 logits, cached vs whole forwards
        assert np.all(pruned == 0)  # τ = 0 and every token's bytes are read: nothing is bounded


def test_pruning_returns_a_bound_that_contains_the_truth(tiny):
    model, tokenizer = tiny
    sampling = Sampling(1.0, 1.0, 0, 4)
    truth = brute_force_j(model, tokenizer, PROMPTS[0], "1", sampling)
    j_low, pruned, taus = strict_j(model, tokenizer, PROMPTS[:1], ["1"], sampling, threshold=5e-3,
                                   eos_token_ids=STOPS, max_pruned=1.0)  # no refinement
    assert taus[0] == 5e-3 and truth - j_low[0] > 0.05 * truth  # pruning cut real accepted mass
    assert j_low[0] <= truth <= j_low[0] + pruned[0]
    exact, _, _ = strict_j(model, tokenizer, PROMPTS[:1], ["1"], sampling, threshold=0.0, eos_token_ids=STOPS)
    assert exact[0] == pytest.approx(truth, rel=1e-5)


def test_refinement_walks_a_question_again_until_its_bound_is_met(tiny):
    model, tokenizer = tiny
    sampling = Sampling(1.0, 1.0, 0, 4)
    target = 1e-3
    coarse = strict_j(model, tokenizer, PROMPTS, ["1", "8"], sampling, threshold=5e-3, eos_token_ids=STOPS,
                      max_pruned=1.0)
    assert coarse[1].max() > target  # the first τ leaves more than the target: refinement has work to do
    j_low, pruned, taus = strict_j(model, tokenizer, PROMPTS, ["1", "8"], sampling, threshold=5e-3,
                                   eos_token_ids=STOPS, max_pruned=target)
    assert np.all(pruned <= target) and taus.min() < 5e-3
    for q, (prompt, gold) in enumerate(zip(PROMPTS, ["1", "8"], strict=True)):
        truth = brute_force_j(model, tokenizer, prompt, gold, sampling)
        assert j_low[q] <= truth <= j_low[q] + pruned[q]
        if coarse[1][q] <= target:  # a question already within the bound is not walked again
            assert taus[q] == 5e-3 and j_low[q] == coarse[0][q]


def test_batches_of_questions_agree_with_one_question_at_a_time(tiny):
    model, tokenizer = tiny
    prompts, golds, sampling = ["a 1", "a a", "1", "a a a 1"], ["1", "8", "1", "0"], Sampling(1.0, 1.0, 0, 3)
    kwargs = {"threshold": 1e-2, "eos_token_ids": STOPS, "max_pruned": 0.09}  # two questions refined, two not
    together = strict_j(model, tokenizer, prompts, golds, sampling, questions_per_batch=3, **kwargs)
    alone = [strict_j(model, tokenizer, [p], [g], sampling, **kwargs) for p, g in zip(prompts, golds, strict=True)]
    assert together[1].min() > 0 and len(set(together[2])) == 2  # the batches share a τ and its bookkeeping
    np.testing.assert_allclose(together[0], [j[0][0] for j in alone], rtol=1e-5)
    np.testing.assert_allclose(together[1], [j[1][0] for j in alone], rtol=1e-5, atol=1e-12)
    np.testing.assert_array_equal(together[2], [j[2][0] for j in alone])


ACCEPTED_8 = ["8", " 8", "8 ", "\n8\n", "8.", " 8.\n", "08", "008.", "8.0", "8.00.", "0,008", "\u2009 8\u3000"]
REJECTED_8 = ["8..", "8 .", "+8", "$8", "8a", "8 8", "80", "8,0", "8,000", "-8", "1/8", "8/", ". 8", "8.5",
              "\\boxed{8}", "8/0.", "8.0.0", "16/2", "-16/-2", "8/1", "8.0/1.", "7.2/0.9", "\u0668", "\uff18"]
"""The strict number format's edge cases for the gold 8: whitespace around, a trailing period, leading and
trailing zeros, thousands commas; not a fraction, a sign it does not have, or a non-ASCII digit."""


def test_accepts_is_strict_reward_on_its_edge_cases():
    answers = StrictAnswers("8")
    for text in ACCEPTED_8 + REJECTED_8:
        assert answers.accepts(text) == (strict_reward(text, True, "8", "number") == 1.0), text
    assert all(answers.accepts(t) for t in ACCEPTED_8)
    assert not any(answers.accepts(t) for t in REJECTED_8)


def test_every_prefix_of_an_accepted_string_is_viable():
    """Soundness of the walk's pruning of dead branches, on every string of ≤ 4 characters over an alphabet of
    the edge cases, for golds with leading zeros, decimals, a sign and zero."""
    alphabet = ["0", "1", "2", "3", "5", "8", " ", "\n", ".", ",", "-", "/", "a", "\u0668"]
    for gold in ("8", "2.5", "-3", "0", "10"):
        answers = StrictAnswers(gold)
        accepted = 0
        for n in range(1, 5):
            for chars in itertools.product(alphabet, repeat=n):
                text = "".join(chars)
                if strict_reward(text, True, gold, "number") == 1.0:
                    accepted += 1
                    dead = [text[:i] for i in range(len(text) + 1) if not answers.viable(text[:i])]
                    assert not dead, (gold, text, dead)
        assert accepted >= 5, gold
    for text in ACCEPTED_8:
        assert all(StrictAnswers("8").viable(text[:i]) for i in range(len(text) + 1)), text


def test_dead_branches_are_recognised():
    answers = StrictAnswers("8")
    for text in ["a", "8a", "8 8", "+", "$", "8..", " 8 .", "9 ", "8 ,", "1", "-", "1/8", "8/", "16/2", "\u0668",
                 "\\"]:
        assert not answers.viable(text), text
    for text in ["", " ", "0", "0,0", "00", "8", "8.", "8.0", " 8 "]:
        assert answers.viable(text), text


# the tiny vocabulary with the bytes of multi-byte spaces (tiny_lm.SPACE_BYTE_WORDS)
SPACE_PROMPTS = ["a 1", "1 a"]


@pytest.fixture(scope="module")
def tiny_spaces():
    tokenizer = byte_tokenizer(SPACE_BYTE_WORDS)
    return flat_model(len(tokenizer), seed=1), tokenizer


@pytest.mark.parametrize("sampling", [Sampling(1.0, 1.0, 0, 3), Sampling(0.8, 0.95, 0, 3)], ids=["T1", "T0.8-top_p"])
def test_multi_byte_spaces_split_over_tokens_are_walked_exactly(tiny_spaces, sampling):
    """U+00A0 (C2 A0), U+0085 (C2 85) and U+3000 (E3 80 80) split over tokens are walked, not bounded: J_low is the
    brute-force J (which decodes every token sequence with the tokenizer), nothing is pruned at τ = 0, and the
    accepted completions through a multi-byte space carry real mass."""
    model, tokenizer = tiny_spaces
    assert len(answer_tokens(tokenizer, len(tokenizer) + 2, STOPS).unknown) == 0
    for gold in ("1", "0"):
        j_low, pruned, _ = strict_j(model, tokenizer, SPACE_PROMPTS, [gold, gold], sampling, threshold=0.0,
                                    eos_token_ids=STOPS)
        truth = [brute_force_j(model, tokenizer, p, gold, sampling) for p in SPACE_PROMPTS]
        spaces = [brute_force_j(model, tokenizer, p, gold, sampling, only=lambda t: any(c > "\x7f" for c in t))
                  for p in SPACE_PROMPTS]
        np.testing.assert_allclose(j_low, truth, rtol=1e-5, atol=1e-12)
        assert np.all(pruned == 0)
        if gold == "1":  # "1\xa0", "\xa01", "\u30001", "1\x85", ... within two tokens and a stop: without them
            # J_low would miss the comparison's tolerance (rtol 1e-5) a hundred times over
            assert all(m > 100 * 1e-5 * t for m, t in zip(spaces, truth, strict=True)), (spaces, truth)


def test_a_lone_continuation_byte_and_a_broken_character_are_rejected():
    assert extend_bytes(b"", b"\x80") is None                 # a lone continuation byte decodes to U+FFFD
    assert extend_bytes(b"", b"\xa0 1") is None
    assert extend_bytes(b"\xc2", b"\xa1") == ("\xa1", b"")     # C2 A1 is "¡": whole, but no space (the walk drops it)
    assert extend_bytes(b"\xc2", b"1") is None                # a pending character broken by an ASCII byte
    assert extend_bytes(b"\xe3", b"\x80\xe3") is None         # or by a new first byte
    assert extend_bytes(b"\xc2", b"\x80\x80") is None         # a continuation byte too many
    assert extend_bytes(b"\xe2", b"\x88") is None             # E2 88 begins no space ("∀"…)
    assert extend_bytes(b"", b"1\xc2") == ("1", b"\xc2")
    assert extend_bytes(b"\xc2", b"\xa01") == ("\xa01", b"")
    assert extend_bytes(b"\xe3", b"\x80") == ("", b"\xe3\x80")
    assert extend_bytes(b"\xe3\x80", b"\x80 \xe2") == ("\u3000 ", b"\xe2")
    assert extend_bytes(b"\xe3", b"") == ("", b"\xe3")          # a special token between bytes: decoding drops it
    # the tokenizer decodes them so too (to U+FFFD, to "¡"): strict_reward gives 0, and the tiny vocabulary's test
    # above holds J_low to brute force's J, which decodes every sequence with these tokens
    tokenizer = byte_tokenizer(SPACE_BYTE_WORDS)
    vocab = tokenizer.get_vocab()
    assert tokenizer.decode([vocab["Ģ"], vocab["1"]]) == "\ufffd1" and tokenizer.decode([vocab["Â"], vocab["¡"]]) == "¡"


def test_only_a_token_that_may_be_part_of_a_space_is_a_candidate():
    for raw, may in [(b"\xe3", True), (b"\xe3\x80", True), (b"\xc2", True), (b"1\xe2\x80", True), (b" \xe1\x9a", True),
                     (b"\xa0", True), (b"\x80\x80", True), (b"\xa0 1", True), (b"\x80 \xe3", True),
                     (b"\xa1", False), (b"\xe2\x88", False), (b"a\xe2", False), (b"\xa1 1", False),
                     (b"\xf0\x9f", False), (b"\xa0a", False), (b"\x80\x80\x80", False)]:
        assert may_be_part_of_a_space(raw) == may, raw
    # every piece of every multi-byte space may be part of one
    assert all(may_be_part_of_a_space(w[i:j]) for w in MULTI_BYTE_SPACES for i in range(len(w))
               for j in range(i + 1, len(w) + 1))


def test_the_bundled_tokenizers_partial_tokens_are_read_as_bytes():
    from grpo_lab.lm.models import load_policy

    _, tokenizer = load_policy("smollm2-135m")
    tokens = answer_tokens(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    assert token_bytes(tokenizer, 111, tokenizer.decode([111])) == b"\xa1"   # a lone continuation byte of no space
    assert 111 not in tokens.ids.tolist() and len(tokens.unknown) == 0      # every partial token's bytes are read
    pieces = dict(zip(tokens.ids.tolist(), tokens.pieces, strict=True))
    partial = [i for i in pieces if "\ufffd" in tokenizer.decode([i])]
    assert len(partial) > 10 and all(may_be_part_of_a_space(pieces[i]) for i in partial)
    assert {b"\xc2", b"\xa0", b"\xe3\x80"} <= {pieces[i] for i in partial}  # NBSP's two bytes; U+3000's first two


def test_bad_input_is_refused(tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="plain-number gold"):
        StrictAnswers("\\frac{1}{2}")
    with pytest.raises(ValueError, match="one gold per prompt"):
        strict_j(model, tokenizer, ["a"], ["1", "2"], Sampling(max_tokens=2))
    with pytest.raises(ValueError, match="max_tokens"):
        Sampling(max_tokens=0)
    with pytest.raises(ValueError, match="threshold"):
        strict_j(model, tokenizer, ["a"], ["1"], Sampling(max_tokens=2), threshold=-1.0)


# ----------------------------------------------------------------------------- the bundled model, against sampling

MC_SAMPLES = 20_000
MC_QUESTIONS = (0, 1)  # two add1 questions (J ≈ 0.1); T_max 3 keeps the sampler's 20,000 completions short
MC_SAMPLING = Sampling(temperature=0.7, top_p=0.95, top_k=0, max_tokens=3)


@pytest.mark.slow
def test_exact_j_lies_in_the_monte_carlo_interval_on_smollm2():
    from grpo_lab.lm.models import load_policy
    from grpo_lab.lm.policy import LMPolicy
    from grpo_lab.lm.rewards import finished_completions
    from grpo_lab.lm.sampling import HFSampler
    from grpo_lab.lm.tasks import build_prompt, load_problems

    model, tokenizer = load_policy()
    problems = [load_problems("add1", 8, seed=0)[i] for i in MC_QUESTIONS]
    exact = exact_evaluate(model, tokenizer, problems, MC_SAMPLING)
    assert exact.pruned.max() <= 1e-3
    policy = LMPolicy(model, temperature=MC_SAMPLING.temperature)
    sampler = HFSampler(policy, tokenizer, MC_SAMPLING.max_tokens, top_p=MC_SAMPLING.top_p)
    generator = torch.Generator().manual_seed(0)
    per_question, batch = MC_SAMPLES // len(problems), 500
    for problem, row in zip(problems, exact.rows, strict=True):
        hits = 0
        for _ in range(per_question // batch):
            rollout = sampler.sample([build_prompt(problem, tokenizer)], batch, generator)
            finished = finished_completions(rollout.completions, rollout.mask, sampler.eos_token_ids).tolist()
            hits += sum(strict_reward(t, f, problem.answer, "number")
                        for t, f in zip(rollout.extra["texts"], finished, strict=True))
        mean = hits / per_question
        half = 2.576 * math.sqrt(max(mean * (1 - mean), 1e-12) / per_question)
        print(f"{problem.question!r}: exact J in [{row['j_low']:.4f}, {row['j_low'] + row['pruned']:.4f}], "
              f"Monte Carlo {mean:.4f} ± {half:.4f} (99 %, {per_question} samples)")
        assert 0.02 < mean < 0.98  # a question that tells a wrong J from the right one
        assert mean - half <= row["j_low"] + row["pruned"] and row["j_low"] <= mean + half
