"""Which task and token budget suit the CPU study? (the untrained SmolLM2-135M, scored strictly)

For each candidate task the untrained bundled model samples n completions per held-out question
(the kit's prompt: the number format's one-shot example, then the question; one row drops the
example to show why it is there) once, at the largest budget; each smaller budget b is scored on
the same samples cut to their first b tokens. That is exactly what sampling with budget b draws
(same seed, same tokens step by step; tests/test_scoring.py checks it), and a cut completion
finished only if its EOS came within b tokens.

Per (task, b): strict Pass@1 (finished within b, just the number, right), lenient Pass@1 (last number
right, truncated or not), the truncated share, strict accuracy among the finished, and the share of
correct answers that need more than b tokens: of the strict-correct completions at the largest budget
(and of the lenient-correct ones that finished there), those longer than b tokens (EOS included).
Strict Pass@1 = (1 − truncated) × accuracy of the finished, so a short budget shows how much is lost
to talk, a generous one how much arithmetic the model has.

    nice -n 19 .venv/bin/python experiments/task_scan.py [--questions 48] [--samples 4]
        [--budgets 4 8 16 32 48] [--out results/task_scan/scan.json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from grpo_lab.files import atomic_write
from grpo_lab.lm.models import load_policy
from grpo_lab.lm.policy import LMPolicy
from grpo_lab.lm.rewards import finished_completions, lenient_reward, strict_reward
from grpo_lab.lm.sampling import HFSampler
from grpo_lab.lm.tasks import Problem, build_prompt, chat_messages, generate_problems

CANDIDATES = {  # label: (a task of grpo_lab.lm.tasks.GYM_TASKS, reasoning-gym overrides, one-shot prompt)
    "one-digit sums (add1)": ("add1", {}, True),
    "add1 without the example": ("add1", {}, False),
    "sums of 1-2-digit numbers (add12)": ("add12", {}, True),
    "two-digit sums": ("add1", dict(min_digits=2, max_digits=2), True),
    "one-digit differences": ("add1", dict(operators=("-",)), True),
    "three one-digit terms": ("add1", dict(min_terms=3, max_terms=3), True),
}
EVAL_SEED = 10_000
"""The held-out problems' seed: a run's eval_problems with seed 0 (grpo_lab.lm.text_task)."""


def prompt(problem: Problem, tokenizer: Any, one_shot: bool) -> str:
    """The kit's prompt (:func:`~grpo_lab.lm.tasks.build_prompt`), or without its example exchange."""
    if one_shot:
        return build_prompt(problem, tokenizer)
    return tokenizer.apply_chat_template(chat_messages(problem)[-1:], add_generation_prompt=True, tokenize=False)


def share(part: torch.Tensor, whole: torch.Tensor) -> float:
    """Share of the True entries of ``whole`` that are True in ``part`` (0 if ``whole`` has none)."""
    return float((part & whole).sum() / whole.sum()) if whole.any() else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", type=int, default=48)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--budgets", type=int, nargs="+", default=[4, 8, 16, 32, 48])
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--tasks", nargs="+", default=list(CANDIDATES), choices=list(CANDIDATES))
    parser.add_argument("--out", default=None, help="write the table as JSON here")
    args = parser.parse_args()
    model, tokenizer = load_policy("smollm2-135m")
    policy = LMPolicy(model, temperature=args.temperature)
    budgets = sorted(args.budgets)
    sampler = HFSampler(policy, tokenizer, budgets[-1])
    rows = []
    print(f"{'task':34} {'T_max':>5} {'strict':>6} {'lenient':>7} {'trunc':>5} {'acc|fin':>7} {'need>b':>6}")
    for label in args.tasks:
        name, overrides, one_shot = CANDIDATES[label]
        problems = generate_problems(name, args.questions, seed=EVAL_SEED, **overrides)
        start = time.perf_counter()
        rollout = sampler.sample([prompt(p, tokenizer, one_shot) for p in problems], args.samples,
                                 torch.Generator().manual_seed(args.seed))
        seconds = time.perf_counter() - start
        targets = [p for p in problems for _ in range(args.samples)]
        lengths = rollout.mask.sum(dim=1)            # tokens of each completion, its EOS included
        scored = {}
        for budget in budgets:
            tokens, keep = rollout.completions[:, :budget], rollout.mask[:, :budget]
            finished = finished_completions(tokens, keep, sampler.eos_token_ids)
            texts = tokenizer.batch_decode([row[k].tolist() for row, k in zip(tokens, keep, strict=True)],
                                           skip_special_tokens=True)
            strict = torch.tensor([bool(strict_reward(t, f, p.answer, p.answer_format))
                                   for t, f, p in zip(texts, finished.tolist(), targets, strict=True)])
            lenient = torch.tensor([bool(lenient_reward(t, p.answer)) for t, p in zip(texts, targets, strict=True)])
            scored[budget] = (finished, strict, lenient, texts)
        finished_max, strict_max, lenient_max, _ = scored[budgets[-1]]
        for budget in budgets:
            finished, strict, lenient, texts = scored[budget]
            longer = lengths > budget
            row = dict(task=label, name=name, one_shot=one_shot, overrides={k: list(v) if isinstance(v, tuple) else v
                                                         for k, v in overrides.items()},
                       max_completion_length=budget, pass_at_1=float(strict.float().mean()),
                       pass_at_1_lenient=float(lenient.float().mean()),
                       truncated_frac=float(1 - finished.float().mean()),
                       accuracy_finished=share(strict, finished),
                       need_more_strict=share(longer, strict_max),
                       need_more_lenient=share(longer, lenient_max & finished_max),
                       example=texts[0], sample_seconds=seconds)
            rows.append(row)
            print(f"{label:34} {budget:5d} {row['pass_at_1']:6.3f} {row['pass_at_1_lenient']:7.3f} "
                  f"{row['truncated_frac']:5.2f} {row['accuracy_finished']:7.3f} {row['need_more_strict']:6.2f}"
                  f"  e.g. {texts[0][:40]!r}", flush=True)
        if args.out:  # after every task: a scan stopped midway keeps the tasks it finished
            atomic_write(args.out, json.dumps(dict(questions=args.questions, samples=args.samples,
                                                   temperature=args.temperature, seed=args.seed,
                                                   eval_seed=EVAL_SEED, scoring="strict", rows=rows), indent=1),
                         what="the task scan")


if __name__ == "__main__":
    main()
