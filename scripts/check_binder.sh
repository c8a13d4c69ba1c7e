#!/usr/bin/env bash
# Build binder/'s environment the way mybinder's repo2docker does (a fresh venv, binder/requirements.txt,
# then binder/postBuild) and execute notebook 01 in it (smoke mode): proves the CPU-only image, with no
# transformers, TRL or vLLM, is enough for the bandit lab. Prints the environment's size.
#   scripts/check_binder.sh [VENV_DIR]      (default: a temporary folder, removed afterwards)
set -euo pipefail
cd "$(dirname "$0")/.."
scratch=$(mktemp -d)                      # removed on exit, whatever the result
trap 'rm -rf "$scratch"' EXIT
venv=${1:-$scratch/binder-venv}
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
requirements=binder/requirements.txt
if ! python3 -c "import socket; socket.getaddrinfo('download.pytorch.org', 443)" 2>/dev/null; then
  # Offline CI: no PyTorch index (pip would retry it for every package); torch==2.13.0+cpu must then
  # come from pip's own configuration (find-links), everything else from PyPI as on mybinder.
  requirements=$scratch/requirements.txt
  grep -v '^--extra-index-url' binder/requirements.txt > "$requirements"
  echo "download.pytorch.org unreachable: installing binder/requirements.txt without its extra index"
fi
"${pip[@]}" install -r "$requirements"
PATH="$venv/bin:$PATH" bash binder/postBuild
"${pip[@]}" install nbclient ipykernel   # what mybinder's base image brings along (Jupyter itself)
"$venv/bin/python" - <<'PY'
import importlib.util, os, time
import nbformat, torch
from nbclient import NotebookClient

absent = [m for m in ("transformers", "trl", "vllm") if importlib.util.find_spec(m)]
assert not absent, f"binder image should not carry {absent}"
assert torch.__version__.endswith("+cpu"), f"binder torch should be the CPU build, got {torch.__version__}"
os.environ.update(GRPO_LAB_SMOKE="1", GRPO_LAB_DISPLAY="none")
nb = nbformat.read("notebooks/01_bandit.ipynb", as_version=4)
start = time.perf_counter()
NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": "notebooks"}}).execute()
print(f"binder: notebook 01 ran {sum(c.cell_type == 'code' for c in nb.cells)} code cells without error in "
      f"{time.perf_counter() - start:.0f} s (torch {torch.__version__}; no transformers, TRL or vLLM)")
PY
du -sh "$venv" | sed 's/^/binder environment size: /'
