"""The CPU study (issue 24 §3): how far the lag v can go, with and without the importance correction.

Each *arm* is one configuration; each *unit* is one run (arm, seed), which writes its own result
file when it finishes. All runs of a seed draw the same training prompts, and every run is scored
on the same held-out questions with the same sampling seed, so differences between arms pair by
seed. :func:`run_units` runs the next missing units in balanced order and rebuilds
``summary.json`` from the unit files after each; the study grows across sittings.

======================= ======================================================================
arm                     against the base config (``grpo_lab/configs/cpu_study_smollm2.yaml``)
======================= ======================================================================
primary (≥ 5 seeds)
``v1``                  v = 1, i = 1: on-policy, the reference of every comparison
``v8_ratio``            v = 8, ``is_correction="ratio"`` (the paper's r and r′ against α)
``v32_ratio``           v = 32, ``ratio``
``v8_none``             v = 8, ``is_correction="none"`` (a naive asynchronous trainer: A·∇log π)
``v32_none``            v = 32, ``none``
secondary (3 seeds)
``v1_i4``               sample reuse i = 4 at v = 1; against ``v1`` (the same samples)
``v1_steps4``           v = 1 with 4× the steps: the same optimiser passes as ``v1_i4``, each on
                        fresh samples (an lr-matched control under clipping measures a larger
                        AdamW step instead; the first study's diverged)
``mask_b04``            β = 0.04 with the zero-variance mask, against
``nomask_b04``          β = 0.04 without it (with β > 0 the mask drops the masked groups' KL term,
                        the only place it changes the gradient under ``mask_normalize="batch"``)
======================= ======================================================================

Every arm: ``empty_step="skip"`` (a step with no signal takes no optimiser step) and
``mask_normalize="batch"``; β = 0 arms keep the mask on, which with β = 0 changes no gradient.
At v = 1, i = 1 the sample is π_k's own, so ``ratio`` and ``none`` give the same gradient and
``v1`` serves both. The largest lag of v = 32 is 31 (lags run 0…v−1).

Files (``out_dir``, default ``results/cpu_study``):

======================================= ================================================================
``units/<arm>_s<seed>.json``            one finished run: ``study`` (the shared settings), ``run`` (its
                                        summary row), ``eval`` (per scoring step), ``metrics`` (per step)
``units/untrained_e<eval_seed>.json``   the untrained model scored once per evaluation seed (step 0
                                        of every run)
``summary.json``                        rebuilt from the units: issue 24's schema, with ``tests``
======================================= ================================================================

Checkpoints go to ``runs_dir/<arm>_s<seed>`` while a run trains (a stopped run continues from its
last one) and are deleted once its unit file is written.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..checks import require_int_at_least
from ..config import smoke_mode
from ..files import atomic_write, results_path
from ..lm.build import build_loop
from ..lm.evaluate import EvalResult, evaluate
from ..lm.train_config import DTYPES, TrainConfig
from ..lm.training import RunDirInUse, check_run_dir_free, train
from .design import ARM_BY_NAME, ARMS, COMPARISONS, UNTRAINED, Arm, drift_by_lag, load_units, unit_key
from .results import MARGIN, power, seeds_for_power, study_tests, wilson_interval

METRIC_FIELDS = ("step", "lag", "synced", "skipped", "reward_mean", "masked_frac", "loss", "clip_low_frac",
                 "clip_high_frac", "ratio_k_mean", "ratio_k_max", "log_ratio_k_abs", "tv_estimate", "kl",
                 "grad_norm", "num_tokens", "sample_seconds", "train_seconds", "sync_seconds")
"""Per-step fields a unit keeps (``docs/metrics.md``), and :data:`OPTIONAL_METRIC_FIELDS` where the loop has them."""
OPTIONAL_METRIC_FIELDS = ("ess_token", "log_ratio_k_p99")
EVAL_SEED = 1234
"""Sampling seed of every held-out evaluation."""
SMOKE_SIZES = dict(steps=4, prompts_per_step=2, G=4, max_completion_length=4, micro_batch_size=8,
                   eval_problems=4, eval_samples=2, checkpoint_every=0)
"""What smoke mode (``GRPO_LAB_SMOKE``) shrinks the study to: the plumbing in a minute."""


def study_dir(root: str | Path | None = None) -> Path:
    """Where ``experiments/cpu_study.py`` writes the committed study: ``results/cpu_study`` of a checkout
    (:func:`~grpo_lab.files.results_path`)."""
    return results_path("cpu_study", root=root)


def scan_path(root: str | Path | None = None) -> Path:
    """The task scan of ``experiments/task_scan.py`` (base Pass@1 per task and token budget):
    ``results/task_scan/scan.json`` of a checkout (:func:`~grpo_lab.files.results_path`)."""
    return results_path("task_scan", "scan.json", root=root)


def unit_order(arms: Sequence[Arm], seeds: int, secondary_seeds: int = 3) -> list[tuple[Arm, int]]:
    """Every (arm, seed) to run, in order: seed 0 of every arm, then seed 1, …, so every arm has n
    seeds before any gets n + 1; primary arms first within a seed. Primary arms go to ``seeds``
    seeds, secondary ones to ``secondary_seeds``."""
    require_int_at_least("seeds", seeds, 0)
    require_int_at_least("secondary_seeds", secondary_seeds, 0)
    ordered = sorted(arms, key=lambda a: not a.primary)
    return [(arm, seed) for seed in range(max(seeds, secondary_seeds)) for arm in ordered
            if seed < (seeds if arm.primary else secondary_seeds)]


def study_settings(base: TrainConfig, eval_questions: int) -> dict[str, Any]:
    """What every unit of one study shares; a unit made under other settings is refused."""
    return {"task": base.task, "model": base.model, "scoring": base.scoring, "steps": base.steps,
            "prompts_per_step": base.prompts_per_step, "G": base.G, "max_completion_length": base.max_completion_length,
            "temperature": base.temperature, "lr": base.lr, "eval_questions": eval_questions,
            "eval_disjoint": base.eval_disjoint,
            "eval_samples": base.eval_samples, "eval_seed": EVAL_SEED}


def _write_json(path: Path, data: Any, what: str) -> None:
    atomic_write(path, json.dumps(data, indent=1), what=what)


def eval_entry(result: EvalResult) -> dict[str, Any]:
    """One evaluation as a unit stores it: strict and lenient Pass@1 (strict with its Wilson interval), the
    truncated share, the accuracy of finished answers, the counts and the examples."""
    completions = result.n * len(result.correct)
    low, high = wilson_interval(sum(result.correct), completions)
    return {"pass_at_1": result.pass_at(1), "pass_at_1_ci": [low, high],
            "pass_at_1_lenient": result.pass_at(1, "lenient"), "truncated_frac": result.truncated_frac(),
            "accuracy_finished": result.accuracy_finished(), "correct": sum(result.correct),
            "completions": completions, "examples": [list(e) for e in result.examples]}


def rebuild_summary(out_dir: str | Path, margin: float = MARGIN) -> dict[str, Any]:
    """``out_dir/summary.json`` from the unit files: the shared settings, one row per run, and the
    paired tests of :data:`COMPARISONS` (:func:`grpo_lab.study.results.study_tests`)."""
    untrained, runs = load_units(out_dir)
    if untrained is None:
        raise FileNotFoundError(f"no untrained unit in {Path(out_dir) / 'units'}: run a unit first")
    order = {a.name: n for n, a in enumerate(ARMS)}
    rows = sorted((u["run"] for u in runs), key=lambda r: (order.get(r["name"], len(order)), r["seed"]))
    s = untrained["study"]
    summary = {**{k: s[k] for k in ("task", "model", "scoring", "steps", "prompts_per_step", "G")},
               "eval_questions": s["eval_questions"], "eval_samples": s["eval_samples"], "settings": s,
               "untrained": {k: v for k, v in untrained["eval"].items() if k != "examples"},
               "cpu_hours": sum(r["unit_seconds"] for r in rows) / 3600,
               "runs": rows, "tests": study_tests(rows, COMPARISONS, margin)}
    _write_json(Path(out_dir) / "summary.json", summary, "the study's summary")
    return summary


def _score_untrained(base: TrainConfig, out: Path, model: Any, tokenizer: Any, held_out: Sequence[Any],
                     score: Callable[[Any], EvalResult], log: Callable[[str], None]) -> dict[str, Any]:
    """The untrained model's scores, from its unit file or scored now and written there."""
    from ..lm.policy import LMPolicy

    path = out / "units" / f"{UNTRAINED}_e{EVAL_SEED}.json"
    if path.is_file():
        return json.loads(path.read_text())
    log(f"scoring the untrained model on {len(held_out)} held-out questions x {base.eval_samples} samples")
    unit = {"study": study_settings(base, len(held_out)),
            "eval": eval_entry(score(LMPolicy(model, temperature=base.temperature)))}
    _write_json(path, unit, "the untrained model's scores")
    return unit


def run_units(base: TrainConfig, out_dir: str | Path, runs_dir: str | Path, seeds: int = 5, secondary_seeds: int = 3,
              arms: Sequence[Arm] = ARMS, units: int | None = None, until: float | None = None,
              model: Any = None, tokenizer: Any = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the next missing units of :func:`unit_order` (at most ``units`` of them; none started once
    ``time.time()`` plus the expected unit time passes ``until``), rebuilding ``summary.json`` after
    each; return the summary.

    Several study processes may share one ``out_dir``: each skips a unit that another has finished
    or is training (its run folder's lock is held), so two processes on two cores split the study.

    ``base`` sets task, model, P, G, T_max, lr, ``steps`` and the evaluation size; the held-out
    questions and the training problems come from ``base`` (its seed), the same for every run.
    Each run is scored at step 0 (the untrained unit), at ``steps // 2`` and at its last step.
    ``model``/``tokenizer``: the untrained model (default: load ``base.model``); runs train copies.
    """
    from ..lm.models import load_policy
    from ..lm.text_task import eval_problems, train_problems

    out, runs_dir = Path(out_dir), Path(runs_dir)
    held_out = eval_problems(base)
    settings = study_settings(base, len(held_out))
    untrained, done = load_units(out)
    if untrained is not None and untrained["study"] != settings:
        raise ValueError(f"{out} holds a study made with {untrained['study']}, not {settings}: use another out_dir")
    finished = {unit_key(u["run"]["name"], u["run"]["seed"]) for u in done}
    todo = [(arm, seed) for arm, seed in unit_order(arms, seeds, secondary_seeds)
            if unit_key(arm.name, seed) not in finished]
    todo = todo if units is None else todo[:units]
    per_step = sorted(u["run"]["unit_seconds"] / u["run"]["steps"] for u in done)
    expected = per_step[len(per_step) // 2] if per_step else 0.0    # median seconds a step, evaluations included
    if until is not None and time.time() > until:
        todo = []
    if not todo:
        log("no unit to run" if untrained else "no unit to run, and no untrained unit yet")
        return rebuild_summary(out) if untrained else {}
    if model is None:
        model, tokenizer = load_policy(base.model, dtype=DTYPES[base.dtype], device=base.torch_device())
    problems = train_problems(base)

    def score(policy: Any) -> EvalResult:
        return evaluate(policy, tokenizer, held_out, n=base.eval_samples,
                        max_completion_length=base.max_completion_length, prompts_per_batch=32, seed=EVAL_SEED,
                        progress=False)

    untrained = _score_untrained(base, out, model, tokenizer, held_out, score, log)
    rebuild_summary(out)
    for arm, seed in todo:
        if until is not None and time.time() + expected * base.steps * arm.step_factor > until:
            log(f"unit {unit_key(arm.name, seed)} would not finish by the deadline: stopping here")
            break
        key = unit_key(arm.name, seed)
        if (out / "units" / f"{key}.json").is_file():      # another study process finished it meanwhile
            continue
        config = arm.config(base, seed).replace(output_dir=str(runs_dir / key))
        try:                                                 # another study process may be running it
            check_run_dir_free(runs_dir / key)
            log(f"unit {key}: v = {config.v}, i = {config.i}, is_correction = {arm.is_correction}, "
                f"mask = {arm.mask}, β = {arm.beta}, {config.steps} steps")
            scores, history, seconds = _train_and_score(config, copy.deepcopy(model), tokenizer, problems, score)
        except RunDirInUse as exc:
            log(f"unit {key}: skipped, {exc}")
            continue
        unit = _unit(arm, seed, config, settings, untrained["eval"], scores, history, seconds)
        _write_json(out / "units" / f"{key}.json", unit, f"the unit {key}")
        for spent in ("checkpoint.pt", "elapsed_seconds"):     # the unit file holds what the study keeps
            (runs_dir / key / spent).unlink(missing_ok=True)
        rebuild_summary(out)
        run = unit["run"]
        log(f"unit {key}: Pass@1 {run['pass_at_1_before']:.3f} -> {run['pass_at_1_after']:.3f} "
            f"(lenient {run['pass_at_1_lenient_after']:.3f}) in {run['unit_seconds']:.0f} s")
    return rebuild_summary(out)                              # with any unit another process finished


def _unit(arm: Arm, seed: int, config: TrainConfig, settings: dict[str, Any], before: dict[str, Any],
          scores: dict[str, dict[str, Any]], history: Sequence[Any], seconds: float) -> dict[str, Any]:
    """A finished run's unit file: its summary row (issue 24's schema, and more), evaluations, per-step metrics."""
    final = scores[str(config.steps)]
    metrics = [{f: row[f] for f in (*METRIC_FIELDS, *OPTIONAL_METRIC_FIELDS) if f in row}
               for row in (r.to_dict() for r in history)]
    run = {**arm.row(), "seed": seed, "steps": config.steps, "lr": config.lr,
           "pass_at_1_before": before["pass_at_1"], "pass_at_1_after": final["pass_at_1"],
           "pass_at_1_after_ci": final["pass_at_1_ci"], "pass_at_1_lenient_after": final["pass_at_1_lenient"],
           "truncated_frac_after": final["truncated_frac"], "accuracy_finished_after": final["accuracy_finished"],
           "pass_at_1_curve": {"0": before["pass_at_1"], **{s: e["pass_at_1"] for s, e in scores.items()}},
           "wall_seconds": sum(m["sample_seconds"] + m["train_seconds"] + m["sync_seconds"] for m in metrics),
           "unit_seconds": seconds, "train_passes": config.i * sum(not m["skipped"] for m in metrics),
           "skipped_steps": sum(m["skipped"] for m in metrics)}
    return {"study": settings, "run": run, "eval": scores, "metrics": metrics}


def _train_and_score(config: TrainConfig, model: Any, tokenizer: Any, problems: Sequence[Any],
                     score: Callable[[Any], EvalResult]) -> tuple[dict[str, dict[str, Any]], list[Any], float]:
    """Train ``config`` (resuming its checkpoint), scoring at ``steps // 2`` and at the end; return the
    scores, the per-step history and the unit's wall seconds over every sitting it took.

    ``train`` checkpoints at each scoring step before the scoring, and the scores are kept in the
    run folder, so a run stopped anywhere continues without redoing either. The seconds of a sitting
    that stops (an exception, Ctrl-C) are added to ``elapsed_seconds`` in the run folder, so the
    sitting that finishes reports the whole unit.
    """
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    scores_path, elapsed_path = out / "scores.json", out / "elapsed_seconds"
    scores: dict[str, Any] = json.loads(scores_path.read_text()) if scores_path.is_file() else {}
    earlier = float(elapsed_path.read_text()) if elapsed_path.is_file() else 0.0
    start = time.perf_counter()
    try:
        loop = build_loop(config, model=model, tokenizer=tokenizer, problems=problems)
        for stop in sorted({config.steps // 2, config.steps} - {0}):
            loop = train(config.replace(steps=stop), loop=loop, progress=False)
            if loop.k < stop:
                raise KeyboardInterrupt(f"unit {out.name} interrupted at step {loop.k}; run the study again to "
                                        "continue")
            if str(stop) not in scores:
                scores[str(stop)] = eval_entry(score(loop.policy))
                _write_json(scores_path, scores, f"the scores of {out.name}")
    except RunDirInUse:                     # the run folder is another process's: leave its files alone
        raise
    except BaseException:
        elapsed_path.write_text(f"{earlier + time.perf_counter() - start:.3f}\n")
        raise
    return scores, loop.history, earlier + time.perf_counter() - start


# ----------------------------------------------------------------------------- the pilot

PILOT_ARMS = (ARM_BY_NAME["v1"], ARM_BY_NAME["v32_ratio"])
def pilot_report(out_dir: str | Path, effect: float = 0.05, margin: float = MARGIN) -> dict[str, Any]:
    """What a pilot's units say: drift by lag (from ``v32_ratio``), the paired SD of Pass@1 after
    (``v32_ratio`` − ``v1`` by seed; one degree of freedom with two seeds, so a rough figure), and
    the power it implies: seeds for 80 % power to detect ``effect``, and TOST power at ±``margin``
    (true difference 0) with 5 seeds and with that many."""
    untrained, runs = load_units(out_dir)
    lagged = [u for u in runs if u["run"]["name"] == "v32_ratio"]
    after = {name: {u["run"]["seed"]: u["run"]["pass_at_1_after"] for u in runs if u["run"]["name"] == name}
             for name in ("v1", "v32_ratio")}
    seeds = sorted(set(after["v1"]) & set(after["v32_ratio"]))
    diffs = [after["v32_ratio"][s] - after["v1"][s] for s in seeds]
    mean = sum(diffs) / len(diffs) if diffs else math.nan
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)) if len(diffs) >= 2 else None
    report: dict[str, Any] = {"lr": untrained["study"]["lr"] if untrained else None,
                              "steps": untrained["study"]["steps"] if untrained else None,
                              "drift_by_lag": {str(k): v for k, v in drift_by_lag(lagged).items()},
                              "pass_at_1_after": {k: {str(s): p for s, p in v.items()} for k, v in after.items()},
                              "paired_sd": sd, "effect": effect, "margin": margin}
    if sd:
        n = seeds_for_power(sd, effect)
        report.update(seeds_for_80pct_power=n, power_at_5_seeds=power(sd, 5, effect),
                      tost_power_at_5_seeds=power(sd, 5, 0.0, "equivalence", margin),
                      tost_power_at_needed_seeds=power(sd, n, 0.0, "equivalence", margin) if n else None)
    return report


def run_pilot(base: TrainConfig, lrs: Sequence[float], out_dir: str | Path, runs_dir: str | Path,
              model: Any = None, tokenizer: Any = None, log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """The pilot: at each learning rate, ``v1`` and ``v32_ratio`` at seeds 0 and 1 (``base.steps`` steps,
    units in ``out_dir/lr<lr>``), then :func:`pilot_report` of each, written to ``out_dir/pilot.json``."""
    from ..lm.models import load_policy

    if not lrs:
        raise ValueError("lrs is empty: give the pilot at least one learning rate")
    if model is None:
        model, tokenizer = load_policy(base.model, dtype=DTYPES[base.dtype], device=base.torch_device())
    reports = []
    for lr in lrs:
        folder = f"lr{lr:g}"
        run_units(base.replace(lr=lr), Path(out_dir) / folder, Path(runs_dir) / folder, seeds=2, secondary_seeds=0,
                  arms=PILOT_ARMS, model=model, tokenizer=tokenizer, log=log)
        reports.append(pilot_report(Path(out_dir) / folder))
        _write_json(Path(out_dir) / "pilot.json", reports, "the pilot's report")
    return reports


def smoke_base(base: TrainConfig) -> TrainConfig:
    """``base`` shrunk to :data:`SMOKE_SIZES` when ``GRPO_LAB_SMOKE`` is set, else ``base``."""
    return base.replace(**SMOKE_SIZES) if smoke_mode() else base
