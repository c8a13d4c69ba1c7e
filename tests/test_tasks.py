"""Tasks: seeded generators, dataset loaders through local files, sampling, prompts."""

from __future__ import annotations

import json
import re
import time

import datasets
import huggingface_hub
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from grpo_lab.lm.rewards import ANSWER_FORMATS, lenient_reward, strict_reward
from grpo_lab.lm.tasks import (
    ANSWER_INSTRUCTIONS,
    TASK_NAMES,
    Problem,
    build_prompt,
    gsm8k_gold,
    load_problems,
    sample_problems,
)

CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def tiny_tokenizer(chat_template: str | None) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel({"<unk>": 0, "<eos>": 1}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>")
    tokenizer.chat_template = chat_template
    return tokenizer


def test_answer_formats_agree_with_rewards():
    assert set(ANSWER_INSTRUCTIONS) == set(ANSWER_FORMATS)


def test_add1_preset_is_one_digit_addition_and_reproducible():
    problems = load_problems("add1", 40, seed=3)
    for p in problems:
        a, b = map(int, re.fullmatch(r"Calculate (\d+) \+ (\d+)\.", p.question).groups())
        assert 0 <= a <= 10 and 0 <= b <= 10  # reasoning-gym's "1 digit" draws from 0..10
        assert p.answer == str(a + b)
        assert p.answer_format == "number"
        assert strict_reward(p.answer, True, p.answer, p.answer_format) == lenient_reward(p.answer, p.answer) == 1.0
    assert problems == load_problems("add1", 40, seed=3)
    assert problems != load_problems("add1", 40, seed=4)
    assert len({p.source for p in problems}) == 40


@pytest.mark.parametrize("name", ["basic_arithmetic", "chain_sum", "gsm_symbolic"])
def test_other_generators(name):
    problems = load_problems(name, 5, seed=0)
    assert len(problems) == 5 and all(p.question and p.answer for p in problems)
    assert [p.question for p in problems] == [p.question for p in load_problems(name, 5, seed=0)]


def test_generator_overrides_and_bad_input():
    two_digit = load_problems("add1", 30, seed=0, min_digits=2, max_digits=2)
    terms = [re.fullmatch(r"Calculate (\d+) \+ (\d+)\.", p.question).groups() for p in two_digit]
    values = [int(t) for pair in terms for t in pair]
    assert max(values) > 10 and max(values) <= 100
    with pytest.raises(ValueError, match="min_terms must be positive"):
        load_problems("add1", 3, min_terms=0, max_terms=0)
    with pytest.raises(ValueError, match="bogus"):
        load_problems("chain_sum", 3, bogus=1)
    with pytest.raises(ValueError, match="takes no split or data_files"):
        load_problems("add1", 3, data_files="x.jsonl")
    with pytest.raises(ValueError, match="n .*required"):
        load_problems("add1")
    with pytest.raises(ValueError, match="n must be an integer >= 1, got 0"):
        load_problems("add1", 0)


def test_bad_task_name_lists_names():
    with pytest.raises(ValueError, match=r"task name must be one of .*'add1'.*'gsm8k'.*got 'gsm9k'"):
        load_problems("gsm9k", 3)
    assert "math500" in TASK_NAMES and "deepscaler" in TASK_NAMES


def test_gsm8k_gold():
    assert gsm8k_gold("She pays 2 * 617 = 1,234.\n#### 1,234") == "1234"
    with pytest.raises(ValueError, match="####"):
        gsm8k_gold("no marker 5")


def test_gsm8k_from_local_jsonl_and_parquet(tmp_path):
    rows = [{"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
            {"question": "A shop sells 1,000 pens twice.", "answer": "2 * 1,000 = 2,000\n#### 2,000"},
            {"question": "Debt?", "answer": "#### -5"}]
    problems = load_problems("gsm8k", data_files=write_jsonl(tmp_path / "gsm8k.jsonl", rows))
    assert [p.answer for p in problems] == ["7", "2000", "-5"]
    assert problems[0].question == rows[0]["question"] and problems[0].answer_format == "boxed"
    assert problems[1].source == "gsm8k:train:1"
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "gsm8k.parquet"))
    assert load_problems("gsm8k", data_files=tmp_path / "gsm8k.parquet") == problems
    assert len(load_problems("gsm8k", 2, data_files=tmp_path / "gsm8k.jsonl")) == 2


@pytest.mark.parametrize("name, rows, meta_key", [
    ("math500", [{"problem": "Compute $\\frac{1}{2}+\\frac{1}{3}$.", "answer": "\\frac{5}{6}", "solution": "...",
                  "subject": "Algebra", "level": 2, "unique_id": "test/algebra/1.json"}], "subject"),
    ("aime24", [{"id": 60, "problem": "Find the remainder.", "answer": "204", "solution": "...", "year": 2024,
                 "url": "u"}], "year"),
    ("aime24", [{"ID": "2024-I-1", "Problem": "Find the remainder.", "Answer": 204, "Solution": "..."}], "ID"),
    ("deepscaler", [{"problem": "Let x = 2. Find x^2.", "answer": " 4 ", "solution": "x^2 = 4"}], "solution"),
])
def test_math_datasets_from_local_files(tmp_path, name, rows, meta_key):
    problems = load_problems(name, data_files=write_jsonl(tmp_path / f"{name}.jsonl", rows))
    question = rows[0].get("problem", rows[0].get("Problem"))
    answer = str(rows[0].get("answer", rows[0].get("Answer"))).strip()
    assert problems == [Problem(question=question, answer=answer, source=f"{name}:train:0")]
    assert problems[0].meta[meta_key] == rows[0][meta_key]


def test_empty_and_broken_local_files(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"dataset 'gsm8k' from .*empty.jsonl"):
        load_problems("gsm8k", data_files=tmp_path / "empty.jsonl")
    datasets.Dataset.from_dict({"problem": [], "answer": []}).to_parquet(str(tmp_path / "empty.parquet"))
    with pytest.raises(ValueError, match=r"dataset 'math500' from .*empty.parquet"):
        load_problems("math500", data_files=tmp_path / "empty.parquet")
    wrong = write_jsonl(tmp_path / "wrong.jsonl", [{"prompt": "q", "answer": "1"}])
    with pytest.raises(ValueError, match=r"needs one of the columns \('problem',\)"):
        load_problems("math500", data_files=wrong)
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_problems("gsm8k", data_files=tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="data_files must be files of one type"):
        load_problems("gsm8k", data_files=tmp_path / "data.txt")
    with pytest.raises(ValueError, match="no config overrides"):
        load_problems("gsm8k", data_files=wrong, level=3)


def test_hub_dataset_offline_fails_fast_with_a_clear_error(monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    start = time.perf_counter()
    with pytest.raises(FileNotFoundError, match=r"'HuggingFaceH4/MATH-500'.*data_files="):
        load_problems("math500")
    assert time.perf_counter() - start < 10


def test_sample_problems_is_seeded_and_distinct():
    problems = load_problems("add1", 50, seed=0)
    first = sample_problems(problems, 10, torch.Generator().manual_seed(1))
    assert first == sample_problems(problems, 10, torch.Generator().manual_seed(1))
    assert first != sample_problems(problems, 10, torch.Generator().manual_seed(2))
    assert len({p.source for p in first}) == 10
    with pytest.raises(ValueError, match="n must be <= the number of problems"):
        sample_problems(problems, 51, torch.Generator())


def test_build_prompt_with_and_without_chat_template():
    problem = load_problems("add1", 1, seed=0)[0]
    chat = build_prompt(problem, tiny_tokenizer(CHAT_TEMPLATE))
    shot = "Calculate 20 + 30.\nAnswer with just the number."  # the number format's one-shot example
    assert chat == (f"<user>{shot}</user><assistant>50</assistant>"
                    f"<user>{problem.question}\nAnswer with just the number.</user><assistant>")
    with_system = build_prompt(problem, tiny_tokenizer(CHAT_TEMPLATE), system_prompt="Be brief.")
    assert with_system.startswith(f"<system>Be brief.</system><user>{shot}</user>")
    plain = build_prompt(problem, tiny_tokenizer(None), system_prompt="Be brief.")
    assert plain == f"Be brief.\n\n{shot}\nAnswer: 50\n\n{problem.question}\nAnswer with just the number.\nAnswer:"
    boxed = Problem("Compute 1+1.", "2", "x")
    assert build_prompt(boxed, tiny_tokenizer(CHAT_TEMPLATE)) == \
        "<user>Compute 1+1.\nThink step by step, then put the final answer in \\boxed{}.</user><assistant>"
    with pytest.raises(ValueError, match="answer_format"):
        build_prompt(Problem("q", "1", "x", answer_format="latex"), tiny_tokenizer(None))


def test_disjoint_evaluation_holds_out_distinct_unseen_questions():
    """eval_disjoint: every held-out question is distinct and none is a training question; without it
    the other seed repeats training questions; a task too small for it is refused with its counts."""
    from grpo_lab.lm.text_task import eval_problems, train_problems
    from grpo_lab.lm.train_config import TrainConfig

    config = TrainConfig(task="add12", train_problems=300, eval_problems=200, eval_disjoint=True)
    seen = {p.question for p in train_problems(config)}
    held_out = [p.question for p in eval_problems(config)]
    assert len(held_out) == 200 == len(set(held_out)) and not seen & set(held_out)
    assert seen & {p.question for p in eval_problems(config.replace(eval_disjoint=False))}
    with pytest.raises(ValueError, match=r"task 'add1' gave 0 distinct questions outside its 2000 training"):
        eval_problems(TrainConfig(task="add1", eval_problems=50, eval_disjoint=True))
