"""Every route runs one step with the model and the batch on a device other than the CPU (tests/tagged_device.py:
CPU values tagged as ``cuda:0`` that refuse, as CUDA does, to meet a CPU tensor in one operation). A tensor that
a route builds on the CPU and hands to an operation on the device fails here, as it would on a GPU.

The routes: the loop with the in-process sampler, the TRL adapter's loss and diagnostics, the exact evaluators
(strict J and the digits LM) and the sync proof (weights' fingerprints, an engine's served fingerprints, the
behavioural audit). Each also checks that the model stayed on the device through the step, so the step ran there.
"""

import contextlib
import math

import pytest
import torch
import trl_two_process as two
from accelerate import Accelerator
from datasets import Dataset
from sync_faults import nudge
from tagged_device import DEVICE, is_on_device, move_module, on_device
from tiny_lm import BYTE_STOPS, EOS, PAD, VOCAB, EvenTokenTask, byte_tokenizer, flat_model, word_tokenizer
from transformers import Qwen2Config, Qwen2ForCausalLM, TrainingArguments

from grpo_lab import GRPOConfig, GRPOLoop, grpo_objective
from grpo_lab.exact.digits_lm import ExactLM
from grpo_lab.exact.strict_j import Sampling, strict_j
from grpo_lab.fingerprint import FUSIONS, prove
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.sampling import GenerateSampler, HFSampler
from grpo_lab.lm.sampling_vllm import served_fingerprints
from grpo_lab.lm.tasks import load_problems
from grpo_lab.objective import (
    IS_CORRECTIONS,
    LEVELS,
    RATIO_DIAGNOSTICS,
    loss_weights,
    offpolicy_split,
    ratio_diagnostics,
    tv_terms,
)
from grpo_lab.scale.trl import OffPolicyGRPOTrainer
from grpo_lab.sync_audit import JUDGED, SyncAudit, SyncError

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    """A random 2-layer Qwen2 (biased q/k/v projections, tied embeddings, GQA) over tiny_lm's word vocabulary."""
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         initializer_range=0.5, tie_word_embeddings=True, pad_token_id=PAD, eos_token_id=EOS,
                         bos_token_id=None)
    return Qwen2ForCausalLM(config).float()


def all_on_device(module: torch.nn.Module) -> bool:
    return all(is_on_device(t) for t in [*module.parameters(), *module.buffers()])


# ----------------------------------------------------------------------------- the stand-in itself

def test_a_cpu_tensor_meeting_the_device_fails_and_scalars_do_not():
    """What the routes' tests rely on: a CPU tensor of one or more dimensions beside a tagged one raises CUDA's
    error (the quantile levels built on the CPU included); 0-dim CPU tensors and numbers pass; moves tag and
    untag; what a route builds with ``device=`` a tagged tensor's device is tagged."""
    with on_device():
        x = torch.arange(6.0).to(DEVICE)
        for mixed in (lambda: x + torch.ones(6), lambda: torch.quantile(x, torch.tensor([0.5, 0.99])),
                      lambda: torch.cat([x, torch.zeros(1)])):
            with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
                mixed()
        with pytest.raises(TypeError, match="cuda:0"):
            x.numpy()
        assert is_on_device(x * torch.tensor(2.0) + 1) and is_on_device(torch.zeros(2, device=x.device))
        assert is_on_device(torch.quantile(x, torch.tensor([0.5, 0.99], device=x.device)))
        assert is_on_device(x[torch.tensor([0, 2])])                             # CUDA takes CPU indices
        assert not is_on_device(x.cpu()) and x.cpu().device.type == "cpu" and x.device == DEVICE
        assert x.sum().item() == 15.0 and x.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        linear = move_module(torch.nn.Linear(6, 2))
        linear(x).sum().backward()
        assert all_on_device(linear) and is_on_device(linear.weight.grad)
        assert isinstance(linear.weight, torch.nn.Parameter)


# ----------------------------------------------------------------------------- the loop, in-process sampler

def loop_step(sampler_type: type, on: bool, truncation: dict) -> tuple[GRPOLoop, dict]:
    """One step of GRPOLoop on a tiny Qwen2 with ``sampler_type``, on the device (``on``) or the CPU."""
    config = GRPOConfig(G=4, prompts_per_step=2, max_completion_length=6, lr=1e-2, steps=1, seed=0, beta=0.04, i=2,
                        micro_batch_size=4, offpolicy_split=True)
    model = tiny_qwen2()
    with on_device() if on else contextlib.nullcontext():
        if on:
            move_module(model)
        policy = LMPolicy(model, config.temperature, share_prompt=sampler_type is HFSampler)
        sampler = sampler_type(policy, word_tokenizer(), config.max_completion_length, **truncation)
        loop = GRPOLoop(policy, sampler, EvenTokenTask(), config)
        record = loop.step()
    return loop, record.to_dict()


@pytest.mark.parametrize("sampler_type, truncation", [(HFSampler, {}), (GenerateSampler, dict(top_p=0.9, top_k=20))],
                         ids=["HFSampler", "GenerateSampler-top_p-top_k"])
def test_the_loop_with_the_in_process_sampler(sampler_type, truncation):
    """One step (sync, proof, audit, sampling, π_ref, 2 passes in micro-batches, π_sync's split) on the device
    gives the CPU's record: the same tokens, loss and diagnostics."""
    loop, record = loop_step(sampler_type, True, truncation)
    assert all_on_device(loop.policy) and all_on_device(loop.sampler.model) and all_on_device(loop.reference)
    assert all(is_on_device(s) for state in loop.optimizer.state.values() for s in state.values())
    assert record["weights_audit"] == "proved" and not record["skipped"] and record["num_tokens"] > 0
    _, on_cpu = loop_step(sampler_type, False, truncation)
    timed = {key for key in record if key.endswith("seconds")}
    numbers = {key for key, value in record.items() if isinstance(value, float)} - timed
    assert {key: record[key] for key in numbers} == pytest.approx({key: on_cpu[key] for key in numbers}, rel=1e-5,
                                                                  abs=1e-7)
    assert {key: record[key] for key in record.keys() - numbers - timed} == {
        key: on_cpu[key] for key in record.keys() - numbers - timed}


# ----------------------------------------------------------------------------- the objective and its diagnostics

@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("is_correction", IS_CORRECTIONS)
def test_the_objective_and_its_diagnostics_on_the_device(is_correction, level):
    """grpo_objective (β > 0, its KL weight), ratio_diagnostics, tv_terms, offpolicy_split and loss_weights over
    stacked runs, on tensors on the device: the CPU's values, for every correction and level."""
    g = torch.Generator().manual_seed(0)
    B, T = 8, 5
    mask = torch.arange(T)[None] < torch.tensor([5, 3, 4, 1, 5, 2, 0, 4])[:, None]
    logp = -torch.rand(B, T, generator=g) * 3
    def near(scale: float) -> torch.Tensor:   # another policy's log-probabilities near logp (≤ 0, as required)
        return (logp + scale * torch.randn(B, T, generator=g)).clamp(max=0.0)

    batch = dict(logp=logp, logp_k=near(0.2), logp_alpha=near(0.4), logp_ref=near(0.3),
                 advantages=torch.randn(B, generator=g),
                 mask=mask, run_ids=torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]))
    options = dict(is_correction=is_correction, is_cap=1.3, is_floor=0.8 if is_correction == "icepop" else 0.5)

    def run(t: dict) -> dict:
        weights = loss_weights(t["mask"], "grpo", run_ids=t["run_ids"])
        loss, metrics = grpo_objective(t["logp"], t["logp_alpha"], t["advantages"], weights, logp_k=t["logp_k"],
                                       logp_ref=t["logp_ref"], beta=0.04, kl_weight_differentiable=True,
                                       level=level, **options)
        tv = tv_terms(t["logp_k"], t["logp_alpha"], t["mask"]).tolist()
        return {"loss": loss.item(), **metrics, **{f"tv_{b}": value for b, value in enumerate(tv)},
                **ratio_diagnostics(t["logp_k"], t["logp_alpha"], t["mask"], level=level, **options),
                **offpolicy_split(t["logp"], t["logp_k"], t["logp_alpha"], t["mask"])}

    with on_device():
        on = run({name: value.to(DEVICE) for name, value in batch.items()})
    assert set(RATIO_DIAGNOSTICS) <= set(on)
    assert on == pytest.approx(run(batch), rel=1e-6, abs=1e-9)


# ----------------------------------------------------------------------------- the TRL adapter

@pytest.fixture(scope="module")
def trl_model_dir(tmp_path_factory):
    return two.build_tiny_model(tmp_path_factory.mktemp("tiny_llama"))


@pytest.mark.parametrize("options", [dict(beta=0.04), dict(
    beta=0.0, top_p=0.9, top_k=5, is_correction="icepop", is_cap=1.5, is_floor=0.9,
    importance_sampling_level="sequence", num_iterations=2)], ids=["beta-token", "top_p-top_k-icepop-sequence-i2"])
def test_the_trl_adapters_loss_and_diagnostics(trl_model_dir, tmp_path, monkeypatch, options):
    """One generation batch through the adapter — sync, proof, audit, generation by α, log α, the step plan — and
    the loss with its diagnostics on each of its micro-batches, then the backward, with the trainer's device
    (accelerate's and the training arguments') the device. The model is put in training mode before it moves:
    switching a model that uses transformers' hub kernels asks ``torch.cuda`` for the card's capability, which
    this machine cannot answer (tests/tagged_device.py, *Limits*)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = two.make_config(str(tmp_path / "out"), 1, 8, max_completion_length=4, **options)
    trainer = OffPolicyGRPOTrainer(model=trl_model_dir, reward_funcs=two.word_reward, args=config,
                                   train_dataset=Dataset.from_dict({"prompt": list(two.TRAIN_PROMPTS)}))
    trainer.model.train()
    monkeypatch.setattr(Accelerator, "device", property(lambda self: DEVICE))
    monkeypatch.setattr(TrainingArguments, "device", property(lambda self: DEVICE))
    models = [m for m in (trainer.model, trainer.alpha_model, trainer.ref_model) if m is not None]
    with on_device():
        for model in models:
            move_module(model)
        trainer._prepare_inputs([{"prompt": p} for p in two.TRAIN_PROMPTS[:2] for _ in range(two.FIXED_G)])
        for inputs in trainer._buffered_inputs:
            assert all(is_on_device(v) for v in inputs.values() if torch.is_tensor(v) and v.dim() > 0)
            loss = trainer.compute_loss(trainer.model, inputs)
            assert is_on_device(loss) and math.isfinite(loss.item())
            loss.backward()
    assert all(all_on_device(m) for m in models)
    assert all(is_on_device(p.grad) for p in trainer.model.parameters())
    metrics = trainer._metrics["train"]
    assert metrics["off_policy/sync_proved"] == [1.0] and metrics["off_policy/synced"] == [1.0]
    for name in RATIO_DIAGNOSTICS:
        assert len(metrics[f"off_policy/{name}"]) == 2 and all(map(math.isfinite, metrics[f"off_policy/{name}"]))


# ----------------------------------------------------------------------------- the exact evaluators

def test_the_exact_evaluators():
    """Strict J's walk and one step of the digits LM's exact Theorem 1 on the device: the CPU's values."""
    tokenizer, problems = byte_tokenizer(), load_problems("add1", 2, seed=0)
    sampling = Sampling(0.7, 0.9, 5, 3)
    config = GRPOConfig(G=4, v=2, lr=1e-3, seed=0, beta=0.04, mask_zero_variance=False)  # trains on the KL alone

    def run(on: bool) -> tuple:
        model = flat_model(len(tokenizer))
        with on_device() if on else contextlib.nullcontext():
            if on:
                move_module(model)
            j = strict_j(model, tokenizer, ["a 1", "a a"], ["1", "8"], sampling, threshold=1e-4,
                         eos_token_ids=BYTE_STOPS)
            exact = ExactLM(model, tokenizer, problems[:1], config, max_tokens=2)
            step = exact.step()
        assert not exact.loop.history[0].skipped and all_on_device(model) == on
        return *j, step.J_k, step.J_next, step.bound, step.tv_next

    for on_device_value, on_cpu in zip(run(True), run(False), strict=True):
        assert on_device_value == pytest.approx(on_cpu, rel=1e-6, abs=1e-12)


# ----------------------------------------------------------------------------- the sync proof

class Product:
    """An engine's kernel for a linear layer (vLLM's ``quant_method``): y = x·Wᵀ, the only way it reads W."""

    def apply(self, layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return x @ layer.weight.t()


def engine_model(model: torch.nn.Module) -> torch.nn.Module:
    """π_θ's weights laid out as a vLLM engine serves them: q/k/v and gate/up fused (:data:`FUSIONS`), each linear
    layer read through its :class:`Product`, copies of π_θ's tensors on π_θ's device."""
    fused_name = {part: fused for fused, parts in FUSIONS for part in parts}
    served: dict[str, list[torch.Tensor]] = {}
    linear: set[str] = set()
    for name, tensor in model.named_parameters(remove_duplicate=False):
        *path, leaf = name.split(".")
        owner = ".".join([*path[:-1], fused_name.get(path[-1], path[-1])])
        served.setdefault(f"{owner}.{leaf}", []).append(tensor.detach())
        if isinstance(model.get_submodule(".".join(path)), torch.nn.Linear):
            linear.add(owner)
    engine = torch.nn.Module()
    for name, parts in served.items():
        *path, leaf = name.split(".")
        module = engine
        for depth, part in enumerate(path):
            if part not in module._modules:
                module.add_module(part, torch.nn.Module())
                if ".".join(path[:depth + 1]) in linear:
                    module._modules[part].quant_method = Product()
                    module._modules[part].input_size_per_partition = parts[0].shape[-1]
            module = module._modules[part]
        module.register_parameter(leaf, torch.nn.Parameter(torch.cat(parts).clone(), requires_grad=False))
    return engine


def probe_logprobs(model: torch.nn.Module, probe: torch.Tensor) -> torch.Tensor:
    """log p of each token of ``probe [n]`` after the ones before it: the audit's scores of a probe."""
    logp = torch.log_softmax(model(probe[None]).logits[0, :-1].float(), dim=-1)
    return logp.gather(-1, probe[1:, None])[:, 0]


def test_the_sync_proof():
    """On the device: HFSampler's proof of a good sync passes and of a sync that skipped a tensor names it; an
    engine's served fingerprints (fused tensors, columns read through its product) prove π_θ's weights and catch
    a stale engine; the behavioural audit refuses a sync that did not take and judges one that did."""
    model = tiny_qwen2()
    with on_device(), torch.no_grad():
        policy = LMPolicy(move_module(model))
        sampler = HFSampler(policy, word_tokenizer(), 4)
        sampler.prove_sync(policy, step=0)
        engine = engine_model(policy.model)
        assert all_on_device(engine) and any(n.endswith("qkv_proj.bias") for n, _ in engine.named_parameters())
        served = served_fingerprints(engine, step=3)
        assert {kind for kind, _, _ in served.values()} == {"elements", "columns"}
        sources = dict(policy.model.named_parameters(remove_duplicate=False))
        prove(served, sources, step=3)
        probe = torch.arange(3, 12).to(DEVICE)
        audit = SyncAudit.for_dtype(torch.float32)
        audit.check(probe_logprobs(policy.model, probe), probe_logprobs(sampler.model, probe), 0)

        nudge(policy.model, scale=0.2)                                          # π_θ moves; nothing synced yet
        with pytest.raises(SyncError, match="did not take"):                   # α's behaviour did not follow
            audit.check(probe_logprobs(policy.model, probe), probe_logprobs(sampler.model, probe), 1)
        with pytest.raises(SyncError, match="did not take"):                   # the engine kept its old weights
            prove(served_fingerprints(engine, step=4), sources, step=4)
        held = dict(policy.model.named_parameters())
        for name, tensor in sampler.model.named_parameters():                  # a sync that skips one tensor
            if name != "model.norm.weight":
                tensor.copy_(held[name])
        with pytest.raises(SyncError, match="'model.norm.weight' differs"):
            sampler.prove_sync(policy, step=5)
        sampler.sync(policy)
        sampler.prove_sync(policy, step=6)
        assert audit.check(probe_logprobs(policy.model, probe), probe_logprobs(sampler.model, probe), 6) == JUDGED
