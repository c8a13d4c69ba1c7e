"""Seconds per optimiser step, interleaved: the loop, its variants that each take one of TRL's ways, and TRL's
``GRPOTrainer``, on the steps-to-target study's recipe, one step each in turn (the study's seconds half and its
decomposition: ``studies/steps_to_target/design.py``).

Every side runs the recipe as the study's units do: the loop through ``build_loop`` with the side's config fields
changed (``studies.steps_to_target.design.SIDES``), TRL through the same ``run_trl`` as the TRL units (its real
training loop, empty-batch rule included), in a thread of its own that pauses between steps (:class:`Turns`), so
only one side computes at a time and a step's seconds are its own. A round gives every side two steps, in an order
drawn per round: one whose rewards are replaced by a fixed pattern with signal in every group (it trains: c) and
one whose rewards are all zero (it is empty: c∅). The reward function still runs; only its output is replaced, so
the seconds hold all the work but the chance of which batches are empty, which the study's units count instead.
After every step π_θ is put back to its starting weights, off the clock (:class:`Untrained`), so every side keeps
sampling from the same policy and times the same kind of completions.
The first rounds are a warm-up, kept in the file and marked. Six sides do not fit in 23 GiB at once, so the
sides run in the design's groups (``studies.steps_to_target.design.RECIPE_GROUPS``), one after another, each in a
process of its own and with ``grpo_lab_v1``; one file per group. Written to ``--out`` with provenance (commit, CPU
model and vector extensions, library versions, threads, load at the start and end), every side's config (TRL's as
its trainer resolved it) and, per round and side, each step's seconds, whether it stepped, its parts and its
completion tokens. Run it alone on the machine::

    .venv/bin/python benchmarks/step_seconds.py                                   # addsubmul1, 8 tokens, 20 rounds
    .venv/bin/python benchmarks/step_seconds.py --group 2                         # one group of its sides only
    .venv/bin/python benchmarks/step_seconds.py --amendment trl_scoring           # TRL scoring completions only
    .venv/bin/python benchmarks/step_seconds.py --amendment long_completions      # 128-token chains, 10 rounds
    .venv/bin/python studies/steps_to_target/run.py --summary                     # the ratios, with intervals
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:   # run as a script from any folder
    sys.path.insert(0, str(ROOT))

from studies.steps_to_target import design  # noqa: E402

MODES = ("signal", "empty")
"""A round's two steps per side: rewards with signal in every group (the step trains), and all zero (it is empty)."""


def forced_rewards(real: torch.Tensor, mode: str, group_size: int, per_completion: bool) -> torch.Tensor:
    """Rewards of ``real``'s shape and dtype: all zero for ``empty``; for ``signal``, 1 on each group's first
    completion and 0 on the others, so every group has signal. ``real`` holds a group a row (the loop's ``[P, G]``)
    or, ``per_completion``, a completion a row in groups of ``group_size`` (TRL's ``[B, reward functions]``)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    out = torch.zeros_like(real)
    if mode == "signal":
        (out[::group_size] if per_completion else out[:, 0]).fill_(1)
    return out


class Untrained:
    """π_θ's starting weights, put back after every step (off the clock): the forced rewards would otherwise train
    each side's policy its own way, and its completion lengths with it (a first run drifted the loop's and TRL's
    completions to the 8-token cap and the ``model.generate`` sides' to 2 tokens within ~10 rounds), so the sides
    would time different work. With the weights restored every step samples from the same untrained policy; AdamW
    still takes its full step, and the loop's next sync copies the restored π_θ into α."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.weights = {name: value.detach().clone() for name, value in model.state_dict().items()}

    def restore(self) -> None:
        with torch.no_grad():
            self.model.load_state_dict(self.weights)


class LoopSide:
    """One of the loop's sides: ``build_loop`` on the recipe with the side's changes, rewards forced by mode, π_θ
    put back to its starting weights after each step (:class:`Untrained`)."""

    def __init__(self, config: Any, model: Any, tokenizer: Any, problems: Sequence[Any]) -> None:
        from grpo_lab.lm.build import build_loop

        self.config, self.mode, self.tokens = config, "signal", 0
        self.loop = build_loop(config, model=model, tokenizer=tokenizer, problems=problems)
        rewards, sample = self.loop.task.rewards, self.loop.sampler.sample

        def forced(rollout: Any, generator: torch.Generator) -> torch.Tensor:
            return forced_rewards(rewards(rollout, generator), self.mode, config.G, per_completion=False)

        def counted(*args: Any, **kwargs: Any) -> Any:
            rollout = sample(*args, **kwargs)
            self.tokens = int(rollout.mask.sum())
            return rollout

        self.loop.task.rewards, self.loop.sampler.sample = forced, counted
        self.untrained = Untrained(self.loop.policy.model)

    def step(self, mode: str) -> dict[str, Any]:
        self.mode = mode
        start = time.perf_counter()
        record = self.loop.step()
        seconds = time.perf_counter() - start
        self.untrained.restore()
        return {"seconds": seconds, "stepped": not record.skipped, "tokens": self.tokens,
                "sample": record.sample_seconds, "train": record.train_seconds,
                "sync": record.sync_seconds + record.audit_seconds}

    def described(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "sampler": type(self.loop.sampler).__name__,
                "micro_batch_size": self.loop.micro_batch_size}     # the memory guard's, where it changed it


class Turns:
    """A trainer whose own loop runs in a thread, one step per turn: ``run(between)`` trains and calls
    ``between()`` once before its first step and after each step; ``between`` hands control back and waits for the
    next :meth:`turn` (it returns True when :meth:`close` asks the trainer to stop). Only one thread computes at a
    time, so a turn's seconds are one step's; the thread runs at the caller's torch thread count."""

    def __init__(self, run: Callable[[Callable[[], bool]], None]) -> None:
        self._go, self._back = threading.Semaphore(0), threading.Semaphore(0)
        self._stop, self._finished = False, False
        self.error: BaseException | None = None
        threads = torch.get_num_threads()

        def main() -> None:
            torch.set_num_threads(threads)     # a new thread starts at the library's default
            try:
                run(self._between)
            except BaseException as error:     # raised again in the caller's thread
                self.error = error
            self._finished = True
            self._back.release()

        self._thread = threading.Thread(target=main, daemon=True)
        self._thread.start()
        self._wait()

    def _between(self) -> bool:
        self._back.release()
        self._go.acquire()
        return self._stop

    def _wait(self) -> None:
        self._back.acquire()
        if self.error is not None:
            raise RuntimeError("the trainer's thread failed") from self.error
        if self._finished:
            raise RuntimeError("the trainer stopped before it was told to")

    def turn(self) -> float:
        """One step of the trainer; its seconds."""
        start = time.perf_counter()
        self._go.release()
        self._wait()
        return time.perf_counter() - start

    def close(self) -> None:
        """Tell the trainer to stop after its current step, and wait until it has."""
        if not self._finished:
            self._stop = True
            self._go.release()
            self._thread.join()


class TRLSide:
    """TRL's side: the TRL units' ``run_trl`` (the empty-batch rule on) in :class:`Turns`, its reward calls forced by
    mode and its generation calls counted, its model put back to its starting weights after each step
    (:class:`Untrained`); ``trl_config`` is the trainer's resolved ``args``. With ``completions_only`` its steps run
    under :func:`~studies.time_to_accuracy.trl_side.completion_scoring`; ``micro_batch_size``: ``run_trl``'s."""

    def __init__(self, config: Any, model: Any, tokenizer: Any, problems: Sequence[Any],
                 completions_only: bool = False, micro_batch_size: int | None = None) -> None:
        from studies.time_to_accuracy.trl_side import run_trl

        self.completions_only = completions_only
        self.mode, self.stepped, self.tokens = "signal", [], []
        self.trl_config: dict[str, Any] = {}

        def wrap(trainer: Any) -> None:
            self.trl_config = json.loads(trainer.args.to_json_string())
            self.untrained = Untrained(trainer.model)
            rewards, generate = trainer._calculate_rewards, trainer._generate

            def forced(*args: Any, **kwargs: Any) -> torch.Tensor:
                return forced_rewards(rewards(*args, **kwargs), self.mode, config.G, per_completion=True)

            def counted(prompts: Any) -> Any:
                out = generate(prompts)
                self.tokens.append(sum(map(len, out[1])))   # (prompt ids, completion ids, …)
                return out

            trainer._calculate_rewards, trainer._generate = forced, counted

        def run(between: Callable[[], bool]) -> None:
            run_trl(config, model, tokenizer, problems, on_start=between,
                    after_step=lambda stepped, _: self.stepped.append(stepped) or between(), on_trainer=wrap,
                    micro_batch_size=micro_batch_size)

        self.turns = Turns(run)

    def step(self, mode: str) -> dict[str, Any]:
        self.mode = mode
        from studies.time_to_accuracy.trl_side import completion_scoring

        with completion_scoring() if self.completions_only else contextlib.nullcontext():
            seconds = self.turns.turn()
        self.untrained.restore()         # TRL's thread waits between steps: the weights are the caller's to set
        return {"seconds": seconds, "stepped": self.stepped[-1], "tokens": self.tokens[-1]}

    def described(self) -> dict[str, Any]:
        return {"trl_config": self.trl_config,
                "scoring": "completion positions" if self.completions_only else "every position"}


TRL_VARIANTS = {"trl_completions": {"completions_only": True}}
"""The amendments' sides (:data:`~studies.steps_to_target.design.AMENDMENTS`): TRL with these :class:`TRLSide`
options."""


def build_sides(names: Sequence[str], base: Any, model: Any, tokenizer: Any, problems: Sequence[Any],
                micro_batch_size: int | None = None) -> dict[str, LoopSide | TRLSide]:
    """Each named side of :data:`~studies.steps_to_target.design.SIDES` or of an amendment's sides (TRL variants)
    on ``base`` (seed 0), on its own copy of ``model``; given ``micro_batch_size``, every side runs that many
    sequences a forward (the loop's micro-batch, TRL's per-device batch), else the loop's sides ``base``'s and TRL's
    the whole batch."""
    sides: dict[str, LoopSide | TRLSide] = {}
    for name in names:
        changes = design.SIDES.get(name, {})
        if name in TRL_VARIANTS or changes is None:
            sides[name] = TRLSide(base, copy.deepcopy(model), tokenizer, problems, micro_batch_size=micro_batch_size,
                                  **TRL_VARIANTS.get(name, {}))
            continue
        micro = {} if micro_batch_size is None else {"micro_batch_size": micro_batch_size}
        sides[name] = LoopSide(base.replace(**changes, **micro), copy.deepcopy(model), tokenizer, problems)
    return sides


def interleave(sides: Mapping[str, LoopSide | TRLSide], rounds: int, warmup: int,
               order_seed: int) -> list[dict[str, Any]]:
    """``warmup`` + ``rounds`` rounds: in each, every side's ``signal`` step, then every side's ``empty`` step, the
    sides in an order drawn per round and mode from one generator seeded ``order_seed``. A signal step that did not
    step, or an empty one that did, is a RuntimeError: the forced rewards did not reach the trainer."""
    rng = np.random.default_rng(order_seed)
    names, out = list(sides), []
    for index in range(warmup + rounds):
        order = {mode: [names[i] for i in rng.permutation(len(names))] for mode in MODES}
        steps: dict[str, dict[str, Any]] = {name: {} for name in names}
        for mode in MODES:
            for name in order[mode]:
                steps[name][mode] = sides[name].step(mode)
                if steps[name][mode]["stepped"] != (mode == "signal"):
                    raise RuntimeError(f"{name}'s {mode} step of round {index} "
                                       f"{'did not step' if mode == 'signal' else 'stepped'}")
        out.append({"warmup": index < warmup, "order": order, "sides": steps})
    return out


def run_group(task: str, tokens: int, pairs: int, group: int, names: Sequence[str], out: Path,
              amendment: Mapping[str, Any] | None = None, micro_batch_size: int | None = None) -> dict[str, Any]:
    """One group of sides on the recipe at ``tokens`` completion tokens (and ``micro_batch_size`` sequences a
    forward on every side, where given: TRL's per-device batch): build them, interleave warm-up + ``pairs`` rounds,
    write ``out`` with provenance (and the amendment's number and SHA-256 if it is an amendment's run) and return
    the record."""
    from grpo_lab.lm.models import load_policy
    from grpo_lab.lm.text_task import train_problems
    from grpo_lab.provenance import provenance
    from studies.time_to_accuracy import design as tta

    record: dict[str, Any] = {"task": task, "tokens": tokens, "pairs": pairs, "group": group,
                              "warmup_rounds": design.WARMUP_ROUNDS, "order_seed": design.ORDER_SEED,
                              "design_sha": tta.design_sha(json.loads((design.HERE / "design.json").read_text())),
                              **({} if amendment is None else {"amendment": amendment["number"],
                                                               "amendment_sha": design.amendment_sha(amendment)}),
                              **provenance(ROOT, ignore=out.parent)}
    wall = time.perf_counter()
    base = tta.shared_recipe(task, design.load_design()["lr"]).replace(
        max_completion_length=tokens, train_problems=200, seed=0)
    model, tokenizer = load_policy(base.model, dtype=base.weights_dtype(), device=base.torch_device())
    sides = build_sides(names, base, model, tokenizer, train_problems(base), micro_batch_size)
    print(f"{task}, {tokens} tokens, group {group}: sides {list(names)}, {design.WARMUP_ROUNDS} + {pairs} rounds, "
          f"{torch.get_num_threads()} threads", flush=True)
    rounds = interleave(sides, pairs, design.WARMUP_ROUNDS, design.ORDER_SEED)
    for side in sides.values():
        if isinstance(side, TRLSide):
            side.turns.close()
    record |= {"sides": {name: side.described() for name, side in sides.items()}, "rounds": rounds,
               "load_end": list(os.getloadavg()), "wall_seconds": time.perf_counter() - wall}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record) + "\n")
    kept = [r for r in rounds if not r["warmup"]]
    for name in names:
        c = np.mean([r["sides"][name]["signal"]["seconds"] for r in kept])
        c_empty = np.mean([r["sides"][name]["empty"]["seconds"] for r in kept])
        print(f"{name:18s} c {c:7.2f} s   c_empty {c_empty:7.2f} s", flush=True)
    print(f"written to {out}", flush=True)
    return record


def main(argv: Sequence[str] | None = None) -> None:
    settings = {task: (tokens, pairs, groups) for task, tokens, pairs, groups in design.SECONDS_TASKS}
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default=design.SECONDS_TASKS[0][0], choices=sorted(settings))
    parser.add_argument("--tokens", type=int, default=None, help="completion tokens (default: the design's)")
    parser.add_argument("--pairs", type=int, default=None, help="rounds kept (default: the design's, at least 10)")
    parser.add_argument("--group", type=int, nargs="+", default=None,
                        help="which of the task's groups of sides to run, from 1 (default: each in turn)")
    parser.add_argument("--amendment", default=None,
                        choices=[design.amendment_name(a) for a in design.AMENDMENTS if a.get("runs")],
                        help="run this amendment's benchmark instead (its task, tokens, rounds and one group)")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--out", type=Path, default=design.HERE / "seconds",
                        help="folder of the files <task>_<tokens>_g<group>.json")
    args = parser.parse_args(argv)
    if args.amendment is not None:
        amendment = next(a for a in design.AMENDMENTS if design.amendment_name(a) == args.amendment)
        (run,) = amendment["runs"]
        (names,) = run["groups"]
        torch.set_num_threads(args.threads)
        run_group(run["task"], run["tokens"], run["pairs"], 1, names,
                  args.out / f"{run['task']}_{run['tokens']}_a{amendment['number']}.json", amendment,
                  run.get("micro_batch_size"))
        return
    tokens, pairs, groups = settings[args.task]
    tokens, pairs = args.tokens or tokens, args.pairs or pairs
    replacing = design.replaced_runs().get(f"{args.task}_{tokens}")
    if replacing is not None:
        name = design.AMENDMENT_NAMES[replacing - 1]
        parser.error(f"{args.task} at {tokens} tokens is amendment {name}'s run now: --amendment {name}")
    chosen = args.group or list(range(1, len(groups) + 1))
    bad = [g for g in chosen if not 1 <= g <= len(groups)]
    if bad:
        parser.error(f"--group {bad}: {args.task} has groups 1 to {len(groups)}: {[list(g) for g in groups]}")
    if len(chosen) > 1:     # each group in a fresh process: a group's freed memory would shrink the next one's
        for group in chosen:   # micro-batches (the memory guard reads what the OS has free)
            subprocess.run([sys.executable, __file__, "--task", args.task, "--tokens", str(tokens), "--pairs",
                            str(pairs), "--group", str(group), "--threads", str(args.threads), "--out", str(args.out)],
                           check=True)
        return
    torch.set_num_threads(args.threads)
    group = chosen[0]
    run_group(args.task, tokens, pairs, group, groups[group - 1], args.out / f"{args.task}_{tokens}_g{group}.json")


if __name__ == "__main__":
    main()
