"""The TRL adapter (grpo_lab.scale.trl): same maths as grpo_objective, sync every v steps, lagged
sampler α, zero-variance mask across processes. A tiny random Llama keeps each test fast."""

import importlib.util
import json
import os
import socket
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from schedule_calls import assert_one_call_order, record_plans_and_schedule
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_lab.lm.recipes import CONFIG_DIR
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.scale.launch import trl_args
from grpo_lab.scale.trl import OffPolicyGRPOTrainer
from grpo_lab.sync_audit import SyncError

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("trl_two_process", ROOT / "tests" / "trl_two_process.py")
two = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(two)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return two.build_tiny_model(tmp_path_factory.mktemp("tiny_llama"))


def alternating_reward(completions, **kwargs):
    """Half of every group right: no group is ever masked, so every step learns."""
    return [float(j % 2) for j in range(len(completions))]


def constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


def trainer_for(model_dir, tmp_path, reward, rows=8, **overrides):
    config = two.make_config(str(tmp_path / "out"), 1, rows, **overrides)
    dataset = Dataset.from_dict({"prompt": list(two.TRAIN_PROMPTS)})
    return OffPolicyGRPOTrainer(model=model_dir, reward_funcs=reward, args=config, train_dataset=dataset)


CASES = [dict(clip_band=band, zero_variance_mask=mask) for band in ("additive", "multiplicative")
         for mask in (True, False)]
CASES += [dict(mask_normalize="unmasked"), dict(mask_normalize="unmasked", loss_type="bnpo"),
          dict(loss_type="bnpo"), dict(loss_type="dr_grpo"), dict(importance_sampling_level="sequence", epsilon=0.05),
          dict(beta=0.0, zero_variance_mask=False), dict(is_correction="truncated", is_cap=1.3),
          dict(is_correction="truncated", clip_band="multiplicative", use_bias_correction_kl=True),
          dict(use_bias_correction_kl=True), dict(kl_importance_weighted=True),
          dict(is_correction="none"), dict(is_correction="none", importance_sampling_level="sequence"),
          dict(is_correction="mask", is_cap=1.3), dict(is_correction="truncated", is_cap=1.3,
                                                       importance_sampling_level="sequence"),
          dict(is_correction="icepop", is_cap=1.5, is_floor=0.9, importance_sampling_level="sequence"),
          dict(is_correction="icepop", is_cap=1.5, is_floor=None, is_level="sequence"),   # TRL's default's levels
          dict(is_correction="truncated", is_cap=1.3, importance_sampling_level="sequence", is_level="token")]


def test_loss_and_gradient_equal_grpo_objective(model_dir, tmp_path):
    """One fixed batch (perturbed log α and log π_k, a masked group, 2 micro-batches, shuffled):
    the adapter's loss and gradient equal grpo_objective's within 1e-5, for every option (``use_bias_correction_kl``
    is the differentiable KL weight, ``kl_importance_weighted`` the detached one: same loss, other gradients)."""
    losses = []
    for case in CASES:
        options = {"beta": 0.04, **case}
        trainer = trainer_for(model_dir, tmp_path, two.fixed_reward, rows=12, max_completion_length=two.FIXED_T,
                              **options)
        result = two.run_fixed_batch(trainer)
        assert result["loss_error"] < 1e-5, (case, result)
        assert result["grad_error"] < 1e-5, (case, result)
        assert result["grad_scale"] > 1e-3, (case, result)  # the gradient is not trivially zero
        assert result["tv_error"] < 1e-5 and result["lab_tv_estimate"] > 0.05, (case, result)
        assert result["diagnostics_error"] < 1e-9 and result["ess_token"] < 0.99, (case, result)
        assert result["lab_clip_low_frac"] + result["lab_clip_high_frac"] > 0, (case, result)  # the band bites
        losses.append((round(result["loss"], 6), round(result["grad_scale"], 6)))
    # band, mask, aggregation each change the loss; the KL weight's gradient (not its value) the gradient
    assert len(set(losses)) == len(losses)


def test_lagged_copy_generates_and_syncs_every_v(model_dir, tmp_path):
    """v = 2 over 4 steps: α ← π_θ at k = 0, 2 only; generation never touches π_θ;
    r′ = π_k/α is 1 right after a sync and not one step later; π_ref hard-resets every 2 steps."""
    trainer = trainer_for(model_dir, tmp_path, alternating_reward, max_steps=4, vllm_sync_interval=2, beta=0.04,
                          sync_ref_model=True, ref_model_sync_steps=2)
    policy_calls = []
    trainer.model.model.register_forward_pre_hook(lambda *args: policy_calls.append(1))
    generate = trainer._generate_single_turn

    def generate_without_policy(*args, **kwargs):
        before = len(policy_calls)
        result = generate(*args, **kwargs)
        assert len(policy_calls) == before, "generation must run the copy α, never π_θ"
        return result

    trainer._generate_single_turn = generate_without_policy
    initial = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()

    assert trainer.sync_steps == [0, 2]
    assert trainer._audit.reference[2] == 2  # the sync audit judged the sync of step 2, and it passed
    logs = [h for h in trainer.state.log_history if "off_policy/lag" in h]
    assert [h["off_policy/lag"] for h in logs] == [0, 1, 0, 1]
    assert [h["off_policy/synced"] for h in logs] == [1, 0, 1, 0]
    assert [h["off_policy/sync_count"] for h in logs] == [1, 1, 2, 2]
    for h in logs:
        if h["off_policy/lag"] == 0:
            assert abs(h["off_policy/ratio_k_mean"] - 1) < 1e-5 and abs(h["off_policy/ratio_k_max"] - 1) < 1e-5
            assert h["off_policy/tv_estimate"] < 1e-5
            assert abs(h["off_policy/ess_token"] - 1) < 1e-9 and abs(h["off_policy/log_ratio_k_max"]) < 1e-5
        else:
            assert h["off_policy/ratio_k_max"] > 1 + 1e-3 and h["off_policy/tv_estimate"] > 1e-4
            assert h["off_policy/ess_seq"] < 1 - 1e-6 and h["off_policy/log_ratio_k_max"] > 1e-3
        assert h["off_policy/cap_frac"] == 0  # is_correction = "ratio": no cap
    for p, ref in zip(trainer.model.parameters(), trainer.ref_model.parameters(), strict=True):
        assert torch.equal(p, ref)  # reset after the last step
    assert any(not torch.equal(p, p0) for p, p0 in zip(trainer.model.parameters(), initial, strict=True))


def test_a_sync_that_does_nothing_is_caught_at_the_first_sync_after_the_weights_changed(model_dir, tmp_path):
    """α's copy never refreshed: the audit (on by default) stops training at step 1's sync, before its batch."""
    trainer = trainer_for(model_dir, tmp_path, alternating_reward, max_steps=3, vllm_sync_interval=1)
    trainer._sync_sampler = lambda: None
    with pytest.raises(SyncError, match=r"step 1 did not take.*sync_audit=False"):
        trainer.train()
    assert trainer.sync_steps == [0] and trainer.state.global_step == 1


@pytest.mark.parametrize("empty_step, zero_variance_mask", [("skip", True), ("skip", False), ("optimizer_step", True)])
def test_a_step_with_no_signal_follows_empty_step(model_dir, tmp_path, empty_step, zero_variance_mask):
    """Every group agrees (β = 0): loss exactly 0. ``skip``: recorded as skipped, weights untouched although
    AdamW has weight decay; ``optimizer_step``: AdamW steps on the zero gradient and its decay moves them."""
    trainer = trainer_for(model_dir, tmp_path, constant_reward, max_steps=2, weight_decay=0.1, empty_step=empty_step,
                          zero_variance_mask=zero_variance_mask)
    initial = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    logs = [h for h in trainer.state.log_history if "off_policy/lag" in h]
    skipped = empty_step == "skip"
    assert [h["off_policy/skipped"] for h in logs] == [float(skipped)] * 2
    assert [h["off_policy/masked_frac"] for h in logs] == [1, 1]
    assert all(h["loss"] == 0 for h in logs)
    unchanged = [torch.equal(p, p0) for p, p0 in zip(trainer.model.parameters(), initial, strict=True)]
    assert all(unchanged) if skipped else not all(unchanged)


PLAN_CASES = [dict(), dict(zero_variance_mask=False), dict(mask_normalize="unmasked", loss_type="bnpo"),
              dict(loss_type="dr_grpo", beta=0.04)]


@pytest.mark.parametrize("options", PLAN_CASES)
def test_the_adapter_plans_the_step_with_plan_step(model_dir, tmp_path, monkeypatch, options):
    """The adapter calls grpo_lab.plan_step once per batch, on the gathered rewards and sampled tokens, with
    the lab's knobs: its plan is the loop's plan of the same batch (GRPOLoop.plan calls plan_step with
    the GRPOConfig written out below), and the batch it trains on carries that plan's rows."""
    import grpo_lab.scale.trl as adapter
    from grpo_lab import GRPOConfig, plan_step

    plans = []
    monkeypatch.setattr(adapter, "plan_step", lambda *a, **k: plans.append(plan_step(*a, **k)) or plans[-1])
    trainer = trainer_for(model_dir, tmp_path, two.fixed_reward, rows=12, max_completion_length=two.FIXED_T, **options)
    trainer._generate_single_turn = lambda prompt_ids, *args, **kwargs: (
        [two.fixed_completion(j) for j in range(len(prompt_ids))], None)
    trainer.model.train()
    out = trainer._generate_and_score_completions([{"prompt": p} for p in two.FIXED_PROMPTS
                                                   for _ in range(two.FIXED_G)])
    (plan,) = plans
    args = trainer.args
    config = GRPOConfig(G=two.FIXED_G, eps_std=args.eps_std, unbiased_std=args.unbiased_std,
                        eps_placement=args.eps_placement, mask_zero_variance=args.zero_variance_mask,
                        mask_normalize=args.mask_normalize, loss_type=args.loss_type,
                        max_completion_length=args.max_completion_length, beta=args.beta, empty_step=args.empty_step)
    prompts = [p for p in two.FIXED_PROMPTS for _ in range(two.FIXED_G)]
    rewards = torch.tensor(two.fixed_reward(prompts, out["completion_ids"].tolist())).view(-1, two.FIXED_G)
    loops = plan_step(rewards, out["completion_mask"].bool(), config)
    for name in ("advantages", "informative", "keep", "mask", "weights"):
        assert torch.equal(getattr(plan, name), getattr(loops, name)), name
    assert (plan.masked_frac, plan.empty, plan.trains) == (loops.masked_frac, loops.empty, loops.trains)
    assert plan.masked_frac == pytest.approx(2 / 3) and plan.trains
    assert torch.equal(out["advantages"], plan.advantages) and torch.equal(out["loss_weights"], plan.weights)
    assert torch.equal(out["loss_mask"], plan.mask) and trainer._plan is plan


def test_the_adapters_sync_decisions_follow_the_step_plans_as_in_the_loop(model_dir, tmp_path):
    """The adaptive schedule on the TRL route sees each step's drift through StepPlan.observed_drift, as the
    loop's does: a skipped step's drift (which TRL's loss passes still measure) is not seen."""
    from grpo_lab import plan_step
    from grpo_lab.schedules import make_sync_schedule

    trainer = trainer_for(model_dir, tmp_path, alternating_reward, vllm_sync_interval=4, sync="adaptive",
                          sync_threshold=0.1)
    one_token = torch.ones(2, 1, dtype=torch.bool)
    trains = plan_step(torch.tensor([[1.0, 0.0]]), one_token, trainer._plan_config)
    skips = plan_step(torch.tensor([[1.0, 1.0]]), one_token, trainer._plan_config)
    script = [(trains, 0.05), (skips, 0.5), (trains, 0.2), (trains, 0.0), (skips, 0.0), (trains, 0.02),
              (trains, 0.03), (trains, 0.0)]   # (plan of step k, mean drift its loss passes measured)
    reference, expected = make_sync_schedule("adaptive", 4, 0.1), []
    for k, (plan, drift) in enumerate(script):
        trainer.state.global_step = k * trainer.num_iterations
        trainer._maybe_sync()
        trainer._commit_sync()                                       # the batch exists
        trainer._plan, trainer._drift = plan, [10 * drift, 10.0]    # Σ |log π_k − log α| over 10 tokens
        if reference.begin(k):
            reference.mark_synced(k)
            expected.append(k)
        reference.end(plan.observed_drift(drift))
    assert trainer.sync_steps == expected == [0, 3, 7]   # not 2: step 1 was skipped; 7: the longest lag v = 4


class FakeVLLM:
    """Stands in for TRL's VLLMGeneration: counts pushes, returns fixed tokens and log-probs
    (one token unscored, as vLLM reports a NaN log-prob)."""

    def __init__(self):
        self.pushes = 0
        self.llm = self  # colocate: the adapter pushes into ``llm`` (one reload per push)

    def sync_weights(self):
        self.pushes += 1

    def _iter_named_params(self):
        return iter(())

    def collective_rpc(self, method, kwargs=None):
        assert method == "reload_weights"
        self.pushes += 1

    def apply_model(self, func):
        return []

    def reset_prefix_cache(self):
        return True

    def generate(self, prompts, images, num_generations, profiler):
        completions = [two.fixed_completion(j) for j in range(len(prompts))]
        logprobs = [[[None if t == 1 else -2.0] for t in range(len(c))] for c in completions]
        return None, completions, logprobs, None


def test_vllm_path_pushes_only_every_v_steps(model_dir, tmp_path):
    """Through TRL's own vLLM branch: weights are pushed at k = 0, 2, 4 of k = 0..5 (v = 2)
    although global_step changes every step; unscored tokens leave the loss finite."""
    trainer = trainer_for(model_dir, tmp_path, alternating_reward, vllm_sync_interval=2)
    trainer.use_vllm, trainer.vllm_generation = True, FakeVLLM()
    trainer.model.train()
    rows = [{"prompt": p} for p in two.TRAIN_PROMPTS[:2] for _ in range(two.FIXED_G)]
    pushes = []
    for k in range(6):
        trainer.state.global_step = k
        out = trainer._generate_and_score_completions(rows)
        pushes.append(trainer.vllm_generation.pushes)
    assert pushes == [1, 1, 2, 2, 3, 3]
    assert trainer.sync_steps == [0, 2, 4]
    assert torch.isnan(out["sampling_per_token_logps"][:, 1]).all()
    assert torch.isfinite(trainer.compute_loss(trainer.model, out))


def test_adaptive_sync_on_the_trl_route_follows_the_drift(model_dir, tmp_path, monkeypatch):
    """sync='adaptive' (the lab's AdaptiveSyncSchedule): α ← π_θ at the step after one whose drift
    mean |log π_k − log α| passed sync_threshold, and at the latest when the lag reaches v; the schedule is
    called in the loop's one order (begin, plan, mark_synced once the batch exists, end), as tests/test_plan.py
    checks for the loop and the closed-form engine."""
    import grpo_lab.scale.trl as adapter

    def run(threshold, v):
        plans, calls = record_plans_and_schedule(monkeypatch, adapter)
        trainer = trainer_for(model_dir, tmp_path / f"{threshold}", alternating_reward, max_steps=6,
                              vllm_sync_interval=v, sync="adaptive", sync_threshold=threshold)
        drifts, end = [], trainer.sync_schedule.end
        trainer.sync_schedule.end = lambda drift: drifts.append(drift) or end(drift)
        trainer.train()
        assert len(plans) == 6 and [c[1] for c in calls if c[0] == "begin"] == list(range(6))
        assert_one_call_order(calls, last_end_pending=True)   # step 5 ends when a step 6 would begin
        return trainer.sync_steps, drifts

    syncs, drifts = run(threshold=0.005, v=5)
    assert syncs == [0, 2, 4]                      # every lag-1 step drifted past 0.005; v = 5 never bound
    assert max(drifts[0::2]) < 1e-6 and min(drifts[1::2]) > 0.005   # lag 0: α = π_k up to float32 rounding
    syncs, drifts = run(threshold=10.0, v=3)
    assert syncs == [0, 3] and max(drifts) < 10.0  # drift never passed: the longest lag v decides


@pytest.mark.parametrize("top_p, top_k", [(0.8, 0), (1.0, 6)])
def test_in_process_alpha_samples_and_scores_the_truncated_distribution(model_dir, tmp_path, top_p, top_k):
    """top_p / top_k on the route without vLLM: ``generate`` draws every token inside the cut (Hugging Face's
    warpers on the copy α's logits / T, recomputed here), log α is the truncated, renormalised log-prob of it
    (NaN where α did not sample), and at lag 0 the logged r′ = π_k/α′ sits below 1: log r′ = log α(S)."""
    from transformers import LogitsProcessorList
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    trainer = trainer_for(model_dir, tmp_path, alternating_reward, max_steps=1, top_p=top_p, top_k=top_k)
    outputs, score = [], trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: outputs.append(score(inputs)) or outputs[-1]
    trainer.train()
    out = outputs[0]
    warpers = LogitsProcessorList(([TopKLogitsWarper(top_k)] if top_k else [])
                                  + ([TopPLogitsWarper(top_p)] if top_p < 1 else []))
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
    T = out["completion_ids"].shape[1]
    with torch.no_grad():  # α is still the step-0 copy: a run of one step syncs only at k = 0
        logits = trainer.alpha_model(input_ids=ids, attention_mask=torch.cat([out["prompt_mask"],
                                     out["completion_mask"]], dim=1)).logits[:, -T - 1:-1] / trainer.temperature
    rows, V = logits.shape[0] * T, logits.shape[-1]
    cut = warpers(ids, logits.reshape(rows, V)).reshape(logits.shape)
    expected = cut.log_softmax(-1).gather(-1, out["completion_ids"][..., None]).squeeze(-1)
    sampled = out["sampled_mask"]
    assert sampled.sum() >= 32 and torch.isfinite(expected[sampled]).all()  # every drawn token was kept
    assert float((out["sampling_per_token_logps"] - expected)[sampled].abs().max()) < 1e-5
    assert torch.isnan(out["sampling_per_token_logps"][~sampled]).all()
    log = next(h for h in trainer.state.log_history if "off_policy/lag" in h)
    assert log["off_policy/lag"] == 0 and log["off_policy/log_ratio_k_max"] < 1e-5
    assert log["off_policy/log_ratio_k_p50"] < -0.05 and log["off_policy/ratio_k_mean"] < 0.95


@pytest.mark.parametrize("change, name", [
    (dict(vllm_sync_interval=0), "vllm_sync_interval"),
    (dict(top_p=0.0), "top_p"), (dict(top_k=-1), "top_k"), (dict(min_p=0.1), "min_p"),
    (dict(repetition_penalty=1.2), "repetition_penalty"),
    (dict(sync="sometimes"), "sync"),
    (dict(sync="adaptive", sync_threshold=0.0), "sync_threshold"),
    (dict(clip_band="box"), "clip_band"),
    (dict(loss_type="sapo"), "loss_type"),
    (dict(eps_placement="inside"), "eps_placement"),
    (dict(vllm_importance_sampling_correction=True), "vllm_importance_sampling_correction"),
    (dict(scale_rewards="batch"), "scale_rewards"),
    (dict(steps_per_generation=4), "steps_per_generation"),
    (dict(vllm_enable_sleep_mode=True, vllm_sync_interval=2), "vllm_enable_sleep_mode"),
])
def test_bad_config_names_the_field(tmp_path, change, name):
    with pytest.raises(ValueError, match=name):
        two.make_config(str(tmp_path), 1, 8, **change)


def test_a_bfloat16_recipe_on_the_trl_route_trains_float32_weights(model_dir, tmp_path):
    """TrainConfig(dtype="bfloat16") → TRL's bf16 autocast over weights TRL loads in float32 by default, even from
    a checkpoint saved in bfloat16 (which transformers alone would load as saved): AdamW steps float32 weights,
    unlike the loop's bfloat16 weights (TrainConfig.dtype)."""
    saved = tmp_path / "bf16_llama"
    AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).save_pretrained(saved)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(saved)
    assert AutoModelForCausalLM.from_pretrained(saved).dtype == torch.bfloat16
    args = trl_args(TrainConfig(model=str(saved), dtype="bfloat16", device="cpu", G=two.FIXED_G, prompts_per_step=2,
                                output_dir=str(tmp_path / "out")), {}, num_processes=1)
    trainer = OffPolicyGRPOTrainer(model=str(saved), reward_funcs=alternating_reward, args=args,
                                   train_dataset=Dataset.from_dict({"prompt": list(two.TRAIN_PROMPTS)}))
    assert args.bf16 and {p.dtype for p in trainer.model.parameters()} == {torch.float32}


@pytest.mark.parametrize("recipe_dtype, engine_dtype", [("bfloat16", torch.bfloat16), ("float16", torch.float16),
                                                         ("float32", torch.float32)])
def test_the_colocated_engine_computes_in_the_recipes_dtype(monkeypatch, recipe_dtype, engine_dtype):
    """The 7B colocate recipe (bfloat16, vLLM in the trainer's processes) builds its engine in bfloat16, the dtype
    its trainer's forwards compute in, not in the float32 of the weights TRL loads; a float16 or float32 recipe
    alike. The engine is TRL's module-level ``LLM``, replaced here: nothing is started."""
    import trl.generation.vllm_generation as generation

    from grpo_lab.lm.recipes import load_launch_recipe
    from grpo_lab.scale.trl import _engine_arguments

    launch_recipe = load_launch_recipe(CONFIG_DIR / "qwen7b_orz_colocate_v10.yaml", [f"dtype={recipe_dtype}"])
    args = trl_args(launch_recipe.config, {**launch_recipe.trl, "use_cpu": True}, num_processes=8)  # bf16: GPU or CPU
    assert (args.use_vllm, args.vllm_mode) == (True, "colocate")
    built = []
    monkeypatch.setattr(generation, "LLM", lambda *args, **kwargs: built.append(kwargs), raising=False)
    trainer = types.SimpleNamespace(args=args, model=types.SimpleNamespace(dtype=torch.float32))  # as TRL loads it
    with _engine_arguments(trainer, enforce_eager=False):
        generation.LLM(model=launch_recipe.config.model)
    assert built == [{"model": "Qwen/Qwen2.5-7B", "dtype": engine_dtype}]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one_process(model_dir, tmp_path):
    """accelerate launch, 2 CPU processes (gloo): on the fixed batch, whose middle group is split
    between the processes, loss and averaged gradient equal grpo_objective's and the one-process
    adapter's; a 4-step run with v = 2 syncs at k = 0, 2 on both processes."""
    out = tmp_path / "result.json"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(CONFIG_DIR / "accelerate" / "cpu_2proc.yaml"), "--main_process_port", str(_free_port()),
               str(ROOT / "tests" / "trl_two_process.py"), "--model-dir", model_dir, "--out", str(out),
               "--steps", "4", "--v", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["num_processes"] == 2
    fixed = result["fixed"]
    assert fixed["loss_error"] < 1e-5 and fixed["grad_error"] < 1e-5, fixed
    assert fixed["lab_masked_frac"] == pytest.approx(2 / 3)

    one = two.run_fixed_batch(trainer_for(model_dir, tmp_path, two.fixed_reward, rows=12, beta=0.04,
                                          max_completion_length=two.FIXED_T))
    assert abs(one["loss"] - fixed["loss"]) < 1e-5
    for rank in result["train"]:
        assert rank["sync_steps"] == [0, 2]
        assert [h["off_policy/lag"] for h in rank["history"]] == [0, 1, 0, 1]


def test_docstring_example_runs(model_dir, tmp_path, monkeypatch):
    """The usage example of OffPolicyGRPOTrainer's docstring, run as written (in a scratch folder), on the
    tiny Llama in place of the bundled SmolLM2 (a chat template added), so it takes seconds, not minutes."""
    import contextlib
    import io
    import shutil

    from transformers import AutoTokenizer

    from grpo_lab.lm import models

    chat = shutil.copytree(model_dir, tmp_path / "tiny_chat")
    tokenizer = AutoTokenizer.from_pretrained(chat)
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    tokenizer.save_pretrained(chat)
    monkeypatch.setattr(models, "bundled_model_dir", lambda *args, **kwargs: chat)
    example = OffPolicyGRPOTrainer.__doc__.split("::\n", 1)[1].split("\n\n    ``python -m", 1)[0]
    assert "bundled_model_dir()" in example
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(textwrap.dedent(example), "docstring example", "exec"), {})
    assert printed.getvalue().strip().splitlines()[-1] == "[0, 3]"
