"""Where a study's unit ran, recorded in the unit: the commit and whether the tree had changes, the CPU's model and
vector extensions, the libraries' versions (TRL's and accelerate's where installed), torch's threads and the load
average. One function for every study, so any two units can be compared on the same fields."""

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


def provenance(root: Path, ignore: str | Path = "") -> dict[str, Any]:
    """What a unit records of where it ran (the module docstring); ``tree_dirty`` counts changes under ``root``
    except paths containing ``ignore`` (a study's own unit folder, written while it runs: a path relative to
    ``root``, or a folder anywhere, which counts only where it lies under ``root``)."""
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
    return {"git_commit": git("rev-parse", "HEAD"), "tree_dirty": bool(changed), **cpu(),
            "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "trl": installed("trl"), "accelerate": installed("accelerate"),
            "torch_threads": torch.get_num_threads(), "load_start": list(os.getloadavg())}
