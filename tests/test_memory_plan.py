"""The memory guard's plan per device, without a GPU: the recipes on the recorded cards (DEVICES) at the shapes of
their models, laid out as their accelerate configs say; which terms a CPU, a GPU, vLLM, DDP and ZeRO-3 change; the
override."""

from __future__ import annotations

import dataclasses
import math

import pytest
import yaml

from grpo_lab.lm.memory import (
    BUDGET_FRACTION,
    CUDA_RESERVED,
    DEVICES,
    HEAP_RETENTION,
    TRL_LOGPROB_TILE,
    VLLM_CPU_ENGINE_FIXED,
    VLLM_CPU_ENGINE_W,
    Device,
    Layout,
    ModelShape,
    estimate_memory,
    gib,
    packed_mask_entries,
    plan_for,
    sampler_tensor_bytes,
)
from grpo_lab.lm.recipes import CONFIG_DIR, load_config, load_launch_recipe
from grpo_lab.lm.train_config import TrainConfig
from grpo_lab.scale import launch as gl


def qwen2_shape(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int,
                tied: bool) -> ModelShape:
    """A Qwen2 decoder from its config.json's numbers, as the recipes load it: float32 weights, all trainable,
    bfloat16 forwards (``dtype: bfloat16``). Parameters: embeddings (and an untied LM head), per layer q, k, v with
    their biases, o, the three MLP matrices and two RMSNorms, and the final norm."""
    d = hidden // heads
    layer = 2 * hidden * hidden + 2 * hidden * kv_heads * d + hidden + 2 * kv_heads * d + 3 * hidden * intermediate
    params = vocab * hidden * (1 if tied else 2) + layers * (layer + 2 * hidden) + hidden
    return ModelShape(weights=4 * params, trainable=4 * params, element_size=4, layers=layers, hidden=hidden,
                      intermediate=intermediate, vocab=vocab, heads=heads, kv_heads=kv_heads, head_dim=d,
                      compute_element_size=2)


# hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, vocab_size and
# tie_word_embeddings of each model's config.json on the Hugging Face hub
QWEN05B = qwen2_shape(896, 4864, 24, 14, 2, 151936, tied=True)         # Qwen/Qwen2.5-0.5B-Instruct
R1_1P5B = qwen2_shape(1536, 8960, 28, 12, 2, 151936, tied=False)       # deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B
QWEN7B = qwen2_shape(3584, 18944, 28, 28, 4, 152064, tied=False)       # Qwen/Qwen2.5-7B
GSM8K = ("gsm8k_qwen05b_onpolicy", "gsm8k_qwen05b_masked", "gsm8k_qwen05b_offpolicy_v10", "gsm8k_qwen05b_reuse_i10")
DEEPSCALER = ("deepscaler_r1distill_1p5b_onpolicy", "deepscaler_r1distill_1p5b_offpolicy_v10")
QWEN7B_COLOCATE = ("qwen7b_orz_colocate_v1", "qwen7b_orz_colocate_v10")
LOOP = Layout()
PROMPT_LENGTHS = (256, 1024)
"""Lp the plans are made at: the recipes' prompts in their chat templates, short to long (a live plan measures the
longest prompt of the task itself)."""


def recipe(name: str) -> tuple[TrainConfig, dict]:
    """A recipe's TrainConfig and its ``trl:`` mapping."""
    launch = load_launch_recipe(CONFIG_DIR / f"{name}.yaml")
    return launch.config, launch.trl


def accelerate_layout(name: str, vllm_share: float) -> Layout:
    """The TRL route as ``grpo_lab/configs/accelerate/<name>.yaml`` lays it out: DeepSpeed ZeRO-3 splits weights,
    gradients and optimiser over all its processes; DDP (MULTI_GPU) gives each process a whole replica."""
    accelerate = yaml.safe_load((CONFIG_DIR / "accelerate" / f"{name}.yaml").read_text())
    zero3 = accelerate["distributed_type"] == "DEEPSPEED" and accelerate["deepspeed_config"]["zero_stage"] == 3
    assert accelerate["num_processes"] == DEVICES["8x80GB"].count
    return Layout("trl", accelerate["num_processes"] if zero3 else 1, vllm_share)


def refusal(shape: ModelShape, config: TrainConfig, prompt_length: int, device: Device,
            layout: Layout = LOOP) -> str:
    """The guard's error for a run that does not fit, checked to name its figures: the bytes the run needs at
    micro-batch 1 and the bytes there are."""
    with pytest.raises(ValueError, match="memory guard: the run needs about") as refused:
        plan_for(shape, config, prompt_length, device, layout)
    need = estimate_memory(shape, config, prompt_length, 1, device, layout)
    assert f"needs about {gib(need.new)}" in str(refused.value)
    assert "even with micro_batch_size = 1, but only" in str(refused.value)
    return str(refused.value)


def test_the_shapes_have_their_models_published_sizes():
    """0.49B, 1.78B and 7.62B parameters, as the hub's model cards give them."""
    assert [round(s.weights / 4 / 1e9, 2) for s in (QWEN05B, R1_1P5B, QWEN7B)] == [0.49, 1.78, 7.62]


@pytest.mark.parametrize("prompt_length", PROMPT_LENGTHS)
@pytest.mark.parametrize("name", GSM8K)
def test_the_gsm8k_recipes_fit_one_80gb_card_at_their_micro_batch(name, prompt_length):
    """`grpo-lab train` on one GPU: the loop, α an in-process copy (the recipes' sampler), no heap term; a 16 GB
    card is refused."""
    config, _ = recipe(name)
    assert (config.sampler, config.micro_batch_size, config.dtype) == ("hf", 16, "bfloat16")
    for card in ("80GB", "141GB"):
        plan = plan_for(QWEN05B, config, prompt_length, DEVICES[card])
        assert plan.micro_batch_size == 16 and not plan.shrunk, (card, plan)
        assert plan.estimate.new <= plan.budget < DEVICES[card].memory
    assert "on Tesla T4 (16 GB)" in refusal(QWEN05B, config, prompt_length, DEVICES["16GB"])


def test_a_24gb_card_takes_gsm8k_at_a_smaller_micro_batch(capsys):
    config, _ = recipe("gsm8k_qwen05b_onpolicy")
    plan = plan_for(QWEN05B, config, 256, DEVICES["24GB"])
    assert plan.shrunk and 1 <= plan.micro_batch_size < 16 and plan.estimate.new <= plan.budget
    assert "memory guard: micro_batch_size 16 → " in capsys.readouterr().out


@pytest.mark.parametrize("prompt_length", PROMPT_LENGTHS)
@pytest.mark.parametrize("name", QWEN7B_COLOCATE)
def test_the_7b_colocate_recipes_fit_8x80gb_under_zero3_with_30_percent_to_vllm(name, prompt_length):
    config, trl = recipe(name)
    layout = accelerate_layout("gpu8_zero3", trl["vllm_gpu_memory_utilization"])
    assert (layout.shards, layout.vllm_share, config.micro_batch_size) == (8, 0.3, 4)
    plan = plan_for(QWEN7B, config, prompt_length, DEVICES["8x80GB"], layout)
    assert plan.micro_batch_size == 4 and not plan.shrunk, plan
    card = DEVICES["8x80GB"].memory
    assert plan.budget == int(BUDGET_FRACTION * (card - CUDA_RESERVED - math.ceil(QWEN7B.weights / 8)
                                                 - math.ceil(0.3 * card)))
    estimate = plan.estimate
    assert estimate.sampler == estimate.sampling == estimate.reference == 0  # α in vLLM's share; β = 0
    assert estimate.optimizer == 2 * math.ceil(QWEN7B.trainable / 8) and estimate.gathered == 2 * 10**9
    # the same run with whole replicas (DDP) does not fit: AdamW's state alone is 57 GiB a card
    message = refusal(QWEN7B, config, prompt_length, DEVICES["8x80GB"], accelerate_layout("gpu8_ddp", 0.3))
    assert f"optimizer {gib(2 * QWEN7B.trainable)}" in message and "vLLM takes its 30% share" in message
    # a plainly too small card: the weights alone do not fit on it
    message = refusal(QWEN7B, config, prompt_length, DEVICES["16GB"])
    assert f"π_θ's weights ({gib(QWEN7B.weights)})" in message and "only 0.00 GiB is available" in message


@pytest.mark.parametrize("prompt_length", PROMPT_LENGTHS)
@pytest.mark.parametrize("name", DEEPSCALER)
def test_the_deepscaler_recipes_fit_8x80gb_under_zero3_and_nothing_smaller(name, prompt_length):
    """8192-token completions at micro-batch 8: under ZeRO-3 with vLLM colocated (TRL's default share, 0.3) a card
    holds it; with whole replicas (DDP) the replicated weights, gradients, DDP's buckets, AdamW's state and π_ref
    leave no room beside vLLM's share; on one card the loop (no gradient checkpointing) holds far more."""
    import trl

    config, _ = recipe(name)
    assert (config.micro_batch_size, config.max_completion_length) == (8, 8192)
    share = trl.GRPOConfig.__dataclass_fields__["vllm_gpu_memory_utilization"].default
    plan = plan_for(R1_1P5B, config, prompt_length, DEVICES["8x80GB"], accelerate_layout("gpu8_zero3", share))
    assert plan.micro_batch_size == 8 and not plan.shrunk, plan
    ddp = accelerate_layout("gpu8_ddp", share)
    refusal(R1_1P5B, config, prompt_length, DEVICES["8x80GB"], ddp)
    card = DEVICES["8x80GB"].memory
    ddp_budget = int(BUDGET_FRACTION * (card - CUDA_RESERVED - R1_1P5B.weights - math.ceil(share * card)))
    at_8 = estimate_memory(R1_1P5B, config, prompt_length, 8, DEVICES["8x80GB"], ddp)
    assert at_8.new - at_8.overhead > ddp_budget     # at the recipe's m = 8 not even with no overhead at all
    for one in ("80GB", "141GB"):                    # `grpo-lab train`, α in process: its KV cache alone
        sampling = estimate_memory(R1_1P5B, config, prompt_length, 1, DEVICES[one]).sampling
        assert sampling > 0.8 * DEVICES[one].memory
        assert f"sampling {gib(sampling)}" in refusal(R1_1P5B, config, prompt_length, DEVICES[one])


SHAPE = ModelShape(weights=4000, trainable=3200, element_size=4, layers=2, hidden=8, intermediate=16, vocab=100,
                   heads=2, kv_heads=1, head_dim=4, compute_element_size=2)
CARD = Device("a card", "cuda", 2 * CUDA_RESERVED)
CONFIG = TrainConfig(G=4, prompts_per_step=2, max_completion_length=5)


def test_the_heap_term_is_a_cpus_and_the_kv_cache_is_in_the_compute_dtype():
    on_cpu, on_gpu = (estimate_memory(SHAPE, CONFIG, 7, device=device) for device in (None, CARD))
    assert on_cpu.sampling - on_gpu.sampling == HEAP_RETENTION * 8 * 5 * 100
    kv, prefill, logits = 2 * 2 * 8 * 12 * 1 * 4 * 2, 2 * 7 * (4 * 8 + 3 * 16) * 2, (2 + 20) * 8 * 100
    assert on_gpu.sampling == sampler_tensor_bytes(SHAPE, 8, 2, 7, 5) == kv + prefill + logits
    # activations (and a CPU's attention) at b_c: half of what float32 forwards hold
    wide = dataclasses.replace(SHAPE, compute_element_size=None)
    layer_terms = 2 * 8 * 12 * (10 * 8 + 4 * 16)                               # L·m·S·(10H + 4I)
    cpu_attention = 2 * 2 * 2 * 8 * 12 * 12                                    # L·2·n_head·m·S²
    assert estimate_memory(wide, CONFIG, 7).training - on_cpu.training == (layer_terms + cpu_attention) * 2


def test_on_a_gpu_the_loops_attention_is_its_packed_mask_not_every_heads_scores():
    entries = packed_mask_entries(8, 4, 7, 5)
    on_gpu = estimate_memory(SHAPE, CONFIG, 7, device=CARD)
    assert on_gpu.training == 2 * 8 * 12 * (10 * 8 + 4 * 16) * 2 + entries * (4 + 2 * 2) + 12 * 8 * 5 * 100
    # the layout LMPolicy packs: a prompt's rows after one copy of it, a new copy past each 2048 inputs
    assert entries == 2 * (7 + 4 * 4) ** 2                                     # two groups of 4 rows, 4 inputs each
    assert packed_mask_entries(16, 8, 100, 512) == 4 * (100 + 5 * 511) ** 2   # rows 0-4 of a group, then 5-7
    assert packed_mask_entries(3, 8, 10, 4096) == 3 * (10 + 4095) ** 2        # each long row alone
    assert packed_mask_entries(3, 2, 10, 5) == 2 * (10 + 2 * 4) ** 2          # 3 rows across groups of 2: widest


def test_vllms_share_comes_off_the_card_and_holds_the_sampling():
    plain, served = (plan_for(SHAPE, CONFIG, 7, CARD, Layout(vllm_share=u)) for u in (0.0, 0.3))
    free = CARD.memory - CUDA_RESERVED - 4000                                  # the card less CUDA's and π_θ's
    assert plain.available == served.available == free and plain.budget == int(BUDGET_FRACTION * free)
    assert served.budget == int(BUDGET_FRACTION * (free - math.ceil(0.3 * CARD.memory)))
    assert served.estimate.sampling == 0 < plain.estimate.sampling
    assert served.estimate.sampler == plain.estimate.sampler == 4000           # the loop keeps α's scorer copy
    trl = estimate_memory(SHAPE, CONFIG, 7, device=CARD, layout=Layout("trl", vllm_share=0.3))
    assert trl.sampler == 0                                                    # TRL's α is vLLM's alone


def test_ddp_keeps_its_buckets_and_zero3_splits_the_state():
    eight = dataclasses.replace(CARD, count=8)
    ddp, zero3 = (estimate_memory(SHAPE, CONFIG, 7, device=eight, layout=Layout("trl", shards, 0.3))
                  for shards in (1, 8))
    assert (ddp.gradients, ddp.optimizer, ddp.autocast, ddp.gathered) == (2 * 3200, 6400, 1600, 0)
    assert (zero3.gradients, zero3.optimizer, zero3.autocast, zero3.gathered) == (400, 800, 200, 2000)
    beta = CONFIG.replace(beta=0.1)
    assert estimate_memory(SHAPE, beta, 7, device=eight, layout=Layout("trl", 8, 0.3)).reference == 500


def test_the_trl_route_keeps_each_layers_input_and_one_layer(monkeypatch):
    """Gradient checkpointing and the fused LM head: TRL's defaults, and the TRL release's own constants."""
    import accelerate
    import trl
    import trl.kernels.chunked_logprob as chunked
    import trl.trainer.utils as trl_utils

    assert TRL_LOGPROB_TILE == (chunked.TOKEN_CHUNK_SIZE, trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE)
    assert trl.GRPOConfig.__dataclass_fields__["gradient_checkpointing"].default is True
    assert accelerate.DistributedDataParallelKwargs().gradient_as_bucket_view is False   # DDP's buckets: a copy
    m, S, t, v = 2, 12, *TRL_LOGPROB_TILE
    training = estimate_memory(SHAPE, CONFIG.replace(micro_batch_size=2), 7, device=CARD,
                               layout=Layout("trl")).training
    head = min(m * 5, t) * min(100, v) * 2 + 4 * 100 * 8 + m * 5 * 8 * (4 + 2)
    assert training == 2 * m * S * 8 * 2 + m * S * (10 * 8 + 4 * 16) * 2 + m * S * S * (1 + 2) + head


def test_the_override_replaces_the_budget_and_warns():
    config, _ = recipe("gsm8k_qwen05b_onpolicy")
    refusal(QWEN05B, config, 512, DEVICES["16GB"])
    with pytest.warns(UserWarning, match=r"memory guard: planning in memory_budget_gib = 40 GiB"):
        plan = plan_for(QWEN05B, config.replace(memory_budget_gib=40), 512, DEVICES["16GB"])
    assert plan.budget == 40 * 2**30 and plan.estimate.new <= plan.budget


def test_a_layout_a_device_cannot_have_is_refused():
    with pytest.raises(ValueError, match="route must be one of"):
        Layout("deepspeed")
    with pytest.raises(ValueError, match=r"vllm_share must be a finite number in \[0.0, 1.0\], got 1.5"):
        Layout(vllm_share=1.5)
    with pytest.raises(ValueError, match="shards = 4: each process holds whole weights"):
        estimate_memory(SHAPE, CONFIG, 7, device=DEVICES["8x80GB"], layout=Layout("trl", 4))
    with pytest.raises(ValueError, match="the loop runs one process"):
        estimate_memory(SHAPE, CONFIG, 7, device=DEVICES["8x80GB"])
    with pytest.raises(ValueError, match="vllm_share = 0.3: vLLM's gpu_memory_utilization is a share of a GPU"):
        estimate_memory(SHAPE, CONFIG, 7, layout=Layout(vllm_share=0.3))
    assert Device.of("cpu").kind == "cpu"


# ----------------------------------------------------------------------------- the commands of docs/recipes.md

SHAPES = {"Qwen/Qwen2.5-0.5B-Instruct": QWEN05B, "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": R1_1P5B,
          "Qwen/Qwen2.5-7B": QWEN7B}
SECTION_CARDS = {"## DeepScaleR": ("80GB", "80 GB"), "## Throughput": ("80GB", "80 GB"),
                 "## Past one node": ("80GB", "80 GB")}
"""The card each section of docs/recipes.md writes its commands for (a key of DEVICES) and the words that name it
there."""


def docs_commands() -> list[tuple[str, list[str]]]:
    """(section heading, shell words) of every indented command line of docs/recipes.md, continuations joined."""
    import re
    import shlex

    text = (CONFIG_DIR.parents[1] / "docs" / "recipes.md").read_text()
    commands = []
    for section in re.split(r"\n(?=## )", text)[1:]:
        code = "\n".join(line[4:] for line in section.splitlines() if line.startswith("    "))
        commands += [(section.splitlines()[0], shlex.split(line))
                     for line in re.sub(r"\\\n\s*", "", code).splitlines() if line.strip()]
    return commands


def planned_launch(words: list[str], card: Device) -> tuple[TrainConfig, Device, Layout]:
    """An ``accelerate launch … -m grpo_lab.scale.launch …`` line as its run plans it: the recipe with its --set and
    --trl, the card times the config's processes, the layout :func:`grpo_lab.scale.launch.trl_layout` takes from
    the arguments the trainer gets (the DeepSpeed plugin as accelerate sets it from the config's ZeRO stage)."""
    from types import SimpleNamespace

    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils import DistributedType

    accelerate = launch_command_parser().parse_args(words[2:])
    assert (accelerate.module, accelerate.training_script) == (True, "grpo_lab.scale.launch"), words
    ours = gl.argument_parser().parse_args(accelerate.training_script_args)
    cluster = load_config_from_file(accelerate.config_file)
    launch_recipe = load_launch_recipe(ours.config, ours.set, ours.trl)
    args = gl.trl_args(launch_recipe.config, {**launch_recipe.trl, "use_cpu": True}, cluster.num_processes)
    if cluster.distributed_type == DistributedType.DEEPSPEED:   # what args carries where DeepSpeed is installed
        args.deepspeed_plugin = SimpleNamespace(zero_stage=cluster.deepspeed_config["zero_stage"])
    device = dataclasses.replace(card, count=cluster.num_processes)
    return launch_recipe.config, device, gl.trl_layout(args, device)


def trains(words: list[str]) -> bool:
    """Whether a documented line trains a recipe; a line that is neither a training line nor one of the others
    known here (evaluation, the vLLM server and the printing of its line, the acceptance script) fails the test."""
    if words[:2] in (["grpo-lab", "train"], ["accelerate", "launch"]) or words[:3] == ["python", "-m",
                                                                                       "grpo_lab.scale.repeats"]:
        return "--print-vllm-serve" not in words
    assert (words[:2] == ["grpo-lab", "eval"] or "vllm-serve" in words or "--print-vllm-serve" in words
            or words[:2] == ["python", "benchmarks/gpu_acceptance.py"]), words
    return False


def planned_command(words: list[str], card: Device) -> tuple[TrainConfig, Device, Layout]:
    """What a documented training line (:func:`trains`) trains, as its run plans it, on ``card``."""
    import argparse
    from types import SimpleNamespace

    import torch

    from grpo_lab.lm.build import sampler_layout
    from grpo_lab.scale import repeats

    if words[:2] == ["grpo-lab", "train"]:
        parser = argparse.ArgumentParser()
        parser.add_argument("--config")
        parser.add_argument("--set", action="append", default=[])
        given, _ = parser.parse_known_args(words[2:])
        config = load_config(given.config, given.set)
        return config, card, sampler_layout(config, SimpleNamespace(device=torch.device("cuda")), 1)
    if words[:2] == ["accelerate", "launch"]:
        return planned_launch(words, card)
    given = repeats.argument_parser().parse_args(words[3:])
    launched = repeats.repeat_command(given.config, given.v[0], 0, given.out, given.accelerate_config, given.set,
                                      given.trl)
    assert launched[1:3] == ["-m", "accelerate.commands.launch"], launched
    return planned_launch(["accelerate", "launch", *launched[3:]], card)


def test_every_training_command_of_docs_recipes_is_admitted_on_the_cards_it_names():
    """Each section's card is named in its text; each command that trains is planned as its run plans it (the
    launch's layout from accelerate's config and the --trl settings) at the recipe's micro-batch, on that card."""
    planned = 0
    for heading, words in filter(lambda command: trains(command[1]), docs_commands()):
        cards = [card for prefix, card in SECTION_CARDS.items() if heading.startswith(prefix)]
        assert cards, f"section {heading!r} gives a training command: name its card in SECTION_CARDS"
        (key, named), = cards
        assert named in docs_section(heading), (heading, named)
        config, device, layout = planned_command(words, DEVICES[key])
        for prompt_length in PROMPT_LENGTHS:
            plan = plan_for(SHAPES[config.model], config, prompt_length, device, layout)
            assert not plan.shrunk and plan.micro_batch_size == config.micro_batch_size, (words, plan)
        planned += 1
    assert planned == 7    # DeepScaleR, the two 7B colocate runs, their repeats, server mode, the two nodes


def docs_section(heading: str) -> str:
    text = (CONFIG_DIR.parents[1] / "docs" / "recipes.md").read_text()
    start = text.index("\n" + heading + "\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def test_the_old_deepscaler_commands_are_refused():
    """What docs/recipes.md gave before: one GPU (`grpo-lab train`, α in torch) and DDP over 8 GPUs."""
    card = DEVICES["80GB"]
    deepscaler = "grpo_lab/configs/deepscaler_r1distill_1p5b_offpolicy_v10.yaml"
    for line in (f"grpo-lab train --config {deepscaler}",
                 "accelerate launch --config_file grpo_lab/configs/accelerate/gpu8_ddp.yaml -m grpo_lab.scale.launch "
                 f"--config {deepscaler} --trl use_vllm=true --trl vllm_mode=colocate "
                 "--trl vllm_gpu_memory_utilization=0.3"):
        config, device, layout = planned_command(line.split(), card)
        refusal(R1_1P5B, config, 512, device, layout)


# ----------------------------------------------------------------------------- the TRL route's guard


class Planned(Exception):
    """Raised by the stand-in for plan_for: the launch got as far as its plan."""


@pytest.fixture
def launch_until_planned(monkeypatch):
    """``launch(trl=…, zero_stage=…, device=…)``: a launch of the SmolLM2 arithmetic recipe (8 prompts × G = 2, one
    row a micro-batch) in a group of 8 processes on ``device`` (``80GB``: an H100 each; ``cpu``: this host), with
    accelerate's DeepSpeed plugin at ``zero_stage`` (None: DDP), stopped at its plan: returns plan_for's arguments.
    Nothing may load the model."""
    from types import SimpleNamespace

    import accelerate
    import torch
    import transformers

    import grpo_lab.scale.trl

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the memory plan")

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", no_load)
    monkeypatch.setattr(grpo_lab.scale.trl, "OffPolicyGRPOTrainer", no_load)
    monkeypatch.setattr(gl, "available_memory", lambda device: 64 * 2**30)

    def plan_for_stand_in(*args):
        raise Planned(*args)

    monkeypatch.setattr(gl, "plan_for", plan_for_stand_in)

    host = Device.__dict__["of"]

    def run(trl=(), zero_stage=None, device="80GB"):
        here = torch.device("cuda" if device != "cpu" else "cpu")
        monkeypatch.setattr(accelerate, "PartialState", lambda: SimpleNamespace(num_processes=8, device=here))
        monkeypatch.setattr(Device, "of", host if device == "cpu" else classmethod(lambda cls, at: DEVICES[device]))
        real_args = gl.trl_args

        def trl_args(*args):
            made = real_args(*args)
            made.deepspeed_plugin = None if zero_stage is None else SimpleNamespace(zero_stage=zero_stage)
            return made

        monkeypatch.setattr(gl, "trl_args", trl_args)
        launch_recipe = load_launch_recipe(CONFIG_DIR / "cpu_arith_smollm2.yaml",
                                           ["prompts_per_step=8", "G=2", "micro_batch_size=1", "train_problems=16"],
                                           list(trl))
        with pytest.raises(Planned) as planned:
            gl.launch(launch_recipe)
        shape, config, prompt_length, device_planned, layout, available = planned.value.args
        assert config == launch_recipe.config and device_planned.count == 8 and prompt_length > 10
        return shape, device_planned, layout, available

    return run


def test_the_launch_plans_ddp_zero3_and_vllm_as_accelerate_and_trl_set_them(launch_until_planned, monkeypatch):
    import torch

    from grpo_lab.lm.models import bundled_model_dir

    shape, device, ddp, available = launch_until_planned()
    assert shape == ModelShape.of_checkpoint(str(bundled_model_dir("smollm2-135m")), torch.float32,  # TRL's dtype
                                             torch.float32)                                         # the recipe's
    assert (device, ddp) == (dataclasses.replace(DEVICES["80GB"], count=8), Layout("trl", 1))
    assert available == 64 * 2**30 - shape.weights                        # free before the load, less the replica
    _, _, zero3, available = launch_until_planned(zero_stage=3)
    assert zero3 == Layout("trl", 8) and available == 64 * 2**30 - math.ceil(shape.weights / 8)
    assert launch_until_planned(zero_stage=2)[2] == Layout("trl", 1)      # ZeRO-2 keeps whole weights
    colocate = ["use_vllm=true", "vllm_mode=colocate", "vllm_gpu_memory_utilization=0.25"]
    assert launch_until_planned(colocate, zero_stage=3)[2] == Layout("trl", 8, vllm_share=0.25)
    server = ["use_vllm=true", "vllm_mode=server"]
    assert launch_until_planned(server, zero_stage=3)[2] == Layout("trl", 8, vllm_server=True)
    # on this host: the processes share its memory; TRL's CPU engine asks for u of it, VLLM_CPU_KVCACHE_SPACE wins
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    _, host, engine, available = launch_until_planned(colocate, device="cpu")
    assert host.kind == "cpu" and available == 64 * 2**30 // 8 - shape.weights
    assert engine == Layout("trl", 1, vllm_cpu_kv_cache=math.ceil(0.25 * host.memory))
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    assert launch_until_planned(colocate, device="cpu")[2] == Layout("trl", 1, vllm_cpu_kv_cache=2 * 2**30)


def test_a_launch_over_its_budget_stops_before_the_model_loads(monkeypatch):
    import transformers

    import grpo_lab.scale.trl

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the memory plan")

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", no_load)
    monkeypatch.setattr(grpo_lab.scale.trl, "OffPolicyGRPOTrainer", no_load)
    launch_recipe = load_launch_recipe(CONFIG_DIR / "cpu_arith_smollm2.yaml",
                                       ["train_problems=16", "device=cpu", "memory_budget_gib=0.01"])
    with pytest.warns(UserWarning, match="memory_budget_gib = 0.01 GiB"), \
            pytest.raises(ValueError, match=r"memory guard: the run needs about [\d.]+ GiB .* even with "
                                            r"micro_batch_size = 1"):
        gl.launch(launch_recipe)


def test_the_trl_route_names_the_micro_batch_that_fits_instead_of_taking_it(capsys):
    """P·G = 8 rows at micro-batch 4: with room for 3 the TRL route stops and names 2 (8 is no multiple of 3)."""
    config = CONFIG.replace(micro_batch_size=4)
    layout = Layout("trl")
    room = estimate_memory(SHAPE, config, 7, 3, CARD, layout).new
    assert estimate_memory(SHAPE, config, 7, 4, CARD, layout).new > room
    with pytest.warns(UserWarning, match="memory_budget_gib"), pytest.raises(
            ValueError, match=r"with micro_batch_size = 4, but .* micro_batch_size = 2 fits "
                              r"\(--set micro_batch_size=2\)"):
        plan_for(SHAPE, config.replace(memory_budget_gib=room / 2**30), 7, CARD, layout)
    assert capsys.readouterr().out == ""                                    # nothing says it shrank
    loop_room = estimate_memory(SHAPE, config, 7, 3, CARD).new
    with pytest.warns(UserWarning, match="memory_budget_gib"):             # the loop takes 3 and says so
        assert plan_for(SHAPE, config.replace(memory_budget_gib=loop_room / 2**30), 7, CARD).micro_batch_size == 3
    assert "micro_batch_size 4 → 3" in capsys.readouterr().out
    with pytest.raises(ValueError, match="prompts_per_step·G = 8 must be a multiple of the 3 processes"):
        plan_for(SHAPE, config, 7, dataclasses.replace(CARD, count=3), layout)


# ----------------------------------------------------------------------------- vLLM's engine on a CPU


def test_a_cpu_vllm_engine_counts_its_weights_kv_cache_and_its_own_cost():
    K = 10**6
    loop, trl = (estimate_memory(SHAPE, CONFIG, 7, layout=Layout(route, vllm_cpu_kv_cache=K)) for route in ("loop",
                                                                                                          "trl"))
    engine = 4000 // 4 * 2 + K + math.ceil(VLLM_CPU_ENGINE_W * 4000) + VLLM_CPU_ENGINE_FIXED
    assert loop.sampling == trl.sampling == engine          # its weights in b_c, its KV cache, what it adds itself
    assert (loop.sampler, trl.sampler) == (4000, 0)          # the loop's scorer copy of α; TRL keeps none
    in_torch = estimate_memory(SHAPE, CONFIG, 7)
    assert loop.new - in_torch.new == engine - in_torch.sampling   # the sampler's tensors and heap are not counted
    with pytest.raises(ValueError, match="vllm_cpu_kv_cache = 1000000: an engine on cuda takes vllm_share"):
        estimate_memory(SHAPE, CONFIG, 7, device=CARD, layout=Layout(vllm_cpu_kv_cache=K))
    with pytest.raises(ValueError, match="on this GPU, on this CPU or on a server, one of them"):
        Layout(vllm_share=0.3, vllm_cpu_kv_cache=K)
    with pytest.raises(ValueError, match="vllm_server = True on route 'loop'"):
        Layout(vllm_server=True)
    served = estimate_memory(SHAPE, CONFIG, 7, device=CARD, layout=Layout("trl", vllm_server=True))
    assert served.sampler == served.sampling == 0            # α on the server's GPUs
