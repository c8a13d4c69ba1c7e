"""Where a run ran, recorded in its result file: the commit and whether the tree had changes, the CPU's model and
vector extensions, the GPUs torch sees, the libraries' versions (TRL's, accelerate's and vLLM's where installed),
torch's threads and the load average. One function for every study unit and every measured run, so any two can be
compared on the same fields."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
"""The extensions torch's and vLLM's CPU kernels choose their paths by."""


def cpu() -> dict[str, Any]:
    """The CPU's model name, its vector extensions among :data:`VECTOR_FLAGS`, and the cores the OS shows."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    lines = info.splitlines()
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
                 platform.processor())
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    return {"cpu_model": model, "cpu_vector": sorted(f for f in flags if f in VECTOR_FLAGS), "cpus": os.cpu_count()}


def gpus() -> dict[str, Any]:
    """The model of every CUDA device torch sees (an empty list without one) and torch's CUDA version."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"gpu_models": [torch.cuda.get_device_name(i) for i in range(count)], "cuda": torch.version.cuda}


def provenance(root: Path, ignore: str | Path = "") -> dict[str, Any]:
    """What a run records of where it ran (the module docstring); ``tree_dirty`` counts changes under ``root``
    except paths containing ``ignore`` (a study's own unit folder, written while it runs: a path relative to
    ``root``, or a folder anywhere, which counts only where it lies under ``root``). Outside a git checkout the
    commit is ``""``."""
    if isinstance(ignore, Path):
        folder, base = ignore.resolve(), root.resolve()
        ignore = str(folder.relative_to(base)) if folder.is_relative_to(base) else ""
    from importlib.metadata import PackageNotFoundError, version

    import torch
    import transformers

    def installed(package: str) -> str | None:
        try:
            return version(package)
        except PackageNotFoundError:
            return None

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True).stdout.strip()

    changed = [line for line in git("status", "--porcelain").splitlines() if not ignore or ignore not in line]
    return {"git_commit": git("rev-parse", "HEAD"), "tree_dirty": bool(changed), **cpu(), **gpus(),
            "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "trl": installed("trl"), "accelerate": installed("accelerate"), "vllm": installed("vllm"),
            "torch_threads": torch.get_num_threads(), "load_start": list(os.getloadavg())}
