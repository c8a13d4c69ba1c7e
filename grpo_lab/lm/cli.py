"""``grpo-lab train | eval`` — the LLM path from a YAML recipe.

    grpo-lab train --config grpo_lab/configs/cpu_arith_smollm2.yaml [--set v=4 --set steps=20]
    grpo-lab eval  --config grpo_lab/configs/cpu_arith_smollm2.yaml [--checkpoint runs/x/checkpoint.pt]

A recipe is a flat YAML mapping of :class:`~grpo_lab.lm.train_config.TrainConfig`
fields; ``--set key=value`` overrides one (the value is read as YAML: ``v=4``,
``eps_high=0.28``, ``report_to=[tensorboard]``); :mod:`grpo_lab.lm.recipes` reads both.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .recipes import load_config
from .train_config import TrainConfig


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grpo-lab", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("train", "train (or resume) a run"), ("eval", "Pass@1 of a model or checkpoint")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--config", help="YAML recipe (see grpo_lab/configs/)")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a field")
        p.add_argument("--quiet", action="store_true", help="no progress bar")
    sub.choices["train"].add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint")
    sub.choices["eval"].add_argument("--checkpoint", help="evaluate π_θ of this checkpoint (default: the model)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, args.set)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    from .training import RunDirInUse

    try:
        if args.command == "train":
            return _train(config, progress=not args.quiet, resume=not args.no_resume)
        return _evaluate(config, args.checkpoint, progress=not args.quiet)
    # bad input (a model path, data files, a busy output_dir), a full or read-only disk (DiskError is an OSError)
    except (ValueError, OSError, RunDirInUse) as exc:
        print(f"grpo-lab {args.command}: error: {exc}", file=sys.stderr)
        return 2


def _train(config: TrainConfig, progress: bool, resume: bool) -> int:
    from .training import train

    loop = train(config, progress=progress, resume=resume)
    last = loop.history[-1] if loop.history else None
    print(json.dumps({"steps": loop.k, "last_reward_mean": last and last.reward_mean,
                      "output_dir": config.output_dir}))
    return 0


def _evaluate(config: TrainConfig, checkpoint: str | None, progress: bool) -> int:
    from .build import build_loop
    from .checkpoint import load_checkpoint
    from .evaluate import evaluate
    from .text_task import eval_problems

    problems = eval_problems(config)
    loop = build_loop(config, problems=problems)
    if checkpoint:
        load_checkpoint(loop, checkpoint)
    result = evaluate(loop.policy, loop.tokenizer, problems, n=config.eval_samples,
                      max_completion_length=config.max_completion_length, seed=config.seed, progress=progress,
                      system_prompt=config.system_prompt)
    print(json.dumps({"model": config.model, "checkpoint": checkpoint, "task": config.eval_task or config.task,
                      "questions": len(problems), "n": config.eval_samples, "scoring": config.scoring,
                      "pass@1": result.pass_at(1, config.scoring)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
