"""Theorem 1 exactly on SmolLM2-135M restricted to digits + EOS (grpo_lab.exact.digits_lm).

Every test here loads the real model (float64), hence ``slow``, as in tests/test_models.py.
"""

import copy
import math

import pytest
import torch

from grpo_lab.config import GRPOConfig
from grpo_lab.exact.digits_lm import (
    ExactLM,
    RestrictedPolicy,
    RestrictedSampler,
    answer_rewards,
    answer_space,
    conditionals,
    sequence_logprobs,
)
from grpo_lab.lm.models import load_policy
from grpo_lab.lm.rewards import answer_reward
from grpo_lab.lm.sampling import tokenize_prompts
from grpo_lab.lm.tasks import build_prompt, load_problems

pytestmark = pytest.mark.slow
PROBLEMS = [load_problems("add1", 7, seed=0)[i] for i in (6, 0)]  # "4 + 0", "0 + 4": J ≈ 0.08, 0.12 restricted


@pytest.fixture(scope="module")
def model_and_tokenizer():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tables are many small forwards: a second thread only adds contention
    yield load_policy(dtype=torch.float64)
    torch.set_num_threads(threads)


def prompt_ids(tokenizer, problem):
    return tokenize_prompts(tokenizer, [build_prompt(problem, tokenizer)])[0]


@pytest.mark.parametrize("max_tokens", [2, 3])
def test_enumerated_probabilities_sum_to_one(model_and_tokenizer, max_tokens):
    model, tokenizer = model_and_tokenizer
    space = answer_space(tokenizer, max_tokens)
    assert len(space.texts) == sum(10**m for m in range(max_tokens)) + 10**max_tokens == len(set(space.texts))
    for problem in PROBLEMS:
        cond = conditionals(model, prompt_ids(tokenizer, problem), space)
        total = float(sequence_logprobs(cond, space).exp().sum())
        print(f"n = {max_tokens}, {problem.question}: Σ_y π(y|x) − 1 = {total - 1:.1e}")
        assert cond.dtype == torch.float64 and abs(total - 1) < 1e-6


def monte_carlo_rewards(model, tokenizer, problem, vocab: torch.Tensor, max_tokens: int, n: int,
                        seed: int, chunk: int = 250) -> torch.Tensor:
    """Rewards of n answers drawn token by token from the restricted model, without the answer table:
    per chunk, the prompt's KV cache copied ``chunk`` times, then ``max_tokens`` draws from a softmax
    over V′ only; the answer is cut after its first EOS, decoded and scored like a rollout."""
    g, ids, rewards = torch.Generator().manual_seed(seed), prompt_ids(tokenizer, problem), []
    eos = tokenizer.eos_token_id
    for _ in range(n // chunk):
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=True)
            cache, logits = out.past_key_values, out.logits[:, -1].expand(chunk, -1)
            cache.batch_repeat_interleave(chunk)
            drawn = []
            for t in range(max_tokens):
                probs = torch.softmax(logits[:, vocab].double(), -1)
                drawn.append(vocab[torch.multinomial(probs, 1, generator=g)[:, 0]])
                if t + 1 < max_tokens:
                    out = model(input_ids=drawn[-1][:, None], cache=cache, use_cache=True,
                                position_ids=torch.full((chunk, 1), ids.shape[1] + t))
                    cache, logits = out.past_key_values, out.logits[:, -1]
        for row in torch.stack(drawn, 1).tolist():
            text = tokenizer.decode(row[:row.index(eos) + 1] if eos in row else row, skip_special_tokens=True)
            rewards.append(answer_reward(text, problem.answer, problem.answer_format))
    return torch.tensor(rewards, dtype=torch.float64)


def test_exact_J_matches_monte_carlo_and_a_wrong_enumeration_does_not(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    space = answer_space(tokenizer, 3)
    problem = PROBLEMS[0]
    pi = sequence_logprobs(conditionals(model, prompt_ids(tokenizer, problem), space), space).exp()
    r = answer_rewards(space, problem)
    J = float((pi * r).sum())
    mc = monte_carlo_rewards(model, tokenizer, problem, space.vocab_ids, 3, n=1000, seed=0)
    se = float(mc.std() / math.sqrt(len(mc)))
    # The same sum without the one-digit answers ("d" + EOS), renormalised: what a wrong enumeration gives.
    kept = space.mask.sum(1) != 2
    J_wrong = float((pi * r)[kept].sum() / pi[kept].sum())
    print(f"{problem.question} exact J = {J:.4f}; Monte Carlo {float(mc.mean()):.4f} ± {se:.4f} (1000 draws); "
          f"enumeration without the one-digit answers: {J_wrong:.4f}")
    assert abs(J - float(mc.mean())) < 4 * se
    assert abs(J_wrong - float(mc.mean())) > 4 * se


def test_the_trained_policy_scores_what_the_table_holds(model_and_tokenizer):
    """log π of a sampled batch from RestrictedPolicy (full forward, the loop's path) equals the
    table's (KV-cached) log α right after the copy; the task's rewards equal the reward table's."""
    model, tokenizer = model_and_tokenizer
    space = answer_space(tokenizer, 3)
    policy = RestrictedPolicy(model, space)
    sampler = RestrictedSampler(policy, tokenizer)
    prompts = [build_prompt(p, tokenizer) for p in PROBLEMS]
    rollout = sampler.sample(prompts, 8, torch.Generator().manual_seed(0))
    with torch.no_grad():
        logp = policy.logprobs(rollout, slice(None))
    gap = float((logp - rollout.logp_alpha)[rollout.mask].abs().max())
    print(f"max |log π (policy forward) − log α (table)| = {gap:.1e}")
    assert gap < 1e-10
    _, index = sampler.last_draw
    table = torch.stack([answer_rewards(space, p) for p in PROBLEMS]).gather(1, index)
    texts = [[rollout.extra["texts"][p * 8 + g] for g in range(8)] for p in range(len(PROBLEMS))]
    scored = torch.tensor([[answer_reward(t, p.answer) for t in row] for row, p in zip(texts, PROBLEMS)])
    assert torch.equal(table, scored.double())
    bad = copy.copy(rollout)
    bad.completions = rollout.completions.clone()
    bad.completions[0, 0] = tokenizer.convert_tokens_to_ids("The")
    with pytest.raises(ValueError, match="outside V′"):
        policy.logprobs(bad, slice(0, 1))


def test_bound_holds_at_every_step_and_a_lag_moves_pi_k_away_from_alpha(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    config = GRPOConfig(G=8, v=2, lr=1e-5, seed=3)  # a seed whose first group is not all-wrong (skipped)
    exact = ExactLM(copy.deepcopy(model), tokenizer, PROBLEMS[:1], config, max_tokens=2)
    steps = [exact.step() for _ in range(3)]
    for s, record in zip(steps, exact.loop.history):
        print(f"k={s.k} lag={s.lag} skipped={record.skipped} J {s.J_k[0]:.4f} → {s.J_next[0]:.4f} "
              f"bound {s.bound[0]:.4f} TV(π_k, α) {s.tv_k[0]:.4f} TV(π_k+1, α) {s.tv_next[0]:.4f}")
        assert (s.improvement >= s.bound - 1e-12).all()
        assert (s.tv_k == 0).all() if s.lag == 0 else (s.tv_k > 1e-3).all()
    assert [s.lag for s in steps] == [0, 1, 0] and not exact.loop.history[0].skipped
    assert steps[1].J_k[0] == steps[0].J_next[0] and steps[1].tv_k[0] == steps[0].tv_next[0]  # π_1 seen from α = π_0
    drift = steps[1].ratios["drift/batch"]
    assert drift["seq_half_abs_dev"] > 0 and steps[0].ratios["drift/batch"]["seq_max_abs_log"] == 0
    for s in steps:  # Theorem 1's ratio is the whole-sequence one: E_α[π/α] = 1 and ½ E_α|π/α − 1| = TV
        for which, tv in (("drift", s.tv_k), ("update", s.tv_next)):
            summary = s.ratios[f"{which}/exact"]
            assert summary["seq_mean"] == pytest.approx(1, abs=1e-12)
            assert summary["seq_half_abs_dev"] == pytest.approx(float(tv.mean()), abs=1e-12)
    assert steps[1].ratios["drift/exact"]["token_half_abs_dev"] < steps[1].tv_k[0]  # token ratios do not see all of it
    for s, record in zip(steps, exact.loop.history):  # the loop's logged estimate, from its own forward pass
        assert record.tv_estimate == pytest.approx(s.ratios["drift/batch"]["seq_half_abs_dev"], abs=1e-9)
