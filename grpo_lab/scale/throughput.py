"""What a lag of v buys in wall-clock time (notebook 03): measure, fit, predict.

=============== ===================================================================
measure (CPU)   the (v, i) loop on SmolLM2 at v = 1, 2, 4, 8 and with the adaptive
                schedule, α on ``transformers`` or on vLLM's engine: sample / train /
                sync seconds of every step (MEASURED here)
fit, predict    step(v) = gen + train + sync / v by least squares on the mean step
                times (:func:`fit_step_times`, with standard errors), and from the
                v = 1 records alone (:func:`~grpo_lab.scale.costmodel.fit_from_records`)
lag 0           :func:`log_ratio_at_lag0`: log r′ right after a sync, α ≠ π_k in
                floating point
split           staleness log(π_k/π_sync) vs mismatch log(π_sync/α) along short runs,
                vLLM in bf16 / fp32 and HF (``experiments/offpolicy_split.py`` writes
                :func:`split_path`; :func:`split_summary`, :func:`split_table`)
paper           the same model fitted to the paper's 7B colocate rates
                (:data:`~grpo_lab.scale.costmodel.PAPER_ITERS_PER_SECOND`): predicted
                speed-up against v and against model size
full mode       the 7B colocate runs themselves, repeated per v by :mod:`grpo_lab.scale.repeats` (8 GPUs);
                :func:`colocate_table` sets their steps/s and ratio beside the PAPER's (the paper's 1.35×
                stays the paper's figure until they have run)
figures         :mod:`grpo_lab.viz.throughput` draws these numbers
=============== ===================================================================
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..checks import require_choice, require_int_at_least, require_number_in
from ..files import results_path
from ..lm.build import build_loop
from ..lm.recipes import recipe
from ..lm.train_config import TrainConfig
from ..loop import StepRecord
from .costmodel import (
    PAPER_ITERS_PER_SECOND,
    PAPER_ITERS_PER_SECOND_SPREAD,
    PAPER_PARAMS_7B,
    StepCostModel,
    fit_from_step_times,
    paper_cost_model,
    paper_effective_bandwidth_gb_s,
    sync_seconds_for,
)

MEASURED, PAPER = "MEASURED here", "PAPER"
WARMUP_STEPS = 1
"""Steps left out of every timing: step 0 pays one-off costs (first generate call, allocations)."""
ADAPTIVE_THRESHOLD = 0.3
"""Drift (mean |log π_k − log α|) above which the adaptive run syncs at the next step: a few optimiser
steps of SmolLM2 at lr 1e-5 (the measured drift per step is in docs/benchmarks.md), so the run syncs
every few steps while the policy moves and waits longer (up to its v) while steps are skipped."""
FIXED_VS = (1, 2, 4, 8)
"""The sync periods notebook 03 times, to fit step(v) = gen + train + sync / v on."""
MODEL_SIZES = {"0.5B": 0.49e9, "1.5B": 1.54e9, "7B": PAPER_PARAMS_7B, "14B": 14.7e9, "32B": 32.5e9, "72B": 72.7e9}
"""Parameter counts N of the Qwen2.5 family (model cards), for the size sweep."""


# ----------------------------------------------------------------------------- measure (reduced / smoke)

def throughput_configs(mode: str, sampler: str = "hf") -> dict[str, TrainConfig]:
    """Notebook 03's CPU runs of ``grpo_lab/configs/cpu_arith_smollm2.yaml`` with α on ``sampler`` (``hf`` or
    ``vllm``): fixed v = 1, 2, 4, 8 and the adaptive schedule (``v`` = its longest lag). Steps = warm-up +
    a multiple of 8, so each fixed run's timed window holds whole sync periods. ``smoke`` shrinks every size.
    The reduced size backs up 8 rows at a time rather than the recipe's 16 (fewer activations at the peak; the
    gradient is the same, micro-batches are summed exactly), so the kernel stays under a laptop's 4 GB
    (docs/benchmarks.md, *Notebook memory*)."""
    require_choice("mode", mode, ("smoke", "reduced", "full"))
    if mode == "smoke":
        size, max_lag = dict(G=3, prompts_per_step=2, max_completion_length=4, micro_batch_size=6,
                             steps=WARMUP_STEPS + 8), 3
    else:
        size, max_lag = dict(steps=WARMUP_STEPS + 16, micro_batch_size=8), 8
    runs = {f"v={v}": recipe("cpu_arith_smollm2", v=v, sampler=sampler, **size) for v in FIXED_VS}
    runs[f"adaptive v≤{max_lag}"] = recipe("cpu_arith_smollm2", sync="adaptive", v=max_lag, sampler=sampler,
                                           sync_threshold=ADAPTIVE_THRESHOLD, **size)
    return runs


def measure(configs: Mapping[str, TrainConfig], progress: bool = True) -> tuple[dict[str, list[StepRecord]], Any]:
    """Each config's records, from a fresh π_θ run for ``config.steps`` steps (nothing written to disk), and
    the sampler. The first run's sampler serves every run (synced to each fresh π_θ): one vLLM engine, built
    once (vLLM keeps one set of process groups per process; hand the sampler on rather than build another).

    The C heap's freed pages go back to the OS after every step (:func:`~grpo_lab.lm.memory.return_freed_memory`,
    outside the timed sections): glibc otherwise keeps a step's freed gradients and temporaries where the next
    step's allocations only partly reuse them, and a run's RSS climbs above one step's peak (docs/benchmarks.md,
    *Notebook memory*). The next step faults those pages in again inside its timed sections, the same for every v."""
    from tqdm.auto import tqdm

    from ..lm.memory import return_freed_memory

    runs, sampler = {}, None
    for name, config in configs.items():
        loop = build_loop(config, sampler=sampler)
        sampler = loop.sampler
        runs[name] = []
        for record in tqdm(loop.run(), total=config.steps, desc=name, disable=not progress):
            runs[name].append(record)
            return_freed_memory()
        del loop                 # this run's π_θ and optimiser, freed before the next run loads its own
        return_freed_memory()
    return runs, sampler


def timed(records: Sequence[StepRecord]) -> list[StepRecord]:
    """The records that timings use: every step after the first WARMUP_STEPS."""
    kept = [r for r in records if r.step >= WARMUP_STEPS]
    if not kept or not any(r.synced for r in kept):
        raise ValueError(f"records must hold a synced step after the {WARMUP_STEPS} warm-up step(s)")
    return kept


def step_seconds(records: Sequence[StepRecord]) -> float:
    """Measured mean wall time of a step: sample + train + sync (the sync only where one happened)."""
    return float(np.mean([r.sample_seconds + r.train_seconds + r.sync_seconds for r in records]))


def effective_v(records: Sequence[StepRecord]) -> float:
    """Steps per sync: v for whole periods of a fixed schedule, the mean period of an adaptive one."""
    return len(records) / sum(r.synced for r in records)


def step_time_stats(runs: Mapping[str, Sequence[StepRecord]]) -> dict[int, tuple[float, float]]:
    """Per fixed-v run ("v=N"): v → (mean step seconds, its standard error) over the timed window."""
    stats = {}
    for name, records in runs.items():
        if name.startswith("v="):
            seconds = np.array([r.sample_seconds + r.train_seconds + r.sync_seconds for r in timed(records)])
            stats[int(name[2:])] = (float(seconds.mean()), float(seconds.std(ddof=1) / np.sqrt(len(seconds))))
    return stats


def fit_step_times(stats: Mapping[int, tuple[float, float]]) -> StepCostModel:
    """step(v) = a + sync / v by least squares on the mean step times (a = gen + train, in ``gen``)."""
    return fit_from_step_times({v: mean for v, (mean, _) in stats.items()})


def log_ratio_at_lag0(loop: Any, prompts: int = 4, seed: int = 0) -> np.ndarray:
    """log r′ = log π_k − log α of every sampled token right after a sync (lag 0): α ← π_θ, sample
    G completions of ``prompts`` of the task's prompts, score them with π_θ. Zero in exact arithmetic; what
    is left is the engine's numerics (kernels, KV cache, dtype), which r′ in the loss corrects for."""
    require_int_at_least("prompts", prompts, 1)
    generator = torch.Generator().manual_seed(seed)
    loop.sampler.sync(loop.policy)
    rollout = loop.sampler.sample(loop.task.prompts(prompts, generator), loop.config.G, generator)
    with torch.no_grad():
        logp = loop.policy.logprobs(rollout, slice(None))
    return (logp - rollout.logp_alpha)[rollout.mask].double().numpy()


def split_path(root: str | Path | None = None) -> Path:
    """``experiments/offpolicy_split.py``'s output (committed), which notebook 03 draws:
    ``results/offpolicy_split/split.json`` of a checkout (:func:`~grpo_lab.files.results_path`)."""
    return results_path("offpolicy_split", "split.json", root=root)


def split_summary(records: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Means of a run's :func:`~grpo_lab.objective.offpolicy_split` (records as dicts with ``lag``,
    ``staleness_abs``, ``mismatch_abs``, ``staleness_share``): the mismatch over every step; the staleness
    at lag 0 (0 by construction) and, with its share, over the steps at lag ≥ 1 (None when none lagged)."""
    if not records:
        raise ValueError("records is empty: a run's split needs at least one step")

    def mean(rows: Sequence[Mapping[str, Any]], key: str) -> float | None:
        return float(np.mean([r[key] for r in rows])) if rows else None

    lag0, lagged = [r for r in records if r["lag"] == 0], [r for r in records if r["lag"] > 0]
    return {"mismatch_abs": mean(records, "mismatch_abs"), "staleness_abs_lag0": mean(lag0, "staleness_abs"),
            "staleness_abs_lagged": mean(lagged, "staleness_abs"),
            "staleness_share_lagged": mean(lagged, "staleness_share")}


def load_split(path: str | Path | None = None) -> dict[str, Any]:
    """The split's results file (default: :func:`split_path`), or a ValueError saying how to make it."""
    path = split_path() if path is None else Path(path)
    if not path.is_file():
        raise ValueError(f"{path} does not exist: experiments/offpolicy_split.py measures it (the command is in its "
                         "docstring); the script comes with a checkout of the repository, not with the package")
    return json.loads(path.read_text())


def split_table(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per run of :func:`load_split`'s data: sampler, engine dtype, v and :func:`split_summary`."""
    return [{"run": run["name"], "engine dtype": run["engine_dtype"], "v": run["v"],
             **split_summary(run["records"])} for run in data["runs"]]


def run_table(runs: Mapping[str, Sequence[StepRecord]], model: StepCostModel) -> list[dict[str, Any]]:
    """One row per run: schedule (syncs, lag), learning (reward, drift) and the step time measured
    vs predicted by ``model`` at the run's effective v (timings after the warm-up)."""
    rows = []
    for name, records in runs.items():
        window = timed(records)
        measured, predicted = step_seconds(window), float(model.step_seconds(effective_v(window)))
        rows.append({"run": name, "source": MEASURED, "steps": len(records), "syncs": sum(r.synced for r in records),
                     "mean lag": np.mean([r.lag for r in records]), "max lag": max(r.lag for r in records),
                     "reward": np.mean([r.reward_mean for r in records]),
                     "drift": np.mean([r.log_ratio_k_abs for r in records]),
                     "step s": measured, "predicted s": predicted, "error": (predicted - measured) / measured})
    return rows


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows of equal keys as aligned text (floats with 4 significant digits)."""
    cells = [[f"{v:.4g}" if isinstance(v, (float, np.floating)) else str(v) for v in row.values()] for row in rows]
    header = list(rows[0])
    widths = [max(len(x) for x in column) for column in zip(header, *cells)]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(line, widths)) for line in [header, *cells])


# ----------------------------------------------------------------------------- predict (paper numbers)

def size_model(params: float, fixed_share: float = 0.0, bandwidth_gb_s: float | None = None,
               bytes_per_param: int = 2) -> StepCostModel:
    """step(v) of an N-parameter model on the paper's node, anchored at its 7B run (N7 = 7.6e9).

    ================= ===================================================================
    gen (+ train)     a7 · (fixed_share + (1 − fixed_share) · N / N7), a7 = the paper's 25.1 s
    sync              N · bytes_per_param / bandwidth (default: the paper's effective 1.48 GB/s)
    ================= ===================================================================

    With ``fixed_share = 0`` every term is ∝ N and the speed-up is the same for every size;
    a per-step part that does not grow with N (reward scoring, scheduling, logging) makes it grow.
    """
    require_number_in("params", params, 0.0, low_open=True)
    require_number_in("fixed_share", fixed_share, 0.0, 1.0)
    paper = paper_cost_model()
    bandwidth = paper_effective_bandwidth_gb_s(bytes_per_param) if bandwidth_gb_s is None else bandwidth_gb_s
    base = (paper.gen + paper.train) * (fixed_share + (1 - fixed_share) * params / PAPER_PARAMS_7B)
    return StepCostModel(gen=base, train=0.0, sync=sync_seconds_for(params, bandwidth, bytes_per_param))


def size_speedups(v: int, fixed_shares: Sequence[float]) -> dict[float, np.ndarray]:
    """Predicted step(1)/step(v) for each model of MODEL_SIZES, per fixed share."""
    require_int_at_least("v", v, 1)
    return {share: np.array([float(size_model(n, share).speedup(v)) for n in MODEL_SIZES.values()])
            for share in fixed_shares}


# ----------------------------------------------------------------------------- full mode: the PAPER's run beside ours

def colocate_table(summary: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The PAPER's iter/s per v and the ratio of its two means (it gives no interval for that ratio), then, where
    the repeats have run (``summary``: :func:`~grpo_lab.scale.repeats.throughput_summary`'s), the MEASURED mean
    steps/s per v and the ratio, each with its 95 % interval."""
    paper_ratio = PAPER_ITERS_PER_SECOND[10] / PAPER_ITERS_PER_SECOND[1]
    rows = [{"v": str(v), "source": PAPER, "steps/s or ratio": ips,
             "interval": f"± {PAPER_ITERS_PER_SECOND_SPREAD[v]} (undefined)", "repeats": "not given"}
            for v, ips in PAPER_ITERS_PER_SECOND.items()]
    rows.append({"v": "10 : 1", "source": PAPER, "steps/s or ratio": paper_ratio, "interval": "not given",
                 "repeats": "not given"})
    if summary is not None:
        measured = f"{MEASURED} (8 GPUs)"
        for v, entry in summary["per_v"].items():
            rows.append({"v": v, "source": measured, "steps/s or ratio": entry["mean"],
                         "interval": f"[{entry['ci'][0]:.4g}, {entry['ci'][1]:.4g}]", "repeats": str(entry["repeats"])})
        for pair, entry in summary["ratios"].items():
            rows.append({"v": pair.replace(":", " : "), "source": measured, "steps/s or ratio": entry["ratio"],
                         "interval": f"[{entry['ci'][0]:.3f}, {entry['ci'][1]:.3f}]", "repeats": "as above"})
    return rows
