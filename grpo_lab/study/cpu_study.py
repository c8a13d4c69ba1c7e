"""The CPU study: the paper's table (docs/theory.md §6) on a real LLM, several paired seeds.

Each *arm* is one configuration of the table; each run is (arm, seed). All runs of a seed
start from the same model, draw the same training prompts and are scored on the same held-out
questions with the same sampling seed, so differences between arms are paired by seed.

========================= ============================================================
arm                       what changes against the task's base config
========================= ============================================================
``onpolicy``              v = 1, i = 1, no zero-variance mask
``masked``                v = 1, i = 1, mask, masked groups leave the denominator
                          (``mask_normalize="unmasked"``: the step grows by 1/(1 − masked))
``lr_matched``            no mask, learning rate × 1/(1 − m̄), m̄ the mean masked fraction
                          of the same seed's ``masked`` run (all-masked steps included): a
                          control sized for SGD without clipping, see below
``lagged_v8``             v = 8 with the mask (a lagged server)
``reuse_i4``              i = 4 with the mask (sample reuse: 4× the training per step)
========================= ============================================================

With β = 0 a masked group has A = 0 and no gradient, so the mask changes a step's gradient
only by the factor 1/(1 − masked) of ``mask_normalize="unmasked"``. These runs use AdamW with
``max_grad_norm``, and the clip cuts both gradients to the same norm whenever they exceed it,
which erases that factor: the learning rate that matches the mask's step is the base one, and
``lr_matched`` measures a larger AdamW step, not the mask. What remains between the masked and
no-mask arms is the step whose groups all agree: the mask skips it, and without the mask it is
taken on AdamW's momentum under ``empty_step="optimizer_step"`` (docs/theory.md §2).

:func:`run_study` trains and scores the runs, resumably (each run keeps its checkpoint, a
finished run is skipped); ``summary.json`` and ``metrics/<arm>_s<seed>.jsonl`` are what the
notebook reads through :func:`load_study`. The statistics (mean ± 95 % CI over seeds, paired
differences) are in :mod:`grpo_lab.study.results`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checks import require_int_at_least
from ..files import atomic_write
from ..lm.build import build_loop
from ..lm.evaluate import EvalResult, evaluate
from ..lm.text_task import eval_problems, train_problems
from ..lm.train_config import DTYPES, TrainConfig
from ..lm.training import train

STUDY_DIR = Path(__file__).resolve().parents[2] / "results" / "cpu_study"
"""Where ``experiments/cpu_study.py`` writes the committed study (notebook 02 reads it)."""
SCAN_PATH = Path(__file__).resolve().parents[2] / "results" / "task_scan" / "scan.json"
"""The task scan of ``experiments/task_scan.py`` (base Pass@1 per task and token budget)."""
METRIC_FIELDS = ("step", "lag", "synced", "skipped", "reward_mean", "masked_frac", "clip_low_frac",
                 "clip_high_frac", "ratio_k_max", "log_ratio_k_abs", "tv_estimate", "grad_norm", "num_tokens",
                 "sample_seconds", "train_seconds", "sync_seconds")
"""The per-step fields kept beside the summary (the rest of ``StepRecord`` stays in the run folder)."""
PAPER_PASS_AT_1 = {"onpolicy": 0.45, "masked": 0.50, "lagged_v8": 0.50, "reuse_i4": None}
"""The paper's GSM8K Pass@1 for the arm that plays its role (v = 10 and i = 10 there; i: slower, no figure)."""


@dataclass(frozen=True)
class Arm:
    """One configuration of the study (a row of the paper's table)."""

    name: str
    v: int = 1
    i: int = 1
    mask: bool = True
    lr_matched: bool = False
    """Scale lr by 1/(1 − m̄) of the same seed's ``masked`` run, without the mask."""

    def config(self, base: TrainConfig, seed: int, lr_factor: float = 1.0) -> TrainConfig:
        return base.replace(v=self.v, i=self.i, mask_zero_variance=self.mask, mask_normalize="unmasked",
                            lr=base.lr * lr_factor, seed=seed)


ARMS = (Arm("onpolicy", mask=False), Arm("masked"), Arm("lr_matched", mask=False, lr_matched=True),
        Arm("lagged_v8", v=8), Arm("reuse_i4", i=4))
"""In running order: ``lr_matched`` needs its seed's ``masked`` run."""


def run_key(arm: str, seed: int) -> str:
    return f"{arm}_s{seed}"


# ----------------------------------------------------------------------------- running

def _write_json(path: Path, data: Any) -> None:
    """Write, then rename: a study killed mid-write (or out of disk) keeps its previous file."""
    atomic_write(path, json.dumps(data, indent=1), what="the study's results")


def _eval_entry(result: EvalResult) -> dict[str, Any]:
    return {"pass_at_1": result.pass_at(1), "pass_at_1_lenient": result.pass_at(1, "lenient"),
            "truncated_frac": result.truncated_frac(),
            "examples": [list(e) for e in result.examples]}


def run_study(base: TrainConfig, out_dir: str | Path, seeds: Sequence[int], runs_dir: str | Path,
              arms: Sequence[Arm] = ARMS, eval_steps: Sequence[int] = (), eval_seed: int = 1234,
              model: Any = None, tokenizer: Any = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train and score every (arm, seed) not yet in ``out_dir/summary.json``; return the summary.

    ``base`` sets the task, model, P, G, T_max, lr and ``steps`` (the same for every run).
    Held-out Pass@1 is measured on ``eval_problems(base)`` with sampling seed ``eval_seed``:
    once on the untrained model (the same for every run), at each of ``eval_steps`` and after
    the last step. A run's checkpoint lives in ``runs_dir/<arm>_s<seed>``; a study stopped
    mid-run continues that run from its last checkpoint (saved at every evaluation step and at
    ``base.checkpoint_every``). ``model``/``tokenizer``: the untrained model (default: load
    ``base.model``); every run trains a copy of it.
    """
    from ..lm.models import load_policy

    for seed in seeds:
        require_int_at_least("seed", seed, 0)
    steps = base.steps
    for s in eval_steps:
        if not 0 < s < steps:
            raise ValueError(f"eval_steps must lie strictly between 0 and steps = {steps}, got {s}")
    out, runs_dir = Path(out_dir), Path(runs_dir)
    (out / "metrics").mkdir(parents=True, exist_ok=True)
    path = out / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    if summary and (summary["task"], summary["model"], summary["steps"]) != (base.task, base.model, steps):
        raise ValueError(f"{path} holds a study of {summary['task']}/{summary['model']}/{summary['steps']} steps, "
                         f"not {base.task}/{base.model}/{steps}: use another out_dir")
    if model is None:
        model, tokenizer = load_policy(base.model, dtype=DTYPES[base.dtype], device=base.torch_device())
    held_out = eval_problems(base)

    def score(policy: Any) -> EvalResult:
        return evaluate(policy, tokenizer, held_out, n=base.eval_samples,
                        max_completion_length=base.max_completion_length, seed=eval_seed, progress=False)

    if "before" not in summary:
        from ..lm.policy import LMPolicy

        log(f"scoring the untrained model on {len(held_out)} held-out questions x {base.eval_samples} samples")
        summary = {"task": base.task, "model": base.model, "steps": steps, "G": base.G,
                   "prompts_per_step": base.prompts_per_step, "max_completion_length": base.max_completion_length,
                   "lr": base.lr, "eval_problems": len(held_out), "eval_samples": base.eval_samples,
                   "eval_seed": eval_seed, "eval_steps": list(eval_steps),
                   "before": _eval_entry(score(LMPolicy(model, temperature=base.temperature))), "runs": []}
        _write_json(path, summary)
    done = {run_key(r["name"], r["seed"]) for r in summary["runs"]}
    problems = train_problems(base)
    for seed in seeds:
        for arm in arms:
            key = run_key(arm.name, seed)
            if key in done:
                continue
            lr_factor = _lr_factor(summary, out, seed) if arm.lr_matched else 1.0
            config = arm.config(base, seed, lr_factor).replace(output_dir=str(runs_dir / key))
            log(f"run {key}: v = {config.v}, i = {config.i}, mask = {config.mask_zero_variance}, lr = {config.lr:.3g}")
            run = _train_and_score(config, copy.deepcopy(model), tokenizer, problems, eval_steps, score)
            run.update(name=arm.name, v=arm.v, i=arm.i, mask=arm.mask, seed=seed, lr=config.lr,
                       pass_at_1_before=summary["before"]["pass_at_1"])
            metrics = [json.loads(line) for line in (runs_dir / key / "metrics.jsonl").read_text().splitlines()]
            atomic_write(out / "metrics" / f"{key}.jsonl",
                         "".join(json.dumps({f: m[f] for f in METRIC_FIELDS}) + "\n" for m in metrics),
                         what=f"the metrics of run {key}")
            summary["runs"].append(run)
            _write_json(path, summary)
            log(f"run {key}: Pass@1 {run['pass_at_1_before']:.3f} -> {run['pass_at_1_after']:.3f} "
                f"in {run['wall_seconds']:.0f} s of training")
    return summary


def _lr_factor(summary: dict[str, Any], out: Path, seed: int) -> float:
    """1/(1 − m̄): m̄ = mean masked fraction of this seed's finished ``masked`` run."""
    if not any(r["name"] == "masked" and r["seed"] == seed for r in summary["runs"]):
        raise ValueError(f"the lr_matched arm of seed {seed} needs that seed's masked run first")
    fracs = [json.loads(line)["masked_frac"] for line in
             (out / "metrics" / f"{run_key('masked', seed)}.jsonl").read_text().splitlines()]
    masked = sum(fracs) / len(fracs)
    if masked >= 1.0:
        raise ValueError(f"seed {seed}'s masked run masked every group: no learning rate to match")
    return 1.0 / (1.0 - masked)


def _train_and_score(config: TrainConfig, model: Any, tokenizer: Any, problems: Sequence[Any],
                     eval_steps: Sequence[int], score: Callable[[Any], EvalResult]) -> dict[str, Any]:
    """Train ``config`` (resuming its checkpoint), scoring at ``eval_steps`` and at the end.

    ``train`` checkpoints at each of those steps before the scoring, and the scores are kept
    in the run folder, so a run stopped anywhere continues without redoing either.
    """
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    scores_path = out / "scores.json"
    scores: dict[str, Any] = json.loads(scores_path.read_text()) if scores_path.is_file() else {}
    loop = build_loop(config, model=model, tokenizer=tokenizer, problems=problems)
    for stop in [*eval_steps, config.steps]:
        loop = train(config.replace(steps=stop), loop=loop, progress=False)
        if loop.k < stop:
            raise KeyboardInterrupt(f"run {out.name} interrupted at step {loop.k}; run the study again to continue")
        if str(stop) not in scores:
            scores[str(stop)] = _eval_entry(score(loop.policy))
            _write_json(scores_path, scores)
    final, history = scores[str(config.steps)], loop.history
    return {"pass_at_1_after": final["pass_at_1"], "truncated_frac_after": final["truncated_frac"],
            "examples_after": final["examples"],
            "pass_at_1_curve": {step: entry["pass_at_1"] for step, entry in scores.items()},
            "wall_seconds": sum(r.sample_seconds + r.train_seconds + r.sync_seconds for r in history),
            "train_passes": config.i * sum(not r.skipped for r in history)}
