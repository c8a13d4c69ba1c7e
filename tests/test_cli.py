"""``grpo-lab`` at the command line as a new user meets it: numbers written as users write them, and
``eval --checkpoint`` under the checkpoint's own config (``--exact`` included)."""

import json
import typing

import numpy as np
import pytest
from tiny_lm import byte_tokenizer, flat_model, perturb

from grpo_lab import cli
from grpo_lab.exact.strict_j import Sampling, exact_evaluate
from grpo_lab.lm.recipes import load_config
from grpo_lab.lm.train_config import TrainConfig

HINTS = typing.get_type_hints(TrainConfig)
FLOATS = sorted(n for n, h in HINTS.items() if float in (typing.get_args(h) or (h,)))
INTS = sorted(n for n, h in HINTS.items() if int in (typing.get_args(h) or (h,)))
SPELLINGS = {0.5: ["5e-1", "5E-1", ".5", "+.5", "0.5", "50e-2"], 5.0: ["5e0", "5.", "5E+0", "50E-1", "5.0"],
             10: ["10", "1e1", "1E1", "+1e1", "100e-1"], 0: ["0", "0e0", "-0"]}


def valid(name, value):
    try:
        TrainConfig(**{name: value})
    except ValueError:
        return False
    return True


def test_every_numeric_field_reads_numbers_as_a_user_writes_them(tmp_path):
    assert len(FLOATS) >= 12 and len(INTS) >= 15, (FLOATS, INTS)  # every numeric field, not a few
    for fields, values in ((FLOATS, (0.5, 5.0)), (INTS, (10, 0))):
        for name in fields:
            value = next(v for v in values if valid(name, v))
            for text in SPELLINGS[value]:
                assert getattr(load_config(None, [f"{name}={text}"]), name) == value, (name, text)
                recipe = tmp_path / "recipe.yaml"
                recipe.write_text(f"{name}: {text}\n")
                assert getattr(load_config(recipe), name) == value, (name, text, "in a YAML file")


def test_a_number_a_field_refuses_is_named_as_the_number():
    with pytest.raises(ValueError, match=r"lr must be a finite number in \(0.0, inf\], got -0.001"):
        load_config(None, ["lr=-1e-3"])
    with pytest.raises(ValueError, match=r"steps must be an integer >= 0, got '2.5e0'"):
        load_config(None, ["steps=2.5e0"])
    with pytest.raises(ValueError, match="scoring must be one of"):
        load_config(None, ["scoring=1e-5"])  # a text field keeps the text


def test_the_command_line_takes_lr_1e_5(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--set", "lr=1e-5", "--set", "v=0"])  # v refused: parsing got past lr
    assert exit_.value.code == 2
    assert "v must be an integer >= 1, got 0" in capsys.readouterr().err


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A real checkpoint of a tiny model, trained config v = 2, π_θ moved away from the saved model's weights."""
    from grpo_lab.lm.build import build_loop
    from grpo_lab.lm.checkpoint import save_checkpoint
    from grpo_lab.lm.models import load_policy
    from grpo_lab.lm.tasks import load_problems

    root = tmp_path_factory.mktemp("cli")
    tokenizer = byte_tokenizer()
    flat_model(len(tokenizer)).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    model, tokenizer = load_policy(str(root / "model"))
    config = TrainConfig(model=str(root / "model"), task="add1", v=2, G=2, prompts_per_step=1, max_completion_length=3,
                         eval_problems=2, steps=1, output_dir=str(root / "run"), sync_audit=False)
    loop = build_loop(config, model, tokenizer, problems=load_problems("add1", 4))
    perturb(loop.policy, scale=0.3)
    save_checkpoint(loop, root / "checkpoint.pt")
    return root, loop.policy.model, tokenizer, config


def test_eval_of_a_checkpoint_takes_its_config_and_the_evaluation_settings(checkpoint, capsys):
    from grpo_lab.lm.tasks import load_problems

    root, trained, tokenizer, config = checkpoint
    out = root / "exact.json"
    code = cli.main(["eval", "--checkpoint", str(root / "checkpoint.pt"), "--exact", "--out", str(out), "--quiet",
                     "--set", "eval_problems=3", "--set", "v=4", "--set", "lr=1e-5", "--set", "top_k=20"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "'v': (4, 2)" in captured.err and "'lr': (1e-05, 1e-06)" in captured.err  # told, not refused
    result = json.loads(out.read_text())
    assert result["temperature"] == 1.0 and result["top_k"] == 20 and result["max_tokens"] == 3
    assert len(result["rows"]) == 3 and set(result["rows"][0]) == {"question", "prompt", "gold", "j_low", "pruned",
                                                                    "threshold"}
    problems = load_problems("add1", 3, seed=config.seed + 10_000)  # eval_problems: another seed of the task
    expected = exact_evaluate(trained, tokenizer, problems, Sampling(1.0, 1.0, 20, 3))  # the checkpoint's π_θ
    assert [r["prompt"] for r in result["rows"]] == [r["prompt"] for r in expected.rows]
    np.testing.assert_allclose([r["j_low"] for r in result["rows"]], expected.j_low, rtol=1e-6)
    assert expected.mean > 0 and result["mean_j_low"] == pytest.approx(expected.mean)
    assert json.loads(captured.out.strip().splitlines()[-1])["mean_j_low"] == pytest.approx(expected.mean)


@pytest.mark.parametrize("change", ["temperature=0.5", "dtype=bfloat16"])
def test_eval_of_a_checkpoint_refuses_what_changes_the_model(checkpoint, capsys, change):
    root = checkpoint[0]
    assert cli.main(["eval", "--checkpoint", str(root / "checkpoint.pt"), "--set", change, "--exact"]) == 2
    threads, err = capsys.readouterr().err.split("\n", 1)     # the thread count it chose, then the error
    assert threads.startswith("grpo-lab eval: torch threads: ")
    assert err.startswith("grpo-lab eval: error: these settings change the model being evaluated")
    assert repr(change.split("=")[0]) in err
