"""The sync audit (grpo_lab.sync_audit) and the staleness/mismatch split (grpo_lab.objective.offpolicy_split):
the rule on hand-made scores, the split against a hand computation on the bandit, and both in GRPOLoop with
HFSampler on a tiny random Llama, where a sync that does nothing is caught at the first sync after π_θ moved."""

import math

import pytest
import torch
from tiny_lm import EvenTokenTask, tiny_model, word_tokenizer

from grpo_lab import GRPOConfig, GRPOLoop, sync_audit
from grpo_lab.exact.bandit import BanditProblem, LaggedTabularSampler, bandit_config, build_bandit_loop
from grpo_lab.lm.checkpoint import load_checkpoint, save_checkpoint
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.sampling import HFSampler
from grpo_lab.objective import offpolicy_split
from grpo_lab.sync_audit import AUDIT_TOLERANCE, PROBE_CONTEXT, SyncAudit, SyncError, probe_of, probe_span


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer()


# ----------------------------------------------------------------------------- the rule

def test_a_sync_that_follows_passes_and_one_that_does_not_raises():
    audit = SyncAudit.for_dtype(torch.float32)
    p0 = torch.tensor([-1.0, -2.0, -0.5, -3.0])
    audit.check(p0, p0 + 0.01, step=0)                      # the reference: α = π_θ up to a mismatch
    p1 = p0 + torch.tensor([0.2, -0.1, 0.05, -0.3])
    audit.check(p1, p1 - 0.02, step=1)                      # α followed π_θ: passes, becomes the reference
    assert audit.reference[2] == 1
    assert audit.mismatch == pytest.approx(0.02)            # M: the largest mismatch seen
    audit.check(p1 + 0.1, p1 - 0.02, step=2)                # moved 0.1 ≤ τ + 6·M: not judged, whatever α did
    assert audit.reference[2] == 1
    with pytest.raises(SyncError, match=r"step 3 did not take.*since step 1.*sleep mode.*sync_audit=False"):
        audit.check(p1 + 0.2, p1 - 0.02, step=3)            # α left where it was


def test_below_the_tolerance_nothing_is_judged_until_the_moves_add_up():
    audit = SyncAudit(tolerance=0.1)
    p, s = torch.zeros(4), torch.zeros(4)
    audit.check(p, s, step=0)
    for step in (1, 2):                                     # π_θ moves 0.04 a sync, α never: not judged yet
        audit.check(p + 0.04 * step, s, step=step)
        assert audit.reference[2] == 0
    with pytest.raises(SyncError, match="since step 0"):
        audit.check(p + 0.12, s, step=3)                    # 0.12 > τ since the reference


@pytest.mark.parametrize("engine", ["noisy", "rounding"])
def test_an_engine_mismatch_alone_never_fires(engine, monkeypatch):
    """α = π_θ + a mismatch as large as π_θ's move per sync: drawn afresh at every sync, or π_θ's scores rounded
    to a grid (a bfloat16 engine fed float32 weights: small moves vanish, then jump). 300 good syncs: never
    fired, yet judged many times; without the 6·M margin the rounding engine's syncs fire."""
    def run(margin: float) -> tuple[int, int]:
        monkeypatch.setattr(sync_audit, "MISMATCH_MARGIN", margin)
        g = torch.Generator().manual_seed(0)
        audit, p = SyncAudit.for_dtype(torch.float32), -torch.rand(8, generator=g)
        trend = torch.randn(8, generator=g).sign()  # π_θ learns: its scores drift one way, with noise
        fired, judged = 0, 0
        for step in range(300):
            s = p + 0.08 * torch.randn(8, generator=g) if engine == "noisy" else torch.round(p / 0.2) * 0.2
            try:
                before = audit.reference
                audit.check(p, s, step=step)
                judged += audit.reference is not before and step > 0
            except SyncError:
                fired += 1
                audit.reference = (p.double(), s.double(), step)
            p = p + 0.05 * trend + 0.03 * torch.randn(8, generator=g)
        return fired, judged

    fired, judged = run(sync_audit.MISMATCH_MARGIN)
    assert fired == 0 and judged >= 10
    assert (run(0.0)[0] > 0) == (engine == "rounding")  # independent noise only adds to α's move; rounding not


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="tolerance"):
        SyncAudit(tolerance=0.0)
    with pytest.raises(ValueError, match="int64"):
        SyncAudit.for_dtype(torch.int64)
    audit = SyncAudit.for_dtype(torch.float64)
    with pytest.raises(ValueError, match="one length"):
        audit.check(torch.zeros(3), torch.zeros(4), step=0)
    audit.check(torch.zeros(2), torch.tensor([0.0, -math.inf]), step=0)
    assert audit.reference is None  # not finite: neither judged nor kept (the loss reports a non-finite log π_θ)
    assert AUDIT_TOLERANCE[torch.float32] < AUDIT_TOLERANCE[torch.bfloat16]


def test_probe_span_takes_the_first_tokens_row_by_row():
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    rows, keep = probe_span(mask, tokens=3)
    assert rows == slice(0, 2) and keep.tolist() == [[True, True], [True, False]]
    rows, keep = probe_span(mask, tokens=5)
    assert rows == slice(0, 3) and keep.tolist() == [[True, True], [True, False], [True, True]]
    rows, keep = probe_span(mask, tokens=100)
    assert rows == slice(0, 4) and torch.equal(keep, mask)
    with pytest.raises(ValueError, match="no completion token"):
        probe_span(torch.zeros(2, 3, dtype=torch.bool))


def test_the_probe_of_a_language_models_batch_keeps_a_short_context(tokenizer):
    """The probe's tokens, after the last PROBE_CONTEXT tokens of their prompts: π_θ scores them there as the
    sampler does (α = π_θ right after the sync), per row as in the batch."""
    policy = LMPolicy(tiny_model(), 0.9)
    sampler = HFSampler(policy, tokenizer, 8)
    rollout = sampler.sample(["w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11", "w5"], 4, torch.Generator().manual_seed(0))
    probe = probe_of(rollout)
    n = probe.completions.shape[0]
    assert int(probe.mask.sum()) == 8 and probe.extra["prompt_ids"].shape == (n, PROBE_CONTEXT)
    assert len(probe.extra["texts"]) == n and probe.prompts == rollout.prompts[:1 + (n - 1) // 4]
    assert torch.equal(probe.completions[probe.mask], rollout.completions[:n, :probe.mask.shape[1]][probe.mask])
    with torch.no_grad():
        logp = policy.logprobs(probe, slice(None))[probe.mask]
        assert torch.equal(logp, sampler.score(probe, slice(None))[probe.mask])
        whole = policy.logprobs(rollout, slice(0, n))[:, :probe.mask.shape[1]][probe.mask]
    assert float((logp - whole).abs().max()) > 1e-3  # another context, other log-probs: only both sides must agree


# ----------------------------------------------------------------------------- the split by hand

class NoisyEngine(LaggedTabularSampler):
    """A bandit sampler whose engine is off by a fixed perturbation of α's logits (its numerics): it samples
    from softmax(logits + δ) and reports that log α, while π_sync is the exact table."""

    def __init__(self, runs: int, contexts: int, arms: int) -> None:
        super().__init__(runs, contexts, arms)
        self.delta = 0.3 * torch.randn(runs, contexts, arms, generator=torch.Generator().manual_seed(5),
                                       dtype=torch.float64)

    def draw(self, prompts, group_size, generator):
        self.logits += self.delta
        try:
            return super().draw(prompts, group_size, generator)
        finally:
            self.logits -= self.delta


def test_split_equals_a_hand_computation_on_the_bandit():
    problem = BanditProblem.random(contexts=4, arms=3, seed=0)
    loop = build_bandit_loop(problem, bandit_config(v=3, steps=5, offpolicy_split=True), runs=2)
    loop.sampler = engine = NoisyEngine(2, problem.contexts, problem.arms)
    seen, sample = [], engine.sample

    def remember(prompts, group_size, generator):
        rollout = sample(prompts, group_size, generator)
        seen.append((rollout, loop.policy.logits.detach().clone(), engine.logits.clone()))
        return rollout

    engine.sample = remember
    for record in loop.run():
        rollout, theta_k, alpha = seen[-1]
        run, context, arms = rollout.extra["run"], rollout.extra["context"], rollout.completions
        logp_k = torch.log_softmax(theta_k[run, context], -1).gather(1, arms)
        logp_sync = torch.log_softmax(alpha[run, context], -1).gather(1, arms)
        staleness = float((logp_k - logp_sync).abs().mean())
        mismatch = float((logp_sync - rollout.logp_alpha).abs().mean())
        assert record.staleness_abs == pytest.approx(staleness, abs=1e-12)
        assert record.mismatch_abs == pytest.approx(mismatch, abs=1e-12) and mismatch > 0.05
        assert record.staleness_share == pytest.approx(staleness / (staleness + mismatch), abs=1e-12)
        assert record.staleness_abs == 0 or record.lag > 0     # π_k = π_sync exactly at lag 0
    assert [r.lag for r in loop.history] == [0, 1, 2, 0, 1]
    assert any(r.staleness_abs > 0.01 for r in loop.history)  # contexts trained since the sync were drawn


def test_split_of_no_token_and_of_equal_policies():
    zeros, mask = torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bool)
    assert offpolicy_split(zeros, zeros, zeros, mask) == {"staleness_abs": 0.0, "mismatch_abs": 0.0,
                                                           "staleness_share": 0.0}
    with pytest.raises(ValueError, match="shape"):
        offpolicy_split(zeros, torch.zeros(2, 2), zeros, mask)


# ----------------------------------------------------------------------------- in the loop, HFSampler

def lm_loop(tokenizer, **changes) -> GRPOLoop:
    config = GRPOConfig(**{**dict(G=4, prompts_per_step=2, max_completion_length=8, lr=1e-2, steps=4, seed=0),
                           **changes})
    policy = LMPolicy(tiny_model(), config.temperature)
    return GRPOLoop(policy, HFSampler(policy, tokenizer, config.max_completion_length), EvenTokenTask(), config)


@pytest.mark.parametrize("v", [1, 2])
def test_a_sync_that_does_nothing_is_caught_at_the_first_sync_after_the_weights_changed(tokenizer, v):
    loop = lm_loop(tokenizer, v=v)
    loop.sampler.sync = lambda policy: 0
    with pytest.raises(SyncError, match=rf"step {v} did not take"):
        list(loop.run())
    assert loop.k == v and [r.synced for r in loop.history][0] and not any(r.skipped for r in loop.history)
    assert loop.schedule.last_sync == 0  # the failed sync was not committed


def test_normal_runs_pass_the_audit_and_log_the_split(tokenizer):
    loop = lm_loop(tokenizer, v=2, offpolicy_split=True)
    records = list(loop.run())
    assert [r.synced for r in records] == [True, False, True, False]
    assert [r.audit_seconds > 0 for r in records] == [True, False, True, False]  # step 0: the reference
    assert loop.audit.reference[2] == 2  # the sync of step 2 was judged and passed
    for r in records:
        if r.lag == 0:  # π_sync = π_k exactly; the decoder's cached forward differs from the whole one by rounding
            assert r.staleness_abs == 0 and r.mismatch_abs < 1e-4 and r.staleness_share == 0
        else:
            assert r.staleness_abs > 1e-3 and r.staleness_share > 0.9
        assert r.staleness_abs <= r.log_ratio_k_abs + r.mismatch_abs + 1e-3  # roughly the parts of log r′


def test_audit_off_lets_a_do_nothing_sync_through(tokenizer):
    loop = lm_loop(tokenizer, v=1, steps=3, sync_audit=False)
    loop.sampler.sync = lambda policy: 0
    records = list(loop.run())
    assert loop.audit is None and all(r.audit_seconds == 0 for r in records)
    assert records[-1].log_ratio_k_abs > 1e-3  # α stayed at π_0: the lag nobody chose


def test_a_sampler_that_cannot_score_is_run_without_the_audit_and_said_once(tokenizer):
    class Plain:
        def __init__(self, inner):
            self.inner = inner

        def sample(self, prompts, group_size, generator):
            return self.inner.sample(prompts, group_size, generator)

        def sync(self, policy):
            return self.inner.sync(policy)

        def state_dict(self):
            return self.inner.state_dict()

        def load_state_dict(self, state):
            return self.inner.load_state_dict(state)

    config = GRPOConfig(G=4, prompts_per_step=2, max_completion_length=8, steps=2)
    policy = LMPolicy(tiny_model(), config.temperature)
    sampler = Plain(HFSampler(policy, tokenizer, 8))
    with pytest.warns(UserWarning, match="Plain has no score") as warned:
        loop = GRPOLoop(policy, sampler, EvenTokenTask(), config)
    assert len(warned) == 1 and loop.audit is None
    assert len(list(loop.run())) == 2
    with pytest.raises(ValueError, match="offpolicy_split = True needs log π_sync, but Plain"):
        GRPOLoop(policy, sampler, EvenTokenTask(), config.replace(offpolicy_split=True, sync_audit=False))


def test_a_resume_takes_a_new_reference(tokenizer, tmp_path):
    loop = lm_loop(tokenizer, v=2)
    list(loop.run(3))
    save_checkpoint(loop, tmp_path / "ckpt.pt")
    resumed = load_checkpoint(lm_loop(tokenizer, v=2), tmp_path / "ckpt.pt")
    assert resumed.audit.reference is None and resumed._probe is None
    record = resumed.step()                       # step 3, lag 1 (α as restored): no probe before a sync
    assert record.audit_seconds == 0 and resumed._probe is None
    record = resumed.step()                       # step 4 syncs: the probe and reference come from its batch
    assert record.audit_seconds > 0 and resumed.audit.reference[2] == 4
    resumed.step()
    resumed.sampler.sync = lambda policy: 0
    with pytest.raises(SyncError, match="step 6 did not take"):
        resumed.step()


@pytest.mark.parametrize("field", ["sync_audit", "offpolicy_split"])
def test_the_knobs_take_booleans_only(field):
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match=rf"{field} must be true or false"):
            GRPOConfig(**{field: bad})


def test_split_summary_table_and_figure_of_a_results_file(tmp_path):
    """Notebook 03's reading of experiments/offpolicy_split.py's file: means by lag, one row and two traces per run."""
    import json

    from grpo_lab.scale.throughput import load_split, split_summary, split_table
    from grpo_lab.viz.throughput import split_figure

    records = [{"step": k, "lag": k % 2, "staleness_abs": 0.1 * (k % 2), "mismatch_abs": 0.01 * (k + 1),
                "staleness_share": 0.9 * (k % 2)} for k in range(4)]
    summary = split_summary(records)
    assert summary == pytest.approx({"mismatch_abs": 0.025, "staleness_abs_lag0": 0.0, "staleness_abs_lagged": 0.1,
                                     "staleness_share_lagged": 0.9})
    assert split_summary(records[:1])["staleness_abs_lagged"] is None
    with pytest.raises(ValueError, match="empty"):
        split_summary([])
    path = tmp_path / "split.json"
    with pytest.raises(ValueError, match="experiments/offpolicy_split.py"):
        load_split(path)
    run = {"name": "HF float32, v=2", "sampler": "hf", "engine_dtype": "float32", "v": 2, "records": records}
    path.write_text(json.dumps({"runs": [run]}))
    data = load_split(path)
    assert split_table(data) == [{"run": "HF float32, v=2", "engine dtype": "float32", "v": 2, **summary}]
    traces = split_figure(data).data
    assert [t.name for t in traces] == ["HF float32, v=2: staleness", "HF float32, v=2: mismatch"]
    assert list(traces[0].y) == [None, 0.1, None, 0.1]  # a part equal to 0 is not drawn on the log axis


def test_the_trl_route_refuses_the_split(tmp_path):
    from grpo_lab.lm.train_config import TrainConfig
    from grpo_lab.scale.launch import trl_args

    with pytest.raises(ValueError, match="offpolicy_split = True is not available on the TRL route: .*full unsharded"):
        trl_args(TrainConfig(offpolicy_split=True, output_dir=str(tmp_path)), {}, num_processes=1)
