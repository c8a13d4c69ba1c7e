"""Past one node, what a CPU can check: the accelerate configs (accelerate's own loader), TRL's server mode (the
``trl vllm-serve`` line read back by TRL's own parser, the trainer's arguments, the settings TRL hands its vLLM
client) and the launch lines of docs/recipes.md, "Past one node"."""

import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import trl.generation.vllm_generation as generation
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.commands.launch import launch_command_parser
from accelerate.utils import DistributedType
from datasets import Dataset
from trl import GRPOConfig as TRLGRPOConfig
from trl.scripts.vllm_serve import build_command, make_parser

from grpo_lab.lm.recipes import CONFIG_DIR, load_launch_recipe
from grpo_lab.scale import launch as gl
from grpo_lab.scale.trl import OffPolicyGRPOTrainer

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("trl_two_process", ROOT / "tests" / "trl_two_process.py")
two = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(two)

ACCELERATE = CONFIG_DIR / "accelerate"
RECIPE_7B = CONFIG_DIR / "qwen7b_orz_colocate_v10.yaml"
SERVER = ["vllm_mode=server", "vllm_gpu_memory_utilization=0.9"]


def gpus_per_machine(cluster) -> int:
    """num_processes = machines × GPUs per machine: the GPUs each machine gives its processes."""
    if cluster.num_processes % cluster.num_machines:
        raise ValueError(f"num_processes {cluster.num_processes} is not a multiple of num_machines "
                         f"{cluster.num_machines}")
    return cluster.num_processes // cluster.num_machines


@pytest.mark.parametrize("path", sorted(ACCELERATE.glob("*.yaml")), ids=lambda p: p.name)
def test_accelerate_configs_load_and_agree(path):
    """Every bundled config loads with accelerate's loader (unknown keys are refused), its processes split evenly over
    its machines and fill the GPUs it names; several machines need the main machine's address and port, and
    DeepSpeed's `standard` launcher (torchrun on each machine: no ssh, no hostfile); ZeRO-3 computes in bf16."""
    cluster = load_config_from_file(str(path))
    per_machine = gpus_per_machine(cluster)
    if cluster.gpu_ids not in (None, "all"):
        assert len(str(cluster.gpu_ids).split(",")) == per_machine
    if cluster.num_machines > 1:
        assert cluster.machine_rank == 0 and cluster.main_process_ip and cluster.main_process_port
        assert cluster.deepspeed_config["deepspeed_multinode_launcher"] == "standard"
    if cluster.distributed_type == DistributedType.DEEPSPEED:
        assert cluster.deepspeed_config["zero_stage"] == 3 and cluster.mixed_precision == "bf16"


def test_the_two_new_configs_are_what_docs_recipes_says():
    two_nodes = load_config_from_file(str(ACCELERATE / "gpu16_2node_zero3.yaml"))
    assert (two_nodes.num_machines, two_nodes.num_processes, gpus_per_machine(two_nodes)) == (2, 16, 8)
    server = load_config_from_file(str(ACCELERATE / "gpu4_server_zero3.yaml"))
    assert (server.num_machines, server.num_processes, server.gpu_ids) == (1, 4, "0,1,2,3")


def test_consistency_check_refuses_processes_that_do_not_split(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ACCELERATE / "gpu16_2node_zero3.yaml").read_text().replace("num_processes: 16",
                                                                               "num_processes: 15"))
    with pytest.raises(ValueError, match="num_processes 15 is not a multiple of num_machines 2"):
        gpus_per_machine(load_config_from_file(str(bad)))


def test_vllm_serve_line_is_read_back_by_trls_own_parser():
    """The line :func:`vllm_serve_command` builds parses with TRL 1.16's ``vllm-serve`` parser into the recipe's
    values, and TRL turns it into a ``vllm serve`` that returns log-probs after temperature (what the trainer
    checks at start) in bfloat16."""
    launch_recipe = load_launch_recipe(RECIPE_7B, [], [*SERVER, "vllm_server_port=8123",
                                                       "vllm_max_model_length=2048"])
    command = gl.vllm_serve_command(launch_recipe)
    assert command[:2] == ["trl", "vllm-serve"]
    (served, rest) = make_parser().parse_args_and_config(args=command[2:], return_remaining_strings=True)
    assert rest == []
    assert (served.model, served.host, served.port) == ("Qwen/Qwen2.5-7B", "0.0.0.0", 8123)
    assert (served.tensor_parallel_size, served.gpu_memory_utilization) == (4, 0.9)
    assert (served.dtype, served.max_model_len, served.trust_remote_code) == ("bfloat16", 2048, False)
    vllm_serve = build_command(served)
    assert vllm_serve[vllm_serve.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert vllm_serve[vllm_serve.index("--dtype") + 1] == "bfloat16"
    plain = load_launch_recipe(CONFIG_DIR / "cpu_arith_smollm2.yaml", ["model=Qwen/Qwen2.5-0.5B-Instruct"],
                               ["use_vllm=true", "vllm_mode=server"])  # no vLLM field: TRL's defaults
    (served, _) = make_parser().parse_args_and_config(args=gl.vllm_serve_command(plain)[2:],
                                                      return_remaining_strings=True)
    assert (served.port, served.tensor_parallel_size, served.gpu_memory_utilization) == (8000, 1, 0.9)
    assert (served.dtype, served.max_model_len) == (plain.config.dtype, None)
    with pytest.raises(ValueError, match="vllm_mode='colocate'.*--trl vllm_mode=server"):
        gl.vllm_serve_command(load_launch_recipe(RECIPE_7B))


def test_print_vllm_serve_prints_the_line_and_trains_nothing(capsys):
    assert gl.main(["--config", str(RECIPE_7B), *[f"--trl={o}" for o in SERVER], "--print-vllm-serve"]) == 0
    printed = capsys.readouterr().out.strip()
    assert shlex.split(printed) == gl.vllm_serve_command(load_launch_recipe(RECIPE_7B, [], SERVER))


def test_server_mode_arguments_build_without_a_gpu():
    launch_recipe = load_launch_recipe(RECIPE_7B, [], [*SERVER, "vllm_server_host=10.1.2.3", "vllm_server_port=8123",
                                                       "vllm_group_port=51300"])
    args = gl.trl_args(launch_recipe.config, {**launch_recipe.trl, "use_cpu": True}, num_processes=4)  # bf16: GPU
    assert (args.use_vllm, args.vllm_mode, args.vllm_server_host, args.vllm_server_port) == (
        True, "server", "10.1.2.3", 8123)
    assert (args.vllm_group_port, args.vllm_server_base_url, args.bf16) == (51300, None, True)
    assert args.per_device_train_batch_size * 4 * args.gradient_accumulation_steps == 32 * 8  # P·G over 4 GPUs
    stock = gl.stock_trl_config(launch_recipe.config, {**launch_recipe.trl, "use_cpu": True}, num_processes=4)
    assert type(stock) is TRLGRPOConfig and (stock.vllm_mode, stock.vllm_server_host) == ("server", "10.1.2.3")


class FakeClient:
    """Stands in for TRL's VLLMClient (it needs vLLM and a live server): records what TRL hands it."""

    made: list["FakeClient"] = []
    logprobs_mode = "processed_logprobs"

    def __init__(self, **settings):
        self.settings, self.communicator_device = settings, None
        FakeClient.made.append(self)

    def init_communicator(self, device):
        self.communicator_device = device

    def get_server_info(self):
        return {"model_config": {"logprobs_mode": self.logprobs_mode}}


@pytest.fixture
def fake_server(monkeypatch):
    """TRL's server branch with a fake client: vLLM counts as installed, no engine is built."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(generation, "is_vllm_available", lambda *args, **kwargs: True)
    monkeypatch.setattr(generation, "VLLMClient", FakeClient)
    monkeypatch.setattr(FakeClient, "made", [])
    return FakeClient


def server_trainer(model_dir, tmp_path, **server):
    config = two.make_config(str(tmp_path / "out"), 1, 8, use_vllm=True, vllm_mode="server", **server)
    return OffPolicyGRPOTrainer(model=model_dir, reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
                                args=config, train_dataset=Dataset.from_dict({"prompt": list(two.TRAIN_PROMPTS)}))


def test_the_trainer_hands_the_server_settings_to_trls_client(fake_server, tmp_path):
    """OffPolicyGRPOTrainer in server mode, through TRL's own VLLMGeneration: the client dials host:port (or the
    base URL, which wins), opens the weight-push group on vllm_group_port from this process's device, waits
    vllm_server_timeout; the sync audit, which cannot query a server, is off with a warning."""
    model_dir = two.build_tiny_model(tmp_path / "tiny")
    with pytest.warns(UserWarning, match="a vLLM server.*cannot score"):
        trainer = server_trainer(model_dir, tmp_path, vllm_server_host="10.1.2.3", vllm_server_port=8123,
                                 vllm_group_port=51300, vllm_server_timeout=600.0)
    (client,) = fake_server.made
    assert client.settings == {"base_url": "http://10.1.2.3:8123", "group_port": 51300, "connection_timeout": 600.0}
    assert client.communicator_device == trainer.accelerator.device and trainer._audit is None
    with pytest.warns(UserWarning, match="cannot score"):
        server_trainer(model_dir, tmp_path, vllm_server_base_url="http://gpu-node-2:9000", vllm_server_host="x")
    assert fake_server.made[-1].settings["base_url"] == "http://gpu-node-2:9000"


def test_a_server_that_returns_raw_logprobs_is_refused(fake_server, tmp_path, monkeypatch):
    monkeypatch.setattr(fake_server, "logprobs_mode", "raw_logprobs")
    with pytest.warns(UserWarning, match="cannot score"), pytest.raises(
            ValueError, match="--logprobs-mode raw_logprobs; restart it with --logprobs-mode processed_logprobs"):
        server_trainer(two.build_tiny_model(tmp_path / "tiny"), tmp_path)


def documented_commands() -> list[list[str]]:
    """The shell lines of docs/recipes.md's "Past one node" section, continuation lines joined, split as a shell
    would."""
    text = (ROOT / "docs" / "recipes.md").read_text()
    section = text[text.index("## Past one node"):]
    code = "\n".join(line[4:] for line in section.splitlines() if line.startswith("    "))
    return [shlex.split(line) for line in re.sub(r"\\\n\s*", "", code).splitlines()]


def trainer_line(tokens: list[str]):
    """An ``accelerate launch … -m grpo_lab.scale.launch …`` line: accelerate's parsed arguments, its config, the
    launch recipe the trainer reads."""
    accelerate = launch_command_parser().parse_args(tokens[2:])
    assert (accelerate.module, accelerate.training_script) == (True, "grpo_lab.scale.launch")
    ours = gl.argument_parser().parse_args(accelerate.training_script_args)
    return accelerate, load_config_from_file(accelerate.config_file), load_launch_recipe(ours.config, ours.set,
                                                                                       ours.trl)


def test_docs_launch_lines_match_the_configs_and_the_code():
    """Server mode: the printed line is the server line, which serves on GPUs the trainer's config leaves free, as
    many as its tensor parallel size, the model the trainer trains; two nodes: the same command on each machine
    but its rank, 0 and 1. Every trainer line's batch divides over its processes."""
    commands = documented_commands()
    printed = [c for c in commands if "--print-vllm-serve" in c]
    served = [c for c in commands if c[1:3] == ["trl", "vllm-serve"]]
    trainers = [trainer_line(c) for c in commands if c[:2] == ["accelerate", "launch"]]
    assert len(printed) == len(served) == 1 and len(trainers) == 3
    (printed,), (served,) = printed, served
    ours = gl.argument_parser().parse_args(printed[3:])
    server_recipe = load_launch_recipe(ours.config, ours.set, ours.trl)
    assert served[1:] == gl.vllm_serve_command(server_recipe)
    server_gpus = served[0].removeprefix("CUDA_VISIBLE_DEVICES=").split(",")
    _, cluster, launch_recipe = trainers[0]
    assert launch_recipe == server_recipe and not set(server_gpus) & set(cluster.gpu_ids.split(","))
    assert len(server_gpus) == launch_recipe.trl["vllm_tensor_parallel_size"]
    nodes = trainers[1:]
    assert [accelerate.machine_rank for accelerate, _, _ in nodes] == [0, 1]
    assert len({accelerate.main_process_ip for accelerate, _, _ in nodes}) == 1
    assert nodes[0][2] == nodes[1][2] and all(cluster.num_machines == 2 for _, cluster, _ in nodes)
    for _, cluster, launch_recipe in trainers:
        gl.trl_args(launch_recipe.config, {**launch_recipe.trl, "use_cpu": True}, cluster.num_processes)
