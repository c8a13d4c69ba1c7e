"""TRL's surface under the adapter (grpo_lab.scale.trl_surface.SURFACE), checked row by row against the
installed TRL: each member exists, a method has the parameters the adapter passes (an override TRL's exact
parameters), each evidence fragment is still in TRL's source, and, where cheap, the behaviour relied on (on
a tiny random Llama). Every failure names the member, the installed TRL and the one SURFACE was verified
against; grpo_lab/scale/trl.py may touch no private TRL member that SURFACE does not list."""

import ast
import collections
import dataclasses
import importlib
import importlib.util
import inspect
import re
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import trl
from datasets import Dataset

import grpo_lab.scale.trl as adapter
from grpo_lab.scale.trl import OffPolicyGRPOConfig, OffPolicyGRPOTrainer
from grpo_lab.scale.trl_surface import FORWARD_KEYS, KINDS, SURFACE, VERIFIED_TRL, Touch

ROOT = Path(__file__).resolve().parents[1]
INSTALLED = trl.__version__
_spec = importlib.util.spec_from_file_location("trl_two_process", ROOT / "tests" / "trl_two_process.py")
two = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(two)


def where(name: str) -> str:
    return f"{name} (TRL {INSTALLED} installed; grpo_lab.scale.trl_surface verified against TRL {VERIFIED_TRL})"


def resolve(path: str) -> Any:
    """The object at a dotted path such as ``trl.GRPOTrainer.__init__``: the longest importable module
    prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name, None)
            assert found is not None, f"{where(path)}: no {name!r} there any more"
        return found
    raise AssertionError(f"{where(path)}: cannot import it")


def test_installed_trl_is_the_verified_series():
    installed = tuple(int(x) for x in INSTALLED.split(".")[:2])
    verified = tuple(int(x) for x in VERIFIED_TRL.split(".")[:2])
    assert installed == verified, (
        f"TRL {INSTALLED} is installed but grpo_lab.scale.trl_surface.SURFACE was verified against TRL "
        f"{VERIFIED_TRL}: read each row's `relies` in the new TRL source, fix the adapter where it changed, "
        "then set VERIFIED_TRL and the pin in pyproject.toml")


@pytest.mark.parametrize("touch", SURFACE, ids=lambda t: f"{t.owner}.{t.member}")
def test_member_is_still_there(touch: Touch):
    name = where(f"{touch.owner}.{touch.member}")
    assert touch.kind in KINDS, touch
    owner = resolve(touch.owner)
    if touch.kind in ("method", "override"):
        member = getattr(owner, touch.member, None)
        assert callable(member), f"{name}: gone (the adapter relies on: {touch.relies})"
        parameters = list(inspect.signature(member).parameters)
        missing = [p for p in touch.params if p not in parameters]
        assert not missing, f"{name}: parameters {missing} gone; it takes {parameters}"
        if touch.kind == "override":
            assert touch.member in vars(OffPolicyGRPOTrainer), f"{touch.member} is no override of the adapter's"
            ours = list(inspect.signature(getattr(OffPolicyGRPOTrainer, touch.member)).parameters)
            assert ours == parameters, f"{name}: TRL's parameters are {parameters}, the adapter's override {ours}"
    elif touch.kind == "attribute":
        assigned = re.search(rf"\bself\.{touch.member}\s*=[^=]", inspect.getsource(owner))
        assert hasattr(owner, touch.member) or assigned, f"{name}: no longer set (relied on: {touch.relies})"
    elif touch.kind == "global":
        imported = re.search(rf"^\s*from \S+ import .*\b{touch.member}\b", inspect.getsource(owner), re.MULTILINE)
        assert hasattr(owner, touch.member) or imported, f"{name}: no longer a module-level name"
    else:
        assert touch.member in {f.name for f in dataclasses.fields(owner)}, f"{name}: no longer a config field"
    for path, fragment in touch.evidence:
        assert fragment in inspect.getsource(resolve(path)), (
            f"{name}: {path} no longer contains {fragment!r}; the adapter relies on: {touch.relies}")


def test_every_private_touch_of_the_adapter_is_listed():
    """Each ``._name`` in grpo_lab/scale/trl.py is the adapter's own (defined or assigned there) or a SURFACE
    member, and each ``from trl.… import X`` / ``import trl.…`` names a SURFACE row's owner."""
    source = inspect.getsource(adapter)
    tree = ast.parse(source)
    own = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef))}
    own |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) and node.value.id == "self"}
    own |= {name.id for node in tree.body if isinstance(node, ast.Assign) for name in node.targets
            if isinstance(name, ast.Name)}
    listed = {touch.member for touch in SURFACE}
    private = set(re.findall(r"\.(_[A-Za-z]\w*)", source)) - own - {"__post_init__", "__init__"}
    assert private <= listed | own, f"private TRL member(s) {sorted(private - listed - own)} used but not in SURFACE"
    assert "_last_loaded_step" in own and "_last_loaded_step" in listed
    overrides = {name for name in vars(OffPolicyGRPOTrainer) if not name.startswith("__")
                 and hasattr(trl.GRPOTrainer, name)}
    rows = {touch.member for touch in SURFACE if touch.kind == "override"}
    assert overrides == rows, f"TRL methods the adapter overrides {sorted(overrides)}, SURFACE lists {sorted(rows)}"
    owners = {(touch.owner, touch.member) for touch in SURFACE}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] == "trl":
            for alias in node.names:
                assert (node.module, alias.name) in owners, f"from {node.module} import {alias.name}: not in SURFACE"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("trl."):
                    assert alias.name in {o for o, _ in owners}, f"import {alias.name}: no SURFACE row owns it"


def test_redeclared_and_required_config_fields_are_trl_fields():
    """The TRL fields OffPolicyGRPOConfig declares again are exactly the ``field`` rows (so none of the
    adapter's own fields shadows a new TRL field), and each value the adapter pins is a TRL field."""
    trl_fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    declared = set(vars(OffPolicyGRPOConfig)["__annotations__"])
    rows = {touch.member for touch in SURFACE if touch.kind == "field"}
    assert declared & trl_fields == rows, where(f"OffPolicyGRPOConfig fields shared with trl.GRPOConfig: "
                                                f"{sorted(declared & trl_fields)}, SURFACE lists {sorted(rows)}")
    assert set(adapter._REQUIRED) <= trl_fields, where(f"pinned fields {set(adapter._REQUIRED) - trl_fields}")


def test_trl_pushes_weights_only_where_last_loaded_step_disarms_it():
    """The ``_last_loaded_step`` property relies on TRL's GRPOTrainer pushing π_θ to vLLM only under
    ``if [self.use_vllm and] self.state.global_step != self._last_loaded_step:``. A TRL that pushes
    anywhere else, or guards its pushes otherwise, would sync α every step: this fails."""
    source = inspect.getsource(trl.GRPOTrainer)
    pushes = source.count("vllm_generation.sync_weights()")
    guarded = re.findall(r"if (?:self\.use_vllm and )?self\.state\.global_step != self\._last_loaded_step:\n"
                         r"\s+with profiling_context\(self, \"sync_weights\"\):\n"
                         r"\s+self\.vllm_generation\.sync_weights\(\)", source)
    assert pushes >= 1 and len(guarded) == pushes, where(f"GRPOTrainer: {pushes} pushes, {len(guarded)} guarded")


def test_vllm_engine_is_built_by_the_module_name_without_dtype_or_enforce_eager(monkeypatch):
    """TRL calls the module-level ``LLM`` with neither ``dtype`` nor ``enforce_eager`` (so the adapter's
    defaults are the ones used), and ``_engine_arguments`` adds both to that one call, then restores it."""
    import trl.generation.vllm_generation as generation

    init = ast.parse(inspect.getsource(generation.VLLMGeneration))
    calls = [node for node in ast.walk(init) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id == "LLM"]
    assert len(calls) == 1, where(f"VLLMGeneration builds LLM {len(calls)} times")
    keywords = {k.arg for k in calls[0].keywords}
    assert not keywords & {"dtype", "enforce_eager"}, where(f"VLLMGeneration now passes {keywords}")

    built = []
    monkeypatch.setattr(generation, "LLM", lambda *args, **kwargs: built.append(kwargs), raising=False)
    trainer = types.SimpleNamespace(args=types.SimpleNamespace(bf16=False, fp16=False),
                                    model=types.SimpleNamespace(dtype=torch.float64))
    stand_in = generation.LLM
    with adapter._engine_arguments(trainer, enforce_eager=True):
        generation.LLM(model="m", seed=0)
    assert generation.LLM is stand_in
    assert built == [{"model": "m", "seed": 0, "dtype": torch.float64, "enforce_eager": True}]


def test_add_fused_lm_head_patches_the_instance(tmp_path):
    """``add_fused_lm_head`` patches the instance's ``forward`` (which a deep copy carries along, still calling
    the original's forward), so the adapter's ``_make_alpha`` drops it and patches the copy again: then both
    the plain forward (generation) and the fused one (scoring) run on the copy's own weights."""
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    model = AutoModelForCausalLM.from_pretrained(two.build_tiny_model(tmp_path / "tiny"))
    add_fused_lm_head(model, temperature=1.0, cast_lm_head_to_fp32=False)
    assert "forward" in vars(model), where("trl.trainer.utils.add_fused_lm_head no longer patches the instance")
    trainer = types.SimpleNamespace(
        model=model, temperature=1.0, args=types.SimpleNamespace(cast_lm_head_to_fp32=False),
        _dist=types.SimpleNamespace(is_zero3=False, is_fsdp=False),
        accelerator=types.SimpleNamespace(unwrap_model=lambda m: m))
    alpha = OffPolicyGRPOTrainer._make_alpha(trainer)
    ids = torch.tensor([[2, 3, 4, 5]])
    with torch.no_grad():
        alpha.lm_head.weight.zero_()  # a uniform next-token distribution, on the copy only
        logits = alpha(input_ids=ids).logits
        log_probs = alpha(input_ids=ids, labels=ids, fused_lm_head=True).log_probs
        original = model(input_ids=ids).logits
    assert bool((logits == 0).all()) and bool((original != 0).any()), where("add_fused_lm_head: plain forward")
    expected = -torch.log(torch.tensor(float(alpha.config.vocab_size))).expand(1, 3)
    assert torch.allclose(log_probs, expected, atol=1e-6), where("add_fused_lm_head: fused forward")


def test_batch_and_bookkeeping_of_a_plain_grpo_trainer(tmp_path):
    """A plain ``trl.GRPOTrainer`` on the tiny Llama: the attributes the adapter reads exist; one batch has
    the keys it reads; ``_calculate_rewards`` gives [N, F]; ``_get_per_token_logps_and_entropies`` gives
    (log-probs, entropies, aux) of shape [N, T]; ``_metrics``, ``_logs`` and ``_dist`` are as used."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = trl.GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                              max_completion_length=4, use_cpu=True, bf16=False, report_to="none",
                              disable_tqdm=True, seed=0)
    trainer = trl.GRPOTrainer(model=two.build_tiny_model(tmp_path / "tiny"), args=args,
                              reward_funcs=lambda completions, **_: [float(j % 2) for j in range(len(completions))],
                              train_dataset=Dataset.from_dict({"prompt": list(two.TRAIN_PROMPTS)}))
    for touch in SURFACE:
        if touch.owner == "trl.GRPOTrainer" and touch.kind == "attribute" and touch.member not in (
                "_last_loaded_step", "vllm_generation"):  # both exist only with use_vllm
            assert hasattr(trainer, touch.member), where(f"GRPOTrainer().{touch.member}")
    rewards = []
    calculate = trainer._calculate_rewards
    trainer._calculate_rewards = lambda *a: rewards.append(calculate(*a)) or rewards[-1]
    trainer.model.train()
    rows = [{"prompt": p} for p in two.TRAIN_PROMPTS[:2] for _ in range(4)]
    out = trainer._generate_and_score_completions(rows)

    assert {"prompt_ids", "prompt_mask", "completion_ids", "completion_mask"} <= set(out), where(sorted(out))
    assert len(rewards) == 1 and rewards[0].shape == (8, 1), where("_calculate_rewards")
    assert isinstance(trainer._metrics["train"], collections.defaultdict) and set(trainer._metrics) >= {"train",
                                                                                                        "eval"}
    assert len(trainer._logs["advantages"]) == 8 and hasattr(trainer._logs["advantages"], "extend")
    assert (trainer._dist.is_zero3, trainer._dist.is_fsdp) == (False, False)
    ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
    mask = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
    T = out["completion_ids"].shape[1]
    result = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, T, batch_size=4,
                                                         compute_entropy=True)
    assert len(result) == 3, where("_get_per_token_logps_and_entropies returns")
    logps, entropies, _ = result
    assert logps.shape == entropies.shape == (8, T) and bool((logps <= 0).all()), where("log-probs")
    parameters = inspect.signature(trl.GRPOTrainer._get_per_token_logps_and_entropies).parameters
    assert set(FORWARD_KEYS) <= set(parameters), where(f"forward keys {set(FORWARD_KEYS) - set(parameters)}")
