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
        command = gl.colocate_command(v)
        accelerate_config = command[command.index("--config_file") + 1]
        assert (gl.ROOT / accelerate_config).is_file() and (gl.ROOT / command[-1]).is_file(), command
        assert command[command.index("-m") + 1] == "accelerate.commands.launch"
    with pytest.raises(ValueError, match="v must be one of"):
        gl.colocate_command(4)


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


@pytest.mark.slow
def test_launch_trains_with_the_trl_adapter_and_writes_results(tmp_path, monkeypatch):
    """A real (tiny) run through launch(): random 2-layer Llama with SmolLM2's tokenizer, CPU, v = 2."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from grpo_lab.lm.models import bundled_model_dir

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir())
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                         tie_word_embeddings=True))
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    launch_recipe = load_launch_recipe(
        CONFIG_DIR / "cpu_arith_smollm2.yaml",
        [f"model={tmp_path / 'model'}", "G=2", "prompts_per_step=2", "micro_batch_size=2", "v=2", "steps=3",
         "max_completion_length=4", "train_problems=8", "checkpoint_every=0", "device=cpu",
         f"output_dir={tmp_path / 'run'}"], ["disable_tqdm=true"])
    result = gl.launch(launch_recipe)
    assert (result["v"], result["steps"], result["syncs"]) == (2, 3, 2)  # α ← π_θ at k = 0 and 2
    assert result["iters_per_second"] > 0 and 0.0 <= result["final_reward"] <= 1.0
    assert json.loads((tmp_path / "run" / gl.RESULT_FILE).read_text()) == result
    assert (tmp_path / "run" / "final" / "config.json").is_file()
