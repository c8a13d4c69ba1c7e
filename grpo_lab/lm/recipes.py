"""Recipes: the YAML files of ``grpo_lab/configs/`` read into a :class:`~grpo_lab.lm.train_config.TrainConfig`.

A recipe is a flat YAML mapping of TrainConfig fields; ``key=value`` overrides (``--set`` on the
command line) replace one field, the value read as YAML (``v=4``, ``eps_high=0.28``,
``report_to=[tensorboard]``). A launch recipe (:func:`load_launch_recipe`) may also hold a ``trl:``
mapping and an ``orz_data_files:`` path. ``grpo-lab`` (:mod:`grpo_lab.cli`), ``python -m
grpo_lab.scale.launch`` and the notebooks (:func:`recipe`) all read recipes here.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from ..checks import require_choice
from ..config import FULL_ENV, full_mode, smoke_mode
from .train_config import TrainConfig

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
"""The recipes, shipped with the package (package data): ``grpo_lab/configs/``."""


def recipe_path(path: str | Path) -> Path:
    """A recipe file: ``path`` if it is a file, else the bundled recipe of that name (``cpu_arith_smollm2``,
    with or without ``.yaml``, in :data:`CONFIG_DIR`), so ``--config <name>`` works outside a checkout. Neither
    is a FileNotFoundError naming the path and the bundled recipes."""
    path = Path(path)
    if path.is_file():
        return path
    bundled = CONFIG_DIR / (path.name if path.suffix == ".yaml" else f"{path.name}.yaml")
    if path.parent == Path(".") and bundled.is_file():
        return bundled
    names = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
    raise FileNotFoundError(f"config file {str(path)!r} does not exist, nor is it a bundled recipe (one of {names})")


def read_recipe(path: str | Path | None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The mapping a YAML recipe (:func:`recipe_path`) holds (empty for None), with ``key=value`` overrides
    applied."""
    values: dict[str, Any] = {}
    if path is not None:
        path = recipe_path(path)
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"config file {str(path)!r} must hold a mapping of TrainConfig fields")
        values = loaded
    return with_overrides(values, overrides)


def with_overrides(values: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of ``values`` with each ``key=value`` of ``overrides`` set (the value read as YAML)."""
    values = dict(values)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"an override takes key=value, got {item!r}")
        values[key.strip()] = yaml.safe_load(raw)
    return values


def train_config(values: Mapping[str, Any]) -> TrainConfig:
    """A :class:`TrainConfig` of ``values``; a key that is not a field is an error naming it. A string given to
    a numeric field is read as the number a user wrote (:func:`user_numbers`)."""
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown config field(s) {unknown}; fields are {sorted(known)}")
    return TrainConfig(**user_numbers(values))


_FLOAT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def user_numbers(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with each string given to a numeric TrainConfig field read as a number, the way a user writes
    one: YAML 1.1 reads ``1e-5``, ``1E-5`` and ``-1e-3`` (an exponent without a dot) as strings, so ``lr=1e-5``
    would otherwise be refused. A float field takes ``1e-5``, ``.5``, ``5.``; an int field takes an integral
    one (``1e3`` → 1000). Anything else is left for the field's own check to refuse, naming it."""
    hints = typing.get_type_hints(TrainConfig)
    out = dict(values)
    for name, value in values.items():
        kinds = typing.get_args(hints[name]) or (hints[name],)
        if not isinstance(value, str) or not _FLOAT.fullmatch(value.strip()):
            continue
        number = float(value)
        if float in kinds:
            out[name] = number
        elif int in kinds and number.is_integer():
            out[name] = int(number)
    return out


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> TrainConfig:
    """A :class:`TrainConfig` from a YAML file and ``key=value`` overrides; unknown keys are errors."""
    return train_config(read_recipe(path, overrides))


@dataclass(frozen=True)
class LaunchRecipe:
    """What ``python -m grpo_lab.scale.launch`` runs.

    ================== =================================================================
    ``config``         the TrainConfig fields of the YAML (a ``grpo_lab/configs/*.yaml`` recipe)
    ``trl``            its ``trl:`` mapping: extra :class:`~grpo_lab.scale.trl.OffPolicyGRPOConfig`
                       fields (vLLM mode, tensor parallelism, memory share)
    ``orz_data_files`` its ``orz_data_files:`` path: orz-math-57k's JSON, which then
                       replaces ``config.task`` as the training problems
                       (:func:`~grpo_lab.lm.tasks.load_orz`)
    ================== =================================================================
    """

    config: TrainConfig
    trl: dict[str, Any] = field(default_factory=dict)
    orz_data_files: str | None = None


def load_launch_recipe(path: str | Path, overrides: Sequence[str] = (),
                       trl_overrides: Sequence[str] = ()) -> LaunchRecipe:
    """A :class:`LaunchRecipe` from YAML; ``key=value`` overrides (YAML values) of the recipe's
    fields (``orz_data_files`` included) and of its ``trl:`` fields."""
    values = read_recipe(path)
    extras = with_overrides(values.pop("trl", None) or {}, trl_overrides)
    values = with_overrides(values, overrides)
    orz = values.pop("orz_data_files", None)
    return LaunchRecipe(train_config(values), extras, None if orz is None else str(orz))


# ----------------------------------------------------------------------------- the notebooks' recipes

def run_mode() -> str:
    """``smoke`` (``GRPO_LAB_SMOKE``, CI; it wins over the other), ``full`` (``GRPO_LAB_FULL=1`` on a machine with a
    CUDA GPU: the GPU sections start their long runs) or ``reduced`` (the default, on a GPU too: the GPU sections
    print what each run costs and its command). ``GRPO_LAB_FULL=1`` where torch sees no CUDA device is a
    RuntimeError."""
    if smoke_mode():
        return "smoke"
    if not full_mode():
        return "reduced"
    if not torch.cuda.is_available():
        raise RuntimeError(f"{FULL_ENV}=1 asks for the GPU recipes' runs, but torch sees no CUDA device: unset it "
                           "(the GPU sections then print each run's cost and command)")
    return "full"


RUNS_DIR_ENV = "GRPO_LAB_RUNS_DIR"


def run_dir(name: str) -> str:
    """Where a notebook's run ``name`` writes: ``$GRPO_LAB_RUNS_DIR/<name>``, by default ``runs/<name>``.
    ``make test-notebooks`` points it at a temporary folder that it removes afterwards: a SmolLM2
    checkpoint (π_θ, α, π_ref, AdamW's moments) takes ~2 GB, and CI's smoke runs write three."""
    return str(Path(os.environ.get(RUNS_DIR_ENV) or "runs") / name)


def recipe_arg(name: str) -> str:
    """Bundled recipe ``name`` as the commands name it (docs/recipes.md, the recipes' headers): the path
    ``grpo_lab/configs/<name>.yaml`` relative to a checkout. A ValueError if no such recipe is bundled."""
    if not (CONFIG_DIR / f"{name}.yaml").is_file():
        raise ValueError(f"no bundled recipe {name!r} in {CONFIG_DIR}")
    return f"{CONFIG_DIR.parent.name}/{CONFIG_DIR.name}/{name}.yaml"


def train_command(name: str) -> str:
    """The shell line that trains recipe ``name`` in one process: ``grpo-lab train --config <recipe>``."""
    return shlex.join(["grpo-lab", "train", "--config", recipe_arg(name)])


def eval_command(name: str, trained: bool = True) -> str:
    """The shell line that scores recipe ``name``'s model on its held-out questions: the checkpoint that
    ``grpo-lab train`` wrote, or (``trained=False``) the untrained model."""
    checkpoint = ["--checkpoint", f"{recipe(name).output_dir}/checkpoint.pt"] if trained else []
    return shlex.join(["grpo-lab", "eval", "--config", recipe_arg(name), *checkpoint])


def recipe(name: str, **changes: Any) -> TrainConfig:
    """``grpo_lab/configs/<name>.yaml`` as a :class:`TrainConfig`, with ``changes`` applied."""
    return load_config(CONFIG_DIR / f"{name}.yaml").replace(**changes)


GSM8K_RECIPES = {name: f"gsm8k_qwen05b_{name}" for name in ("onpolicy", "masked", "offpolicy_v10", "reuse_i10")}
"""The paper's four GSM8K runs on Qwen2.5-0.5B-Instruct (notebook 02's GPU section), by short name."""


def gsm8k_lab_configs(mode: str) -> dict[str, TrainConfig]:
    """Notebook 02's GSM8K section. ``full``: the paper's four configurations on
    Qwen2.5-0.5B-Instruct (:data:`GSM8K_RECIPES`). ``smoke``: the same code path on SmolLM2-135M, one-digit
    additions, v = 1 vs v = 4, shrunk to a few tiny steps (CI checks the plumbing). Without either the notebook
    prints the full runs' costs and commands (no runs there)."""
    require_choice("mode", mode, ("smoke", "full"))
    if mode == "full":
        return {name: recipe(file) for name, file in GSM8K_RECIPES.items()}
    shrink = dict(G=3, prompts_per_step=2, max_completion_length=4, steps=5, micro_batch_size=6,
                  checkpoint_every=0, eval_problems=2, eval_samples=2)
    return {f"v={v}": recipe("cpu_arith_smollm2", v=v, output_dir=run_dir(f"nb02_smoke_v{v}"), **shrink)
            for v in (1, 4)}
