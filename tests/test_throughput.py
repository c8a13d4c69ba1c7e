"""Notebook 03's logic (grpo_lab.scale.throughput) on fake step records, the paper-anchored predictions,
the launch recipes (grpo_lab.lm.recipes, grpo_lab.scale.launch: DeepScaleR, 7B colocate) and their loaders on
small local files."""

import json

import numpy as np
import pytest

from grpo_lab.lm.models import bundled_model_dir
from grpo_lab.lm.recipes import CONFIG_DIR, load_config, load_launch_recipe
from grpo_lab.lm.tasks import load_orz
from grpo_lab.lm.text_task import eval_problems
from grpo_lab.loop import StepRecord
from grpo_lab.scale import launch as gl
from grpo_lab.scale import repeats
from grpo_lab.scale import throughput as tp
from grpo_lab.scale.costmodel import StepCostModel, fit_from_records, paper_cost_model
from grpo_lab.viz import throughput as figures

TRUTH = StepCostModel(gen=2.0, train=1.0, sync=0.8)


def fake_run(v, steps, model=TRUTH, noise=0.0, seed=0, warmup_extra=5.0):
    """Records of a fixed-v run whose timings follow ``model`` (plus uniform noise); step 0 is slow."""
    rng = np.random.default_rng(seed)
    records = []
    for k in range(steps):
        synced = k % v == 0
        jitter = 1 + noise * rng.uniform(-1, 1, size=3)
        records.append(StepRecord(
            step=k, lag=k % v, synced=synced, skipped=False, reward_mean=0.5, masked_frac=0.0, loss=0.0,
            clip_low_frac=0.0, clip_high_frac=0.0, ratio_k_mean=1.0, ratio_k_max=1.0,
            log_ratio_k_abs=0.01 * (k % v), tv_estimate=0.0, kl=0.0, grad_norm=1.0, num_tokens=8,
            sync_bytes=100 * synced,
            sample_seconds=model.gen * jitter[0] + (warmup_extra if k == 0 else 0.0),
            train_seconds=model.train * jitter[1], sync_seconds=model.sync * jitter[2] * synced, ref_reset=False))
    return records


def test_fit_on_v1_predicts_v4_exactly_without_noise():
    runs = {"v=1": fake_run(1, 9), "v=4": fake_run(4, 9)}
    fitted = fit_from_records(tp.timed(runs["v=1"]))
    assert (fitted.gen, fitted.train, fitted.sync) == pytest.approx((2.0, 1.0, 0.8))  # step 0's extra left out
    window = tp.timed(runs["v=4"])
    assert [r.step for r in window] == list(range(1, 9)) and tp.effective_v(window) == 4
    assert tp.step_seconds(window) == pytest.approx(TRUTH.step_seconds(4))
    rows = tp.run_table(runs, fitted)
    assert [row["syncs"] for row in rows] == [9, 3]
    assert [row["max lag"] for row in rows] == [0, 3]
    assert rows[1]["mean lag"] == pytest.approx(np.mean([k % 4 for k in range(9)]))
    assert all(row["error"] == pytest.approx(0.0, abs=1e-12) for row in rows)
    assert all(row["source"] == tp.MEASURED for row in rows)


def test_prediction_error_is_the_relative_gap():
    runs = {"v=1": fake_run(1, 9), "v=4": fake_run(4, 9, model=StepCostModel(gen=2.5, train=1.0, sync=0.8))}
    row = tp.run_table(runs, fit_from_records(tp.timed(runs["v=1"])))[1]
    assert row["error"] == pytest.approx((TRUTH.step_seconds(4) - (3.5 + 0.2)) / 3.7)
    noisy = tp.run_table({"v=4": fake_run(4, 9, noise=0.3, seed=1)}, TRUTH)[0]
    assert noisy["error"] != 0 and abs(noisy["error"]) < 0.3


def test_timed_needs_a_sync_after_the_warmup():
    with pytest.raises(ValueError, match="synced step after the 1 warm-up"):
        tp.timed(fake_run(8, 5))
    with pytest.raises(ValueError, match="synced step"):
        tp.timed(fake_run(1, 1))


def test_format_table_aligns_columns():
    text = tp.format_table([{"a": 1.23456, "name": "x"}, {"a": 10.0, "name": "longer"}])
    lines = text.splitlines()
    assert lines[1].split() == ["1.235", "x"] and lines[2].split() == ["10", "longer"]
    assert len({line.index(word) for line, word in zip(lines, ["name", "x", "longer"])}) == 1


def test_paper_model_and_size_sweep():
    paper = paper_cost_model()
    # the paper's rates, 0.02828 and 0.03828 iter/s, give 35.36 s and 26.12 s a step: a sync of (35.36 − 26.12) / 0.9
    assert (paper.gen + paper.train, paper.sync) == (pytest.approx(25.097, abs=1e-3), pytest.approx(10.264, abs=1e-3))
    assert tp.size_model(tp.MODEL_SIZES["7B"]).step_seconds(10) == pytest.approx(paper.step_seconds(10))
    vs = np.arange(1, 33)
    assert np.all(np.diff(paper.speedup(vs)) > 0)
    sizes = tp.size_speedups(10, (0.0, 0.2, 0.5))
    assert np.allclose(sizes[0.0], paper.speedup(10))  # every term ∝ N: the same speed-up for every N
    assert np.all(np.diff(sizes[0.2]) > 0) and np.all(np.diff(sizes[0.5]) > 0)  # a fixed part: grows with N
    seven = list(tp.MODEL_SIZES).index("7B")
    assert sizes[0.2][seven] == pytest.approx(sizes[0.5][seven])  # every assumption meets the paper at 7B
    assert sizes[0.5][0] < sizes[0.2][0] and sizes[0.5][-1] > sizes[0.2][-1]  # a larger fixed share: steeper
    faster = tp.size_model(7.6e9, bandwidth_gb_s=100.0)
    assert faster.sync == pytest.approx(0.152) and faster.speedup(10) < paper.speedup(10)
    with pytest.raises(ValueError, match="params must be"):
        tp.size_model(0.0)
    with pytest.raises(ValueError, match="fixed_share must be"):
        tp.size_model(1e9, fixed_share=1.5)
    with pytest.raises(ValueError, match="v must be an integer"):
        tp.size_speedups(0, (0.0,))


def test_figures_label_measured_and_paper():
    runs = {"v=1": fake_run(1, 9), "v=4": fake_run(4, 9)}
    fitted = fit_from_records(tp.timed(runs["v=1"]))
    bars = figures.step_time_figure(runs, fitted)
    assert [t.type for t in bars.data] == ["bar"] * 3 + ["scatter"]
    assert all(tp.MEASURED in t.name for t in bars.data[:3])
    assert list(bars.data[3].y) == pytest.approx([TRUTH.step_seconds(1), TRUTH.step_seconds(4)])
    curves = figures.speedup_v_figure(fitted, runs)
    names = [t.name for t in curves.data]
    assert sum(tp.PAPER in n for n in names) == 2 and sum(tp.MEASURED in n for n in names) == 2
    assert list(curves.data[-1].x) == [1, 4] and curves.data[-1].y[1] == pytest.approx(TRUTH.speedup(4))
    sizes = figures.speedup_size_figure(10, (0.0, 0.2))
    assert len(sizes.data) == 2 and list(sizes.data[0].text) == list(tp.MODEL_SIZES)


def test_reduced_configs_hold_whole_sync_periods():
    for mode in ("smoke", "reduced"):
        configs = tp.throughput_configs(mode)
        fixed = [c for c in configs.values() if c.sync == "fixed"]
        assert sorted(c.v for c in fixed) == list(tp.FIXED_VS) == [1, 2, 4, 8]
        assert all((c.steps - tp.WARMUP_STEPS) % 8 == 0 for c in configs.values())
        assert {c.sampler for c in configs.values()} == {"hf"}
        assert {c.sampler for c in tp.throughput_configs(mode, "vllm").values()} == {"vllm"}
        adaptive = [c for c in configs.values() if c.sync == "adaptive"]
        assert len(adaptive) == 1 and adaptive[0].sync_threshold == tp.ADAPTIVE_THRESHOLD
    assert tp.throughput_configs("smoke")["v=1"].G < tp.throughput_configs("reduced")["v=1"].G
    with pytest.raises(ValueError, match="mode must be one of"):
        tp.throughput_configs("huge")


def test_step_time_stats_and_fit_recover_the_terms_with_error_bars():
    runs = {f"v={v}": fake_run(v, 17, noise=0.05, seed=v) for v in (1, 2, 4, 8)}
    stats = tp.step_time_stats(runs)
    assert sorted(stats) == [1, 2, 4, 8] and all(err > 0 for _, err in stats.values())
    for v, (mean, err) in stats.items():
        assert abs(mean - TRUTH.step_seconds(v)) < 4 * err + 1e-9  # step 0's extra is left out
    fit = tp.fit_step_times(stats)
    assert fit.gen + fit.train == pytest.approx(TRUTH.gen + TRUTH.train, rel=0.05)
    assert fit.sync == pytest.approx(TRUTH.sync, rel=0.3)
    exact = tp.fit_step_times(tp.step_time_stats({f"v={v}": fake_run(v, 17) for v in (1, 2, 4, 8)}))
    assert (exact.gen, exact.sync) == pytest.approx((TRUTH.gen + TRUTH.train, TRUTH.sync))
    figure = figures.fit_figure(stats, fit, "hf")
    assert list(figure.data[0].x) == [1, 2, 4, 8] and list(figure.data[0].error_y.array) == [
        stats[v][1] for v in (1, 2, 4, 8)]
    assert tp.MEASURED in figure.data[0].name


# ----------------------------------------------------------------------------- recipes and launch

def test_deepscaler_recipes_load_and_differ_only_in_v():
    on = load_config(CONFIG_DIR / "deepscaler_r1distill_1p5b_onpolicy.yaml")
    off = load_config(CONFIG_DIR / "deepscaler_r1distill_1p5b_offpolicy_v10.yaml")
    assert on.model == "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B" and on.task == "deepscaler"
    assert (on.eval_task, on.eval_samples, on.v, on.i, off.v, off.i) == ("aime24", 32, 1, 1, 10, 1)
    changed = {k for k, value in on.to_dict().items() if off.to_dict()[k] != value}
    assert changed == {"v", "output_dir"}
    math500 = load_config(CONFIG_DIR / "deepscaler_r1distill_1p5b_onpolicy.yaml",
                          ["eval_task=math500", "eval_problems=500", "eval_samples=4"])
    assert (math500.eval_task, math500.eval_problems, math500.eval_samples) == ("math500", 500, 4)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_aime24_and_math500_eval_loaders_on_local_files(tmp_path):
    aime = write_jsonl(tmp_path / "aime.jsonl", [{"id": i, "problem": f"Find {i}.", "answer": str(100 + i)}
                                                 for i in range(3)])
    math500 = write_jsonl(tmp_path / "math500.jsonl", [{"problem": "Compute 1/2 + 1/3.", "answer": "\\frac{5}{6}",
                                                        "subject": "Algebra", "level": 1}])
    base = load_config(CONFIG_DIR / "deepscaler_r1distill_1p5b_offpolicy_v10.yaml")
    problems = eval_problems(base.replace(eval_data_files=aime))
    assert [p.answer for p in problems] == ["100", "101", "102"] and problems[0].source.startswith("aime24:")
    assert all(p.answer_format == "boxed" for p in problems)
    assert len(eval_problems(base.replace(eval_data_files=aime, eval_problems=2))) == 2
    (m,) = eval_problems(base.replace(eval_task="math500", eval_data_files=math500))
    assert (m.question, m.answer, m.meta["subject"]) == ("Compute 1/2 + 1/3.", "\\frac{5}{6}", "Algebra")


def test_colocate_recipes_map_to_the_paper_setting():
    for v, name in gl.COLOCATE_RECIPES.items():
        launch_recipe = load_launch_recipe(CONFIG_DIR / f"{name}.yaml")
        config = launch_recipe.config
        assert (config.model, config.v, config.i) == ("Qwen/Qwen2.5-7B", v, 1)
        assert launch_recipe.orz_data_files == "data/orz_math_57k_collected.json"
        args = gl.trl_args(config, {**launch_recipe.trl, "use_cpu": True}, num_processes=8)  # bf16: GPU or use_cpu
        assert (args.use_vllm, args.vllm_mode, args.vllm_tensor_parallel_size) == (True, "colocate", 4)
        assert args.vllm_gpu_memory_utilization == 0.3 and args.vllm_sync_interval == v
        rows = config.prompts_per_step * config.G
        assert args.per_device_train_batch_size * 8 * args.gradient_accumulation_steps == rows
        assert args.steps_per_generation == args.gradient_accumulation_steps and args.max_steps == config.steps
    command = repeats.colocate_repeats_command()
    config = command[command.index("--config") + 1]
    assert (gl.ROOT / config).is_file() and load_launch_recipe(gl.ROOT / config).config.v == 1
    assert command[command.index("--v") + 1:command.index("--repeats")] == ["1", "10"]
    assert command[command.index("--accelerate-config") + 1] == "gpu8_zero3"
    assert int(command[command.index("--repeats") + 1]) >= repeats.MIN_REPEATS
    with pytest.raises(ValueError, match="repeats must be"):
        repeats.colocate_repeats_command(2)


def test_trl_args_map_names_and_refuse_what_trl_cannot_do(tmp_path):
    launch_recipe = load_launch_recipe(CONFIG_DIR / "cpu_arith_smollm2.yaml",
                                       ["i=2", "eps_high=0.28", "beta=0.04", "ref_period=5",
                                        f"output_dir={tmp_path}"], ["logging_steps=3"])
    config = launch_recipe.config
    assert launch_recipe.trl == {"logging_steps": 3} and launch_recipe.orz_data_files is None
    args = gl.trl_args(config, launch_recipe.trl, num_processes=2)
    assert (args.num_generations, args.num_iterations, args.vllm_sync_interval) == (8, 2, 4)
    assert (args.epsilon, args.epsilon_high, args.beta, args.ref_model_sync_steps) == (0.2, 0.28, 0.04, 10)
    assert args.per_device_train_batch_size == 16 and args.gradient_accumulation_steps == 1  # 32 rows = 16·2·1
    assert (args.max_steps, args.logging_steps, args.lr_scheduler_type) == (80, 3, "constant")
    adaptive = gl.trl_args(config.replace(sync="adaptive", sync_threshold=0.3), {}, 1)
    assert (adaptive.sync, adaptive.sync_threshold, adaptive.vllm_sync_interval) == ("adaptive", 0.3, 4)
    with pytest.raises(ValueError, match="kl_kind must be one of"):
        gl.trl_args(config.replace(kl_kind="k1"), {}, 1)
    with pytest.raises(ValueError, match="must be a multiple of micro_batch_size"):
        gl.trl_args(config.replace(micro_batch_size=5), {}, 1)
    with pytest.raises(ValueError, match="an override takes key=value"):
        load_launch_recipe(CONFIG_DIR / "cpu_arith_smollm2.yaml", ["v"])
    with pytest.raises(ValueError, match="unknown"):
        load_launch_recipe(CONFIG_DIR / "cpu_arith_smollm2.yaml", ["nonsense=1"])


def test_orz_rows_become_chat_prompts_and_rewards(tmp_path):
    rows = [[{"from": "human", "value": q}, {"from": "assistant", "ground_truth": {"value": a}}]
            for q, a in (("What is 2+3?", "5"), ("Half of 1?", "\\frac{1}{2}"))]
    path = tmp_path / "orz.json"
    path.write_text(json.dumps(rows))
    assert [p.answer for p in load_orz(path)] == ["5", "\\frac{1}{2}"] and len(load_orz(path, 1)) == 1
    launch_recipe = load_launch_recipe(CONFIG_DIR / "qwen7b_orz_colocate_v1.yaml",
                                       [f"orz_data_files={path}", "system_prompt=Be brief."])
    assert launch_recipe.orz_data_files == str(path)
    data = gl.training_dataset(launch_recipe)
    assert data[0]["prompt"][0] == {"role": "system", "content": "Be brief."}
    user = data[0]["prompt"][1]["content"]
    assert user.startswith("What is 2+3?\n") and "\\boxed{}" in user
    gym = gl.training_dataset(load_launch_recipe(CONFIG_DIR / "cpu_arith_smollm2.yaml", ["train_problems=3"]))
    assert len(gym) == 3 and all(row["answer_format"] == "number" for row in gym)
    assert gym[0]["prompt"][-1]["content"].endswith("Answer with just the number.")
    reward = gl.verifiable_reward(eos_token_ids=[2])
    completions = [[{"role": "assistant", "content": "so \\boxed{5}"}], "\\boxed{0.5}"]
    ended, cut = [[7, 2], [8, 2]], [[7, 9], [8, 9]]  # ends with the EOS id 2, or truncated
    assert reward(completions, answer=data["answer"], answer_format=data["answer_format"],
                  completion_ids=ended) == [1.0, 1.0]
    assert reward(completions, answer=data["answer"], answer_format=data["answer_format"],
                  completion_ids=cut) == [0.0, 0.0]
    assert gl.verifiable_reward(scoring="lenient")(completions, answer=data["answer"],
                                                   answer_format=data["answer_format"]) == [1.0, 1.0]
    assert reward(["\\boxed{6}"], answer=["5"], answer_format=["boxed"], completion_ids=[[2]]) == [0.0]
    with pytest.raises(ValueError, match="strict scoring needs eos_token_ids"):
        gl.verifiable_reward()
    with pytest.raises(ValueError, match="strict scoring needs completion_ids"):
        reward(["\\boxed{5}"], answer=["5"], answer_format=["boxed"])
    assert gl.stop_token_ids(str(bundled_model_dir())) == [2]  # SmolLM2's <|im_end|>, as TRL's eos_token_ids
    path.write_text("[]")
    with pytest.raises(ValueError, match="holds no problems"):
        load_orz(path)


def tiny_qwen2(folder):
    """A random one-layer Qwen2 with SmolLM2's tokenizer, saved to ``folder`` (no download)."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir())
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                         tie_word_embeddings=True))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


TINY = ["G=2", "prompts_per_step=2", "micro_batch_size=2", "max_completion_length=4", "train_problems=8",
        "checkpoint_every=0", "device=cpu"]
"""A launch at the smallest shapes (with ``model=`` and ``steps=``): seconds on a CPU."""


def check_provenance(result):
    assert len(result["git_commit"]) == 40 and result["cpu_model"] and result["gpu_models"] == []
    assert all(result[k] for k in ("torch", "transformers", "trl", "accelerate")) and result["world_size"] == 1


@pytest.mark.slow
def test_launch_trains_with_the_trl_adapter_and_writes_results(tmp_path, monkeypatch):
    """A real (tiny) run through launch(): random one-layer Qwen2 with SmolLM2's tokenizer, CPU, v = 2, 3 steps,
    planned first on this host at the recipe's micro-batch."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    launch_recipe = load_launch_recipe(
        CONFIG_DIR / "cpu_arith_smollm2.yaml",
        [f"model={tiny_qwen2(tmp_path / 'model')}", *TINY, "v=2", "steps=3", f"output_dir={tmp_path / 'run'}"],
        ["disable_tqdm=true"])
    plans, plan_launch = [], gl.plan_launch
    monkeypatch.setattr(gl, "plan_launch", lambda *args: plans.append((args[3], plan_launch(*args))) or plans[-1][1])
    result = gl.launch(launch_recipe)
    (device, plan), = plans
    assert device.kind == "cpu" and device.count == 1 and plan.micro_batch_size == 2 and not plan.shrunk
    assert plan.estimate.sampler > 0 and plan.estimate.sampling > 0                      # α samples in torch
    assert plan.estimate.new <= plan.budget
    assert (result["v"], result["steps"], result["syncs"], result["seed"]) == (2, 3, 2, 0)  # α ← π_θ at k = 0 and 2
    assert result["seconds"] > 0 and result["steps_per_second"] == result["steps"] / result["seconds"]
    assert 0.0 <= result["final_reward"] <= 1.0
    check_provenance(result)
    assert json.loads((tmp_path / "run" / gl.RESULT_FILE).read_text()) == result
    assert (tmp_path / "run" / "final" / "config.json").is_file()


@pytest.mark.slow
def test_repeats_time_each_v_three_times_interleaved_and_summarise_the_files(tmp_path, monkeypatch):
    """The driver on the TRL route: v = 1 and 2, 3 repeats each, 2 steps, each launch a process of its own; the
    summary is the files' seconds, recomputed here."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    sets = [f"model={tiny_qwen2(tmp_path / 'model')}", *TINY, "steps=2"]
    summary = repeats.run_repeats(CONFIG_DIR / "cpu_arith_smollm2.yaml", [1, 2], 3, tmp_path / "out", sets=sets,
                                  trl=["disable_tqdm=true"])
    assert summary["plan"] == [(1, 0), (2, 0), (2, 1), (1, 1), (1, 2), (2, 2)]
    assert json.loads((tmp_path / "out" / repeats.SUMMARY_FILE).read_text()) == json.loads(json.dumps(summary))
    for (v, j), run in zip(summary["plan"], summary["runs"]):
        assert run == json.loads((tmp_path / "out" / f"v{v}_r{j}" / gl.RESULT_FILE).read_text())
        assert (run["v"], run["seed"], run["steps"], run["syncs"]) == (v, j, 2, 2 // v)
        assert run["seconds"] > 0 and not (tmp_path / "out" / f"v{v}_r{j}" / "final").exists()
        check_provenance(run)
    rates = {v: [r["steps"] / r["seconds"] for r in summary["runs"] if r["v"] == v] for v in (1, 2)}
    per_v = summary["summary"]["per_v"]
    assert [per_v[str(v)]["steps_per_second"] for v in (1, 2)] == [rates[1], rates[2]]
    assert per_v["1"]["mean"] == pytest.approx(np.mean(rates[1]))
    ratio = summary["summary"]["ratios"]["2:1"]
    assert ratio["ratio"] == pytest.approx(np.exp(np.mean(np.log(rates[2])) - np.mean(np.log(rates[1]))))
    assert ratio["ci"][0] < ratio["ratio"] < ratio["ci"][1]


def made_up_run(v, seconds, steps=2, **changes):
    return {"v": v, "seed": 0, "steps": steps, "seconds": seconds, "world_size": 1, "gpu_models": ["H100"],
            "cpu_model": "x", **changes}


def test_throughput_summary_by_hand():
    """v = 1: 2 steps in 4, 4e^0.1 and 4e^−0.1 s; v = 10: 2 steps in 2, 2e^0.2 and 2e^−0.2 s. Log rates: mean
    log 0.5, s.d. 0.1; mean log 1, s.d. 0.2. Ratio e^(0 − log 0.5) = 2; s.e. √(0.01/3 + 0.04/3) = 0.129099; Welch
    df = (0.05/3)² / ((0.01/3)²/2 + (0.04/3)²/2) = 2.94 → 2; t_0.975,2 = 4.302653; interval 2·e^(±0.555468)."""
    runs = [made_up_run(1, 4.0), made_up_run(10, 2.0), made_up_run(10, 2 * np.exp(0.2)),
            made_up_run(1, 4 * np.exp(0.1)), made_up_run(1, 4 * np.exp(-0.1)), made_up_run(10, 2 * np.exp(-0.2))]
    summary = repeats.throughput_summary(runs)
    ratio = summary["ratios"]["10:1"]
    assert ratio["ratio"] == pytest.approx(2.0) and ratio["df"] == 2 and ratio["log_se"] == pytest.approx(0.1290994)
    assert ratio["ci"] == pytest.approx([1.147605, 3.485520], rel=1e-6)
    v1 = summary["per_v"]["1"]       # rates 0.5, 0.5e^−0.1, 0.5e^0.1: mean 0.501668, s.d. 0.050125
    assert v1["repeats"] == 3 and v1["steps_per_second"] == pytest.approx([0.5, 0.5 * np.exp(-0.1), 0.5 * np.exp(0.1)])
    assert v1["mean"] == pytest.approx(0.501668) and v1["ci"] == pytest.approx([0.377202, 0.626134], rel=1e-5)
    lines = repeats.summary_lines(summary)
    assert lines[-1] == "v 10 : v 1: 2.000x [1.148, 3.486] (95 %, 2 df)"
    table = tp.colocate_table(summary)
    assert [row["source"] for row in table] == [tp.PAPER] * 3 + [f"{tp.MEASURED} (8 GPUs)"] * 3
    assert table[2]["steps/s or ratio"] == pytest.approx(0.03828 / 0.02828) and table[-1]["v"] == "10 : 1"
    assert len(tp.colocate_table(None)) == 3


def test_throughput_summary_refuses_what_it_cannot_compare():
    runs = [made_up_run(v, 3.0) for v in (1, 1, 10, 10)]
    with pytest.raises(ValueError, match="differ in world_size"):
        repeats.throughput_summary([*runs, made_up_run(10, 3.0, world_size=8)])
    with pytest.raises(ValueError, match="differ in steps"):
        repeats.throughput_summary([*runs, made_up_run(10, 3.0, steps=3)])
    with pytest.raises(ValueError, match="v = 4 has 1 repeat"):
        repeats.throughput_summary([*runs, made_up_run(4, 3.0)])
    with pytest.raises(ValueError, match="seconds = 0.0"):
        repeats.throughput_summary([*runs[:3], made_up_run(10, 0.0)])


def test_repeat_plan_interleaves_and_alternates_the_first_v():
    assert repeats.repeat_plan([1, 10], 4) == [(1, 0), (10, 0), (10, 1), (1, 1), (1, 2), (10, 2), (10, 3), (1, 3)]
    with pytest.raises(ValueError, match="repeats must be"):
        repeats.repeat_plan([1, 10], 2)
    with pytest.raises(ValueError, match="two different values of v"):
        repeats.repeat_plan([4, 4], 3)


def test_repeat_command_sets_v_seed_and_folder_and_reads_files_already_there(tmp_path, monkeypatch):
    config = CONFIG_DIR / "cpu_arith_smollm2.yaml"
    command = repeats.repeat_command(config, 10, 2, tmp_path, "gpu8_zero3", ["seed=5"], ["logging_steps=2"])
    assert command[1:5] == ["-m", "accelerate.commands.launch", "--config_file",
                            str(CONFIG_DIR / "accelerate" / "gpu8_zero3.yaml")]
    sets = [command[i + 1] for i, word in enumerate(command) if word == "--set"]
    assert sets == ["seed=5", "v=10", "seed=7", f"output_dir={tmp_path.resolve() / 'v10_r2'}"]
    assert command[-3:] == ["--trl", "logging_steps=2", "--no-final-model"]
    assert repeats.repeat_command(config, 1, 0, tmp_path)[1:3] == ["-m", "grpo_lab.scale.launch"]
    for v, j in repeats.repeat_plan([1, 10], 3):          # every run already there: nothing is launched
        repeats.run_dir(tmp_path, v, j).mkdir()
        (repeats.run_dir(tmp_path, v, j) / gl.RESULT_FILE).write_text(json.dumps(made_up_run(v, 3.0 + j / v)))
    monkeypatch.setattr(repeats.subprocess, "run", lambda *a, **k: pytest.fail("a finished repeat was run again"))
    summary = repeats.run_repeats(config, [1, 10], 3, tmp_path)
    assert json.loads(json.dumps(summary)) == repeats.read_summary(tmp_path)
    assert summary["summary"] == repeats.throughput_summary(summary["runs"])
    (repeats.run_dir(tmp_path, 10, 1) / gl.RESULT_FILE).write_text(json.dumps(made_up_run(1, 3.0)))
    with pytest.raises(ValueError, match="holds a run at v = 1, not 10"):
        repeats.run_repeats(config, [1, 10], 3, tmp_path)


def test_training_clock_spans_the_first_step_start_to_the_last_step_end(monkeypatch):
    ticks = iter([10.0, 12.5, 14.0, 19.0])   # the first step's start, then each step's end
    monkeypatch.setattr(gl.time, "perf_counter", lambda: next(ticks))
    clock = gl.TrainingClock()
    with pytest.raises(ValueError, match="no whole optimiser step"):
        _ = clock.seconds
    for _ in range(3):
        clock.on_step_begin(None, None, None)
        clock.on_step_end(None, None, None)
    assert clock.seconds == 9.0 and next(ticks, None) is None   # 19.0 − 10.0: read once at the start


def test_require_free_gpus_names_the_device_in_use(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    used = {0: 30 * 2**30}      # cuda:0 holds 30 GiB (an engine still alive), the rest are free
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (80 * 2**30 - used.get(d, 0), 80 * 2**30))
    with pytest.raises(RuntimeError, match="cuda:0 has 30.0 of 80.0 GiB in use"):
        gl.require_free_gpus(8)
    used.clear()
    gl.require_free_gpus(8)
    with pytest.raises(RuntimeError, match="needs 9 CUDA devices; torch sees 8"):
        gl.require_free_gpus(9)


def one_line(text):
    """Shell text with its line continuations joined and its runs of spaces made one."""
    return " ".join(text.replace("\\\n", " ").split())


def test_the_printed_commands_are_the_documented_ones():
    """The notebooks print the commands these functions build; docs/recipes.md and the recipes' headers hold the
    same lines."""
    from grpo_lab.lm.recipes import GSM8K_RECIPES, eval_command, recipe_arg, train_command

    docs = one_line((gl.ROOT / "docs" / "recipes.md").read_text())
    for name in gl.COLOCATE_RECIPES.values():
        assert gl.launch_command(name, "gpu8_zero3") in docs, name
    deepscaler = "deepscaler_r1distill_1p5b_offpolicy_v10"
    assert gl.launch_command(deepscaler, "gpu8_zero3", trl=["use_vllm=true", "vllm_mode=colocate",
                                                            "vllm_gpu_memory_utilization=0.3"]) in docs
    for name in GSM8K_RECIPES.values():
        header = one_line((gl.ROOT / recipe_arg(name)).read_text().replace("#", " "))
        assert train_command(name) in header and eval_command(name) in header, name
    with pytest.raises(ValueError, match="no bundled recipe 'gsm8k'"):
        train_command("gsm8k")
    with pytest.raises(ValueError, match="accelerate_config must be one of"):
        gl.launch_command(deepscaler, "gpu9")


def test_full_mode_starts_only_when_asked(monkeypatch):
    import torch

    from grpo_lab.lm.recipes import run_mode

    monkeypatch.delenv("GRPO_LAB_SMOKE", raising=False)
    monkeypatch.delenv("GRPO_LAB_FULL", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert run_mode() == "reduced"                         # a GPU alone does not start the long runs
    monkeypatch.setenv("GRPO_LAB_FULL", "1")
    assert run_mode() == "full"
    monkeypatch.setenv("GRPO_LAB_SMOKE", "1")
    assert run_mode() == "smoke"                           # CI's smoke mode wins
    monkeypatch.setenv("GRPO_LAB_SMOKE", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="GRPO_LAB_FULL=1 asks for the GPU recipes' runs, but torch sees no CUDA"):
        run_mode()
    monkeypatch.setenv("GRPO_LAB_FULL", "0")
    assert run_mode() == "reduced"
