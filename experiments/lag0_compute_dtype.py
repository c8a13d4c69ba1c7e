"""The in-process sampler's mismatch at lag 0 in float32 and in bfloat16: what a check right after a sync can ask.

The GSM8K recipes compute in bfloat16 over float32 weights (``TrainConfig.dtype``), α in process (``sampler:
hf``): α decodes under the same autocast as π_θ's forward, from a copy of the same weights, so at lag 0 the two
differ only by their kernels' rounding (a cached one-token decode against one packed forward). This runs the CPU
default's recipe at v = 1 (every step at lag 0) in each dtype with the sync audit on, and records per step::

    mismatch   = mean_t |log π_k − log α|     over the counted tokens (StepRecord.log_ratio_k_abs)
    ratio_max  = max_t π_k/α                   (StepRecord.ratio_k_max)
    proof      = the weights' proof of the sync (StepRecord.weights_audit)

``grpo_lab.sync_audit.LAG0_MISMATCH`` takes its bfloat16 tolerance from this file. CPU autocast's kernels are
not a GPU's: the figure gives the size, not the GPU's value. Writes ``results/offpolicy_split/lag0_dtype.json``::

    OMP_NUM_THREADS=1 python experiments/lag0_compute_dtype.py [--steps 6] [--prompts 4] [--tokens 32]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("step", "lag", "skipped", "weights_audit", "probe_audit", "num_tokens", "log_ratio_k_abs", "ratio_k_max",
          "mismatch_abs")
"""The StepRecord fields kept per step."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step (G = 8 each)")
    parser.add_argument("--tokens", type=int, default=32, help="max_completion_length")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--out", type=Path, default=ROOT / "results/offpolicy_split/lag0_dtype.json")
    args = parser.parse_args()


    from grpo_lab.lm.build import build_loop
    from grpo_lab.lm.recipes import recipe
    from grpo_lab.provenance import provenance

    start, runs = time.perf_counter(), {}
    for dtype in args.dtypes:
        config = recipe("cpu_arith_smollm2", dtype=dtype, device="cpu", v=1, steps=args.steps,
                        prompts_per_step=args.prompts, max_completion_length=args.tokens, offpolicy_split=True,
                        sync_audit=True, checkpoint_every=0)
        loop = build_loop(config)
        records = []
        for record in loop.run():
            records.append({name: getattr(record, name) for name in FIELDS})
            print(dtype, records[-1], flush=True)
        trained = [r for r in records if not r["skipped"]]
        runs[dtype] = {"records": records, "max_mismatch": max(r["log_ratio_k_abs"] for r in trained),
                       "max_ratio": max(r["ratio_k_max"] for r in trained),
                       "proved": all(r["weights_audit"] == "proved" for r in records)}
        print(dtype, {k: v for k, v in runs[dtype].items() if k != "records"}, flush=True)
        del loop
    result = {"command": shlex.join([Path(sys.executable).name, *sys.argv]), "date": time.strftime("%Y-%m-%d"),
              "seconds": round(time.perf_counter() - start), **provenance(ROOT, ignore=args.out.parent),
              "settings": {"model": config.model, "task": config.task, "G": config.G, "P": args.prompts,
                           "max_completion_length": args.tokens, "lr": config.lr, "v": 1, "sampler": config.sampler,
                           "weights": "float32", "temperature": config.temperature},
              "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
