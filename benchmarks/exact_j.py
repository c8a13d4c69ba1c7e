"""Exact strict J(π) of the bundled SmolLM2-135M on a task's whole question set: how long it takes.

``grpo_lab.exact.strict_j`` walks the token tree of accepted completions of every question (KV cache,
batched by depth and across questions). This times it on the distinct questions of a task (add1: all 121),
at the CPU recipes' sampling settings (T = 0.7, T_max = 8), and prints wall and CPU seconds, torch's
threads, the load average before and after, the mean J_low and the largest pruned mass (the bound on the
error of any one question's J). Target: the study task's whole question set in ≤ 30 s on the 2-core CPU.

    python benchmarks/exact_j.py [--task add1] [--threshold 1e-5] [--threads N]
                                 [--questions-per-batch 8] [--limit Q]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from grpo_lab.exact.strict_j import QUESTIONS_PER_BATCH, THRESHOLD, Sampling, exact_evaluate
from grpo_lab.lm.models import load_policy
from grpo_lab.lm.tasks import all_questions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="add1")
    parser.add_argument("--limit", type=int, default=None, help="time only the first Q distinct questions")
    parser.add_argument("--threshold", type=float, default=THRESHOLD)
    parser.add_argument("--questions-per-batch", type=int, default=QUESTIONS_PER_BATCH)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    problems = all_questions(args.task)[:args.limit]
    model, tokenizer = load_policy()
    sampling = Sampling(temperature=args.temperature, max_tokens=args.max_tokens)
    load_before, cpu, start = os.getloadavg(), time.process_time(), time.perf_counter()
    result = exact_evaluate(model, tokenizer, problems, sampling, args.threshold,
                            questions_per_batch=args.questions_per_batch)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(json.dumps({"task": args.task, "questions": len(problems), "wall_s": round(wall, 2),
                      "cpu_s": round(cpu, 2), "threads": torch.get_num_threads(),
                      "load_before": load_before, "load_after": os.getloadavg(), "threshold": args.threshold,
                      "questions_per_batch": args.questions_per_batch, "temperature": args.temperature,
                      "max_tokens": args.max_tokens, "mean_j_low": round(result.mean, 5),
                      "mean_pruned": float(result.pruned.mean()), "max_pruned": float(result.pruned.max())}))


if __name__ == "__main__":
    main()
