"""What a lag of v buys in wall-clock time (notebook 03): measure, fit, predict, launch at scale.

=============== ===================================================================
measure (CPU)   the (v, i) loop on SmolLM2 at v = 1, v = 4 and with the adaptive
                schedule: sample / train / sync seconds of every step (MEASURED here)
fit, predict    step(v) = gen + train + sync / v from the v = 1 records
                (:func:`~grpo_lab.costmodel.fit_from_records`), checked against the
                step time measured at v = 4
paper           the same model fitted to the 7B colocate run (0.02828 vs 0.03828
                iter/s, PAPER): predicted speed-up against v and against model size
launch (GPUs)   ``accelerate launch ... -m grpo_lab.throughput --config R``: a recipe
                trained by :class:`~grpo_lab.trl.OffPolicyGRPOTrainer` (vLLM colocate
                for the 7B runs); writes iter/s and the final reward to ``throughput.json``
=============== ===================================================================
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import plotly.graph_objects as go
import yaml

from .checks import require_choice, require_int_at_least, require_number_in
from .costmodel import (
    PAPER_ITERS_PER_SECOND,
    PAPER_PARAMS_7B,
    StepCostModel,
    paper_cost_model,
    paper_effective_bandwidth_gb_s,
    sync_seconds_for,
)
from .experiment import CONFIG_DIR, TrainConfig, build_loop, recipe
from .loop import StepRecord
from .tasks import ANSWER_INSTRUCTIONS, GYM_TASKS, Problem, load_problems
from .viz.display import new_figure

if TYPE_CHECKING:
    from .trl import OffPolicyGRPOConfig

MEASURED, PAPER = "MEASURED here", "PAPER"
ROOT = CONFIG_DIR.parent
WARMUP_STEPS = 1
"""Steps left out of every timing: step 0 pays one-off costs (first generate call, allocations)."""
ADAPTIVE_THRESHOLD = 0.3
"""Drift (mean |log π_k − log α|) above which the adaptive run syncs at the next step. SmolLM2 at
lr 1e-5 drifts ≈ 0.12 per optimiser step (measured: 0.12 at lag 1, 0.24 at lag 2), so this syncs about
every 4 steps while the policy moves, and waits longer (up to its v) while steps are skipped."""
PAPER_FINAL_REWARD = 0.50
PAPER_ITERS_PER_SECOND_STD = {1: 0.017, 10: 0.016}
COLOCATE_RECIPES = {1: "qwen7b_orz_colocate_v1", 10: "qwen7b_orz_colocate_v10"}
ACCELERATE_ZERO3 = "configs/accelerate/gpu8_zero3.yaml"
RESULT_FILE = "throughput.json"
ORZ_SOURCE = "orz_math_57k"
MODEL_SIZES = {"0.5B": 0.49e9, "1.5B": 1.54e9, "7B": PAPER_PARAMS_7B, "14B": 14.7e9, "32B": 32.5e9, "72B": 72.7e9}
"""Parameter counts N of the Qwen2.5 family (model cards), for the size sweep."""


# ----------------------------------------------------------------------------- measure (reduced / smoke)

def throughput_configs(mode: str) -> dict[str, TrainConfig]:
    """Notebook 03's CPU runs of ``configs/cpu_arith_smollm2.yaml``: fixed v = 1, fixed v = 4 and the
    adaptive schedule (``v`` = its longest lag). Steps = warm-up + a multiple of 4 (and of 1), so each
    fixed run's timed window holds whole sync periods. ``smoke`` shrinks every size."""
    require_choice("mode", mode, ("smoke", "reduced", "full"))
    if mode == "smoke":
        size, max_lag = dict(G=3, prompts_per_step=2, max_completion_length=4, micro_batch_size=6,
                             steps=WARMUP_STEPS + 4), 3
    else:
        size, max_lag = dict(steps=WARMUP_STEPS + 24), 8
    return {"v=1": recipe("cpu_arith_smollm2", v=1, **size),
            "v=4": recipe("cpu_arith_smollm2", v=4, **size),
            f"adaptive v≤{max_lag}": recipe("cpu_arith_smollm2", sync="adaptive", v=max_lag,
                                            sync_threshold=ADAPTIVE_THRESHOLD, **size)}


def measure(configs: Mapping[str, TrainConfig], progress: bool = True) -> dict[str, list[StepRecord]]:
    """Each config's records, from a fresh loop run for ``config.steps`` steps (nothing written to disk)."""
    from tqdm.auto import tqdm

    runs = {}
    for name, config in configs.items():
        loop = build_loop(config)
        runs[name] = list(tqdm(loop.run(), total=config.steps, desc=name, disable=not progress))
    return runs


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


# ----------------------------------------------------------------------------- figures

def step_time_figure(runs: Mapping[str, Sequence[StepRecord]], model: StepCostModel) -> go.Figure:
    """MEASURED mean seconds per step, split into sample / train / sync, beside the step time the
    v = 1 fit predicts at each run's effective v."""
    names, windows = list(runs), [timed(r) for r in runs.values()]
    fig = new_figure(barmode="stack", height=380, yaxis_title="seconds per step",
                     title=f"{MEASURED}: mean step time after {WARMUP_STEPS} warm-up step (shared machine: noisy)")
    for key, label in (("sample_seconds", "sample (gen)"), ("train_seconds", "train"), ("sync_seconds", "sync")):
        fig.add_bar(x=names, y=[np.mean([getattr(r, key) for r in w]) for w in windows], name=f"{label}, {MEASURED}")
    fig.add_scatter(x=names, y=[float(model.step_seconds(effective_v(w))) for w in windows], mode="markers",
                    marker=dict(symbol="diamond", size=12, color="black"), name="predicted from the v=1 fit")
    return fig


def speedup_v_figure(measured: StepCostModel, runs: Mapping[str, Sequence[StepRecord]], base: str = "v=1",
                     max_v: int = 32) -> go.Figure:
    """Predicted speed-up step(1)/step(v) for v = 1..max_v: the PAPER 7B model and the model fitted
    here, with the measured points: the paper's v = 10 and, per run, step(base) / step(run) at the
    run's steps per sync."""
    vs, paper = np.arange(1, max_v + 1), paper_cost_model()
    fig = new_figure(height=380, xaxis_title="v (steps per sync)", yaxis_title="speed-up step(1) / step(v)",
                     title="What a lag of v buys: step(v) = gen + train + sync / v")
    fig.add_scatter(x=vs, y=paper.speedup(vs), name=f"{PAPER} 7B colocate model (sync {paper.sync:.1f} s)")
    fig.add_scatter(x=vs, y=measured.speedup(vs), name=f"fit to {base}, {MEASURED} (sync {measured.sync:.2g} s)")
    fig.add_scatter(x=[10], y=[PAPER_ITERS_PER_SECOND[10] / PAPER_ITERS_PER_SECOND[1]], mode="markers",
                    marker=dict(size=11), name=f"{PAPER} measured, v=10")
    one = step_seconds(timed(runs[base]))
    windows = {name: timed(records) for name, records in runs.items()}
    fig.add_scatter(x=[effective_v(w) for w in windows.values()], y=[one / step_seconds(w) for w in windows.values()],
                    text=list(windows), mode="markers", marker=dict(size=11, symbol="x"),
                    name=f"{MEASURED}: step({base}) / step(run)")
    return fig


def speedup_size_figure(v: int, fixed_shares: Sequence[float]) -> go.Figure:
    """Predicted speed-up at lag v against model size, one line per assumption (see :func:`size_model`)."""
    fig = new_figure(height=380, xaxis_title="parameters N", xaxis_type="log", yaxis_title=f"speed-up at v={v}",
                     title=f"{PAPER}-anchored prediction against model size (sync at "
                           f"{paper_effective_bandwidth_gb_s():.2f} GB/s, bf16)")
    for share, speedups in size_speedups(v, fixed_shares).items():
        fig.add_scatter(x=list(MODEL_SIZES.values()), y=speedups, text=list(MODEL_SIZES), mode="lines+markers+text",
                        textposition="top center", name=f"gen+train: {share:.0%} fixed per step, rest ∝ N")
    return fig


# ----------------------------------------------------------------------------- full mode: 8 GPUs, TRL colocate

def colocate_command(v: int) -> list[str]:
    """The 8-GPU launch of the paper's throughput run at lag v (run it from the repository root):
    ``accelerate launch`` with this interpreter, so the kernel's environment is the one launched."""
    require_choice("v", v, COLOCATE_RECIPES)
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", ACCELERATE_ZERO3,
            "-m", "grpo_lab.throughput", "--config", f"configs/{COLOCATE_RECIPES[v]}.yaml"]


def colocate_table(results: Mapping[int, Mapping[str, float] | None]) -> list[dict[str, Any]]:
    """The PAPER's iter/s and final reward per v, and the MEASURED ones where a run wrote them."""
    rows = []
    for v, ips in PAPER_ITERS_PER_SECOND.items():
        rows.append({"v": v, "source": PAPER, "iter/s": ips, "± std": PAPER_ITERS_PER_SECOND_STD[v],
                     "final reward": PAPER_FINAL_REWARD})
        if results.get(v):
            rows.append({"v": v, "source": "MEASURED (8 GPUs)", "iter/s": results[v]["iters_per_second"],
                         "± std": float("nan"), "final reward": results[v]["final_reward"]})
    return rows


def read_result(v: int) -> dict[str, float] | None:
    """``throughput.json`` of the colocate run at lag v, or None if it has not run."""
    launch_recipe = load_launch_recipe(CONFIG_DIR / f"{COLOCATE_RECIPES[v]}.yaml")
    path = ROOT / launch_recipe.config.output_dir / RESULT_FILE
    return json.loads(path.read_text()) if path.is_file() else None


@dataclass(frozen=True)
class LaunchRecipe:
    """What ``python -m grpo_lab.throughput`` runs.

    ================== =================================================================
    ``config``         the TrainConfig fields of the YAML (a ``configs/*.yaml`` recipe)
    ``trl``            its ``trl:`` mapping: extra :class:`~grpo_lab.trl.OffPolicyGRPOConfig`
                       fields (vLLM mode, tensor parallelism, memory share)
    ``orz_data_files`` its ``orz_data_files:`` path: orz-math-57k's JSON, which then
                       replaces ``config.task`` as the training problems (:func:`load_orz`)
    ================== =================================================================
    """

    config: TrainConfig
    trl: dict[str, Any] = field(default_factory=dict)
    orz_data_files: str | None = None


def load_launch_recipe(path: str | Path, overrides: Sequence[str] = (),
                       trl_overrides: Sequence[str] = ()) -> LaunchRecipe:
    """A :class:`LaunchRecipe` from YAML; ``key=value`` overrides (YAML values) of the recipe's
    fields (``orz_data_files`` included) and of its ``trl:`` fields."""
    values = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(values, dict):
        raise ValueError(f"recipe {str(path)!r} must hold a mapping of TrainConfig fields")
    extras = dict(values.pop("trl", None) or {})
    for target, items in ((values, overrides), (extras, trl_overrides)):
        for item in items:
            key, sep, raw = item.partition("=")
            if not sep or not key:
                raise ValueError(f"an override takes key=value, got {item!r}")
            target[key.strip()] = yaml.safe_load(raw)
    orz = values.pop("orz_data_files", None)
    return LaunchRecipe(TrainConfig().replace(**values), extras, None if orz is None else str(orz))


def trl_args(config: TrainConfig, extras: Mapping[str, Any], num_processes: int) -> OffPolicyGRPOConfig:
    """The :class:`~grpo_lab.trl.OffPolicyGRPOConfig` of a recipe: SPEC names mapped to TRL's
    (G → num_generations, v → vllm_sync_interval, i → num_iterations, ε → epsilon, …), one step k =
    P·G completions over all processes, constant learning rate, then ``extras`` on top."""
    from .trl import OffPolicyGRPOConfig

    if config.sync != "fixed":
        raise ValueError(f"sync = {config.sync!r}: the TRL adapter syncs every v steps; use sync='fixed'")
    require_choice("kl_kind", config.kl_kind, ("k3",))  # TRL's estimator
    rows = config.prompts_per_step * config.G
    micro = config.micro_batch_size or max(rows // num_processes, 1)
    if rows % (micro * num_processes):
        raise ValueError(f"prompts_per_step·G = {rows} must be a multiple of micro_batch_size·processes = "
                         f"{micro}·{num_processes}")
    accumulation = rows // (micro * num_processes)
    values = dict(
        output_dir=config.output_dir, num_generations=config.G, per_device_train_batch_size=micro,
        gradient_accumulation_steps=accumulation, steps_per_generation=accumulation, vllm_sync_interval=config.v,
        num_iterations=config.i, epsilon=config.eps_low, epsilon_high=config.eps_high, clip_band=config.band,
        beta=config.beta, use_bias_correction_kl=config.kl_importance_weighted, sync_ref_model=config.ref_period > 0,
        ref_model_sync_steps=max(config.ref_period, 1) * config.i, eps_std=config.eps_std,
        unbiased_std=config.unbiased_std, eps_placement=config.eps_placement,
        zero_variance_mask=config.mask_zero_variance, loss_type=config.loss_type,
        importance_sampling_level=config.level, learning_rate=config.lr, lr_scheduler_type="constant",
        optim="sgd" if config.optimizer == "sgd" else "adamw_torch", weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm or 0.0, max_completion_length=config.max_completion_length,
        temperature=config.temperature, max_steps=config.steps * config.i, seed=config.seed,
        bf16=config.dtype == "bfloat16", fp16=config.dtype == "float16", use_cpu=config.device == "cpu",
        logging_steps=1, save_strategy="steps" if config.checkpoint_every else "no",
        save_steps=max(config.checkpoint_every, 1) * config.i, report_to=list(config.report_to) or "none")
    return OffPolicyGRPOConfig(**{**values, **extras})


def load_orz(path: str | Path, limit: int | None = None) -> list[Problem]:
    """orz-math-57k (Open-Reasoner-Zero's ``data/orz_math_57k_collected.json``): a JSON list of
    ``[{"from": "human", "value": question}, {"from": "assistant", "ground_truth": {"value": answer}}]``;
    ``limit`` keeps the first rows."""
    rows = json.loads(Path(path).read_text())
    problems = [Problem(question=q["value"], answer=str(a["ground_truth"]["value"]).strip(),
                        source=f"{ORZ_SOURCE}:{i}") for i, (q, a) in enumerate(rows[:limit])]
    if not problems:
        raise ValueError(f"{str(path)!r} holds no problems")
    return problems


def training_dataset(launch_recipe: LaunchRecipe) -> Any:
    """The training problems as TRL rows: ``prompt`` (chat messages: the user message of
    :func:`~grpo_lab.tasks.build_prompt`), ``answer`` and ``answer_format`` for the reward."""
    from datasets import Dataset

    config = launch_recipe.config
    if launch_recipe.orz_data_files is not None:
        problems = load_orz(launch_recipe.orz_data_files, config.train_problems)
    elif config.task in GYM_TASKS:
        problems = load_problems(config.task, config.train_problems, seed=config.seed)
    else:
        problems = load_problems(config.task, config.train_problems, split=config.train_split,
                                 data_files=config.data_files)
    system = [{"role": "system", "content": config.system_prompt}] if config.system_prompt else []
    return Dataset.from_list([{"prompt": [*system, {"role": "user", "content": f"{p.question}\n"
                                          f"{ANSWER_INSTRUCTIONS[p.answer_format]}"}],
                               "answer": p.answer, "answer_format": p.answer_format} for p in problems])


def verifiable_reward(format_weight: float = 0.0) -> Any:
    """TRL reward function: :func:`~grpo_lab.rewards.answer_reward` of each completion, in [0, 1]."""
    from .rewards import answer_reward

    def answer_correct(completions: list, answer: list[str], answer_format: list[str], **kwargs: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [answer_reward(t, a, f, format_weight) for t, a, f in zip(texts, answer, answer_format, strict=True)]

    return answer_correct


def launch(launch_recipe: LaunchRecipe) -> dict[str, float]:
    """Train a recipe with the TRL adapter on this process group; the main process writes
    ``<output_dir>/throughput.json`` (iter/s = steps k per second, final reward, syncs)."""
    from accelerate import PartialState

    from .models import BUNDLED, bundled_model_dir
    from .trl import OffPolicyGRPOTrainer

    config = launch_recipe.config
    model = str(bundled_model_dir(config.model)) if config.model in BUNDLED else config.model
    trainer = OffPolicyGRPOTrainer(model=model, reward_funcs=verifiable_reward(config.format_weight),
                                   args=trl_args(config, launch_recipe.trl, PartialState().num_processes),
                                   train_dataset=training_dataset(launch_recipe))
    output = trainer.train()
    rewards = [row["reward"] for row in trainer.state.log_history if "reward" in row]
    tail = rewards[-max(len(rewards) // 10, 1):]
    result = {"v": config.v, "steps": trainer.state.global_step // config.i,
              "iters_per_second": output.metrics["train_steps_per_second"] / config.i,
              "train_seconds": output.metrics["train_runtime"], "final_reward": float(np.mean(tail)),
              "syncs": len(trainer.sync_steps)}
    trainer.save_model(str(Path(config.output_dir) / "final"))
    if trainer.accelerator.is_main_process:
        (Path(config.output_dir) / RESULT_FILE).write_text(json.dumps(result, indent=2))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_lab.throughput",
                                     description="Train a recipe with the TRL adapter (under accelerate launch).")
    parser.add_argument("--config", required=True, help="recipe YAML: TrainConfig fields, optional trl: mapping "
                        "and orz_data_files: path")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe field")
    parser.add_argument("--trl", action="append", default=[], metavar="KEY=VALUE", help="set a TRL config field")
    args = parser.parse_args(argv)
    print(json.dumps(launch(load_launch_recipe(args.config, args.set, args.trl))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
