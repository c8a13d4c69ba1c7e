"""The lag frontier (issue 34): how far may α lag π_θ, with each correction, and still train as well as v = 1?

The design and its analysis are fixed here before any unit runs; the units only fill them in.

**Arms.** v ∈ {1, 4, 16, 32} × ``is_correction`` ∈ {``ratio``, ``truncated``, ``none``}; at v = 1 the three
are one arm (r′ = 1), so 10 arms. ``truncated`` caps r′ at C = ``GRPOConfig.is_cap`` = 2, the kit's default
(verl's; TRL's ``vllm_importance_sampling_clip_max`` is 3): the arm tests the cap users of verl run. The mask
arms (§4) at β > 0: the mask, no mask, and no mask with the KL-only steps skipped (the same empty-step rule),
so "the mask helps" is a claim about the mask and not about extra AdamW steps.

**Endpoint.** Primary: ``j_auc``, the mean of exact J (:mod:`grpo_lab.exact.strict_j`) over the evaluation
steps after 0 (¼, ½, ¾ and the end of the budget): it rewards learning speed and saturates later than the
final J. Secondary: ``j_final``. J is the task's whole question set, computed, not sampled.

**Comparisons** (the declared family, :data:`COMPARISONS`): each arm − ``v1``; ``truncated − ratio`` and
``ratio − none`` at each v > 1. Per comparison, over the seeds both arms finished (paired by seed):

=================== ===========================================================================
``p_difference``    two-sided paired t test of mean d = 0
``p_equivalence``   TOST: the larger of the two one-sided t tests of d ≤ −m and d ≥ m
``p_sign_flip``     the exact sign-flip permutation test of mean d = 0 (all 2^n sign patterns), beside the
                    t test: J is bounded and an arm can collapse, so d need not be normal. With n = 5
                    its smallest two-sided p is 2/32 = 0.0625: alone it cannot reach 0.05
``holm_*``          Holm's step-down adjustment of each p over the whole family
verdict             ``equivalent`` if holm(p_equivalence) < 0.05; else ``worse``/``better`` if
                    holm(p_difference) < 0.05; else ``not resolved``
=================== ===========================================================================

The margin m is 10 % of ``v1``'s mean gain (its mean ``j_auc`` − the untrained J), fixed by rule before the
data. **The frontier** of a correction is the largest v whose arm is ``equivalent`` with every smaller v
of that correction equivalent too; none: "not resolved". Collapse (final J below the untrained J) is
counted per arm on its own. Seeds are fixed in advance (5 per arm), every arm at n seeds before any at
n + 1, and nothing is read before all are in.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from grpo_lab.stats.intervals import t_cdf
from studies.stats.comparisons import PairedTest, holm, sign_flip_p

RESULTS = Path(__file__).resolve().parent / "results"
"""The committed units and ``summary.json``."""
PILOT_RESULTS = Path(__file__).resolve().parent / "pilot_results"
"""The pilot's units (task and lr selection)."""
V_GRID = (1, 4, 16, 32)
CORRECTIONS = ("ratio", "truncated", "none")
SEEDS = 5
MARGIN_FRACTION = 0.10
"""The equivalence margin as a share of ``v1``'s mean gain in the primary endpoint."""
LEVEL = 0.05
ENDPOINTS = ("j_auc", "j_final")


@dataclass(frozen=True)
class FrontierArm:
    """One arm: the sync period v, the correction, and for the mask arms β, the mask and the empty-step rule."""

    v: int
    is_correction: str = "ratio"
    beta: float = 0.0
    mask: bool = True
    skip_kl_only: bool = True
    """With no mask at β > 0 every step has a KL gradient, so ``empty_step="skip"`` never skips; True sets
    ``empty_step="skip_kl_only"``: a step whose every group's rewards agree (a KL-only gradient) is skipped,
    as the mask arm skips it, so both arms take the same AdamW steps."""

    @property
    def name(self) -> str:
        if self.beta > 0:
            return "mask" if self.mask else "nomask_skip" if self.skip_kl_only else "nomask"
        return "v1" if self.v == 1 else f"v{self.v}_{self.is_correction}"

    def changes(self) -> dict[str, Any]:
        """The config fields this arm sets on the study's recipe."""
        if self.beta > 0:
            return {"v": 1, "beta": self.beta, "mask_zero_variance": self.mask,
                    "empty_step": "skip_kl_only" if not self.mask and self.skip_kl_only else "skip"}
        return {"v": self.v, "is_correction": self.is_correction}


ARMS = (FrontierArm(1),) + tuple(FrontierArm(v, c) for v in V_GRID[1:] for c in CORRECTIONS)
MASK_BETA = 0.04
MASK_ARMS = (FrontierArm(1, beta=MASK_BETA), FrontierArm(1, beta=MASK_BETA, mask=False, skip_kl_only=False),
             FrontierArm(1, beta=MASK_BETA, mask=False))
COMPARISONS = tuple((arm.name, "v1") for arm in ARMS[1:]) + tuple(
    (f"v{v}_{a}", f"v{v}_{b}") for v in V_GRID[1:] for a, b in (("truncated", "ratio"), ("ratio", "none")))
"""(a, b): a − b, the declared primary family (15 comparisons)."""
MASK_COMPARISONS = (("mask", "nomask_skip"), ("mask", "nomask"), ("nomask_skip", "nomask"))
"""The mask family (§4): the unconfounded comparison first."""


PAPER_GSM8K = (
    ("on-policy (v = 1, i = 1), no mask", "45 % (unstable)", ("nomask", "nomask_skip")),
    ("on-policy + zero-variance mask", "50 %", ("mask", "v1")),
    ("lagged server (v = 10, i = 1)", "50 % (stable)", ("v4_ratio", "v16_ratio")),
    ("sample reuse (v = 1, i = 10)", "slower; 10× the training", ()),
    ("not in the paper: a lagged server without the correction", "-", ("v4_none", "v16_none", "v32_none")),
)
"""The paper's GSM8K table (Qwen2.5-0.5B-Instruct, β = 0.04; docs/theory.md §6): each row, its Pass@1, and the
arms here that play its role (the mask arms run at β = 0.04 as the paper's; sample reuse is not an arm)."""


def unit_order(arms: Sequence[FrontierArm], seeds: int = SEEDS) -> list[tuple[FrontierArm, int]]:
    """Every arm at seed n before any at n + 1."""
    return [(arm, seed) for seed in range(seeds) for arm in arms]


# ----------------------------------------------------------------------------- tests


def _t_p_two_sided(t: float, df: int) -> float:
    return 2.0 * (1.0 - t_cdf(abs(t), df))


@dataclass(frozen=True)
class Comparison(PairedTest):
    """a − b over the seeds both finished (:class:`~studies.stats.comparisons.PairedTest`'s pairing) with the
    frontier's three p-values, which Holm then adjusts over the family."""

    def p_values(self) -> dict[str, float]:
        """``p_difference``, ``p_equivalence`` and ``p_sign_flip`` (NaN below two seeds; a difference test
        of differences that are all equal is decided without a t: 0 if they are not 0, else 1)."""
        if self.n < 2:
            return {"p_difference": math.nan, "p_equivalence": math.nan, "p_sign_flip": math.nan}
        d = np.asarray(self.diffs)
        mean, se, df = float(d.mean()), float(d.std(ddof=1) / math.sqrt(self.n)), self.n - 1
        if se == 0.0:
            return {"p_difference": 0.0 if mean != 0 else 1.0,
                    "p_equivalence": 0.0 if abs(mean) < self.margin else 1.0, "p_sign_flip": sign_flip_p(d)}
        p_low = 1.0 - t_cdf((mean + self.margin) / se, df)   # H0: d ≤ −m
        p_high = t_cdf((mean - self.margin) / se, df)        # H0: d ≥ m
        return {"p_difference": _t_p_two_sided(mean / se, df), "p_equivalence": max(p_low, p_high),
                "p_sign_flip": sign_flip_p(d)}


def compare(endpoint_by_arm: Mapping[str, Mapping[int, float]], comparisons: Sequence[tuple[str, str]],
            margin: float) -> list[dict[str, Any]]:
    """Each declared comparison with its p-values, Holm-adjusted over the family, and its verdict.

    A comparison whose arms have no seed in common stays in the family with NaN p-values (it cannot
    be decided and does not shrink the correction of the others)."""
    if not margin > 0:
        raise ValueError(f"margin must be > 0, got {margin}")
    rows = []
    for a, b in comparisons:
        left, right = endpoint_by_arm.get(a, {}), endpoint_by_arm.get(b, {})
        seeds = tuple(sorted(set(left) & set(right)))
        test = Comparison(a, b, margin, seeds, tuple(left[s] - right[s] for s in seeds))
        rows.append({"comparison": f"{a} - {b}", "a": a, "b": b, "n": test.n, "seeds": list(seeds),
                     "estimate": float(np.mean(test.diffs)) if test.n else None, "margin": margin,
                     **test.p_values()})
    for key in ("p_difference", "p_equivalence", "p_sign_flip"):
        for row, adjusted in zip(rows, holm([row[key] for row in rows]), strict=True):
            row[f"holm_{key}"] = adjusted
    for row in rows:
        row["verdict"] = ("equivalent" if row["holm_p_equivalence"] < LEVEL else
                          ("worse" if row["estimate"] < 0 else "better") if row["holm_p_difference"] < LEVEL
                          else "not resolved")
    return rows


def frontier(rows: Sequence[Mapping[str, Any]]) -> dict[str, int | str]:
    """Per correction: the largest v equivalent to ``v1`` with every smaller v equivalent too, else
    "not resolved"."""
    verdict = {row["a"]: row["verdict"] for row in rows if row["b"] == "v1"}
    out: dict[str, int | str] = {}
    for correction in CORRECTIONS:
        largest: int | str = "not resolved"
        for v in V_GRID[1:]:
            if verdict.get(f"v{v}_{correction}") != "equivalent":
                break
            largest = v
        out[correction] = largest
    return out


# ----------------------------------------------------------------------------- units and the summary


def load_units(out_dir: str | Path) -> list[dict[str, Any]]:
    """The unit files ``<out_dir>/units/*.json`` (the untrained unit, ``untrained.json``, not among them)."""
    return [json.loads(p.read_text()) for p in sorted(Path(out_dir, "units").glob("*.json"))
            if p.name != "untrained.json"]


def design_status(units: Sequence[Mapping[str, Any]], arms: Sequence[FrontierArm],
                  seeds: int = SEEDS) -> dict[str, Any]:
    """How many of a family's units (``arms`` × ``seeds``) are in, and which are missing: its analysis is read
    only when every one is (no interim looks)."""
    done = {(unit["arm"], unit["seed"]) for unit in units}
    missing = [f"{arm.name}_s{seed}" for arm, seed in unit_order(arms, seeds) if (arm.name, seed) not in done]
    expected = len(arms) * seeds
    return {"units": expected, "in": expected - len(missing), "complete": not missing, "missing": missing}


def summarize(units: Sequence[Mapping[str, Any]], untrained_j: float, constant_answer_j: float,
              settings: Mapping[str, Any], seeds: int = SEEDS) -> dict[str, Any]:
    """``summary.json``: the settings, one row per unit, and — once every unit of the primary family is in
    (:func:`design_status`; before that, nothing is read) — each arm's endpoints (mean, 95 % t CI), the
    comparisons on the primary endpoint, the frontier and the collapses; the mask arms' endpoints and the mask
    family's comparisons only once its own units are all in too."""
    from grpo_lab.stats.intervals import mean_ci

    status = {"primary": design_status(units, ARMS, seeds), "mask": design_status(units, MASK_ARMS, seeds)}
    summary: dict[str, Any] = {
        "evaluation": "exact", **settings, "untrained_j": untrained_j, "constant_answer_j": constant_answer_j,
        "design": status, "runs": [{key: unit.get(key) for key in RUN_KEYS} for unit in units],
        "margin": None, "arms": {}, "comparisons": [], "mask_comparisons": [],
        "frontier": {c: "not resolved" for c in CORRECTIONS}}
    if not status["primary"]["complete"]:
        return summary
    read = {arm.name for arm in (*ARMS, *(MASK_ARMS if status["mask"]["complete"] else ()))}
    by_arm: dict[str, dict[str, dict[int, float]]] = {e: {} for e in ENDPOINTS}
    for unit in (unit for unit in units if unit["arm"] in read):
        for endpoint in ENDPOINTS:
            by_arm[endpoint].setdefault(unit["arm"], {})[unit["seed"]] = unit[endpoint]
    arms = {}
    for name, by_seed in by_arm["j_auc"].items():
        entry: dict[str, Any] = {"seeds": sorted(by_seed)}
        for endpoint in ENDPOINTS:
            values = [by_arm[endpoint][name][s] for s in sorted(by_seed)]
            mean, half = mean_ci(values)
            entry[endpoint] = {"mean": float(mean), "ci": [float(mean - half), float(mean + half)]
                               if len(values) > 1 else None}
        entry["collapsed"] = sum(by_arm["j_final"][name][s] < untrained_j for s in by_seed)
        arms[name] = entry
    margin = MARGIN_FRACTION * (arms["v1"]["j_auc"]["mean"] - untrained_j)
    summary |= {"margin": margin, "arms": arms}
    if margin > 0:
        summary["comparisons"] = compare(by_arm["j_auc"], COMPARISONS, margin)
        summary["frontier"] = frontier(summary["comparisons"])
        if status["mask"]["complete"]:
            summary["mask_comparisons"] = compare(by_arm["j_auc"], MASK_COMPARISONS, margin)
    return summary


RUN_KEYS = ("arm", "v", "is_correction", "seed", "git_commit", "j_curve", "j_auc", "j_final", "pruned_max")
"""The fields of a unit that ``summary.json``'s ``runs`` keeps."""


# ----------------------------------------------------------------------------- running a unit


def eval_steps(steps: int) -> list[int]:
    """The evaluation steps: 0, ¼, ½, ¾ and the end of the budget."""
    return [steps * q // 4 for q in range(5)]


def endpoints(curve: Mapping[int, float]) -> tuple[float, float]:
    """(``j_auc``, ``j_final``) of a curve step → J: the mean J over the evaluation steps after 0, the last J."""
    steps = sorted(curve)
    return sum(curve[s] for s in steps[1:]) / (len(steps) - 1), curve[steps[-1]]


def constant_answer(questions: Sequence[Any]) -> dict[str, Any]:
    """The best constant-answer policy on ``questions``: the most common gold answer, always given, and its J."""
    from collections import Counter

    answer, hits = Counter(q.answer for q in questions).most_common(1)[0]
    return {"answer": answer, "j": hits / len(questions)}


def provenance(root: Path) -> dict[str, Any]:
    """What a unit records of where it ran (:func:`grpo_lab.provenance.provenance`)."""
    from grpo_lab.provenance import provenance as where

    return where(root)


def exact_j(model: Any, tokenizer: Any, questions: Sequence[Any], config: Any) -> Any:
    """Exact J of ``model`` on ``questions`` under ``config``'s sampling (T, top-p/k, T_max) and stop tokens."""
    from grpo_lab.exact.strict_j import Sampling, exact_evaluate
    from grpo_lab.lm.sampling import stop_and_pad_ids

    sampling = Sampling(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                        max_tokens=config.max_completion_length)
    return exact_evaluate(model, tokenizer, questions, sampling, system_prompt=config.system_prompt,
                          eos_token_ids=stop_and_pad_ids(model, tokenizer, None)[0])


def run_unit(arm: FrontierArm, seed: int, base: Any, out_dir: Path, root: Path,
             questions: Sequence[Any] | None = None) -> dict[str, Any] | None:
    """Train one unit (``base`` with the arm's changes and the seed), with exact J on the task's whole question
    set at each evaluation step (off the clock), and write ``<out_dir>/units/<arm>_s<seed>.json``.

    Skipped (None) if the file exists or another process holds it (:func:`claim`). The unit keeps every step's
    record (lag, r′ statistics, ESS, drift, the empty-step decisions), J per question at each evaluation step
    (and the lowest τ its refinement reached), and its provenance. ``questions``: the evaluation set
    (default: the task's whole question set, :func:`~grpo_lab.lm.tasks.all_questions`)."""
    import os
    import time

    from grpo_lab.lm.build import build_loop
    from grpo_lab.lm.tasks import all_questions

    path = out_dir / "units" / f"{arm.name}_s{seed}.json"
    if path.exists() or not claim(path):
        return None
    unit: dict[str, Any] = {"arm": arm.name, "v": arm.v, "is_correction": arm.is_correction, "beta": arm.beta,
                            "seed": seed, **provenance(root)}
    wall, cpu = time.perf_counter(), time.process_time()
    config = base.replace(seed=seed, **arm.changes())
    loop = build_loop(config)
    questions = all_questions(config.task) if questions is None else questions
    results, records, eval_seconds = train_with_exact_j(loop, questions, config)
    curve, per_question = curve_of(results)
    pruned_max = max([0.0, *(float(result.pruned.max()) for result in results.values())])
    thresholds = {k: float(min(row["threshold"] for row in result.rows)) for k, result in results.items()}
    j_auc, j_final = endpoints(curve)
    unit.update(task=config.task, steps=config.steps, lr=config.lr, j_curve=curve, j_per_question=per_question,
                j_auc=j_auc, j_final=j_final, pruned_max=pruned_max, lowest_threshold=thresholds, records=records,
                load_end=list(os.getloadavg()),
                wall_seconds=time.perf_counter() - wall, cpu_seconds=time.process_time() - cpu,
                eval_seconds=eval_seconds)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(unit) + "\n")
    tmp.replace(path)
    path.with_suffix(".lock").unlink()
    return unit


def train_with_exact_j(loop: Any, questions: Sequence[Any], config: Any,
                       after_step: Any = None) -> tuple[dict[int, Any], list[dict[str, Any]], float]:
    """Train ``loop`` for ``config.steps`` steps with exact J on ``questions`` at :func:`eval_steps` (off the clock):
    the evaluation at each of those steps, every step's record, and the seconds the evaluations took.
    ``after_step(loop)``, if given, runs after each step (a study logging what the step drew)."""
    import dataclasses
    import time

    import torch

    results, records, eval_seconds = {}, [], 0.0
    for k in range(config.steps + 1):
        if k in eval_steps(config.steps):
            start = time.perf_counter()
            with torch.no_grad():
                results[k] = exact_j(loop.policy.model, loop.task.tokenizer, questions, config)
            eval_seconds += time.perf_counter() - start
        if k < config.steps:
            records.append(dataclasses.asdict(loop.step()))
            if after_step is not None:
                after_step(loop)
    return results, records, eval_seconds


def curve_of(results: dict[int, Any]) -> tuple[dict[int, float], dict[int, list[float]]]:
    """Exact J by step and J per question by step (6 decimals) of :func:`train_with_exact_j`'s evaluations."""
    return ({k: result.mean for k, result in results.items()},
            {k: [round(float(j), 6) for j in result.j_low] for k, result in results.items()})


def claim(path: Path) -> bool:
    """Create ``path``'s lock file unless a process holds it (then False): processes side by side share one
    unit order, each taking the next unit nobody holds. A lock left by a killed process is removed by hand."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.with_suffix(".lock").touch(exist_ok=False)
    except FileExistsError:
        return False
    return True


def run_untrained(base: Any, out_dir: Path, root: Path, questions: Sequence[Any] | None = None) -> dict[str, Any]:
    """``<out_dir>/units/untrained.json``: exact J of the untrained model per question, and the best
    constant-answer policy's J (the task's most common gold answer, answered always), with the provenance of
    a unit (``root``: the checkout whose commit it records); computed once."""
    import os

    from grpo_lab.lm.models import load_policy
    from grpo_lab.lm.tasks import all_questions

    path = out_dir / "units" / "untrained.json"
    if path.exists():
        return json.loads(path.read_text())
    unit: dict[str, Any] = provenance(root)
    model, tokenizer = load_policy(base.model)
    questions = all_questions(base.task) if questions is None else questions
    result = exact_j(model, tokenizer, questions, base)
    unit |= {"task": base.task, "questions": [q.question for q in questions], "j": result.mean,
            "j_per_question": [round(float(j), 6) for j in result.j_low], "pruned_max": float(result.pruned.max()),
            "constant_answer": constant_answer(questions), "load_end": list(os.getloadavg())}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(unit) + "\n")
    return unit


def rebuild_summary(out_dir: str | Path, base: Any, write: bool = True) -> dict[str, Any]:
    """``<out_dir>/summary.json`` rebuilt from the unit files (and the untrained unit); ``write=False`` only
    returns it (a notebook reading the committed units)."""
    out = Path(out_dir)
    untrained = json.loads((out / "units" / "untrained.json").read_text())
    settings = {"task": base.task, "steps": base.steps, "lr": base.lr, "G": base.G,
                "prompts_per_step": base.prompts_per_step, "temperature": base.temperature,
                "max_completion_length": base.max_completion_length, "is_cap": base.is_cap}
    summary = summarize(load_units(out), untrained["j"], untrained["constant_answer"]["j"], settings)
    if write:
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
