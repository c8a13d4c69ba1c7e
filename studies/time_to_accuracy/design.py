"""Time to accuracy against TRL (issue 38): the design, fixed before any unit runs, and the units run in its order.

**Recipe.** The frontier study's (:mod:`studies.lag_frontier.frontier`): ``cpu_arith_smollm2`` on the task and at the
lr that ``targets.json`` records (``addsubmul1``, 1e-5), strict scoring, v = 1, one micro-batch of P·G rows
(as TRL's batch), exact J (:mod:`grpo_lab.exact.strict_j`) as the evaluator.

**Targets** are read from ``studies/time_to_accuracy/results/targets.json`` and nowhere else (never from a competitor's
run): levels of exact J, the date they were fixed, the untrained J they start from, and the question set they are
defined on (``questions``: all of the task's, or every k-th, :func:`eval_questions`). The untrained unit's J must
agree with the file's (:data:`UNTRAINED_TOLERANCE`): a different model, task or question set is refused rather
than compared against levels set for another endpoint.

**Arms** (:func:`arms`, §2 of the issue), each switching off one cause of the speed-up at a time:

================================== =============================================================================
``grpo_lab_v1``                    the loop's defaults: prompt shared by a group, empty steps skipped unrun
``grpo_lab_v1_no_share_prompt``    every row runs its own prompt (``share_prompt=False``), as TRL's
``grpo_lab_v1_empty_backward``     an empty step runs its forward and backward, then drops them
                                   (``empty_step="skip_after_backward"``): TRL's compute, the loop's rule
``grpo_lab_v{v}_{correction}``     one lagged arm (default v = 4, ``ratio``; the frontier decides which)
``trl``                            TRL's ``GRPOTrainer``, a batch with no signal takes no AdamW step
``trl_every_batch``                stock TRL: AdamW steps on every batch
================================== =============================================================================

No decoder arm: the house issue kept one decoding path for α (the other was removed), so there is no second
decoder to switch to.

**Order.** Seeds in blocks: every arm at seed n before any at n + 1, the arms within a block in a random order
drawn from :data:`ORDER_SEED` (:func:`unit_order`), written into the design. Each unit runs alone on the machine
(the clock is wall time); units record threads and the load at start and end, so a unit that was not alone shows.

**The design file** (``design.json``) holds all of the above and the statistic's settings; it is written once and
each unit records its SHA-256, so a unit from another design (or from changed targets) is refused by the summary.
The statistic: :mod:`grpo_lab.stats.passage`; the summary: :mod:`studies.time_to_accuracy.summary`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from studies.stats import passage

BUDGET_SECONDS = 600.0
EVAL_EVERY_SECONDS = 30.0
SEEDS = 5
ORDER_SEED = 38
LAG_V = 4
"""The lagged arm's v: the frontier (issue 34) found no v > 1 equivalent to v1 at 5 seeds; v = 4 with ``ratio``
is the nearest to it (docs/theory.md §3)."""
LAG_CORRECTION = "ratio"
REFERENCE = "trl"
UNTRAINED_TOLERANCE = 1e-4
"""How far the untrained unit's J may lie from ``targets.json``'s (runs at other thread counts differ by ~1e-7)."""
RECIPE = "cpu_arith_smollm2"


@dataclass(frozen=True)
class Arm:
    """One arm: which trainer, and the config fields it sets on the shared recipe (grpo_lab) or whether empty
    batches skip their optimiser step (TRL)."""

    name: str
    trainer: str
    what: str
    changes: dict[str, Any] = field(default_factory=dict)
    skip_empty: bool = True


def arms(lag_v: int = LAG_V, lag_correction: str = LAG_CORRECTION) -> list[Arm]:
    """The design's arms (module docstring), the lagged one at ``lag_v`` with ``lag_correction``."""
    if lag_v < 2:
        raise ValueError(f"the lagged arm needs v > 1, got {lag_v}")
    return [
        Arm("grpo_lab_v1", "grpo_lab", "the loop's defaults (v = 1)"),
        Arm("grpo_lab_v1_no_share_prompt", "grpo_lab", "v = 1, every row runs its own prompt",
            {"share_prompt": False}),
        Arm("grpo_lab_v1_empty_backward", "grpo_lab", "v = 1, an empty step runs forward and backward, then drops "
            "them", {"empty_step": "skip_after_backward"}),
        Arm(f"grpo_lab_v{lag_v}_{lag_correction}", "grpo_lab", f"v = {lag_v}, is_correction = {lag_correction}",
            {"v": lag_v, "is_correction": lag_correction}),
        Arm("trl", "trl", "TRL GRPOTrainer, a batch with no signal takes no optimiser step"),
        Arm("trl_every_batch", "trl", "stock TRL GRPOTrainer: an optimiser step on every batch", skip_empty=False),
    ]


def shared_recipe(task: str, lr: float) -> Any:
    """The recipe every arm starts from: the frontier's (``cpu_arith_smollm2``, strict, empty steps skipped) at
    v = 1 with one micro-batch of P·G rows, as TRL's batch."""
    from grpo_lab.lm.recipes import recipe

    base = recipe(RECIPE, task=task, lr=lr, scoring="strict", empty_step="skip", checkpoint_every=0)
    return base.replace(v=1, i=1, micro_batch_size=base.prompts_per_step * base.G)


def arm_config(base: Any, arm: Arm, seed: int) -> Any:
    """``base`` with the arm's changes at ``seed`` (TRL reads the same config: :func:`~.tta_trl.trl_config`)."""
    return base.replace(seed=seed, **arm.changes)


def unit_order(names: Sequence[str], seeds: int, order_seed: int = ORDER_SEED) -> list[tuple[str, int]]:
    """Every (arm, seed): seed blocks in order, the arms of each block in a random order (one generator seeded
    with ``order_seed`` draws every block's permutation in turn)."""
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    rng = np.random.default_rng(order_seed)
    return [(names[i], seed) for seed in range(seeds) for i in rng.permutation(len(names))]


def committed_dir() -> Path:
    """The committed units and summary: ``results/`` beside this module."""
    return Path(__file__).resolve().parent / "results"


def load_targets(path: str | Path) -> dict[str, Any]:
    """``targets.json``: exact J levels (``targets``: name → level), ``fixed_on``, ``untrained_j``, ``task``,
    ``lr`` and optionally ``questions`` ({"every": k}; default all). Levels must lie above the untrained J."""
    targets = json.loads(Path(path).read_text())
    missing = {"evaluation", "targets", "fixed_on", "untrained_j", "task", "lr"} - set(targets)
    if missing or targets["evaluation"] != "exact":
        raise ValueError(f"{path}: exact-J targets need {sorted(missing) or 'evaluation = exact'}")
    low = {name: level for name, level in targets["targets"].items() if level <= targets["untrained_j"]}
    if low:
        raise ValueError(f"{path}: targets {low} do not lie above the untrained J {targets['untrained_j']}")
    return targets


def eval_questions(targets: dict[str, Any]) -> list[Any]:
    """The question set the targets are defined on: the task's every question
    (:func:`~grpo_lab.lm.tasks.all_questions`, sorted), or every k-th of them from the first."""
    from grpo_lab.lm.tasks import all_questions

    questions = targets.get("questions", "all")
    every = 1 if questions == "all" else int(questions["every"])
    return all_questions(targets["task"])[::every]


def design_questions(design: dict[str, Any]) -> list[Any]:
    """The question set a design's units are evaluated on: its targets' (the design keeps the task beside them)."""
    return eval_questions({**design["targets"], "task": design["task"]})


def make_design(targets: dict[str, Any], *, budget: float = BUDGET_SECONDS, every: float = EVAL_EVERY_SECONDS,
                seeds: int = SEEDS, lag_v: int = LAG_V, lag_correction: str = LAG_CORRECTION,
                arm_names: Sequence[str] | None = None, stop_when_reached: bool = True, threads: int,
                eval_threads: int, order_seed: int = ORDER_SEED, questions: int) -> dict[str, Any]:
    """The design (module docstring) as plain data: arms, order, budget, marks, targets, threads, statistic."""
    chosen = [a for a in arms(lag_v, lag_correction) if arm_names is None or a.name in arm_names]
    unknown = set(arm_names or ()) - {a.name for a in chosen}
    if unknown or REFERENCE not in {a.name for a in chosen}:
        raise ValueError(f"unknown arms {sorted(unknown)}" if unknown else f"the reference arm {REFERENCE!r} is needed")
    return {"issue": 38, "recipe": RECIPE, "task": targets["task"], "lr": targets["lr"], "evaluation": "exact",
            "targets": {k: targets[k] for k in ("targets", "fixed_on", "untrained_j", "source") if k in targets}
            | {"questions": targets.get("questions", "all"), "question_count": questions},
            "budget_seconds": budget, "eval_every_seconds": every, "stop_when_reached": stop_when_reached,
            "threads": threads, "eval_threads": eval_threads, "reference": REFERENCE,
            "arms": [asdict(a) for a in chosen], "seeds": seeds, "order_seed": order_seed,
            "order": [list(u) for u in unit_order([a.name for a in chosen], seeds, order_seed)],
            "statistic": {"ratio": "restricted mean first-passage time at the budget, arm / reference",
                          "interval": "percentile bootstrap over seeds, within each arm",
                          "resamples": passage.RESAMPLES, "bootstrap_seed": passage.BOOTSTRAP_SEED,
                          "level": passage.LEVEL, "min_seeds": passage.MIN_SEEDS}}


def design_sha(design: dict[str, Any]) -> str:
    """SHA-256 of the design's canonical JSON: each unit records it."""
    return hashlib.sha256(json.dumps(design, sort_keys=True).encode()).hexdigest()


def write_design(out_dir: str | Path, design: dict[str, Any]) -> dict[str, Any]:
    """Write ``<out_dir>/design.json`` unless one exists; return the design in force (an existing different one
    is a ValueError: a design is fixed in advance, a new one needs a new ``out_dir``)."""
    path = Path(out_dir) / "design.json"
    if path.exists():
        existing = json.loads(path.read_text())
        if existing != json.loads(json.dumps(design)):
            raise ValueError(f"{path} holds another design; it is fixed before the units: use another directory")
        return existing
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(design, indent=1) + "\n")
    return design


def run_units(out_dir: str | Path, root: Path, *, units: int | None = None, model: Any = None, tokenizer: Any = None,
              questions: Sequence[Any] | None = None, problems: Callable[[Any], Sequence[Any]] | None = None,
              base: Any = None, on_unit: Callable[[dict[str, Any]], None] | None = None,
              log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Run the next units of ``<out_dir>/design.json``'s order that no file or lock holds (at most ``units``),
    after the untrained unit, calling ``on_unit(unit)`` after each (the script rebuilds the summary there);
    return the units run. ``model``/``tokenizer`` (default: the recipe's, loaded),
    ``questions`` (default :func:`eval_questions`), ``problems`` (config → training problems; default the
    recipe's) and ``base`` (the shared recipe) are for tests on a tiny model."""
    from grpo_lab.lm.text_task import train_problems
    from studies.time_to_accuracy.units import run_unit

    out = Path(out_dir)
    design = json.loads((out / "design.json").read_text())
    sha = design_sha(design)
    base, model, tokenizer, questions, untrained = prepare_sitting(out, root, design, base, model, tokenizer, questions)
    by_name = {a["name"]: Arm(**a) for a in design["arms"]}
    stop_at = max(design["targets"]["targets"].values()) if design["stop_when_reached"] else None
    done = []
    for name, seed in design["order"]:
        if units is not None and len(done) >= units:
            break
        if (out / "units" / f"{name}_s{seed}.json").exists():
            continue
        config = arm_config(base, by_name[name], seed)
        log(f"unit {name}_s{seed}: {design['budget_seconds']:.0f} training seconds")
        unit = run_unit(by_name[name], seed, config, out, root, sha, budget=design["budget_seconds"],
                        every=design["eval_every_seconds"], stop_at=stop_at, questions=questions,
                        untrained_j=untrained["j"], eval_threads=design["eval_threads"], model=model,
                        tokenizer=tokenizer, problems=(problems or train_problems)(config))
        if unit is not None:
            done.append(unit)
            if on_unit is not None:
                on_unit(unit)
            log(f"unit {name}_s{seed}: J {untrained['j']:.3f} -> {unit['points'][-1]['j']:.3f} at "
                f"{unit['follow_up_seconds']:.0f} training s, {unit['steps']} steps "
                f"({unit['optimizer_steps']} optimiser steps), {unit['wall_seconds']:.0f} s wall")
    return done


def prepare_sitting(out: Path, root: Path, design: dict[str, Any], base: Any = None, model: Any = None,
                    tokenizer: Any = None, questions: Sequence[Any] | None = None) -> tuple[Any, Any, Any, Any, Any]:
    """What a sitting of a design on exact-J targets needs before its first unit: (``base``, ``model``,
    ``tokenizer``, ``questions``, the untrained unit). Defaults: the shared recipe of the design's task and lr, its
    model loaded, the targets' question set; the untrained unit is computed once (``<out>/units/untrained.json``)
    and its J must be the targets' (:data:`UNTRAINED_TOLERANCE`): another model, task or question set is refused."""
    from studies.time_to_accuracy.units import run_untrained

    base = shared_recipe(design["task"], design["lr"]) if base is None else base
    if model is None:
        from grpo_lab.lm.models import load_policy

        model, tokenizer = load_policy(base.model, dtype=base.weights_dtype(), device=base.torch_device())
    questions = design_questions(design) if questions is None else questions
    targets = design["targets"]
    if len(questions) != targets["question_count"]:
        raise ValueError(f"{len(questions)} questions, the design's targets are on {targets['question_count']}")
    untrained = run_untrained(out, root, design_sha(design), base, questions, design["eval_threads"], model, tokenizer)
    if abs(untrained["j"] - targets["untrained_j"]) > UNTRAINED_TOLERANCE:
        raise ValueError(f"the untrained J here is {untrained['j']:.6f}, the targets' {targets['untrained_j']:.6f}: "
                         "another model, task or question set than the targets were fixed on")
    return base, model, tokenizer, questions, untrained


def load_summary(out_dir: str | Path | None = None) -> dict[str, Any]:
    """The ``summary.json`` in ``out_dir`` (default :func:`committed_dir`)."""
    path = Path(committed_dir() if out_dir is None else out_dir) / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run studies/time_to_accuracy/run.py first")
    return json.loads(path.read_text())
