"""benchmarks/gpu_acceptance.py at small shapes on the CPU (``make test-vllm``, vLLM's CPU build): every route runs,
the JSON holds every part's numbers for every route, and every check passes, so the GPU's script cannot rot."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_acceptance.py"
ROUTES = {"hf", "vllm", "trl"}


def test_the_acceptance_script_passes_every_check_at_small_shapes(tmp_path):
    out = tmp_path / "acceptance.json"
    # The loop's engine sizes its own KV cache, as a run's does (the Makefile's 1 GiB would override it).
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--small", "--out", str(out)], env=env, timeout=1800,
                          check=False)
    report = json.loads(out.read_text())
    print(json.dumps(report["checks"], indent=1))
    run, checks = report["run"], report["checks"]
    assert (run["mode"], run["dtype"], run["not_run"], set(run["routes"])) == ("small", "bfloat16", [], ROUTES)
    assert (run["P"], run["G"], run["T"], run["micro_batch_size"]) == (2, 4, 8, 4)
    assert all(report["provenance"][name] for name in ("commit", "device", "torch", "transformers", "trl", "vllm"))
    assert {part: set(by_route) for part, by_route in checks.items()} == {
        "step": ROUTES, "sync_proof": ROUTES, "log_alpha": ROUTES, "memory": {"hf", "vllm"}}
    for route in ROUTES:
        step, gap, proof = checks["step"][route], checks["log_alpha"][route], checks["sync_proof"][route]
        assert step["engine_dtype"] == ("None" if route == "hf" else "torch.bfloat16")
        assert math.isfinite(step["loss"]) and step["grad_norm"] > 0
        assert 0 < gap["tokens"] <= 2 * 4 * 8 and 0 <= gap["mean_abs"] <= gap["max_abs"] <= gap["tolerance"]["max"]
        assert proof["checks"] == {"proved_after_sync": True, "caught_unsynced_move": True}
    for route in ("hf", "vllm"):
        memory = checks["memory"][route]
        assert 0 < memory["measured_gib"] <= memory["planned_gib"] and memory["micro_batch_size"] == 4
    assert set(report["seconds"]) == {"model", "total", *ROUTES}
    assert report["failed"] == [] and report["passed"] and done.returncode == 0, report["failed"]
