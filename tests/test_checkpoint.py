"""Checkpoints: atomic write, exact resume, safe loading."""

import pickle

import pytest
import torch

from grpo_lab.exact.bandit import BanditProblem, bandit_config, build_bandit_loop
from grpo_lab.lm.checkpoint import load_checkpoint, save_checkpoint


def make_loop():
    cfg = bandit_config(v=3, i=2, beta=0.05, ref_period=5, steps=14, optimizer="adamw", lr=0.05)
    return build_bandit_loop(BanditProblem.random(contexts=5, arms=4, seed=1), cfg, runs=3)


def test_resume_from_file_equals_uninterrupted_run(tmp_path):
    full = make_loop()
    list(full.run())
    part = make_loop()
    list(part.run(6))
    save_checkpoint(part, tmp_path / "ckpt.pt")
    resumed = load_checkpoint(make_loop(), tmp_path / "ckpt.pt")
    assert resumed.k == 6
    list(resumed.run())
    timing = dict.fromkeys(("sample_seconds", "train_seconds", "sync_seconds", "audit_seconds", "probe_audit"), 0)
    # (the probe takes a new reference after a resume: its verdict at the first sync may differ)
    assert [r.to_dict() | timing for r in resumed.history] == [r.to_dict() | timing for r in full.history]
    for a, b in [(resumed.policy.logits, full.policy.logits), (resumed.sampler.logits, full.sampler.logits),
                 (resumed.reference.logits, full.reference.logits)]:
        assert torch.equal(a, b)


def test_failed_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    loop = make_loop()
    list(loop.run(2))
    target = save_checkpoint(loop, tmp_path / "ckpt.pt")
    before = target.read_bytes()
    list(loop.run(2))

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(loop, target)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]   # no temp file left behind
    assert load_checkpoint(make_loop(), target).k == 2


def test_save_removes_the_temp_file_of_a_killed_write(tmp_path):
    loop = make_loop()
    killed = tmp_path / ".ckpt.pt.abc123.tmp"   # what a writer killed mid-write leaves (the except never ran)
    killed.write_bytes(b"half a checkpoint")
    save_checkpoint(loop, tmp_path / "ckpt.pt")
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_load_refuses_arbitrary_pickles(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "evil.pt"
    path.write_bytes(pickle.dumps({"k": Evil()}))
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(make_loop(), path)


def test_load_missing_path_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        load_checkpoint(make_loop(), tmp_path / "nope.pt")


def test_a_checkpoint_from_before_the_correction_knob_resumes(tmp_path):
    """Saved without is_correction / is_cap and without the ratio diagnostics in its history: it loads with
    the defaults (the behaviour it was trained with), and a run with another correction is refused."""
    part = make_loop()
    list(part.run(3))
    state = part.state_dict()
    for name in ("is_correction", "is_cap"):
        del state["config"][name]
    for record in state["history"]:
        for name in ("ess_token", "ess_seq", "log_ratio_k_p50", "log_ratio_k_p99", "log_ratio_k_max", "cap_frac"):
            del record[name]
    resumed = make_loop()
    resumed.load_state_dict(state)
    assert resumed.k == 3 and resumed.history[0].ess_token == 1.0 and resumed.history[0].cap_frac == 0.0
    list(resumed.run(1))
    other = build_bandit_loop(BanditProblem.random(contexts=5, arms=4, seed=1),
                              make_loop().config.replace(is_correction="none"), runs=3)
    with pytest.raises(ValueError, match="is_correction"):
        other.load_state_dict(state)


def test_a_moved_run_resumes_and_another_config_does_not(tmp_path):
    """Where and how often a run saves may change on resume (a moved run folder); what a step computes may not."""
    from reliability_runs import make_loop as make_run
    from reliability_runs import train_config

    config = train_config("bandit", tmp_path / "run")
    part = make_run("bandit", config)
    list(part.run(4))
    save_checkpoint(part, tmp_path / "ckpt.pt")
    moved = make_run("bandit", config.replace(output_dir=str(tmp_path / "moved"), checkpoint_every=7))
    assert load_checkpoint(moved, tmp_path / "ckpt.pt").k == 4
    other = make_run("bandit", config.replace(eps_low=0.3))
    with pytest.raises(ValueError, match=r"different config \(saved, current\): \{'eps_low': \(0.2, 0.3\)\}"):
        load_checkpoint(other, tmp_path / "ckpt.pt")
