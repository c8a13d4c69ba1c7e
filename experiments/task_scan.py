"""Which arithmetic task does SmolLM2-135M solve 10–50 % of the time? (the CPU study's task scan)

For each candidate task (reasoning-gym ``basic_arithmetic`` with some parameters) the untrained
bundled model samples n completions per held-out question once, at the largest token budget;
each smaller budget T_max is scored on the same samples cut to their first T_max tokens (what
sampling with that budget would have drawn: the same seed draws the same tokens step by step).
Per budget: Pass@1, the share of completions that ran out of tokens (no EOS within T_max), and
the accuracy of those that finished. Pass@1 = (1 − truncated) × accuracy of the finished ones, so
a generous budget tells how much arithmetic the model has, a short one how much is lost to talk.

    .venv/bin/python experiments/task_scan.py [--questions 16] [--samples 4] [--budgets 8 32]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from grpo_lab.lm.models import load_policy
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.rewards import correctness_reward
from grpo_lab.lm.sampling import HFSampler
from grpo_lab.lm.tasks import build_prompt, generate_problems

CANDIDATES = {
    "one-digit sums (add1)": {},
    "sums of 1-2-digit numbers": dict(max_digits=2),
    "two-digit sums": dict(min_digits=2, max_digits=2),
    "one-digit differences": dict(operators=("-",)),
    "three one-digit terms": dict(min_terms=3, max_terms=3),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--budgets", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--out", default=None, help="write the table as JSON here")
    args = parser.parse_args()
    model, tokenizer = load_policy("smollm2-135m")
    policy = LMPolicy(model, temperature=args.temperature)
    sampler = HFSampler(policy, tokenizer, max(args.budgets))
    eos = torch.as_tensor(sampler.eos_token_ids)
    rows = []
    print(f"{'task':30} {'T_max':>5} {'Pass@1':>7} {'truncated':>9} {'acc|finished':>12}")
    for label, overrides in CANDIDATES.items():
        problems = generate_problems("add1", args.questions, seed=10_000, **overrides)
        start = time.perf_counter()
        rollout = sampler.sample([build_prompt(p, tokenizer) for p in problems], args.samples,
                                 torch.Generator().manual_seed(1234))
        seconds = time.perf_counter() - start
        golds = [p.answer for p in problems for _ in range(args.samples)]
        for budget in sorted(args.budgets):
            tokens = rollout.completions[:, :budget]
            finished = torch.isin(tokens, eos).any(dim=1)
            keep = rollout.mask[:, :budget]
            texts = tokenizer.batch_decode([row[k].tolist() for row, k in zip(tokens, keep, strict=True)],
                                           skip_special_tokens=True)
            correct = torch.tensor([correctness_reward(t, g) for t, g in zip(texts, golds, strict=True)])
            row = dict(task=label, overrides={k: list(v) if isinstance(v, tuple) else v for k, v in overrides.items()},
                       max_completion_length=budget, pass_at_1=float(correct.mean()),
                       truncated_frac=float(1 - finished.float().mean()),
                       accuracy_finished=float(correct[finished].mean()) if finished.any() else 0.0,
                       example=texts[0], sample_seconds=seconds)
            rows.append(row)
            print(f"{label:30} {budget:5d} {row['pass_at_1']:7.3f} {row['truncated_frac']:9.2f} "
                  f"{row['accuracy_finished']:12.3f}  e.g. {texts[0][:50]!r}", flush=True)
        if args.out:  # after every task: a scan stopped midway keeps the tasks it finished
            with open(args.out, "w") as f:
                json.dump(dict(questions=args.questions, samples=args.samples, temperature=args.temperature,
                               seed=1234, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
