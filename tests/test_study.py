"""The CPU study: confidence intervals, the verdict rule (TOST / worse / not resolved), bounded intervals,
power, the balanced unit order, a tiny study run unit by unit end to end, and reading a study folder as it
stands (fake units from :func:`write_fake_units`). Its figures and notebook 02's live panel: tests/test_study_viz.py."""

import json
import math
import time

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from grpo_lab.lm.models import bundled_model_dir
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.lm.training import hold_run_dir
from grpo_lab.study.cpu_study import METRIC_FIELDS, pilot_report, run_units, unit_order
from grpo_lab.study.design import (
    ARM_BY_NAME,
    ARMS,
    COMPARISONS,
    PRIMARY,
    SECONDARY,
    drift_by_lag,
    format_rows,
    load_study,
)
from grpo_lab.study.results import (
    bounded_mean_ci,
    mean_ci,
    paired_test,
    power,
    seeds_for_power,
    study_tests,
    t_975,
    t_cdf,
    t_quantile,
    wilson_interval,
)


def test_mean_ci_is_students_t():
    mean, half = mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.303 / math.sqrt(3), rel=1e-4)     # s = 1, t_{0.975, 2} = 4.303
    mean, half = mean_ci(np.array([[0.0, 2.0], [1.0, 1.0]]), axis=1)
    assert mean.tolist() == [1.0, 1.0] and half[1] == 0.0 and half[0] == pytest.approx(12.706 * 1.0, rel=1e-4)
    assert math.isnan(float(mean_ci([0.5])[1]))
    # NaN = a seed without that point: the statistics of the others
    mean, half = mean_ci(np.array([[1.0, 2.0, 3.0], [1.0, math.nan, 3.0], [math.nan, 4.0, math.nan]]), axis=1)
    assert mean.tolist() == [2.0, 2.0, 4.0] and math.isnan(half[2])
    assert half[0] == pytest.approx(4.303 / math.sqrt(3), rel=1e-4)
    assert half[1] == pytest.approx(12.706 * math.sqrt(2) / math.sqrt(2), rel=1e-4)
    with pytest.raises(ValueError, match="not NaN"):
        mean_ci([math.nan, math.nan])
    assert t_975(100) == pytest.approx(1.984, abs=1e-3)
    with pytest.raises(ValueError, match="df must be >= 1"):
        t_975(0)


SETTINGS = {"task": "add12", "model": "m", "scoring": "strict", "steps": 4, "prompts_per_step": 2, "G": 4,
            "max_completion_length": 8, "temperature": 0.7, "lr": 2e-5, "eval_questions": 10, "eval_disjoint": True,
            "eval_samples": 2, "eval_seed": 1234}
BEFORE = 0.2


def eval_entry(pass_at_1, completions=20):
    correct = round(pass_at_1 * completions)
    return {"pass_at_1": pass_at_1, "pass_at_1_ci": list(wilson_interval(correct, completions)),
            "pass_at_1_lenient": pass_at_1, "truncated_frac": 0.1, "accuracy_finished": pass_at_1,
            "correct": correct, "completions": completions, "examples": [["Calculate 1 + 2.", "3", "3", 1.0]]}


def write_fake_units(folder, after, steps=4, untrained=True, mid=True):
    """A study folder as :func:`grpo_lab.study.cpu_study.run_units` writes it: ``after`` maps arm →
    {seed: Pass@1 at the last step}; every run is scored at step 0 (the untrained unit), at steps // 2
    (unless ``mid`` is False for that run: ``mid`` may be a set of (arm, seed) scored there) and at the
    end. Per step: lag k % v, drift ``log_ratio_k_abs`` = 0.01 · lag · (seed + 1), reward rising to the
    final Pass@1. Returns :func:`load_study` of it."""
    units = folder / "units"
    units.mkdir(parents=True, exist_ok=True)
    if untrained:
        (units / "untrained_e1234.json").write_text(json.dumps({"study": SETTINGS, "eval": eval_entry(BEFORE)}))
    for name, by_seed in after.items():
        arm = ARM_BY_NAME[name]
        n_steps = steps * arm.step_factor
        for seed, value in by_seed.items():
            scored = {str(n_steps): value}
            if mid is True or (mid and (name, seed) in mid):
                scored[str(n_steps // 2)] = (BEFORE + value) / 2
            metrics = [{f: 0.0 for f in METRIC_FIELDS} | {
                "step": k, "lag": k % arm.v, "synced": k % arm.v == 0, "skipped": k == 1,
                "reward_mean": value * k / n_steps, "log_ratio_k_abs": 0.01 * (k % arm.v) * (seed + 1),
                "sample_seconds": 1.0, "train_seconds": 1.5, "sync_seconds": 0.0} for k in range(n_steps)]
            run = {**arm.row(), "seed": seed, "steps": n_steps, "lr": SETTINGS["lr"], "pass_at_1_before": BEFORE,
                   "pass_at_1_after": value, "pass_at_1_after_ci": eval_entry(value)["pass_at_1_ci"],
                   "pass_at_1_lenient_after": value, "truncated_frac_after": 0.1, "accuracy_finished_after": value,
                   "pass_at_1_curve": {"0": BEFORE, **scored}, "wall_seconds": 2.5 * n_steps,
                   "unit_seconds": 3.0 * n_steps, "train_passes": arm.i * (n_steps - 1), "skipped_steps": 1}
            unit = {"study": SETTINGS, "run": run, "eval": {s: eval_entry(p) for s, p in scored.items()},
                    "metrics": metrics}
            (units / f"{name}_s{seed}.json").write_text(json.dumps(unit))
    return load_study(folder)


def test_study_reads_units_as_they_stand(tmp_path):
    study = write_fake_units(tmp_path / "s", {"v32_ratio": {0: 0.5, 1: 0.6}, "v1": {0: 0.30, 1: 0.50, 2: 0.40},
                                              "v1_i4": {0: 0.7}}, mid={("v1", 1), ("v1", 2)})
    assert study.arms == ["v1", "v32_ratio", "v1_i4"] and study.settings == SETTINGS       # the study's order
    assert study.untrained["pass_at_1"] == BEFORE and [study.n(a) for a in ("v1", "v8_none")] == [3, 0]
    assert study.after("v1") == {0: 0.30, 1: 0.50, 2: 0.40}
    steps, passes = study.pass_curve("v1")                 # seed 0 was not scored part-way: NaN there
    assert steps.tolist() == [0, 2, 4] and passes[0].tolist() == [BEFORE] * 3
    assert math.isnan(passes[1][0]) and passes[1][1:].tolist() == pytest.approx([0.35, 0.30])
    assert study.metric("v1", "reward_mean").shape == (4, 3) and study.metric("v1", "skipped")[1].tolist() == [1, 1, 1]
    lags, drift = study.drift_by_lag("v32_ratio")         # 4 steps reach lags 0…3; step 1 (lag 1) skipped
    assert lags.tolist() == [0, 2, 3] and drift[0].tolist() == [0.0, 0.0]
    assert drift[2].tolist() == pytest.approx([0.03, 0.06])
    with pytest.raises(ValueError, match="arm must be one with a finished unit"):
        study.runs("v8_none")
    with pytest.raises(ValueError, match="key must be a per-step field"):
        study.metric("v1", "reward")
    row = study.row("v1")
    mean, low, high = bounded_mean_ci([0.30, 0.50, 0.40])
    assert (row["n"], row["pass_at_1_after"], row["low"], row["high"]) == (3, pytest.approx(0.4), low, high)
    assert row["interval"] == "t over seeds" and 0.0 < row["low"] < 0.4 < row["high"] < 1.0
    one = study.row("v1_i4")                                 # one seed: that run's Wilson interval, said so
    assert one["interval"].startswith("Wilson") and [one["low"], one["high"]] == list(wilson_interval(14, 20))
    text = format_rows([row, one])
    assert "v1_i4" in text and "* one seed" in text and text.count("\n") == 3

    empty = load_study(tmp_path / "nothing")                 # no folder yet: a study without arms
    assert empty.arms == [] and empty.tests() == [] and empty.untrained is None and empty.settings == {}


def test_study_tests_follow_the_rule_with_any_seeds(tmp_path):
    study = write_fake_units(tmp_path / "s", {"v1": {0: 0.4, 1: 0.5, 2: 0.6}, "v8_ratio": {0: 0.41, 1: 0.50, 2: 0.60},
                                              "v32_none": {0: 0.1, 1: 0.2, 2: 0.25}, "v8_none": {0: 0.4},
                                              "mask_b04": {0: 0.5}})
    tests = {t.comparison: t for t in study.tests()}
    assert list(tests) == ["v8_ratio - v1", "v8_none - v1", "v32_none - v1"]   # nomask_b04 missing: no test
    assert tests["v8_none - v1"].n == 1 and tests["v8_none - v1"].verdict == "not resolved"
    assert tests["v8_none - v1"].ci(0.90) is None
    assert tests["v8_none - v1"].describe().endswith("n = 1, mean +0.000, one seed, no interval -> not resolved")
    assert "90 % CI [" in tests["v8_ratio - v1"].describe() and tests["v8_ratio - v1"].describe().endswith("equivalent")
    apart = paired_test({0: 0.1}, {1: 0.2}, "a", "b")
    assert apart.describe() == "a - b: no seed that both arms finished: not resolved"
    assert tests["v32_none - v1"].verdict == "worse" and tests["v32_none - v1"].ci(0.95)[1] < 0
    low, high = tests["v8_ratio - v1"].ci(0.90)
    assert tests["v8_ratio - v1"].verdict == "equivalent" and -0.03 < low < high < 0.03
    rows = [unit["run"] for arm in study.arms for unit in study.units[arm].values()]
    from_summary = study_tests(rows, COMPARISONS)            # what summary.json holds: the same tests
    assert [(r["comparison"], r["finding"]) for r in from_summary[::2]] == [(c, t.verdict) for c, t in tests.items()]


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


def test_t_distribution_in_closed_form():
    assert t_cdf(0.0, 3) == 0.5 and t_cdf(1.0, 1) == pytest.approx(0.75)            # Cauchy: 1/2 + atan(1)/π
    assert t_cdf(-2.0, 4) == pytest.approx(1 - t_cdf(2.0, 4))
    assert t_quantile(0.975, 2) == pytest.approx(4.3027, abs=1e-4)                   # printed tables
    assert t_quantile(0.95, 4) == pytest.approx(2.1318, abs=1e-4)
    assert t_quantile(0.975, 29) == pytest.approx(2.0452, abs=1e-4)
    with pytest.raises(ValueError, match="p must lie strictly between 0 and 1"):
        t_quantile(1.0, 3)


@pytest.mark.parametrize("diffs, finding, equivalence, difference", [
    ((0.01, -0.01, 0.005, -0.005, 0.0), "equivalent", "equivalent", "not resolved"),
    ((-0.10, -0.12, -0.08, -0.11, -0.09), "worse", "not resolved", "worse"),
    ((0.10, 0.12, 0.08, 0.11, 0.09), "better", "not resolved", "better"),
    ((0.10, -0.10, 0.05, -0.08, 0.02), "not resolved", "not resolved", "not resolved"),
    ((-0.010, -0.011, -0.009, -0.010, -0.010), "equivalent", "equivalent", "worse"),   # real, inside the margin
    ((-0.05,), "not resolved", "not resolved", "not resolved"),                      # one seed: no interval
])
def test_verdict_rule_on_constructed_differences(diffs, finding, equivalence, difference):
    reference = {s: 0.5 for s in range(len(diffs))}
    arm = {s: 0.5 + d for s, d in enumerate(diffs)} | {99: 0.9}                      # seed 99 has no partner
    test = paired_test(arm, reference, "v8_none", "v1")
    assert test.n == len(diffs) and test.verdict == finding and test.comparison == "v8_none - v1"
    eq, diff = test.entries()
    assert (eq["kind"], eq["verdict"], eq["margin"], diff["kind"], diff["verdict"]) == \
           ("equivalence", equivalence, 0.03, "difference", difference)
    assert eq["finding"] == diff["finding"] == finding and eq["estimate"] == pytest.approx(np.mean(diffs))
    if len(diffs) >= 2:                      # the 90 % / 95 % t intervals by hand: t_{0.95, 4}, t_{0.975, 4}
        mean, se = float(np.mean(diffs)), float(np.std(diffs, ddof=1)) / len(diffs) ** 0.5
        assert eq["ci"] == pytest.approx([mean - 2.1318 * se, mean + 2.1318 * se], abs=1e-5)
        assert diff["ci"] == pytest.approx([mean - 2.7764 * se, mean + 2.7764 * se], abs=1e-5)
    else:
        assert eq["ci"] is None and diff["ci"] is None


def test_study_tests_pair_by_seed():
    runs = [{"name": "v1", "seed": s, "pass_at_1_after": 0.4 + 0.01 * s} for s in range(3)]
    runs += [{"name": "v8_ratio", "seed": s, "pass_at_1_after": 0.2 + 0.01 * s} for s in (0, 1)]
    tests = study_tests(runs, [("v8_ratio", "v1"), ("v32_ratio", "v1")])
    assert [t["kind"] for t in tests] == ["equivalence", "difference"]                # v32_ratio has no run: no row
    assert tests[0]["seeds"] == [0, 1] and tests[0]["diffs"] == pytest.approx([-0.2, -0.2])
    with pytest.raises(ValueError, match="margin must be > 0"):
        paired_test({0: 0.1}, {0: 0.1}, "a", "b", margin=0.0)


def test_wilson_and_bounded_intervals_stay_in_the_unit_interval():
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)     # the textbook value
    low, high = wilson_interval(0, 10)
    assert low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(1.96 ** 2 / (10 + 1.96 ** 2), abs=1e-4)
    for k in range(0, 21):
        low, high = wilson_interval(k, 20)
        assert 0.0 <= low <= k / 20 <= high <= 1.0
    mean, low, high = bounded_mean_ci([0.9, 1.0, 0.97])                              # t interval alone passes 1
    assert mean_ci([0.9, 1.0, 0.97])[1] + mean > 1.0 and high == 1.0 and 0.0 <= low < mean
    with pytest.raises(ValueError, match="successes must be an integer in"):
        wilson_interval(11, 10)
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        wilson_interval(0, 0)


def test_power_of_the_rule():
    # issue 24: a paired SD of 0.096 with 3 seeds gives 80 % power only for an effect of about 0.31
    assert power(0.096, 3, 0.31) == pytest.approx(0.8, abs=0.03)
    assert power(0.096, 5, 0.0) == pytest.approx(0.05, abs=0.01)                    # the 95 % CI's false alarms
    assert power(0.02, 5, 0.03, "equivalence") <= 0.05 + 0.01                        # TOST's, at the margin
    assert power(0.02, 10, 0.0, "equivalence") > power(0.02, 5, 0.0, "equivalence") > 0.5
    n = seeds_for_power(0.096, 0.05)
    assert 29 <= n <= 34                                                             # normal approximation: 28.9 + t
    assert power(0.096, n, 0.05) >= 0.8 > power(0.096, n - 1, 0.05)
    assert seeds_for_power(0.5, 0.01, n_max=5) is None
    with pytest.raises(ValueError, match="n must be an integer >= 2"):
        power(0.1, 1)
    with pytest.raises(ValueError, match="kind must be one of"):
        power(0.1, 3, kind="superiority")


def test_unit_order_balances_seeds_primary_first():
    order = unit_order(ARMS, seeds=5, secondary_seeds=3)
    assert len(order) == 5 * len(PRIMARY) + 3 * len(SECONDARY)
    assert [a.name for a, _ in order[:len(ARMS)]] == [a.name for a in PRIMARY + SECONDARY]
    assert all(seed == 0 for _, seed in order[:len(ARMS)])
    for k, (_, seed) in enumerate(order):       # an arm's seed n comes after seed n − 1 of every arm that has one
        assert all((other, seed - 1) in order[:k] for other in ARMS if 1 <= seed <= (5 if other.primary else 3))
    assert order[-1] == (PRIMARY[-1], 4)
    assert unit_order([ARM_BY_NAME["v1_i4"]], seeds=5, secondary_seeds=0) == []


def test_drift_by_lag_pools_trained_steps():
    unit = {"metrics": [{"lag": 0, "skipped": False, "log_ratio_k_abs": 0.0},
                        {"lag": 1, "skipped": False, "log_ratio_k_abs": 0.2},
                        {"lag": 1, "skipped": True, "log_ratio_k_abs": 9.0},
                        {"lag": 8, "skipped": False, "log_ratio_k_abs": 0.5}]}
    other = {"metrics": [{"lag": 1, "skipped": False, "log_ratio_k_abs": 0.4}]}
    assert drift_by_lag([unit, other]) == {1: pytest.approx(0.3), 8: 0.5, 31: None}


def test_tiny_study_unit_by_unit(tmp_path, tokenizer):
    base = TrainConfig(G=4, prompts_per_step=2, steps=4, lr=1e-3, max_completion_length=4, train_problems=20,
                       eval_problems=3, eval_samples=2, checkpoint_every=2, temperature=1.0)
    arms = [ARM_BY_NAME["v1"], ARM_BY_NAME["v32_ratio"]]
    model = tiny_model(tokenizer)
    untouched = {k: v.clone() for k, v in model.state_dict().items()}
    logs = []
    out, runs = tmp_path / "study", tmp_path / "runs"
    kwargs = dict(arms=arms, seeds=2, secondary_seeds=0, model=model, tokenizer=tokenizer, log=logs.append)
    summary = run_units(base, out, runs, units=1, **kwargs)
    assert sorted(p.name for p in (out / "units").iterdir()) == ["untrained_e1234.json", "v1_s0.json"]
    assert not (runs / "v1_s0" / "checkpoint.pt").exists()                           # the unit keeps what counts
    assert all(torch.equal(v, untouched[k]) for k, v in model.state_dict().items())   # runs train copies
    assert {"task", "model", "scoring", "steps", "prompts_per_step", "G", "eval_questions", "eval_samples", "runs",
            "tests"} <= set(summary)
    assert [summary[k] for k in ("scoring", "steps", "eval_questions", "eval_samples")] == ["strict", 4, 3, 2]
    run = summary["runs"][0]
    assert {"name", "v", "i", "mask", "beta", "is_correction", "seed", "pass_at_1_before", "pass_at_1_after",
            "pass_at_1_lenient_after", "pass_at_1_curve", "wall_seconds"} <= set(run)
    assert sorted(run["pass_at_1_curve"], key=int) == ["0", "2", "4"]
    assert run["pass_at_1_after"] == run["pass_at_1_curve"]["4"] and run["wall_seconds"] > 0
    assert run["pass_at_1_before"] == run["pass_at_1_curve"]["0"] == summary["untrained"]["pass_at_1"]
    unit = json.loads((out / "units" / "v1_s0.json").read_text())
    assert [m["step"] for m in unit["metrics"]] == [0, 1, 2, 3] and set(METRIC_FIELDS) <= set(unit["metrics"][0])
    assert 0.0 <= unit["eval"]["4"]["pass_at_1_ci"][0] <= run["pass_at_1_after"] <= unit["eval"]["4"]["pass_at_1_ci"][1]
    assert summary["tests"] == []                                                    # one arm so far

    # a later sitting runs the rest in balanced order and skips what is finished
    logs.clear()
    summary = run_units(base, out, runs, **kwargs)
    started = [line.split(":")[0] for line in logs if line.startswith("unit ") and "v = " in line]
    assert started == ["unit v32_ratio_s0", "unit v1_s1", "unit v32_ratio_s1"]
    assert [(r["name"], r["seed"]) for r in summary["runs"]] == [("v1", 0), ("v1", 1), ("v32_ratio", 0),
                                                                 ("v32_ratio", 1)]
    assert [(t["comparison"], t["kind"], t["n"]) for t in summary["tests"]] == \
           [("v32_ratio - v1", "equivalence", 2), ("v32_ratio - v1", "difference", 2)]
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(summary))
    lagged = [json.loads((out / "units" / f"v32_ratio_s{s}.json").read_text()) for s in (0, 1)]
    assert [m["lag"] for m in lagged[0]["metrics"]] == [0, 1, 2, 3] and lagged[0]["run"]["v"] == 32
    report = pilot_report(out)
    assert report["drift_by_lag"] == {str(k): v for k, v in drift_by_lag(lagged).items()}
    assert report["drift_by_lag"]["8"] is None and report["pass_at_1_after"]["v1"].keys() == {"0", "1"}

    logs.clear()
    assert run_units(base, out, runs, **kwargs) == summary and logs == ["no unit to run"]
    with pytest.raises(ValueError, match="use another out_dir"):
        run_units(base.replace(lr=2e-3), out, runs, **kwargs)
    summary = run_units(base, tmp_path / "late", runs, until=0.0, **kwargs)           # past the deadline: nothing
    assert summary == {} and not (tmp_path / "late" / "units").exists()


def test_an_interrupted_unit_resumes_and_counts_every_sitting(tmp_path, tokenizer, monkeypatch):
    import grpo_lab.study.cpu_study as cpu_study

    base = TrainConfig(G=4, prompts_per_step=2, steps=4, lr=1e-3, max_completion_length=4, train_problems=20,
                       eval_problems=3, eval_samples=2, checkpoint_every=2, temperature=1.0)
    out, runs = tmp_path / "study", tmp_path / "runs"
    kwargs = dict(arms=[ARM_BY_NAME["v1"]], seeds=1, secondary_seeds=0, model=tiny_model(tokenizer),
                  tokenizer=tokenizer, log=lambda line: None)
    evaluate, calls = cpu_study.evaluate, []

    def stopped_at_mid_run(*args, **kw):          # Ctrl-C during the unit's evaluation at step 2
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return evaluate(*args, **kw)

    monkeypatch.setattr(cpu_study, "evaluate", stopped_at_mid_run)
    with pytest.raises(KeyboardInterrupt):
        run_units(base, out, runs, **kwargs)
    elapsed = runs / "v1_s0" / "elapsed_seconds"
    assert float(elapsed.read_text()) > 0 and (runs / "v1_s0" / "checkpoint.pt").exists()
    assert not (out / "units" / "v1_s0.json").exists()
    elapsed.write_text("1000.0")                        # as if the first sitting had taken 1000 s
    start = time.perf_counter()
    summary = run_units(base, out, runs, **kwargs)                                   # the next sitting finishes it
    second_sitting = time.perf_counter() - start
    unit = json.loads((out / "units" / "v1_s0.json").read_text())
    assert [m["step"] for m in unit["metrics"]] == [0, 1, 2, 3] and len(calls) == 4  # the untrained model scored once
    assert 1000.0 < summary["runs"][0]["unit_seconds"] < 1000.0 + second_sitting
    assert not (runs / "v1_s0" / "elapsed_seconds").exists() and not (runs / "v1_s0" / "checkpoint.pt").exists()


@pytest.mark.parametrize("look_first", [True, False], ids=["look-first", "race"])
def test_two_study_processes_share_the_units(tmp_path, tokenizer, monkeypatch, look_first):
    """The other process holds v1_s0 from the start and finishes v1_s2 while this one trains v1_s1.
    ``race``: it takes v1_s0's lock between this process's look and its training."""
    import grpo_lab.study.cpu_study as cpu_study

    if not look_first:
        monkeypatch.setattr(cpu_study, "check_run_dir_free", lambda out: None)
    base = TrainConfig(G=4, prompts_per_step=2, steps=2, lr=1e-3, max_completion_length=4, train_problems=20,
                       eval_problems=3, eval_samples=2, checkpoint_every=2, temperature=1.0)
    out, runs = tmp_path / "study", tmp_path / "runs"
    logs = []

    def log(line: str) -> None:
        logs.append(line)
        if line.startswith("unit v1_s1: Pass@1"):              # meanwhile another process finished v1_s2
            unit = json.loads((out / "units" / "v1_s1.json").read_text())
            unit["run"]["seed"] = 2
            (out / "units" / "v1_s2.json").write_text(json.dumps(unit))

    kwargs = dict(arms=[ARM_BY_NAME["v1"]], seeds=3, secondary_seeds=0, model=tiny_model(tokenizer),
                  tokenizer=tokenizer, log=log)
    (runs / "v1_s0").mkdir(parents=True)
    with hold_run_dir(runs / "v1_s0"):                          # and another one is training v1_s0
        summary = run_units(base, out, runs, **kwargs)
    started = [line.split(":")[0] for line in logs if " v = " in line]
    assert started == (["unit v1_s1"] if look_first else ["unit v1_s0", "unit v1_s1"])   # look first: not built
    assert any(line.startswith("unit v1_s0: skipped") and "in use" in line for line in logs)
    assert sorted(p.name for p in (out / "units").iterdir()) == ["untrained_e1234.json", "v1_s1.json", "v1_s2.json"]
    assert [r["seed"] for r in summary["runs"]] == [1, 2]
    assert sorted(p.name for p in (runs / "v1_s0").iterdir()) == ["run.lock"]   # its folder left as it was
    logs.clear()
    run_units(base, out, runs, **kwargs)                        # the lock is free: this process runs v1_s0
    assert [line.split(":")[0] for line in logs if " v = " in line] == ["unit v1_s0"]


def test_wilson_bounds_are_exact_at_none_and_all():
    """0 of n: the lower bound is 0 itself (a float difference of equal terms can leave 2e-19 > 0)."""
    assert wilson_interval(0, 1000)[0] == 0.0 and wilson_interval(1000, 1000)[1] == 1.0
    low, high = wilson_interval(3, 1000)
    assert 0.0 < low < 0.003 < high < 1.0


def test_a_comparison_reports_its_power():
    test = paired_test({0: 0.20, 1: 0.10, 2: 0.15}, {0: 0.18, 1: 0.12, 2: 0.10}, "a", "b")
    report = test.power()
    assert report["paired_sd"] == pytest.approx(np.std([0.02, -0.02, 0.05], ddof=1))
    assert report["power_difference"] == power(report["paired_sd"], 3, 0.05)
    assert report["power_equivalence"] == power(report["paired_sd"], 3, 0.0, "equivalence")
    needed = report["seeds_for_80pct_difference"]
    assert power(report["paired_sd"], needed, 0.05) >= 0.8 > power(report["paired_sd"], needed - 1, 0.05)
    assert "paired SD 0.035 over n = 3" in test.describe_power()
    assert all(e["power"] == report for e in test.entries())
    assert paired_test({0: 0.2}, {0: 0.1}, "a", "b").power() is None                 # one seed: no SD
    assert paired_test({0: 0.5, 1: 0.75}, {0: 0.25, 1: 0.5}, "a", "b").power() is None  # equal differences
