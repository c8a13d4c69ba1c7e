"""Time to accuracy (issue 25 §5): the clock that takes evaluation off, the crossing time, the TRL config
that matches the recipe, and every arm run end to end on a tiny model (TRL's GRPOTrainer included)."""

import json

import pytest
import torch
from reliability_runs import tiny_model, tokenizer

from grpo_lab.lm.evaluate import EvalResult
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.study import time_to_accuracy as tta
from grpo_lab.study.time_to_accuracy import (
    TrainingClock,
    rebuild_summary,
    run_units,
    seconds_to_reach,
    summary_table,
    target_findings,
    trl_config,
)
from grpo_lab.viz.throughput import time_to_accuracy_figure


def test_clock_takes_evaluation_off_and_scores_each_time_once(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(tta.time, "perf_counter", lambda: now[0])
    clock = TrainingClock(10.0, fractions=(0.2, 0.5, 1.0))

    def score():
        now[0] += 50.0                                # an evaluation: 50 s that the clock must not count
        return EvalResult(n=1, correct=[1, 0], correct_lenient=[1, 0], examples=[], truncated=[0, 0])

    clock.start()
    now[0] += 1.0
    assert not clock.step_done(score) and clock.points == []
    now[0] += 1.5                                     # 2.5 s: the 2 s point is due
    assert not clock.step_done(score)
    assert [(p["at"], p["seconds"], p["steps"]) for p in clock.points] == [(2.0, 2.5, 2)]
    assert clock.seconds == 2.5                       # the 50 s evaluation is off the clock
    now[0] += 8.0                                     # 10.5 s: the 5 s and 10 s points pass in one step
    assert clock.step_done(score)
    assert [(p["at"], p["seconds"]) for p in clock.points] == [(2.0, 2.5), (5.0, 10.5), (10.0, 10.5)]
    assert clock.points[-1]["pass_at_1"] == 0.5 and clock.points[-1]["completions"] == 2
    with pytest.raises(ValueError, match="fractions must rise"):
        TrainingClock(10.0, fractions=(0.5, 0.2, 1.0))
    with pytest.raises(ValueError, match="budget_seconds"):
        TrainingClock(0.0)
    with pytest.raises(RuntimeError, match="not started"):
        _ = TrainingClock(1.0).seconds


def test_seconds_to_reach_interpolates_the_first_crossing():
    curve = [(0, 0.0), (100, 0.1), (200, 0.3), (300, 0.2), (400, 0.5)]
    assert seconds_to_reach(curve, 0.2) == pytest.approx(150.0)     # between 0.1 at 100 s and 0.3 at 200 s
    assert seconds_to_reach(curve, 0.1) == 100.0
    assert seconds_to_reach(curve, 0.0) == 0.0
    assert seconds_to_reach(curve, 0.6) is None
    assert seconds_to_reach([(0, 0.4), (50, 0.4)], 0.4) == 0.0


def test_trl_config_sets_the_recipe_where_trl_defaults_differ(tmp_path):
    config = TrainConfig(G=8, prompts_per_step=4, lr=2e-5, beta=0.0, temperature=0.7, max_completion_length=8,
                         loss_type="grpo", seed=3)
    args = trl_config(config, str(tmp_path))
    assert (args.num_generations, args.per_device_train_batch_size, args.gradient_accumulation_steps) == (8, 32, 1)
    assert (args.learning_rate, args.lr_scheduler_type, args.beta, args.temperature, args.loss_type) == \
           (2e-5, "constant", 0.0, 0.7, "grpo")
    assert (args.max_completion_length, args.epsilon, args.max_grad_norm, args.num_iterations) == (8, 0.2, 1.0, 1)
    assert args.disable_dropout and not args.gradient_checkpointing and args.seed == 3   # recompute off


def test_skip_empty_batch_leaves_a_zero_gradient_step_undone_and_a_real_one_alone():
    """AdamW after one real step: a zero-gradient step would still move θ by momentum; skipped, it does not."""
    weights = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([weights], lr=0.1)
    weights.grad = torch.tensor([1.0, -2.0, 0.5])
    optimizer.step()
    after_first, state = weights.detach().clone(), {k: v.clone() for k, v in optimizer.state[weights].items()}
    skipper = tta.skip_empty_batch()
    weights.grad = torch.zeros(3)
    skipper.on_pre_optimizer_step(None, None, None, optimizer=optimizer)
    optimizer.step()
    assert skipper.skipped == 1 and weights.grad is None and torch.equal(weights.detach(), after_first)
    assert all(torch.equal(v, state[k]) for k, v in optimizer.state[weights].items())
    weights.grad = torch.zeros(3)                                          # the stock rule: momentum moves θ
    optimizer.step()
    assert not torch.allclose(weights.detach(), after_first)
    weights.grad = torch.tensor([0.0, 1.0, 0.0])                           # a real gradient is kept
    skipper.on_pre_optimizer_step(None, None, None, optimizer=optimizer)
    assert skipper.skipped == 1 and torch.equal(weights.grad, torch.tensor([0.0, 1.0, 0.0]))


def test_every_arm_runs_unit_by_unit(tmp_path):
    base = TrainConfig(G=4, prompts_per_step=2, lr=1e-3, max_completion_length=4, train_problems=20,
                       eval_problems=3, eval_samples=2, temperature=1.0)
    model = tiny_model()
    untouched = {k: v.clone() for k, v in model.state_dict().items()}
    logs = []
    kwargs = dict(seeds=1, model=model, tokenizer=tokenizer(), log=logs.append)
    summary = run_units(base, 1.5, tmp_path, units=2, **kwargs)
    assert sorted(p.name for p in (tmp_path / "units").iterdir()) == \
           ["grpo_lab_v1_s0.json", "grpo_lab_v8_s0.json", "untrained.json"]
    assert "seconds_to_trl_final" not in summary                         # no TRL run yet
    summary = run_units(base, 1.5, tmp_path, **kwargs)                     # the next sitting: TRL's unit
    assert all(torch.equal(v, untouched[k]) for k, v in model.state_dict().items())
    assert [(r["arm"], r["seed"]) for r in summary["runs"]] == [("grpo_lab_v1", 0), ("grpo_lab_v8", 0), ("trl", 0)]
    for run in summary["runs"]:
        times = [t for t, _ in run["curve"]]
        assert run["curve"][0] == [0.0, summary["untrained_pass_at_1"]] and len(times) == 1 + len(tta.EVAL_FRACTIONS)
        assert times == sorted(times) and times[-1] >= 1.5 and run["steps"] >= 1
    unit = json.loads((tmp_path / "units" / "trl_s0.json").read_text())
    assert [p["at"] for p in unit["points"]] == [f * 1.5 for f in tta.EVAL_FRACTIONS]
    assert all(p["completions"] == 6 for p in unit["points"]) and 0 <= unit["optimizer_steps"] <= unit["steps"]
    stock = run_units(base, 1.5, tmp_path / "stock", arms=["trl_every_batch"], **kwargs)["runs"][0]
    assert stock["arm"] == "trl_every_batch" and stock["optimizer_steps"] == stock["steps"]   # steps on every batch
    assert summary["trl_final_pass_at_1"] == summary["runs"][2]["curve"][-1][1]
    assert summary["seconds_to_trl_final"]["trl"] <= summary["runs"][2]["curve"][-1][0]
    assert summary["budget_seconds"] == 1.5 and summary["scoring"] == "strict"
    assert json.loads((tmp_path / "summary.json").read_text()) == json.loads(json.dumps(rebuild_summary(tmp_path)))
    rows = summary_table(summary)
    assert [r["arm"] for r in rows] == list(tta.ARMS) and all(r["95 % CI"] == "-" for r in rows)   # one seed each
    trl_seconds = summary["seconds_to_trl_final"]["trl"]                  # 0 where TRL ended at the untrained score
    assert rows[2]["× TRL's"] == ("1.00" if trl_seconds > 0 else "-")
    fig = time_to_accuracy_figure(summary)
    assert [t.name for t in fig.data if t.showlegend is not False] == list(tta.ARMS)
    assert not [t for t in fig.data if t.fill == "toself"]                 # no band from one seed
    logs.clear()
    run_units(base, 1.5, tmp_path, **kwargs)
    assert not any(line.startswith("unit ") for line in logs)             # nothing left to run
    with pytest.raises(ValueError, match="use another out_dir"):
        run_units(base, 3.0, tmp_path, **kwargs)


def test_target_findings_follow_the_rule():
    def summary(seeds, ratios, by_seed, trl_final=0.2):
        runs = [{"arm": arm, "seed": s} for arm, n in seeds.items() for s in range(n)]
        return {"runs": runs, "ratio_to_trl": ratios, "seconds_to_trl_final_by_seed": by_seed,
                "trl_final_pass_at_1": trl_final, "untrained_pass_at_1": 0.035}

    three = {"grpo_lab_v1": 3, "grpo_lab_v8": 3, "trl": 3}
    by_seed = {"grpo_lab_v1": {"0": 100.0, "1": 200.0, "2": 150.0}, "grpo_lab_v8": {"0": None, "1": 500.0, "2": 550.0}}
    findings = target_findings(summary(three, {"grpo_lab_v1": 0.25, "grpo_lab_v8": 0.9, "trl": 1.0}, by_seed))
    assert findings["grpo_lab_v1"].endswith("met") and "0.25× TRL's time" in findings["grpo_lab_v1"]
    assert findings["grpo_lab_v8"].endswith("missed") and "never, 500 s, 550 s" in findings["grpo_lab_v8"]
    findings = target_findings(summary({**three, "trl": 1}, {"grpo_lab_v1": 0.25, "grpo_lab_v8": None}, by_seed))
    assert all("not resolved (3 seeds" in f for f in findings.values())       # one TRL seed decides nothing
    assert "does not reach it" in findings["grpo_lab_v8"]
    collapsed = target_findings(summary(three, {"grpo_lab_v1": None, "grpo_lab_v8": None}, by_seed, trl_final=0.0))
    assert all(f.startswith("not resolved: TRL ended at 0.000, at or below the untrained 0.035")
               for f in collapsed.values())
    assert target_findings(summary({"grpo_lab_v1": 1}, {}, {})) == {"grpo_lab_v1": "not run yet",
                                                                     "grpo_lab_v8": "not run yet"}
