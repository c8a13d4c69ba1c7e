"""The lag frontier's pilot: which task and learning rate the frontier study runs at.

Each unit trains on-policy (v = 1) on a task at one lr and seed, for the frontier's step budget, and saves
π_θ's weights at the evaluation steps (0, ¼, ½, ¾ and the end of the budget) into ``--runs-dir``; a second
pass (``--evaluate``) computes exact J on the task's whole question set at each of them
(:mod:`grpo_lab.exact`, no sampling noise) and stores the per-question probabilities in the unit file. The
rules the pilot applies (fixed before any unit ran):

- untrained J in [0.05, 0.40];
- ``v1`` gains ≥ 0.25 in J within the budget;
- no ceiling: J at the budget ≤ 0.85 and still rising at half the budget;
- final J exceeds the best constant-answer policy's J by ≥ 0.15;
- the gain is spread: the share of questions whose probability rose by ≥ 0.1 is reported;
- the lr: the best primary endpoint (mean exact J over the evaluation steps after 0, averaged over seeds) of
  ≥ 3 values × 2 seeds, among the lrs whose ``v1`` meets the rules above (a lr whose ``v1`` saturates cannot
  rank lags); its drift per step at lag 1 (mean |log π_{k+1}/π_k| over step k's sampled tokens) is reported.

Tasks tried, in order: ``addmul1`` (its lr 1e-5 unit saturated: J 0.948 at the budget, 0.836 at half of it),
then ``addsubmul1`` (negative differences added; the selection rule among lrs above fixed
before its units ran).

Units are files ``<out>/units/<task>_lr<lr>_s<seed>.json`` with their provenance (git commit, torch threads,
load average at start and end, wall and CPU seconds); a unit whose file exists is skipped, and a process claims
a unit (or its evaluation) by creating ``<name>.lock`` beside it first, so processes side by side or sittings
one after another share the work (a lock left by a killed process is removed by hand)::

    python studies/lag_frontier/pilot.py --task addsubmul1 --lrs 3e-6 1e-5 3e-5 --seeds 2 [--threads 1]
    python studies/lag_frontier/pilot.py --task addsubmul1 --evaluate
    python studies/lag_frontier/pilot.py --task addsubmul1 --report
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import torch

from studies.lag_frontier import frontier

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STEPS = 128
"""The frontier's budget: ≥ 4 syncs at its largest v = 32."""


def unit_name(task: str, lr: float, seed: int) -> str:
    return f"{task}_lr{lr:g}_s{seed}"


def train_unit(task: str, lr: float, seed: int, steps: int, out: Path, runs: Path) -> None:
    """Train one unit and save π_θ at the evaluation steps; write its unit file (J comes with --evaluate)."""
    from safetensors.torch import save_model

    from grpo_lab.lm.build import build_loop
    from grpo_lab.lm.recipes import recipe

    path = out / "units" / f"{unit_name(task, lr, seed)}.json"
    if path.exists() or not frontier.claim(path):
        return
    record = {"task": task, "lr": lr, "seed": seed, "steps": steps, "v": 1, **frontier.provenance(ROOT)}
    wall, cpu = time.perf_counter(), time.process_time()
    config = recipe("cpu_arith_smollm2", task=task, lr=lr, seed=seed, steps=steps, v=1, empty_step="skip",
                    scoring="strict", checkpoint_every=0)
    loop = build_loop(config)
    captured: dict[str, Any] = {}
    sample = loop.sampler.sample

    def keep_rollout(*args: Any, **kwargs: Any) -> Any:
        captured["rollout"] = sample(*args, **kwargs)
        return captured["rollout"]

    loop.sampler.sample = keep_rollout
    weights = runs / unit_name(task, lr, seed)
    weights.mkdir(parents=True, exist_ok=True)
    rows = []
    for k in range(steps + 1):
        if k in frontier.eval_steps(steps):
            save_model(loop.policy.model, str(weights / f"step{k}.safetensors"))
        if k == steps:
            break
        step = loop.step()
        rollout = captured["rollout"]
        with torch.no_grad():  # drift at lag 1: π_{k+1} against π_k (= α at v = 1) on step k's tokens
            logp_next = torch.cat([loop.policy.logprobs(rollout, slice(r, r + 16))
                                   for r in range(0, rollout.completions.shape[0], 16)])
        drift = float((logp_next - rollout.logp_alpha).abs()[rollout.mask].mean())
        rows.append({"step": k, "reward_mean": step.reward_mean, "skipped": step.skipped,
                     "masked_frac": step.masked_frac, "grad_norm": step.grad_norm, "drift_lag1": drift,
                     "num_tokens": step.num_tokens})
    record.update(steps_log=rows, weights_dir=str(weights), load_end=os.getloadavg(),
                  wall_seconds=time.perf_counter() - wall, cpu_seconds=time.process_time() - cpu,
                  max_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
    path.write_text(json.dumps(record, indent=1) + "\n")
    path.with_suffix(".lock").unlink()


def evaluate_unit(path: Path) -> None:
    """Exact J on the task's whole question set at each saved step of a trained unit; written into its file.

    Per question, J_low is stored (J_low ≤ J ≤ J_low + pruned), with the curve of mean J_low, its area (the
    primary endpoint: the mean over the evaluation steps after 0), the final J, the largest pruned mass, and the
    constant-answer baseline (the best J of a policy that always answers one number).
    """
    from safetensors.torch import load_model

    from grpo_lab.exact.strict_j import MAX_PRUNED, THRESHOLD
    from grpo_lab.lm.models import load_policy
    from grpo_lab.lm.recipes import recipe
    from grpo_lab.lm.tasks import all_questions

    unit = json.loads(path.read_text())
    if "j_curve" in unit or not frontier.claim(path):
        return
    config = recipe("cpu_arith_smollm2", task=unit["task"])
    model, tokenizer = load_policy(config.model)
    model.requires_grad_(False)
    questions = all_questions(unit["task"])
    curve, per_question, pruned_max, seconds, thresholds = {}, {}, 0.0, {}, {}
    for step in frontier.eval_steps(unit["steps"]):
        load_model(model, str(Path(unit["weights_dir"]) / f"step{step}.safetensors"))
        start = time.perf_counter()
        result = frontier.exact_j(model, tokenizer, questions, config)
        seconds[step] = time.perf_counter() - start
        curve[step], per_question[step] = result.mean, [round(float(j), 6) for j in result.j_low]
        pruned_max = max(pruned_max, float(result.pruned.max()))
        thresholds[step] = float(min(row["threshold"] for row in result.rows))
    j_auc, j_final = frontier.endpoints(curve)
    unit.update(evaluation="exact", threshold=THRESHOLD, max_pruned_target=MAX_PRUNED, lowest_threshold=thresholds,
                eval_git_commit=frontier.provenance(ROOT)["git_commit"], questions=[q.question for q in questions],
                j_curve=curve, j_per_question=per_question, j_auc=j_auc, j_final=j_final, pruned_max=pruned_max,
                eval_seconds=seconds, constant_answer=frontier.constant_answer(questions))
    path.write_text(json.dumps(unit, indent=1) + "\n")
    path.with_suffix(".lock").unlink()


RULES = {"untrained J in [0.05, 0.40]": lambda r: 0.05 <= r["untrained_j"] <= 0.40,
         "gain >= 0.25": lambda r: r["gain"] >= 0.25,
         "J at the budget <= 0.85": lambda r: r["j_final"] <= 0.85,
         "still rising after half the budget": lambda r: r["rise_after_half"] > 0,
         "final J - constant answer >= 0.15": lambda r: r["j_final"] - r["constant_answer_j"] >= 0.15}
"""The task rules of the module docstring, on an lr's means over its seeds."""


def report(out: Path, task: str) -> dict[str, Any]:
    """Each lr's means over its evaluated seeds, the rules it meets, and the lr the rule picks (the best primary
    endpoint among the lrs that meet every rule); written to ``<out>/summary_<task>.json``."""
    import numpy as np

    units = [json.loads(p.read_text()) for p in sorted((out / "units").glob(f"{task}_*.json"))]
    units = [u for u in units if "j_curve" in u]
    rows = []
    for lr in sorted({u["lr"] for u in units}):
        mine = [u for u in units if u["lr"] == lr]
        curves = [{int(k): v for k, v in u["j_curve"].items()} for u in mine]
        steps = sorted(curves[0])
        mean = {k: float(np.mean([c[k] for c in curves])) for k in steps}
        rose = [float((np.subtract(u["j_per_question"][str(steps[-1])], u["j_per_question"]["0"]) >= 0.1).mean())
                for u in mine]
        drift = [r["drift_lag1"] for u in mine for r in u["steps_log"]]
        row = {"lr": lr, "seeds": [u["seed"] for u in mine], "j_curve": mean, "untrained_j": mean[0],
               "j_auc": float(np.mean([u["j_auc"] for u in mine])), "j_final": mean[steps[-1]],
               "gain": mean[steps[-1]] - mean[0], "rise_after_half": mean[steps[-2]] - mean[steps[len(steps) // 2]],
               "constant_answer_j": mine[0]["constant_answer"]["j"], "share_rose_0.1": float(np.mean(rose)),
               "drift_lag1_mean": float(np.mean(drift)), "drift_lag1_median": float(np.median(drift)),
               "skipped_steps": [sum(r["skipped"] for r in u["steps_log"]) for u in mine],
               "pruned_max": max(u["pruned_max"] for u in mine),
               "git_commits": sorted({u["git_commit"] for u in mine} | {u.get("eval_git_commit", "") for u in mine})}
        row["rules"] = {name: bool(rule(row)) for name, rule in RULES.items()}
        rows.append(row)
    passing = [r for r in rows if all(r["rules"].values())]
    chosen = max(passing, key=lambda r: r["j_auc"])["lr"] if passing else None
    summary = {"task": task, "rows": rows, "chosen_lr": chosen,
               "complete": all(len(r["seeds"]) >= 2 for r in rows) and len(rows) >= 3}
    (out / f"summary_{task}.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="addsubmul1")
    parser.add_argument("--lrs", type=float, nargs="+", default=[3e-6, 1e-5, 3e-5])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=HERE / "pilot_results")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "frontier_pilot")
    parser.add_argument("--evaluate", action="store_true", help="compute exact J of the trained units")
    parser.add_argument("--report", action="store_true", help="each lr's means, its rules and the lr chosen")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.report:
        summary = report(args.out, args.task)
        for row in summary["rows"]:
            print(f"lr {row['lr']:g} (seeds {row['seeds']}): J {[round(v, 3) for v in row['j_curve'].values()]}, "
                  f"J_auc {row['j_auc']:.3f}, rules failed {[k for k, ok in row['rules'].items() if not ok]}")
        print(f"chosen lr: {summary['chosen_lr']} (complete: {summary['complete']})")
        return
    if args.evaluate:
        for path in sorted((args.out / "units").glob(f"{args.task}_*.json")):
            evaluate_unit(path)
        return
    for seed in range(args.seeds):  # every lr at n seeds before any at n + 1
        for lr in args.lrs:
            train_unit(args.task, lr, seed, args.steps, args.out, args.runs_dir)


if __name__ == "__main__":
    main()
