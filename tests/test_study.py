"""The CPU study: confidence intervals, paired differences, and a tiny resumable study end to end."""

import json
import math

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from grpo_lab.lm.models import bundled_model_dir
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.study.cpu_study import ARMS, METRIC_FIELDS, run_study
from grpo_lab.study.results import format_table, load_study, mean_ci, paired, t_975, table


def test_mean_ci_is_students_t():
    mean, half = mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.303 / math.sqrt(3))     # s = 1, t_{0.975, 2} = 4.303
    mean, half = mean_ci(np.array([[0.0, 2.0], [1.0, 1.0]]), axis=1)
    assert mean.tolist() == [1.0, 1.0] and half[1] == 0.0 and half[0] == pytest.approx(12.706 * 1.0)
    assert math.isnan(float(mean_ci([0.5])[1]))
    # NaN = a seed without that point: the statistics of the others
    mean, half = mean_ci(np.array([[1.0, 2.0, 3.0], [1.0, math.nan, 3.0], [math.nan, 4.0, math.nan]]), axis=1)
    assert mean.tolist() == [2.0, 2.0, 4.0] and math.isnan(half[2])
    assert half[0] == pytest.approx(4.303 / math.sqrt(3))
    assert half[1] == pytest.approx(12.706 * math.sqrt(2) / math.sqrt(2))
    with pytest.raises(ValueError, match="not NaN"):
        mean_ci([math.nan, math.nan])
    assert t_975(100) == 1.96
    with pytest.raises(ValueError, match="df must be >= 1"):
        t_975(0)


def fake_study(tmp_path, after):
    """summary.json + metrics for arms → {seed: Pass@1 after}, 4 steps each."""
    runs, metrics = [], tmp_path / "metrics"
    metrics.mkdir()
    for arm, by_seed in after.items():
        for seed, value in by_seed.items():
            runs.append(dict(name=arm, v=1, i=1, mask=False, seed=seed, pass_at_1_before=0.2, pass_at_1_after=value,
                             pass_at_1_curve={"2": (0.2 + value) / 2, "4": value}, wall_seconds=10.0 + seed,
                             train_passes=4))
            rows = [{f: 0 for f in METRIC_FIELDS} | {"step": k, "reward_mean": value * k / 3, "sample_seconds": 1.0,
                                                       "train_seconds": 1.5, "sync_seconds": 0.0} for k in range(4)]
            (metrics / f"{arm}_s{seed}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "summary.json").write_text(json.dumps(dict(task="add1", model="m", steps=4, before={"pass_at_1": 0.2},
                                                           runs=runs)))
    return load_study(tmp_path)


def test_paired_differences_and_table(tmp_path):
    study = fake_study(tmp_path, {"onpolicy": {0: 0.30, 1: 0.50, 2: 0.40},
                                  "masked": {0: 0.35, 1: 0.56, 2: 0.43, 3: 0.9}})
    d = paired(study, "masked", "onpolicy")
    assert d.n == 3 and d.diffs == pytest.approx((0.05, 0.06, 0.03))          # seed 3 has no partner
    assert d.mean == pytest.approx(0.04667, abs=1e-4)
    assert d.half == pytest.approx(4.303 * 0.015275 / math.sqrt(3), rel=1e-3)
    assert d.low > 0                                                           # the seeds' shared spread cancels
    rows = {r["arm"]: r for r in table(study, {"onpolicy": 0.45})}
    assert rows["onpolicy"]["after"] == pytest.approx(0.4) and rows["onpolicy"]["gain"] == pytest.approx(0.2)
    assert rows["masked"]["seeds"] == 4 and rows["onpolicy"]["paper"] == 0.45 and rows["masked"]["paper"] is None
    assert rows["onpolicy"]["gain_per_minute"] == pytest.approx(0.2 / (11.0 / 60))
    assert "onpolicy" in format_table(table(study))
    steps, passes = study.pass_curve("onpolicy")
    assert steps.tolist() == [0, 2, 4] and passes[0].tolist() == [0.2] * 3 and passes[2].tolist() == [0.3, 0.5, 0.4]
    summary = json.loads((tmp_path / "summary.json").read_text())
    del summary["runs"][0]["pass_at_1_curve"]["2"]                             # a run scored at the end only
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    steps, passes = load_study(tmp_path).pass_curve(summary["runs"][0]["name"])
    assert steps.tolist() == [0, 2, 4] and math.isnan(passes[1][0]) and not np.isnan(passes[1][1:]).any()
    assert study.seconds_matrix("masked")[:, 0].tolist() == [2.5, 5.0, 7.5, 10.0]
    with pytest.raises(ValueError, match="arm must be one of"):
        study.runs("lagged_v8")
    (tmp_path / "apart").mkdir()
    apart = fake_study(tmp_path / "apart", {"a": {0: 0.1}, "b": {1: 0.2}})
    with pytest.raises(ValueError, match="share no finished seed"):
        paired(apart, "a", "b")


@pytest.fixture(scope="module")
def tokenizer():
    tok = AutoTokenizer.from_pretrained(bundled_model_dir())
    tok.padding_side = "left"
    return tok


def tiny_model(tokenizer):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                        tie_word_embeddings=True))


def test_tiny_study_runs_pairs_and_resumes(tmp_path, tokenizer):
    base = TrainConfig(G=4, prompts_per_step=2, steps=4, lr=1e-3, max_completion_length=4, train_problems=20,
                       eval_problems=3, eval_samples=2, checkpoint_every=2, temperature=1.0)
    arms = [a for a in ARMS if a.name in ("onpolicy", "reuse_i4")]
    model = tiny_model(tokenizer)
    untouched = {k: v.clone() for k, v in model.state_dict().items()}
    logs = []
    kwargs = dict(arms=arms, eval_steps=[2], model=model, tokenizer=tokenizer, log=logs.append)
    summary = run_study(base, tmp_path / "study", [0, 1], tmp_path / "runs", **kwargs)
    assert all(torch.equal(v, untouched[k]) for k, v in model.state_dict().items())   # runs train copies
    assert [(r["name"], r["seed"]) for r in summary["runs"]] == [("onpolicy", 0), ("reuse_i4", 0),
                                                                 ("onpolicy", 1), ("reuse_i4", 1)]
    for run in summary["runs"]:
        assert {"name", "v", "i", "mask", "seed", "pass_at_1_before", "pass_at_1_after", "wall_seconds"} <= set(run)
        assert run["pass_at_1_before"] == summary["before"]["pass_at_1"] and run["wall_seconds"] > 0
        assert sorted(run["pass_at_1_curve"]) == ["2", "4"] and 0 <= run["pass_at_1_after"] <= 1
        lines = (tmp_path / "study" / "metrics" / f"{run['name']}_s{run['seed']}.jsonl").read_text().splitlines()
        assert [json.loads(x)["step"] for x in lines] == [0, 1, 2, 3]
    assert (summary["runs"][0]["i"], summary["runs"][1]["i"]) == (1, 4)
    saved = json.loads((tmp_path / "study" / "summary.json").read_text())
    assert saved == json.loads(json.dumps(summary))

    # a second sitting skips what is finished; a run lost from the summary after it trained is re-read
    # from its checkpoint and scores, not retrained
    logs.clear()
    again = run_study(base, tmp_path / "study", [0, 1], tmp_path / "runs", **kwargs)
    assert not [line for line in logs if line.startswith("run ")] and again == saved
    lost = dict(saved, runs=saved["runs"][:-1])
    (tmp_path / "study" / "summary.json").write_text(json.dumps(lost))
    redone = run_study(base, tmp_path / "study", [0, 1], tmp_path / "runs", **kwargs)
    old, new = saved["runs"][-1], redone["runs"][-1]
    assert {k: new[k] for k in ("pass_at_1_after", "pass_at_1_curve", "wall_seconds")} == \
           {k: old[k] for k in ("pass_at_1_after", "pass_at_1_curve", "wall_seconds")}
    with pytest.raises(ValueError, match="use another out_dir"):
        run_study(base.replace(steps=8), tmp_path / "study", [0], tmp_path / "runs", **kwargs)
    with pytest.raises(ValueError, match="eval_steps must lie strictly between"):
        run_study(base, tmp_path / "other", [0], tmp_path / "runs", **{**kwargs, "eval_steps": [4]})
    study = load_study(tmp_path / "study")
    assert study.arms == ["onpolicy", "reuse_i4"] and study.steps_matrix("reuse_i4", "reward_mean").shape == (4, 2)


def test_live_panel_continues_stops_and_restarts_and_group_view(tmp_path, tokenizer):
    from grpo_lab.lm.group_view import group_view, token_ratios
    from grpo_lab.lm.tasks import load_problems
    from grpo_lab.viz.study_panel import LivePanel

    (tmp_path / "study").mkdir()
    study = fake_study(tmp_path / "study", {"masked": {0: 0.3, 1: 0.4}})
    base = TrainConfig(G=4, prompts_per_step=2, v=2, lr=1e-3, max_completion_length=4, temperature=1.0)
    panel = LivePanel(study, base, tiny_model(tokenizer), tokenizer, load_problems("add1", 20, seed=0), steps=3,
                      out_dir=tmp_path / "live", mode="none")
    first = panel.run(steps=2)
    assert first.k == 2 and (tmp_path / "live" / "checkpoint.pt").is_file()
    assert list(panel.figure.data[-1].x) == [0, 1] and panel.progress.value == 2
    assert panel.run() is first and first.k == 3                       # same knobs: the run continues
    panel.knobs["v"].value = 1
    panel._draw = lambda loop, seconds, lag: panel._stop.set()          # Stop pressed during the first step
    second = panel.run()
    assert second is not first and second.k == 1 and second.config.v == 1

    view = group_view(first, seed=3)
    G, T = base.G, base.max_completion_length
    assert len(view.texts) == G and view.ratios.shape[0] == G and view.ratios.shape[1] <= T
    assert view.lag == first.k - first.schedule.last_sync and view.kept == bool(view.rewards.std() > 0)
    assert abs(float(view.advantages.sum())) < 1e-5 and view.tv >= 0
    assert all(len(tokens) == int((row > 0).sum()) for tokens, row in zip(view.tokens, view.ratios, strict=True))
    r = token_ratios(torch.tensor([[0.0, -1.0]]), torch.tensor([[0.0, -2.0]]), torch.tensor([[True, False]]))
    assert r.tolist() == [[1.0, 0.0]]
