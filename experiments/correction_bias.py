"""Each correction's exact bias and variance under lag on SmolLM2-135M (notebook 01b §4's run, written to a file).

The notebook's default size: reasoning-gym ``add1`` problems 6 and 0, answers restricted to digits + EOS (≤ 3
tokens), G = 8, AdamW lr 5e-6, C = 2, a = 0.5. α is held at π_0 while the loop takes ``--lags`` real steps; after
each, :func:`grpo_lab.exact.correction_bias.bias_sweep` computes every correction's exact first-pass update
against κ_α∇J(π_ℓ) (no sampling). Writes ``results/correction_bias/sweep.json``: per lag, TV(π_ℓ, α) and one row
per correction (cosine, relative error, variance / ‖κ∇J‖², dropped and capped shares). docs/choosing_v.md quotes
it, and ``tests/test_choosing_v.py`` re-reads every number it quotes::

    OMP_NUM_THREADS=1 python experiments/correction_bias.py [--lags 6]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "correction_bias" / "sweep.json"
PROBLEM_INDICES = (6, 0)
G, LR = 8, 5e-6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lags", type=int, default=6)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    import torch

    from grpo_lab.config import GRPOConfig
    from grpo_lab.exact import bandit
    from grpo_lab.exact.correction_bias import bias_sweep
    from grpo_lab.exact.digits_lm import ExactLM, sequence_logprobs
    from grpo_lab.lm.models import load_policy
    from grpo_lab.lm.tasks import load_problems
    from grpo_lab.provenance import provenance

    started = time.perf_counter()
    problems = [load_problems("add1", 7, seed=0)[i] for i in PROBLEM_INDICES]
    config = GRPOConfig(G=G, lr=LR, seed=0)
    model, tokenizer = load_policy(dtype=torch.float32)
    lagged = ExactLM(model, tokenizer, problems, config.replace(v=args.lags + 1))
    tables = [lagged.cond]
    for _ in range(args.lags):
        lagged.step()
        tables.append(lagged.cond)
    cond_alpha = torch.stack([lagged.loop.sampler.table(p) for p in lagged.prompts])
    tables[0] = cond_alpha
    sweep = bias_sweep(tables, cond_alpha, lagged.rewards, lagged.space, config)
    alpha_probs = sequence_logprobs(cond_alpha, lagged.space).exp()
    lags = []
    for lag, rows in sweep.items():
        tv = float(bandit.tv(sequence_logprobs(tables[lag], lagged.space).exp(), alpha_probs).mean())
        lags.append({"lag": lag, "tv": tv, "whiten_scale": rows[0].whiten_scale, "corrections": [
            {"name": r.name, "is_correction": r.is_correction, "level": r.level, "cosine": r.cosine,
             "rel_error": r.rel_error, "variance": r.var / r.target_norm ** 2, "drop_share": r.drop_share,
             "cap_share": r.cap_share} for r in rows]})
    result = {"command": "python " + shlex.join(["experiments/correction_bias.py", *sys.argv[1:]]),
              "seconds": round(time.perf_counter() - started), **provenance(ROOT, ignore=args.out.parent),
              "settings": {"task": "add1", "problems": list(PROBLEM_INDICES), "G": G, "lr": LR,
                           "is_cap": config.is_cap, "is_floor": config.is_floor, "loss_type": "dr_grpo",
                           "lags": args.lags},
              "lags": lags}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} in {result['seconds']} s")


if __name__ == "__main__":
    main()
