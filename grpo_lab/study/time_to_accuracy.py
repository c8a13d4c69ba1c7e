"""Time to accuracy (issue 25 §5): how soon held-out Pass@1 rises, in training seconds, for grpo_lab
at v = 1 and v = 8 and for TRL's ``GRPOTrainer`` on the same recipe.

A step ratio (``benchmarks/trl_step_ratio.py``) compares one step; a user feels how soon the model
gets good. Every arm trains the same model on the same task, problems, strict reward, P, G, lr, β,
temperature and loss type (``grpo``) for the same budget of training seconds, and is scored on the
same held-out questions with the same sampling seed at fixed shares of the budget
(:data:`EVAL_FRACTIONS`). Evaluation time is taken off the clock (:class:`TrainingClock`), and so is
the set-up before the first step (loading, α's copy, TRL's trainer construction).

========================= ==========================================================================
arm                       what trains
========================= ==========================================================================
``grpo_lab_v1``           :class:`~grpo_lab.loop.GRPOLoop`, v = 1 (α synced every step)
``grpo_lab_v8``           the loop at v = 8 with the paper's ratios (``is_correction="ratio"``)
``trl``                   ``trl.GRPOTrainer`` (1.16), driven by its own ``train()``, transformers
                          generation; TRL's defaults that differ are set to the recipe's (loss type,
                          lr schedule constant, temperature, dropout off), gradient checkpointing
                          is off (memory does not bind here; on, it recomputes the forward), and a
                          batch with no signal takes no optimiser step (:func:`skip_empty_batch`)
``trl_every_batch``       the same, but stock: AdamW steps on every batch, also on a zero gradient
                          (run on request, not one of the compared :data:`ARMS`)
========================= ==========================================================================

Both grpo_lab arms keep the loop's defaults of the recipe: the zero-variance mask, ``empty_step="skip"``
and the sync audit. Stock TRL takes an optimiser step on every batch; with strict scoring over half the
batches have no signal, and AdamW's momentum then keeps moving θ along the last real gradient, several
times that gradient's own step in all. That is a rule of the recipe, not of the trainer's speed, so the
``trl`` arm takes the recipe's rule too (``empty_step="skip"``: with β = 0 a batch has no signal exactly
when its gradient is zero) and ``trl_every_batch`` shows what the stock rule does. Files (``out_dir``, default
``results/time_to_accuracy``): ``units/<arm>_s<seed>.json`` per run, ``units/untrained.json`` (the
t = 0 point of every curve), and ``summary.json`` rebuilt from them (issue 25's schema).
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..checks import require_int_at_least, require_number_in
from ..files import atomic_write, results_path
from ..lm.evaluate import EvalResult
from ..lm.train_config import TrainConfig
from .cpu_study import EVAL_SEED, eval_entry
from .design import UNTRAINED
from .results import bounded_mean_ci

ARMS = ("grpo_lab_v1", "grpo_lab_v8", "trl")
"""The compared arms: every (arm, seed) unit of :func:`unit_order` by default."""
ALL_ARMS = (*ARMS, "trl_every_batch")
EVAL_FRACTIONS = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0)
"""Shares of the budget at which every run is scored (denser early, where the curves separate)."""


class TrainingClock:
    """Training seconds with evaluations taken out, and when to score.

    ``start()`` at the first step; ``step_done(score)`` after each step (trained or skipped): once an
    evaluation time has passed it calls ``score`` with the clock stopped, and it says when the budget
    is spent. One rule for every arm: the TRL arm calls it from a callback.
    """

    def __init__(self, budget_seconds: float, fractions: Sequence[float] = EVAL_FRACTIONS) -> None:
        require_number_in("budget_seconds", budget_seconds, 0.0, low_open=True)
        if not fractions or list(fractions) != sorted(fractions) or fractions[0] <= 0 or fractions[-1] != 1:
            raise ValueError(f"fractions must rise in (0, 1] and end at 1, got {fractions!r}")
        self.budget_seconds = budget_seconds
        self.times = [f * budget_seconds for f in fractions]
        self.points: list[dict[str, Any]] = []
        self.steps = 0
        self._started: float | None = None
        self._paused = 0.0

    def start(self) -> None:
        self._started, self._paused = time.perf_counter(), 0.0

    @property
    def seconds(self) -> float:
        if self._started is None:
            raise RuntimeError("the clock was not started")
        return time.perf_counter() - self._started - self._paused

    def step_done(self, score: Callable[[], EvalResult]) -> bool:
        """Count a step; score once if one or more evaluation times have passed (each gets the point);
        True once the budget is spent, after its last evaluation."""
        self.steps += 1
        now = self.seconds
        due = [t for t in self.times if t <= now][len(self.points):]
        if due:
            paused = time.perf_counter()
            entry = {"seconds": now, "steps": self.steps, **eval_entry(score())}
            self.points.extend({"at": t, **entry} for t in due)
            self._paused += time.perf_counter() - paused
        return now >= self.budget_seconds


def seconds_to_reach(curve: Sequence[Sequence[float]], target: float) -> float | None:
    """The first time a curve of (seconds, Pass@1) points reaches ``target``, linearly interpolated
    between the point before and the first at or above it; None if it never does."""
    previous: Sequence[float] | None = None
    for point in curve:
        seconds, value = point[0], point[1]
        if value >= target:
            if previous is None or previous[1] >= target:
                return float(seconds)
            share = (target - previous[1]) / (value - previous[1])
            return float(previous[0] + share * (seconds - previous[0]))
        previous = point
    return None


def recipe(base: TrainConfig, arm: str, seed: int) -> TrainConfig:
    """The arm's config: the base recipe at the arm's lag, micro-batches the whole batch (as TRL does)."""
    if arm not in ALL_ARMS:
        raise ValueError(f"arm must be one of {ALL_ARMS}, got {arm!r}")
    v = 8 if arm == "grpo_lab_v8" else 1
    return base.replace(v=v, i=1, is_correction="ratio", seed=seed, checkpoint_every=0,
                        micro_batch_size=base.prompts_per_step * base.G)


def run_grpo_lab(config: TrainConfig, model: Any, tokenizer: Any, problems: Sequence[Any],
                 clock: TrainingClock, score: Callable[[Any], EvalResult]) -> dict[str, Any]:
    """Train the loop until the clock's budget is spent; scores ``loop.policy`` at the clock's times."""
    from ..lm.build import build_loop

    loop = build_loop(config, model=model, tokenizer=tokenizer, problems=problems)
    clock.start()
    skipped = 0
    while True:
        skipped += bool(loop.step().skipped)
        if clock.step_done(lambda: score(loop.policy)):
            break
    return {"steps": clock.steps, "optimizer_steps": clock.steps - skipped}


def trl_config(config: TrainConfig, output_dir: str) -> Any:
    """``trl.GRPOConfig`` for the recipe in ``config``: every default of TRL that differs is set."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir, per_device_train_batch_size=config.prompts_per_step * config.G,
        gradient_accumulation_steps=1, num_generations=config.G, max_completion_length=config.max_completion_length,
        learning_rate=config.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm, beta=config.beta, epsilon=config.eps_low, loss_type=config.loss_type,
        num_iterations=config.i, temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
        scale_rewards="group", disable_dropout=True, activation_checkpointing=False, use_cpu=True, bf16=False,
        seed=config.seed, data_seed=config.seed, max_steps=10**6, report_to="none", save_strategy="no",
        disable_tqdm=True)


def skip_empty_batch() -> Any:
    """A ``TrainerCallback`` for a stock ``trl.GRPOTrainer`` with β = 0: before each optimiser step, if every
    gradient is zero (every advantage 0: the batch has no signal) it sets them to ``None``, so AdamW skips
    the step and leaves its moments as they were (the loop's ``empty_step="skip"``). ``skipped`` counts them."""
    from transformers import TrainerCallback

    class SkipEmptyBatch(TrainerCallback):
        skipped = 0

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, optimizer: Any = None,
                                  **kwargs: Any) -> None:
            grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            if not any(bool(g.any()) for g in grads):
                optimizer.zero_grad(set_to_none=True)
                self.skipped += 1

    return SkipEmptyBatch()


def trl_trainer(config: TrainConfig, model: Any, tokenizer: Any, problems: Sequence[Any], output_dir: str,
                callbacks: Sequence[Any] = ()) -> Any:
    """``trl.GRPOTrainer`` on the recipe (:func:`trl_config`): ``problems`` as text prompts and the strict reward,
    where a completion has finished if it ends in one of the trainer's EOS ids."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from ..lm.rewards import strict_reward
    from ..lm.tasks import build_prompt

    stop_ids: set[int] = set()

    def reward(completions: list[str], completion_ids: list[list[int]], answer: list[str],
               answer_format: list[str], **kwargs: Any) -> list[float]:
        return [strict_reward(text, bool(ids) and ids[-1] in stop_ids, gold, form)
                for text, ids, gold, form in zip(completions, completion_ids, answer, answer_format, strict=True)]

    data = Dataset.from_dict({"prompt": [build_prompt(p, tokenizer, config.system_prompt) for p in problems],
                              "answer": [p.answer for p in problems],
                              "answer_format": [p.answer_format for p in problems]})
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=trl_config(config, output_dir), train_dataset=data,
                          processing_class=tokenizer, callbacks=list(callbacks))
    stop_ids.update(trainer.eos_token_ids)
    return trainer


def run_trl(config: TrainConfig, model: Any, tokenizer: Any, problems: Sequence[Any],
            clock: TrainingClock, score: Callable[[Any], EvalResult], skip_empty: bool = True) -> dict[str, Any]:
    """Train ``trl.GRPOTrainer`` with the strict reward until the clock's budget is spent; with
    ``skip_empty`` a batch with no signal takes no optimiser step (:func:`skip_empty_batch`)."""
    import tempfile

    from transformers import TrainerCallback

    from ..lm.policy import LMPolicy

    if skip_empty and config.beta != 0:
        raise ValueError(f"skipping empty batches by their zero gradient needs beta = 0, got {config.beta}")

    class Clocked(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            clock.start()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            control.should_training_stop = clock.step_done(
                lambda: score(LMPolicy(kwargs["model"], temperature=config.temperature)))

    skipper = skip_empty_batch()
    with tempfile.TemporaryDirectory() as output_dir:
        trl_trainer(config, model, tokenizer, problems, output_dir,
                    callbacks=[Clocked(), *([skipper] if skip_empty else [])]).train()
    return {"steps": clock.steps, "optimizer_steps": clock.steps - skipper.skipped}


def run_trl_every_batch(config: TrainConfig, model: Any, tokenizer: Any, problems: Sequence[Any],
                        clock: TrainingClock, score: Callable[[Any], EvalResult]) -> dict[str, Any]:
    """Stock ``trl.GRPOTrainer``: an optimiser step on every batch."""
    return run_trl(config, model, tokenizer, problems, clock, score, skip_empty=False)


RUNNERS = {"grpo_lab_v1": run_grpo_lab, "grpo_lab_v8": run_grpo_lab, "trl": run_trl,
           "trl_every_batch": run_trl_every_batch}


def unit_order(seeds: int, arms: Sequence[str] = ARMS) -> list[tuple[str, int]]:
    """Every (arm, seed), seed by seed, so every arm has n seeds before any has n + 1."""
    require_int_at_least("seeds", seeds, 1)
    return [(arm, seed) for seed in range(seeds) for arm in arms]


def settings(base: TrainConfig, budget_seconds: float, eval_questions: int) -> dict[str, Any]:
    """What every unit of one comparison shares; a unit made under other settings is refused."""
    return {"task": base.task, "model": base.model, "scoring": base.scoring, "prompts_per_step": base.prompts_per_step,
            "G": base.G, "max_completion_length": base.max_completion_length, "temperature": base.temperature,
            "lr": base.lr, "beta": base.beta, "loss_type": base.loss_type, "budget_seconds": budget_seconds,
            "eval_fractions": list(EVAL_FRACTIONS), "eval_questions": eval_questions,
            "eval_samples": base.eval_samples, "eval_seed": EVAL_SEED}


def load_units(out_dir: str | Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    units = Path(out_dir) / "units"
    untrained = units / f"{UNTRAINED}.json"
    runs = [json.loads(p.read_text()) for p in sorted(units.glob("*_s*.json"))] if units.is_dir() else []
    return (json.loads(untrained.read_text()) if untrained.is_file() else None), runs


def run_curve(run: dict[str, Any], before: float) -> list[list[float]]:
    """One unit's (training seconds, Pass@1) points, from (0, ``before``): the untrained score."""
    return [[0.0, before]] + [[p["seconds"], p["pass_at_1"]] for p in run["points"]]


def arm_curve(runs: Sequence[dict[str, Any]], before: float) -> dict[str, list[float]]:
    """One arm's curve over its seeds: mean seconds and mean Pass@1 with its 95 % t interval (clipped to
    [0, 1]) at each evaluation time, from (0, ``before``)."""
    curves = np.array([run_curve(r, before) for r in runs])          # [seeds, points, (seconds, Pass@1)]
    mean, low, high = bounded_mean_ci(curves[:, :, 1])
    return {"seconds": curves[:, :, 0].mean(0).tolist(), "pass_at_1": mean.tolist(),
            "ci_low": [None if math.isnan(x) else x for x in low.tolist()],
            "ci_high": [None if math.isnan(x) else x for x in high.tolist()]}


def rebuild_summary(out_dir: str | Path) -> dict[str, Any]:
    """``summary.json`` from the units: issue 25's schema plus each arm's mean curve, TRL's final
    score, the seconds each arm needs to reach it (on its mean curve and per seed) and the ratio to TRL's."""
    untrained, runs = load_units(out_dir)
    if untrained is None:
        raise FileNotFoundError(f"no untrained unit in {Path(out_dir) / 'units'}")
    s, before = untrained["settings"], untrained["eval"]["pass_at_1"]
    by_arm = {arm: [r for r in runs if r["arm"] == arm] for arm in ALL_ARMS}
    curves = {arm: arm_curve(rs, before) for arm, rs in by_arm.items() if rs}
    summary: dict[str, Any] = {
        "budget_seconds": s["budget_seconds"], "task": s["task"], "scoring": s["scoring"], "settings": s,
        "untrained_pass_at_1": before, "machine": untrained.get("machine"),
        "runs": [{"arm": r["arm"], "seed": r["seed"], "curve": run_curve(r, before), "steps": r["steps"],
                  "optimizer_steps": r["optimizer_steps"], "wall_seconds": r["wall_seconds"]} for r in runs],
        "mean_curves": curves}
    if "trl" in curves:
        final = curves["trl"]["pass_at_1"][-1]
        reach = {arm: seconds_to_reach(list(zip(c["seconds"], c["pass_at_1"], strict=True)), final)
                 for arm, c in curves.items()}
        summary.update(trl_final_pass_at_1=final, seconds_to_trl_final=reach,
                       ratio_to_trl={arm: None if t is None or not reach["trl"] else t / reach["trl"]
                                     for arm, t in reach.items()},
                       seconds_to_trl_final_by_seed={
                           arm: {str(r["seed"]): seconds_to_reach(run_curve(r, before), final) for r in rs}
                           for arm, rs in by_arm.items() if rs})
    atomic_write(Path(out_dir) / "summary.json", json.dumps(summary, indent=1), what="the time-to-accuracy summary")
    return summary


def run_units(base: TrainConfig, budget_seconds: float, out_dir: str | Path, seeds: int = 3,
              arms: Sequence[str] = ARMS, units: int | None = None, machine: dict[str, Any] | None = None,
              model: Any = None, tokenizer: Any = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the next missing units of :func:`unit_order` (at most ``units``), each alone, writing its unit
    file and rebuilding the summary after each; return the summary. ``model``/``tokenizer``: the
    untrained model (default: load ``base.model``); every run trains a copy."""
    from ..lm.evaluate import evaluate
    from ..lm.models import load_policy
    from ..lm.policy import LMPolicy
    from ..lm.text_task import eval_problems, train_problems
    from ..lm.train_config import DTYPES

    out = Path(out_dir)
    held_out = eval_problems(base)
    shared = settings(base, budget_seconds, len(held_out))
    untrained, done = load_units(out)
    for unit in ([untrained] if untrained else []) + done:
        if unit["settings"] != shared:
            raise ValueError(f"{out} holds units made with {unit['settings']}, not {shared}: use another out_dir")
    finished = {(u["arm"], u["seed"]) for u in done}
    todo = [key for key in unit_order(seeds, arms) if key not in finished][:units]
    if model is None:
        model, tokenizer = load_policy(base.model, dtype=DTYPES[base.dtype], device=base.torch_device())
    problems = train_problems(base)

    def score(policy: Any) -> EvalResult:
        return evaluate(policy, tokenizer, held_out, n=base.eval_samples,
                        max_completion_length=base.max_completion_length, prompts_per_batch=32,
                        seed=EVAL_SEED, progress=False)

    if untrained is None:
        log(f"scoring the untrained model on {len(held_out)} questions x {base.eval_samples} samples")
        untrained = {"settings": shared, "machine": machine,
                     "eval": eval_entry(score(LMPolicy(model, temperature=base.temperature)))}
        atomic_write(out / "units" / f"{UNTRAINED}.json", json.dumps(untrained, indent=1), what="the untrained unit")
    for arm, seed in todo:
        config = recipe(base, arm, seed)
        log(f"unit {arm}_s{seed}: {budget_seconds:.0f} training seconds")
        clock = TrainingClock(budget_seconds)
        start = time.perf_counter()
        counts = RUNNERS[arm](config, copy.deepcopy(model), tokenizer, problems, clock, score)
        unit = {"settings": shared, "arm": arm, "seed": seed, "points": clock.points,
                "wall_seconds": time.perf_counter() - start, "machine": machine, **counts}
        atomic_write(out / "units" / f"{arm}_s{seed}.json", json.dumps(unit, indent=1), what=f"the unit {arm}_s{seed}")
        rebuild_summary(out)
        last = clock.points[-1]
        log(f"unit {arm}_s{seed}: Pass@1 {untrained['eval']['pass_at_1']:.3f} -> {last['pass_at_1']:.3f} in "
            f"{last['seconds']:.0f} training s, {counts['steps']} steps ({counts['optimizer_steps']} optimiser steps)")
    return rebuild_summary(out)


def committed_dir(root: str | Path | None = None) -> Path:
    """Where ``experiments/time_to_accuracy.py`` writes the committed comparison: ``results/time_to_accuracy``
    of a checkout (:func:`~grpo_lab.files.results_path`)."""
    return results_path("time_to_accuracy", root=root)


def load_summary(out_dir: str | Path | None = None) -> dict[str, Any]:
    """The ``summary.json`` in ``out_dir`` (default: :func:`committed_dir`; ``experiments/time_to_accuracy.py``
    writes it)."""
    path = Path(committed_dir() if out_dir is None else out_dir) / "summary.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run experiments/time_to_accuracy.py first")
    return json.loads(path.read_text())


def summary_table(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """A row per arm: seeds, steps per run, Pass@1 at the budget (mean and 95 % CI over seeds, "-" with
    one seed) and the seconds to TRL's final Pass@1 on the mean curve, with the ratio to TRL's."""
    rows = []
    for arm, curve in summary["mean_curves"].items():
        runs = [r for r in summary["runs"] if r["arm"] == arm]
        low, high = curve["ci_low"][-1], curve["ci_high"][-1]
        reach = summary.get("seconds_to_trl_final", {}).get(arm)
        ratio = summary.get("ratio_to_trl", {}).get(arm)
        rows.append({"arm": arm, "seeds": len(runs), "steps": f"{np.mean([r['steps'] for r in runs]):.0f}",
                     "Pass@1 at budget": f"{curve['pass_at_1'][-1]:.3f}",
                     "95 % CI": "-" if low is None else f"[{low:.3f}, {high:.3f}]",
                     "s to TRL's final": "not reached" if reach is None else f"{reach:.0f}",
                     "× TRL's": "-" if ratio is None else f"{ratio:.2f}"})
    return rows


def target_findings(summary: dict[str, Any], target: float = 0.5, min_seeds: int = 3) -> dict[str, str]:
    """Per grpo_lab arm, what the data say about the target (TRL's final Pass@1 in ≤ ``target`` × TRL's
    time), by rule: with fewer than ``min_seeds`` seeds of the arm or of TRL, "not resolved"; otherwise
    "met" or "missed" on the mean curves, with the ratio and the per-seed crossing times. A TRL final at or
    below the untrained score is reached at 0 s by every arm: "not resolved", the time says nothing."""
    findings = {}
    counts = {arm: sum(r["arm"] == arm for r in summary["runs"]) for arm in ARMS}
    for arm in ARMS[:-1]:
        if not counts[arm] or not counts["trl"]:
            findings[arm] = "not run yet"
            continue
        if summary["trl_final_pass_at_1"] <= summary["untrained_pass_at_1"]:
            findings[arm] = (f"not resolved: TRL ended at {summary['trl_final_pass_at_1']:.3f}, at or below the "
                             f"untrained {summary['untrained_pass_at_1']:.3f}, so every arm 'reaches' it at 0 s")
            continue
        ratio = summary["ratio_to_trl"][arm]
        seeds = summary["seconds_to_trl_final_by_seed"][arm]
        per_seed = ", ".join("never" if t is None else f"{t:.0f} s" for t in seeds.values())
        said = "does not reach it in the budget" if ratio is None else f"{ratio:.2f}× TRL's time"
        if min(counts[arm], counts["trl"]) < min_seeds:
            verdict = f"not resolved ({counts[arm]} seeds of {arm}, {counts['trl']} of TRL; {min_seeds} needed)"
        else:
            verdict = "met" if ratio is not None and ratio <= target else "missed"
        findings[arm] = f"{said} (per seed: {per_seed}): target ≤ {target}× {verdict}"
    return findings
