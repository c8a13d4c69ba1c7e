"""Steps to target against TRL: time to an exact-J target as (optimiser steps to reach it) × (seconds per optimiser
step), each half measured where it is clean. Everything here is fixed before the first unit runs; the units and
the benchmark only fill it in.

**Why.** The time-to-accuracy study timed wall clock within 600 s; TRL (29–46 s a step) reached no target in any
seed, so every ratio to TRL was a bound set by the budget. A step count does not depend on the machine's load, so
the steps half runs as long as TRL needs, at one thread, two units side by side; the seconds half is a short
interleaved benchmark run alone.

**Recipe.** The time-to-accuracy study's (:func:`studies.time_to_accuracy.design.shared_recipe`): ``cpu_arith_smollm2``
on ``addsubmul1`` at lr 1e-5, strict scoring, v = 1, one micro-batch of P·G = 32 rows, empty steps skipped, one
thread. Targets: read from ``studies/time_to_accuracy/results/targets.json`` (50 % and 80 % of the frontier's
``v1`` gain over the untrained J: J 0.420 and 0.630) and nowhere else, on that file's question set (every 3rd of
the 363, 121); the untrained unit must match the file's untrained J.

**Steps half: arms and units.** ``grpo_lab_v1`` (the loop's defaults) and ``trl`` (TRL's ``GRPOTrainer``, a batch
with no signal takes no AdamW step: the loop's rule), seeds :data:`LOOP_SEEDS` and :data:`TRL_SEEDS` (fresh: no
earlier unit used them). Exact J every :data:`EVERY` = 2 optimiser steps, off the clock. A unit trains until it
has passed both targets and at least :data:`MIN_STEPS` = 60 optimiser steps (the largest TOST step count), or until
the cap :data:`CAP` = 142 optimiser steps: twice the loop's slowest seed in the time-to-accuracy units (71 optimiser
steps to the 80 % target, :func:`issue38_passages`), rounded up to a multiple of k; a seed that has not reached a
target by then is censored at the cap, and said so. A unit that takes :data:`BATCH_CAP` batches without reaching
the cap (empty batches take no optimiser step) stops too; its restricted steps are not observed, and amendment 4
(:data:`AMENDMENT_4`) reads it censored at its stop. Order: seed by seed, TRL before the loop
(:func:`unit_order`); processes share it by advisory locks.

**First passage** N: the optimiser steps at the first evaluation with J ≥ the target (no interpolation: N is
overstated by at most k − 1 = 1 step), with E, the empty batches by then (:class:`grpo_lab.stats.passage.StepPassage`).

**Seconds half.** ``benchmarks/step_seconds.py``, alone on the machine: the sides of :data:`SIDES` take their steps
in turn, round by round, :data:`PAIRS` = 20 rounds after :data:`WARMUP_ROUNDS` = 1; in a round each side takes one
step whose rewards are replaced by a fixed pattern with signal in every group (it trains) and one whose rewards are
all zero (it is empty), the order of the sides drawn per round from :data:`ORDER_SEED`. The reward function still
runs; only its output is replaced, so a step's seconds hold everything but the draw of which batches are empty,
which the units count. After every step π_θ goes back to its starting weights, off the clock: trained by the
forced pattern, the sides' policies drifted apart in a first run (the loop's and TRL's completions to the 8-token
cap, the ``model.generate`` sides' to 2 tokens), so they timed different work; that run is discarded. Per round:
c (seconds of a step that trains) and c∅ (of one that does not) for every side.

**Time ratio** (:func:`grpo_lab.stats.passage.product_time_ratio`): mean N·c̄ + E·c̄∅ over the loop's seeds / the
same over TRL's = steps ratio × seconds-per-step ratio, each arm's seconds per optimiser step at its own empty
share; 95 % percentile bootstrap, :data:`RESAMPLES` resamples seeded :data:`BOOTSTRAP_SEED`, seeds of each arm and
the benchmark's rounds resampled together. A censored seed makes the ratio a bound (``≤`` when only TRL's are).

**Per update** (:func:`decide_per_update`): is TRL's exact J the loop's within ±:data:`MARGIN` (0.051 of J, the lag
frontier's margin) after the same number of optimiser steps? Welch TOST (:func:`grpo_lab.stats.paired.welch_tost`),
unpaired (the trainers share no randomness seed by seed), at 60, 40 and 20 optimiser steps in that fixed sequence
(:data:`TOST_SEQUENCE`, :func:`per_update_verdicts`): each at α = 0.05 until the first that does not reject, the
counts after it not tested; "the same per update" at every count only if all three reject. Late counts come first
because the seeds agree most there. The difference and its 95 % interval are reported beside, as estimates.

**Decomposition** (the benchmark's sides; per-step ratios to ``grpo_lab_v1`` at the loop's empty share
e₀ = :data:`EMPTY_SHARE` = 0.31 empty batches per optimiser step, pooled from the time-to-accuracy ``v1`` units to
the 80 % target, and at a step that trains): ``no_share_prompt`` (every row runs its own prompt),
``empty_backward`` (an empty batch runs forward and backward, then drops them, as TRL does), ``generate_sampler``
(α decodes through ``model.generate``, one row per completion, as TRL: :class:`grpo_lab.lm.sampling.GenerateSampler`),
``trl_like`` (all three at once) and ``trl``. Each factor with its interval; the product of the three against
``trl_like`` (``interaction``: 1 where they multiply), and ``trl`` / ``trl_like`` (``unexplained``: what the three
leave, TRL's trainer around them). Six sides do not fit in this machine's memory at once: they run in two groups
(:data:`RECIPE_GROUPS`), each with ``grpo_lab_v1``, so each ratio is paired within its group's run, and the groups'
rounds are resampled independently. The same benchmark at 128-token completions on ``gsm_symbolic``, 10 rounds,
sides ``grpo_lab_v1``, ``generate_sampler``, ``trl_like``, ``trl`` in one group (:data:`SECONDS_TASKS`), answers
whether the per-step ratio holds as completions lengthen (no steps half there).

**Precision and power** (:func:`precision`, :func:`power_table`; both in ``design.json``), from the time-to-accuracy
units (2 threads, alone; J interpolated between their 30-second evaluations, so the spreads are approximate, and
only 3 seeds ran to 60 optimiser steps):

- N to the 50 % / 80 % target, ``grpo_lab_v1``: 24–39 / 43–71 optimiser steps, coefficient of variation 0.19 / 0.19.
- a batch's seconds: the loop's trained batches vary by 0.40 (CV), TRL's batches by 0.19.
- with 10 loop seeds, 5 TRL seeds and 20 rounds, if TRL's N spreads as the loop's, the time ratio's relative
  standard error is about 0.14: a 95 % interval of about ×/÷ 1.33 around the estimate.
- the loop's J across seeds at 60, 40, 20 optimiser steps: SD 0.014, 0.030, 0.048 (TRL's, unknown, taken equal).
  Power of the fixed sequence, 20,000 simulated studies a row:

====== ============= ============= ============= ============
true d at 60 steps   at 40 steps   at 20 steps   all three
====== ============= ============= ============= ============
0      1.00          0.75          0.14          0.14
0.02   0.98          0.51          0.08          0.08
0.04   0.37          0.06          0.00          0.00
====== ============= ============= ============= ============

What the design can decide: equivalence per update late in training (60 steps, where seeds agree) if TRL's J
spreads as the loop's, and at 40 steps three times in four if the arms agree; at 20 steps it cannot (a spread of
0.048 at 10 and 5 seeds is as wide as the margin), so an early gap shows as "not resolved", not as a difference.
The time ratio's interval, about ×/÷ 1.33, resolves any ratio further than that from 1.

**Budget at one thread** (from the lag-decided units, the same recipe at one thread with two units side by side: a
batch 5.4 s, exact J on the 121 questions ≈ 23 s): a loop unit ≈ 85 batches + 33 evaluations ≈ 20 min; a TRL unit,
if its batch takes ~60 s at one thread (36 s at two, alone), ≈ 1.7 h when it passes 80 % near the loop's 65 steps,
≈ 3.5 h censored at 142. All 15 units on two processes: ≈ 6–11 h. The benchmark alone at two threads: ≈ 35 min at 8
tokens (its first group; the second, without TRL, a few minutes), ≈ 1.5–2 h at 128 (from the P1 rows at 128
tokens, doubled for P = 4). TRL's one-thread batch is a guess: no unit has timed it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from grpo_lab.stats.intervals import welch_t
from studies.stats import passage
from studies.stats.comparisons import tost_p, welch_tost
from studies.time_to_accuracy import design as tta

HERE = Path(__file__).resolve().parent
TARGETS = tta.committed_dir() / "targets.json"
ISSUE38_UNITS = tta.committed_dir() / "units"
"""The time-to-accuracy units the cap, the empty share and the spreads are computed from."""
ISSUE38_SUMMARY = tta.committed_dir() / "summary.json"
"""The time-to-accuracy study's wall-clock first passages, which the product is checked against."""
ISSUE38_SIDES = {"empty_backward": "grpo_lab_v1_empty_backward", "no_share_prompt": "grpo_lab_v1_no_share_prompt"}
"""Benchmark side → the time-to-accuracy arm that runs the same change."""

ARMS = ("grpo_lab_v1", "trl")
"""The steps half's arms, by their names in :func:`studies.time_to_accuracy.design.arms`."""
LOOP, REFERENCE = ARMS
LOOP_SEEDS = tuple(range(530, 540))
TRL_SEEDS = tuple(range(530, 535))
EVERY = 2
"""Exact J every this many optimiser steps."""
TOST_SEQUENCE = (60, 40, 20)
"""The per-update step counts in the order the fixed sequence tests them: where the seeds agree most first."""
TOST_STEPS = tuple(sorted(TOST_SEQUENCE))
MIN_STEPS = max(TOST_STEPS)
"""Every unit trains at least this far, so every TOST step count has J in every seed."""
CAP_FACTOR = 2
CAP = 142
"""Optimiser steps at which a unit stops, reached or not: :data:`CAP_FACTOR` × the loop's slowest seed in the
time-to-accuracy units, up to a multiple of :data:`EVERY` (:func:`cap_from`; a test checks it against the data)."""
BATCH_CAP = 4 * CAP
"""Batches at which a unit stops short of the cap (it stalled on empty batches): its restricted steps are not
observed (amendment 4 reads it censored at its stop). The time-to-accuracy units took at most 1.4 batches per
optimiser step."""
MARGIN = 0.051
ALPHA = 0.05
RESAMPLES = passage.RESAMPLES
BOOTSTRAP_SEED = 53
LEVEL = passage.LEVEL

SIDES = {
    "grpo_lab_v1": {},
    "no_share_prompt": {"share_prompt": False},
    "empty_backward": {"empty_step": "skip_after_backward"},
    "generate_sampler": {"sampler": "hf_generate"},
    "trl_like": {"share_prompt": False, "empty_step": "skip_after_backward", "sampler": "hf_generate"},
    "trl": None,
}
"""The benchmark's sides: the loop with these config fields changed on the recipe, or TRL (None)."""
FACTORS = ("no_share_prompt", "empty_backward", "generate_sampler")
"""The sides that each switch one of TRL's ways on in the loop; ``trl_like`` switches all three."""
WARMUP_ROUNDS = 1
ORDER_SEED = 53
RECIPE_GROUPS = (("grpo_lab_v1", "trl", "generate_sampler", "trl_like"),
                 ("grpo_lab_v1", "no_share_prompt", "empty_backward"))
"""The recipe's sides in the groups the benchmark runs one after another, each group in one process of its own.
All six sides at once held 24.3 GB and were killed on a 23 GiB machine (about 4 GB a side: π_θ, its gradients and
AdamW's moments, and α); four fit. Each group holds ``grpo_lab_v1``, so every ratio to it is paired within a run;
``trl`` and ``trl_like`` share a group, so what the three factors leave (``trl`` / ``trl_like``) is paired too, and
the time ratio takes ``trl`` and ``grpo_lab_v1`` from that group."""
SECONDS_TASKS = (("addsubmul1", 8, 20, RECIPE_GROUPS),
                 ("gsm_symbolic", 128, 10, (("grpo_lab_v1", "generate_sampler", "trl_like", "trl"),)))
"""(task, completion tokens, rounds kept, groups of sides) the benchmark runs: the recipe's, every side in two groups
(:data:`RECIPE_GROUPS`), 20 rounds (the seconds are most of the time ratio's error: :func:`precision`); and
128-token chains of thought, 10 rounds, the four sides that say how much of the gap sampling explains there."""
PAIRS = SECONDS_TASKS[0][2]


def check_groups(groups: Sequence[Sequence[str]]) -> None:
    """ValueError unless the groups can be joined (:data:`RECIPE_GROUPS`): every side known, ``grpo_lab_v1`` in
    every group, every other side in one group only, and ``trl`` with ``trl_like`` where both run."""
    sides = [name for group in groups for name in group if name != LOOP]
    unknown = sorted(set(sides) - set(SIDES))
    if unknown:
        raise ValueError(f"unknown sides {unknown}; the sides are {list(SIDES)}")
    missing = [list(group) for group in groups if LOOP not in group]
    if missing:
        raise ValueError(f"groups {missing} lack {LOOP}: their ratios to it would not be paired")
    repeated = sorted({name for name in sides if sides.count(name) > 1})
    if repeated:
        raise ValueError(f"sides {repeated} are in more than one group")
    if {"trl", "trl_like"} <= set(sides) and not any({"trl", "trl_like"} <= set(group) for group in groups):
        raise ValueError("trl and trl_like run in different groups: trl / trl_like would not be paired")

TOST_SCENARIOS = (0.0, 0.02, 0.04)
"""True per-update differences |d| for :func:`power_table`, the same at every step count."""


# ----------------------------------------------------------------------------- from the time-to-accuracy units


def issue38_units(arm: str, units_dir: Path = ISSUE38_UNITS) -> list[dict[str, Any]]:
    """The time-to-accuracy units of ``arm``, in seed order."""
    return [json.loads(p.read_text()) for p in sorted(units_dir.glob(f"{arm}_s[0-9]*.json"))]


def j_by_optimizer_steps(unit: Mapping[str, Any]) -> tuple[list[int], list[float]]:
    """A time-to-accuracy unit's exact J against optimiser steps, from (0, its untrained J); of evaluations at the
    same step count (empty batches between them) the last."""
    by_steps = {0: unit["untrained_j"]} | {p["optimizer_steps"]: p["j"] for p in unit["points"]}
    steps = sorted(by_steps)
    return steps, [by_steps[s] for s in steps]


def step_passage(points: Sequence[Mapping[str, Any]], level: float) -> passage.StepPassage | None:
    """The first passage in optimiser steps: at the first of ``points`` (evaluations with ``optimizer_steps``,
    ``steps`` (batches) and ``j``, in order) with J ≥ ``level``, N and E = batches − N; None if none reached it."""
    hit = next((p for p in points if p["j"] >= level), None)
    return None if hit is None else passage.StepPassage(hit["optimizer_steps"], hit["steps"] - hit["optimizer_steps"],
                                                        True)


def issue38_passages(arm: str = LOOP, units_dir: Path = ISSUE38_UNITS,
                     targets_path: Path = TARGETS) -> dict[str, list[passage.StepPassage]]:
    """Target name → each seed's first passage in optimiser steps (:func:`step_passage`) in the time-to-accuracy
    units of ``arm`` (evaluated every 30 s, so each N is the first such evaluation's)."""
    levels = tta.load_targets(targets_path)["targets"]
    units = issue38_units(arm, units_dir)
    out: dict[str, list[passage.StepPassage]] = {}
    for name, level in levels.items():
        out[name] = [step_passage(unit["points"], level) for unit in units]
        if None in out[name]:
            raise ValueError(f"a seed of {arm} did not reach {name}: no cap can be set from it")
    return out


def cap_from(passages: Mapping[str, Sequence[passage.StepPassage]], factor: int = CAP_FACTOR,
             every: int = EVERY) -> int:
    """``factor`` × the slowest seed's optimiser steps over every target, up to a multiple of ``every``."""
    slowest = max(p.steps for seeds in passages.values() for p in seeds)
    return every * math.ceil(factor * slowest / every)


def empty_share(passages: Sequence[passage.StepPassage]) -> float:
    """Empty batches per optimiser step, pooled over seeds: ΣE / ΣN."""
    return sum(p.empty for p in passages) / sum(p.steps for p in passages)


EMPTY_SHARE = 0.3125
"""e₀: :func:`empty_share` of the loop's passages to the 80 % target in the time-to-accuracy units (a test checks
it)."""

AMENDMENT_1 = {
    "number": 1,
    "fixed_on": "2026-12-06",
    "why": "trl / trl_like is 1.57x [1.52, 1.62] at 8 tokens, which no side isolates. A profile of one TRL step "
           "(one thread, under load: a lead, not a figure) put a third of its CPU time in TRL's fused LM head "
           "(trl.kernels.chunked_logprob), which off a Triton device scores every position of prompt and "
           "completion and masks the prompt's afterwards; where Triton runs it scores the completion positions only",
    "sides": {"trl_completions": "trl, its fused LM head scoring the completion positions only (TRL's path where "
                                 "Triton runs; the tiles stay torch's)"},
    "runs": [{"task": "addsubmul1", "tokens": 8, "pairs": 10, "groups": [["trl", "trl_completions"]]}],
    "ratios": {"every_position": ["trl", "trl_completions"]},
    "rest": "trl_completions / trl_like = (trl / trl_like in the recipe's group 1) / every_position, the two runs' "
            "rounds resampled independently",
    "empty_share": EMPTY_SHARE,
}
"""A benchmark added after the design (amendment 1), fixed before its run and kept out of ``design.json`` so
every unit and benchmark file run under that design stays valid: TRL and TRL scoring the completion positions only
(``trl_completions``), 10 rounds alone at 2 threads, read as ``trl`` / ``trl_completions`` (what scoring every
position costs) and, with the recipe's first group, ``trl_completions`` / ``trl_like`` (what is left). A first try
with ``trl_like`` in the group as well held 24.3 GB and was killed in its warm-up round (no file written, nothing
read); two TRL trainers and a loop do not fit in 23 GiB. Its files carry :func:`amendment_sha`."""
AMENDMENT_2 = {
    "number": 2,
    "fixed_on": "2026-12-06",
    "why": "amendment 1 ran on an AMD EPYC (AVX-512, no AMX); the recipe's group 1 ran on I2 (Intel Xeon, AVX-512 "
           "and AMX), where TRL's step took 16.5 s against 23.8 s there, so amendment 1's rest would join two "
           "machines and is not read. What is left after scoring is measured within one run instead, on amendment "
           "1's machine",
    "sides": {},
    "runs": [{"task": "addsubmul1", "tokens": 8, "pairs": 10, "groups": [["trl_like", "trl_completions"]]}],
    "ratios": {"rest": ["trl_completions", "trl_like"]},
    "joined": "trl / trl_like on that machine = every_position (amendment 1) x rest (here), the two runs' rounds "
              "resampled independently, only where both ran on one CPU model",
    "empty_share": EMPTY_SHARE,
}
"""Amendment 2, fixed before its run: ``trl_completions`` / ``trl_like`` in one run on amendment 1's machine, and
with amendment 1 the whole of ``trl`` / ``trl_like`` there (:func:`~.summary.joined_amendments`)."""
AMENDMENT_3 = {
    "number": 3,
    "fixed_on": "2026-12-06",
    "why": "a TRL unit censored at the cap takes about 4 h at one thread beside a loop unit (trl_s530: 26 optimiser "
           "steps in 44 batches, J 0.134, about 65 s a batch), longer than a sitting, whose processes and "
           "checkpoints do not outlive it; no TRL unit had finished. Scoring the completion positions only (TRL's "
           "path where Triton runs) gives the same log-probabilities and gradients to 1e-6 (tested) and takes "
           "1/1.70 of a step (amendment 1); at 2 threads alone a unit censored at the cap takes about 70 min. "
           "A step count is the measure, not a unit's seconds; the seconds half keeps stock TRL",
    "arm": "trl",
    "scoring": "completion positions",
    "threads": 2,
    "beside": "nothing: one TRL unit at a time",
}
"""Amendment 3, fixed before any TRL unit finished: TRL's units score the completion positions only
(:func:`studies.time_to_accuracy.trl_side.completion_scoring`) and run at 2 threads, one at a time. Every TRL unit
records it; the summary refuses a TRL unit without it."""
AMENDMENT_4 = {
    "number": 4,
    "fixed_on": "2026-12-06",
    "why": "trl_s532 took 21 optimiser steps in its first 141 batches and none in the 50 after (every group's eight "
           "rewards equal; entropy 0.01-0.16; J 0.066 at 20 steps), so it may stop at the batch cap, and the design "
           "refused such a unit without saying how the study reads it: refusing it would drop a seed for not "
           "reaching the target. Fixed before that unit stopped",
    "rule": "a unit stopped by the batch cap before reaching a target enters that target's passages censored at its "
            "stop: N and E its optimiser steps and empty batches at its last batch, not reached, as a seed censored "
            "at the cap does, so the time ratio is a bound (censoring_bound). Per update, a step count the unit did "
            "not reach has no J from it: the TOST runs on the seeds that reached it, and the summary says how many",
}
"""Amendment 4, fixed before ``trl_s532`` stopped: how a unit stopped by the batch cap (it stalled on empty
batches) is read (:func:`~.summary.unit_passages`)."""
AMENDMENT_5 = {
    "number": 5,
    "fixed_on": "2026-12-06",
    "why": "the design's 128-token run (its four sides in one process, the recipe's micro-batch of 32) was killed for "
           "memory in its first round (23.3 GiB resident on a 23.5 GiB machine; no file written, nothing read). Alone "
           "at 128 tokens (AMD EPYC, 2 threads) stock TRL, its 32 completions in one forward, peaked at 23.2 GiB. "
           "The four sides in one process, one warm-up round each (nothing kept): at 8 sequences a forward they "
           "peaked at 21.3 GiB, too near the machine's 23.5 for 11 rounds; at 4, at 16.6 GiB. The memory guard had "
           "also given the loop's sides 20, 18 and 16 a forward, by what each found free when it was built, so the "
           "sides differed in more than their ways. 4 a forward is what the P1 benchmark ran at 128 tokens "
           "(benchmarks/trl_step_ratio.py --micro-batch 4)",
    "sides": {},
    "runs": [{"task": "gsm_symbolic", "tokens": 128, "pairs": 10, "micro_batch_size": 4,
              "groups": [["grpo_lab_v1", "generate_sampler", "trl_like", "trl"]]}],
    "micro_batch": "4 sequences a forward and backward on every side: the loop's micro_batch_size, TRL's "
                   "per_device_train_batch_size with gradient_accumulation_steps = steps_per_generation = 8 (one "
                   "optimiser step on the same 32 completions); a file whose sides ran another is refused",
    "replaces": "gsm_symbolic_128",
}
"""Amendment 5, fixed before any 128-token file: the design's 128-token run (:data:`SECONDS_TASKS`) again, every
side at a micro-batch of 4, so four sides fit in one process and differ only in their ways. Its file is read as
that run's decomposition (:func:`~.summary.seconds_entry`), in its place."""
AMENDMENT_6 = {
    "number": 6,
    "fixed_on": "2026-12-06",
    "why": "the 8-token decomposition ran on I2 (Intel Xeon, AMX) at the recipe's micro-batch, amendment 5's 128-token "
           "run on an AMD EPYC (no AMX) at 4 sequences a forward; ratios on two CPU models and two micro-batches are "
           "not joined, so how the loop's lead per step changes from 8 to 128 tokens could be read only as a "
           "direction. The 8-token recipe again with amendment 5's four sides and micro-batch, on amendment 5's CPU "
           "model, leaves the completion length the only difference",
    "sides": {},
    "runs": [{**AMENDMENT_5["runs"][0], "task": "addsubmul1", "tokens": 8}],   # its sides, rounds, micro-batch
    "micro_batch": "as amendment 5: 4 sequences a forward and backward on every side; a file whose sides ran another "
                   "is refused",
    "ratios": {"trl": ["trl", "grpo_lab_v1"], "trl_like": ["trl_like", "grpo_lab_v1"],
               "generate_sampler": ["generate_sampler", "grpo_lab_v1"], "unexplained": ["trl", "trl_like"]},
    "empty_share": EMPTY_SHARE,
}
"""Amendment 6, fixed before its run: amendment 5's group at 8 tokens of the recipe, on amendment 5's CPU model, so
8 and 128 tokens sit side by side with nothing else changed (its ratios in the summary's ``amendments``)."""
AMENDMENTS = (AMENDMENT_1, AMENDMENT_2, AMENDMENT_3, AMENDMENT_4, AMENDMENT_5, AMENDMENT_6)
UNIT_AMENDMENT = AMENDMENT_3


def replaced_runs(amendments: Sequence[Mapping[str, Any]] = AMENDMENTS) -> dict[str, int]:
    """The design's benchmark runs, ``<task>_<tokens>``, that an amendment's run replaces, each with its number."""
    return {a["replaces"]: a["number"] for a in amendments if "replaces" in a}


def amendment_sha(amendment: Mapping[str, Any]) -> str:
    """SHA-256 of an amendment's canonical JSON: its benchmark files record it."""
    return tta.design_sha(dict(amendment))


def j_spread_at(steps: Sequence[int], arm: str = LOOP, units_dir: Path = ISSUE38_UNITS) -> list[float]:
    """The SD over ``arm``'s seeds of exact J at each optimiser-step count, J interpolated linearly between the
    unit's evaluations (seeds that stopped before a count are left out of it)."""
    curves = [j_by_optimizer_steps(u) for u in issue38_units(arm, units_dir)]
    return [float(np.std([np.interp(n, x, y) for x, y in curves if x[-1] >= n], ddof=1)) for n in steps]


def batch_seconds_spread(units_dir: Path = ISSUE38_UNITS) -> dict[str, float]:
    """The coefficient of variation of a batch's seconds: the loop's batches that trained (``grpo_lab_v1``'s records:
    sample + train + sync), TRL's batches (the steps between its clock's readings)."""
    def cv(values: Sequence[float]) -> float:
        return float(np.std(values, ddof=1) / np.mean(values))

    loop = [r["sample_seconds"] + r["train_seconds"] + r["sync_seconds"]
            for unit in issue38_units(LOOP, units_dir) for r in unit["records"] if not r["skipped"]]
    trl = [float(s) for unit in issue38_units(REFERENCE, units_dir)
           for s in np.diff([0.0] + [step["training_seconds"] for step in unit["step_log"]])]
    return {LOOP: cv(loop), REFERENCE: cv(trl)}


# ----------------------------------------------------------------------------- the decision rule


def per_update_verdicts(p_equivalence: Sequence[float], alpha: float = ALPHA) -> list[str]:
    """The fixed-sequence rule over the step counts in :data:`TOST_SEQUENCE` order (``p_equivalence`` in that order):
    each TOST at the full ``alpha`` until the first that does not reject; the counts after it are not tested. The
    family's error stays at ``alpha`` because a count is tested only once every count before it rejected."""
    verdicts, open_ = [], True
    for p in p_equivalence:
        verdicts.append(("equivalent" if p < alpha else "not resolved") if open_ else "not tested")
        open_ = open_ and p < alpha
    return verdicts


def decide_per_update(loop_j: Mapping[int, Sequence[float]], trl_j: Mapping[int, Sequence[float]],
                      sequence: Sequence[int] = TOST_SEQUENCE, margin: float = MARGIN,
                      alpha: float = ALPHA) -> dict[int, dict[str, Any]]:
    """Per step count (``loop_j[n]``, ``trl_j[n]``: exact J of each seed at n optimiser steps): Welch TOST of TRL −
    loop (:func:`~grpo_lab.stats.paired.welch_tost`) and the verdict of the fixed sequence over ``sequence``
    (:func:`per_update_verdicts`): ``equivalent``, ``not resolved`` or ``not tested``. The difference's two-sided
    p and 95 % interval (``ci95``) ride along as estimates; ``ci`` is TOST's (1 − 2α) interval."""
    tests = {n: welch_tost(trl_j[n], loop_j[n], margin, alpha) for n in sequence}
    verdicts = per_update_verdicts([tests[n]["p_equivalence"] for n in sequence], alpha)
    return {n: {**tests[n], "ci95": welch_tost(trl_j[n], loop_j[n], margin, alpha / 2)["ci"], "verdict": verdict}
            for n, verdict in zip(sequence, verdicts, strict=True)}


# ----------------------------------------------------------------------------- precision and power


def precision(passages: Mapping[str, Sequence[passage.StepPassage]], seconds_cv: Mapping[str, float],
              loop_seeds: int = len(LOOP_SEEDS), trl_seeds: int = len(TRL_SEEDS), pairs: int = PAIRS) -> dict[str, Any]:
    """The time ratio's relative standard error to first order: √(CV_N²/n_loop + CV_N²/n_trl + CV_c,loop²/pairs +
    CV_c,trl²/pairs), TRL's N taken to spread as the loop's (the larger CV of the two targets), the rounds taken
    as independent (pairing can only shrink it); and the 95 % interval's factor exp(1.96 · that)."""
    cv_n = max(float(np.std([p.steps for p in seeds], ddof=1) / np.mean([p.steps for p in seeds]))
               for seeds in passages.values())
    se = math.sqrt(cv_n**2 / loop_seeds + cv_n**2 / trl_seeds
                   + (seconds_cv[LOOP] ** 2 + seconds_cv[REFERENCE] ** 2) / pairs)
    return {"cv_steps": cv_n, "cv_seconds": dict(seconds_cv), "relative_se": se, "interval_factor": math.exp(1.96 * se)}


def power(d: float, spreads: Sequence[float], reps: int = 20_000, seed: int = 0, loop_seeds: int = len(LOOP_SEEDS),
          trl_seeds: int = len(TRL_SEEDS), margin: float = MARGIN) -> dict[str, Any]:
    """Monte Carlo power of the per-update family: ``reps`` studies of normal J at each step count of
    :data:`TOST_SEQUENCE` (SD from ``spreads``, in that order, in both arms; TRL's mean ``d`` above the loop's), Welch
    TOST at each, the fixed sequence (:func:`per_update_verdicts`). The share decided equivalent at each count; the
    last is the share equivalent at all of them."""
    rng = np.random.default_rng(seed)
    p = np.column_stack([tost_p(*welch_t(d + s * rng.standard_normal((reps, trl_seeds)),
                                         s * rng.standard_normal((reps, loop_seeds))), margin) for s in spreads])
    hits = np.cumprod(p < ALPHA, axis=1).astype(bool)      # the fixed sequence: rejected, and every count before
    return {"d": d, "steps": list(TOST_SEQUENCE), "equivalent": hits.mean(axis=0).round(3).tolist(),
            "all": float(hits[:, -1].mean().round(3))}


def power_table(spreads: Sequence[float]) -> list[dict[str, Any]]:
    """:func:`power` for each of :data:`TOST_SCENARIOS` (``spreads`` in :data:`TOST_SEQUENCE` order)."""
    return [power(d, spreads) for d in TOST_SCENARIOS]


# ----------------------------------------------------------------------------- the record


def unit_order(loop_seeds: Sequence[int] = LOOP_SEEDS, trl_seeds: Sequence[int] = TRL_SEEDS) -> list[tuple[str, int]]:
    """Seed by seed, TRL's unit before the loop's (the long units start first), then the loop's further seeds."""
    return [(arm, seed) for seed in sorted({*loop_seeds, *trl_seeds})
            for arm, seeds in ((REFERENCE, trl_seeds), (LOOP, loop_seeds)) if seed in seeds]


def design_record() -> dict[str, Any]:
    """``design.json``: every fixed choice of this module, the targets, and what the time-to-accuracy units give:
    the passages the cap is computed from, the empty share, the spreads, the precision and the power table."""
    targets = tta.load_targets(TARGETS)
    passages = issue38_passages()
    spreads = j_spread_at(TOST_SEQUENCE)
    seconds_cv = batch_seconds_spread()
    return {"recipe": tta.RECIPE, "task": targets["task"], "lr": targets["lr"], "evaluation": "exact",
            "targets": {k: targets[k] for k in ("targets", "fixed_on", "untrained_j", "questions", "question_count")},
            "arms": list(ARMS), "seeds": {LOOP: list(LOOP_SEEDS), REFERENCE: list(TRL_SEEDS)},
            "order": [list(u) for u in unit_order()], "every": EVERY, "min_steps": MIN_STEPS, "cap": CAP,
            "batch_cap": BATCH_CAP, "threads": 1, "eval_threads": 1,
            "cap_rule": f"{CAP_FACTOR} x the slowest {LOOP} seed in optimiser steps, up to a multiple of {EVERY}",
            "issue38_passages": {name: [[p.steps, p.empty] for p in seeds] for name, seeds in passages.items()},
            "time_ratio": {"statistic": "mean (N c + E c_empty) over the loop's seeds / over TRL's",
                           "interval": "percentile bootstrap over each arm's seeds and the benchmark's rounds",
                           "resamples": RESAMPLES, "bootstrap_seed": BOOTSTRAP_SEED, "level": LEVEL},
            "per_update": {"steps": list(TOST_SEQUENCE), "margin": MARGIN, "alpha": ALPHA,
                           "test": "Welch TOST, TRL - loop, df rounded down",
                           "multiplicity": "fixed sequence in the order of steps, each at alpha",
                           "loop_j_spread": [round(s, 4) for s in spreads]},
            "benchmark": {"sides": SIDES, "factors": list(FACTORS), "warmup_rounds": WARMUP_ROUNDS,
                          "order_seed": ORDER_SEED, "empty_share": EMPTY_SHARE,
                          "runs": [{"task": task, "tokens": tokens, "pairs": pairs,
                                    "groups": [list(group) for group in groups]}
                                   for task, tokens, pairs, groups in SECONDS_TASKS],
                          "steps": "per round and side: one step with signal in every group, one empty; pi_theta "
                                   "back to its starting weights after each step"},
            "precision": precision(passages, seconds_cv), "power": power_table(spreads)}


def load_design(out: Path = HERE) -> dict[str, Any]:
    """The design in force: ``<out>/design.json``."""
    return json.loads((out / "design.json").read_text())
