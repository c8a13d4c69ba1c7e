"""``grpo-lab train | eval`` — the LLM path from a YAML recipe.

    grpo-lab train --config grpo_lab/configs/cpu_arith_smollm2.yaml [--set v=4 --set steps=20]
    grpo-lab eval  --config grpo_lab/configs/cpu_arith_smollm2.yaml [--checkpoint runs/x/checkpoint.pt]
    grpo-lab eval  --checkpoint runs/x/checkpoint.pt --exact --set eval_problems=121 --out exact.json

A recipe is a flat YAML mapping of :class:`~grpo_lab.lm.train_config.TrainConfig`
fields; ``--set key=value`` overrides one (the value is read as YAML: ``v=4``,
``eps_high=0.28``, ``report_to=[tensorboard]``; numbers as a user writes them: ``lr=1e-5``);
:mod:`grpo_lab.lm.recipes` reads both. ``eval --checkpoint`` evaluates under the checkpoint's own
config with the evaluation settings given applied (:func:`~grpo_lab.lm.evaluate.checkpoint_eval_config`).
``eval --exact`` computes strict Pass@1 exactly, per question, under the config's T, top-p, top-k and
T_max (:mod:`grpo_lab.exact.strict_j`) instead of sampling ``eval_samples`` completions per question.
Both commands print on stderr how many torch threads they use, and why (:func:`~grpo_lab.threads.choose_threads`:
the cores the load leaves free, unless ``OMP_NUM_THREADS`` or ``--threads N`` says otherwise).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from .lm.recipes import read_recipe, train_config
from .lm.train_config import TrainConfig
from .threads import use_threads


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grpo-lab", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("train", "train (or resume) a run"), ("eval", "Pass@1 of a model or checkpoint")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--config", help="YAML recipe (see grpo_lab/configs/)")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field")
        p.add_argument("--quiet", action="store_true", help="no progress bar")
        p.add_argument("--threads", type=int, default=None,
                       help="torch threads (default: OMP_NUM_THREADS, else the cores the 1-minute load leaves free)")
    sub.choices["train"].add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint")
    evaluation = sub.choices["eval"]
    evaluation.add_argument("--checkpoint", help="evaluate π_θ of this checkpoint, under its own config "
                                                 "(default: the model)")
    evaluation.add_argument("--exact", action="store_true", help="exact strict Pass@1 per question, no sampling")
    evaluation.add_argument("--threshold", type=float, default=None,
                            help="--exact: probability below which a branch is pruned (its mass bounds the error)")
    evaluation.add_argument("--out", help="write the result as JSON to this file (--exact: one row per question)")
    args = parser.parse_args(argv)
    try:
        given = read_recipe(args.config, args.set)
        config = train_config(given)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    if args.command == "eval" and args.threshold is not None and not args.exact:
        parser.error("--threshold applies to --exact")
    try:
        print(f"grpo-lab {args.command}: {use_threads(args.threads)}", file=sys.stderr)
    except ValueError as exc:
        parser.error(f"--threads: {exc}")
    from .lm.training import RunDirInUse

    try:
        if args.command == "train":
            return _train(config, progress=not args.quiet, resume=not args.no_resume)
        return _evaluate(config, given, args)
    # bad input (a model path, data files, a busy output_dir), a full or read-only disk (DiskError is an OSError)
    except (ValueError, OSError, RunDirInUse) as exc:
        print(f"grpo-lab {args.command}: error: {exc}", file=sys.stderr)
        return 2


def _train(config: TrainConfig, progress: bool, resume: bool) -> int:
    from .lm.training import train

    loop = train(config, progress=progress, resume=resume)
    last = loop.history[-1] if loop.history else None
    print(json.dumps({"steps": loop.k, "last_reward_mean": last and last.reward_mean,
                      "output_dir": config.output_dir}))
    return 0


def _evaluate(config: TrainConfig, given: dict[str, Any], args: argparse.Namespace) -> int:
    from .files import atomic_write
    from .lm.checkpoint import read_checkpoint
    from .lm.evaluate import checkpoint_eval_config, evaluate, load_eval_policy
    from .lm.text_task import eval_problems

    state = None
    if args.checkpoint:
        state = read_checkpoint(args.checkpoint)
        config, ignored = checkpoint_eval_config(state["config"], given)
        if ignored:
            print(f"grpo-lab eval: note: training settings have no effect on an evaluation; the checkpoint's are "
                  f"kept (given, kept): {ignored}", file=sys.stderr)
    problems = eval_problems(config)
    policy, tokenizer = load_eval_policy(config, state)
    summary: dict[str, Any] = {"model": config.model, "checkpoint": args.checkpoint,
                               "task": config.eval_task or config.task, "questions": len(problems)}
    if args.exact:
        if config.scoring != "strict":
            raise ValueError(f"--exact computes strict Pass@1; scoring = {config.scoring!r} is not strict")
        from .exact.strict_j import THRESHOLD, Sampling, exact_evaluate

        sampling = Sampling(config.temperature, config.top_p, config.top_k, config.max_completion_length)
        threshold = THRESHOLD if args.threshold is None else args.threshold
        result = exact_evaluate(policy.model, tokenizer, problems, sampling, threshold, config.system_prompt)
        result.extra.update(summary)
        summary.update({key: value for key, value in result.to_dict().items() if key != "rows"})
        out = result.to_dict()
    else:
        sampled = evaluate(policy, tokenizer, problems, n=config.eval_samples,
                           max_completion_length=config.max_completion_length, seed=config.seed,
                           progress=not args.quiet, system_prompt=config.system_prompt)
        summary.update({"n": config.eval_samples, "scoring": config.scoring,
                        "pass@1": sampled.pass_at(1, config.scoring)})
        out = summary
    if args.out:
        atomic_write(args.out, json.dumps(out, indent=1), what="the evaluation's result")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
