"""Algorithm 1 on one page (grpo_lab/algorithm1.py) is the step GRPOLoop runs.

Two identical set-ups are run side by side, one by ``GRPOLoop.step`` and one by ``off_policy_step``, over steps
that cross a sync with v > 1 (so α ≠ π_k at lag > 0) with i = 1 and i > 1 and β > 0: each step must give the same
loss, the same gradient at every optimiser pass (as the optimiser receives it), the same parameters, α and random
state afterwards, and the same decision to skip. The bandit and a tiny random LM run by default; SmolLM2 restricted
to digits (grpo_lab/exact/digits_lm.py) is ``slow``. A page with one term changed (no zero-variance mask, ε_std
outside the root, r′ = 1) must fail the comparison.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from grpo_lab import GRPOConfig, GRPOLoop, Rollout, StepRecord, algorithm1
from grpo_lab.advantages import whiten
from grpo_lab.algorithm1 import off_policy_step
from grpo_lab.exact.bandit import BanditProblem, build_bandit_loop
from grpo_lab.objective import clipped_surrogate

KNOBS = [dict(v=3, i=1, beta=0.1), dict(v=2, i=2, beta=0.1), dict(v=2, i=2, beta=0.0)]
IDS = ["v 3, i 1, beta 0.1", "v 2, i 2, beta 0.1", "v 2, i 2, beta 0"]


def record_gradients(loop: GRPOLoop) -> list[list[torch.Tensor]]:
    """The gradients the optimiser of ``loop`` steps on, one list per optimiser step (after the norm clip)."""
    seen: list[list[torch.Tensor]] = []
    params = [p for group in loop.optimizer.param_groups for p in group["params"]]
    loop.optimizer.register_step_pre_hook(lambda *_: seen.append([p.grad.detach().clone() for p in params]))
    return seen


def compare(loop: GRPOLoop, twin: GRPOLoop, steps: int) -> list[StepRecord]:
    """Run ``steps`` steps of ``loop`` by ``GRPOLoop.step`` and of ``twin``'s parts by ``off_policy_step``;
    assert that every step agrees. Returns the loop's records."""
    grads, twin_grads = record_gradients(loop), record_gradients(twin)
    for k in range(steps):
        record = loop.step()
        losses = off_policy_step(k, twin.policy, twin.sampler, twin.task, twin.reference, twin.optimizer,
                                 twin.generator, twin.config)
        assert record.skipped == (losses == []), k
        if losses:
            assert record.loss == pytest.approx(sum(losses) / len(losses), rel=1e-6, abs=1e-9), k
        assert len(grads) == len(twin_grads), k
        for passes, twin_passes in zip(grads, twin_grads, strict=True):
            torch.testing.assert_close(passes, twin_passes, msg=lambda m, k=k: f"step {k}, gradient: {m}")
        grads.clear()
        twin_grads.clear()
        torch.testing.assert_close(twin.policy.state_dict(), loop.policy.state_dict(),
                                   msg=lambda m, k=k: f"step {k}, θ: {m}")
        torch.testing.assert_close(twin.sampler.state_dict(), loop.sampler.state_dict(),
                                   msg=lambda m, k=k: f"step {k}, α: {m}")
        assert torch.equal(twin.generator.get_state(), loop.generator.get_state()), k
    return loop.history


def bandit_pair(**knobs: object) -> tuple[GRPOLoop, GRPOLoop]:
    """Two identical one-run bandit loops at the paper's defaults (AdamW, gradient norm clipped at 1)."""
    config = GRPOConfig(G=8, prompts_per_step=4, lr=0.3, steps=6, **knobs)
    problem = BanditProblem.random(contexts=8, arms=4, seed=1)
    return build_bandit_loop(problem, config, runs=1), build_bandit_loop(problem, config, runs=1)


def assert_off_policy_terms_acted(records: list[StepRecord], config: GRPOConfig, clip: bool = True) -> None:
    """The steps compared exercised what the page computes: a trained step at lag > 0 with r′ ≠ 1 (beyond the
    rounding between α's and π_θ's forwards, 5e-7 on the digits LM), the KL when β > 0 and, with ``clip``,
    the clip (a pass with π_θ ≠ π_k: i > 1)."""
    trained = [r for r in records if not r.skipped]
    assert any(r.lag > 0 and r.log_ratio_k_abs > 1e-5 for r in trained), [(r.lag, r.log_ratio_k_abs) for r in trained]
    if config.beta > 0:
        assert all(r.kl > 0 for r in trained if r.lag > 0)
    if clip:
        assert any(r.clip_low_frac + r.clip_high_frac > 0 for r in trained)


@pytest.mark.parametrize("knobs", KNOBS, ids=IDS)
def test_the_page_is_the_loops_step_on_the_bandit(knobs, one_thread):
    loop, twin = bandit_pair(**knobs)
    records = compare(loop, twin, loop.config.steps)
    assert_off_policy_terms_acted(records, loop.config, clip=loop.config.i > 1)
    assert any(0 < r.masked_frac < 1 for r in records if not r.skipped)  # the mask dropped groups of trained steps


MUTANTS = {
    "no zero-variance mask": ("zero_variance_mask", lambda rewards: torch.ones(len(rewards), dtype=torch.bool)),
    "ε_std outside the root": ("whiten", functools.partial(whiten, eps_placement="added_to_std")),
    "r′ = 1 (α ignored)": ("clipped_surrogate", lambda logp, logp_k, logp_alpha, A, eps:
                           clipped_surrogate(logp, logp_k, logp_k, A, eps)),
}


@pytest.mark.parametrize("name", MUTANTS)
def test_a_page_with_one_term_changed_fails(name, monkeypatch, one_thread):
    attribute, mutant = MUTANTS[name]
    monkeypatch.setattr(algorithm1, attribute, mutant)
    loop, twin = bandit_pair(v=3, i=1, beta=0.1)
    with pytest.raises(AssertionError):
        compare(loop, twin, loop.config.steps)


def test_the_page_refuses_knobs_it_does_not_write():
    loop, twin = bandit_pair(v=2, loss_type="dapo")
    with pytest.raises(ValueError, match="loss_type"):
        off_policy_step(0, twin.policy, twin.sampler, twin.task, twin.reference, twin.optimizer, twin.generator,
                        twin.config)
    loop, twin = bandit_pair(beta=0.1)
    with pytest.raises(ValueError, match="beta = 0.1 needs a reference"):
        off_policy_step(0, twin.policy, twin.sampler, twin.task, None, twin.optimizer, twin.generator, twin.config)


def test_the_page_is_the_loops_step_on_a_tiny_language_model(one_thread):
    """Completions of several tokens and of different lengths (half the vocabulary ends one): the token weights
    1/(L_b·B) and the padding."""
    from tiny_lm import EvenTokenTask, tiny_model, word_tokenizer

    from grpo_lab.lm.policy import LMPolicy
    from grpo_lab.lm.sampling import HFSampler

    config = GRPOConfig(G=4, prompts_per_step=2, max_completion_length=5, lr=3e-2, steps=4, v=2, i=2, beta=0.1)
    lengths: set[int] = set()

    def build() -> GRPOLoop:
        policy = LMPolicy(tiny_model(), config.temperature)
        sampler = HFSampler(policy, word_tokenizer(), config.max_completion_length, eos_token_ids=range(1, 64))
        sample = sampler.sample

        def sample_and_measure(*args: object) -> Rollout:
            rollout = sample(*args)
            lengths.update(rollout.mask.sum(1).tolist())
            return rollout

        sampler.sample = sample_and_measure
        return GRPOLoop(policy, sampler, EvenTokenTask(), config)

    records = compare(build(), build(), config.steps)
    assert_off_policy_terms_acted(records, config, clip=False)
    assert len(lengths) > 1, lengths


@pytest.mark.slow
def test_the_page_is_the_loops_step_on_the_digits_lm(one_thread):
    """SmolLM2-135M restricted to digits + EOS (as grpo_lab.exact.digits_lm.ExactLM builds its loop), two
    prompts, answers of at most 2 tokens, the strict answer reward, the default learning rate. Seed 5 draws, at
    steps 0 and 1, one group with reward variance and one without: a trained step, then one at lag 1 whose
    masked group carries only the KL's gradient; step 2 syncs."""
    from grpo_lab.exact.digits_lm import RestrictedPolicy, RestrictedSampler, answer_space
    from grpo_lab.lm.models import load_policy
    from grpo_lab.lm.tasks import load_problems
    from grpo_lab.lm.text_task import TextTask

    problems = [load_problems("add1", 7, seed=0)[i] for i in (6, 0)]  # "4 + 0", "0 + 4": J ≈ 0.1
    config = GRPOConfig(G=4, prompts_per_step=len(problems), max_completion_length=2, steps=3, seed=5, v=2, i=2,
                        beta=0.04)
    model, tokenizer = load_policy()
    model.requires_grad_(True)
    space = answer_space(tokenizer, config.max_completion_length)

    def build(model: torch.nn.Module) -> GRPOLoop:
        policy = RestrictedPolicy(model, space, config.temperature)
        return GRPOLoop(policy, RestrictedSampler(policy, tokenizer), TextTask(problems, tokenizer), config)

    records = compare(build(copy.deepcopy(model)), build(model), config.steps)
    print([(r.lag, r.skipped, f"|log r′| {r.log_ratio_k_abs:.1e}", f"KL {r.kl:.1e}") for r in records])
    assert_off_policy_terms_acted(records, config, clip=False)
    assert [r.masked_frac for r in records[:2]] == [0.5, 0.5]
