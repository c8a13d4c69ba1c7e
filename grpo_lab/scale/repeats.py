"""Throughput measured: a launch recipe's steps k per second at several v, repeated, and the ratio with its interval.

Each repeat is one launch (:func:`~grpo_lab.scale.launch.launch`, under ``accelerate launch`` when a config is
named) in a process of its own, seed = the recipe's seed + the repeat's index (every v of a round shares it),
writing ``<out>/v<v>_r<j>/throughput.json``: steps over
:class:`~grpo_lab.scale.launch.TrainingClock`'s seconds, with provenance. The rounds interleave the v's and alternate
which goes first (:func:`repeat_plan`), so a machine that drifts (heat, a neighbour's load) hits every v alike. A
repeat whose file exists is not run again: a driver stopped part-way resumes. :func:`throughput_summary` reads the
files:

=================== ==========================================================================================
per v               steps/s = steps / seconds of each repeat; their mean with a 95 % t interval
                    (:func:`~grpo_lab.stats.intervals.mean_ci`)
ratio v : v₀        exp(mean log rate_v − mean log rate_v₀), the ratio of the geometric means against the
                    smallest v, v₀; its 95 % interval is Welch's t interval of the difference of the mean log
                    rates (:func:`~grpo_lab.stats.intervals.welch_t`), mapped back by exp
=================== ==========================================================================================

The command (``--accelerate-config`` names a bundled config, ``grpo_lab/configs/accelerate/<name>.yaml``)::

    python -m grpo_lab.scale.repeats --config R --v 1 10 --repeats 3 --out DIR [--accelerate-config gpu8_zero3]
        [--set key=value] [--trl key=value]

It writes ``DIR/summary.json`` (the plan, every run's file, the summary) and prints the summary.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..checks import require_choice, require_int_at_least
from ..lm.recipes import CONFIG_DIR, load_launch_recipe, recipe_arg
from ..stats.intervals import mean_ci, t_975, welch_t
from .launch import ACCELERATE_CONFIGS, COLOCATE_RECIPES, RESULT_FILE

MIN_REPEATS = 3
"""Repeats per v: two give an interval with one degree of freedom a side; three is the least the kit accepts."""
SUMMARY_FILE = "summary.json"
COLOCATE_OUT = "runs/qwen7b_orz_colocate_repeats"
"""Where :func:`colocate_repeats_command` writes, relative to the checkout."""
SAME_MACHINE = ("world_size", "gpu_models", "cpu_model", "steps")
"""Fields every run of one summary must share: rates from different machines, sizes or lengths are not compared."""


def repeat_plan(vs: Sequence[int], repeats: int) -> list[tuple[int, int]]:
    """The launches in order, as (v, repeat): round j runs every v, in the given order for even j and reversed for
    odd j (v = 1, 10, then 10, 1, …)."""
    if len(vs) < 2 or len(set(vs)) != len(vs):
        raise ValueError(f"vs must hold at least two different values of v, got {list(vs)}")
    for v in vs:
        require_int_at_least("v", v, 1)
    require_int_at_least("repeats", repeats, MIN_REPEATS)
    return [(v, j) for j in range(repeats) for v in (vs if j % 2 == 0 else list(reversed(vs)))]


def run_dir(out: str | Path, v: int, repeat: int) -> Path:
    """Where repeat ``repeat`` at lag ``v`` writes: ``<out>/v<v>_r<repeat>``."""
    return Path(out) / f"v{v}_r{repeat}"


def repeat_command(config: str | Path, v: int, repeat: int, out: str | Path, accelerate_config: str | None = None,
                   sets: Sequence[str] = (), trl: Sequence[str] = ()) -> list[str]:
    """One repeat's launch: this interpreter running :mod:`grpo_lab.scale.launch` (under ``accelerate launch
    --config_file`` the bundled ``accelerate_config`` where one is named) on recipe ``config`` with ``sets``, then v,
    the seed (the recipe's + ``repeat``) and the output folder (:func:`run_dir`, absolute) set, no final model saved."""
    seed = load_launch_recipe(config, sets).config.seed + repeat
    launcher = [sys.executable, "-m", "grpo_lab.scale.launch"]
    if accelerate_config is not None:
        require_choice("accelerate_config", accelerate_config, ACCELERATE_CONFIGS)
        launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                    str(CONFIG_DIR / "accelerate" / f"{accelerate_config}.yaml"), "-m", "grpo_lab.scale.launch"]
    overrides = [*sets, f"v={v}", f"seed={seed}", f"output_dir={run_dir(out, v, repeat).resolve()}"]
    return [*launcher, "--config", str(config), *(w for s in overrides for w in ("--set", s)),
            *(w for s in trl for w in ("--trl", s)), "--no-final-model"]


def run_repeats(config: str | Path, vs: Sequence[int], repeats: int, out: str | Path,
                accelerate_config: str | None = None, sets: Sequence[str] = (),
                trl: Sequence[str] = ()) -> dict[str, Any]:
    """Run :func:`repeat_plan`'s launches (each :func:`repeat_command`, in a process of its own; a repeat whose
    ``throughput.json`` exists is read, not run), then write and return ``<out>/summary.json``: the plan, every
    run's result and :func:`throughput_summary`."""
    plan = repeat_plan(vs, repeats)
    results = []
    for v, j in plan:
        path = run_dir(out, v, j) / RESULT_FILE
        if not path.is_file():
            subprocess.run(repeat_command(config, v, j, out, accelerate_config, sets, trl), check=True)
        result = json.loads(path.read_text())
        if result["v"] != v:
            raise ValueError(f"{path} holds a run at v = {result['v']}, not {v}: remove it or choose another --out")
        results.append(result)
    summary = {"config": str(config), "sets": list(sets), "trl": list(trl), "accelerate_config": accelerate_config,
               "plan": plan, "runs": results, "summary": throughput_summary(results)}
    (Path(out) / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
    return summary


def throughput_summary(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per v, each repeat's steps/s (steps / seconds, from the files' two fields) and their mean with its 95 % t
    interval; per v above the smallest v₀, the ratio v : v₀ of the geometric means with its 95 % Welch t interval
    (the module docstring). Runs must share :data:`SAME_MACHINE`, and each v needs 2 repeats or more."""
    if not results:
        raise ValueError("results is empty: run the repeats first")
    for key in SAME_MACHINE:
        values = {json.dumps(r.get(key)) for r in results}
        if len(values) > 1:
            raise ValueError(f"the runs differ in {key} ({sorted(values)}): their rates are not comparable")
    rates: dict[int, list[float]] = {}
    for r in results:
        if not r["seconds"] > 0:
            raise ValueError(f"a run at v = {r['v']} has seconds = {r['seconds']!r}: a rate needs seconds > 0")
        rates.setdefault(int(r["v"]), []).append(r["steps"] / r["seconds"])
    for v, values in rates.items():
        if len(values) < 2:
            raise ValueError(f"v = {v} has {len(values)} repeat: an interval needs at least 2")
    per_v = {}
    for v, values in sorted(rates.items()):
        mean, half = mean_ci(values)
        per_v[str(v)] = {"repeats": len(values), "steps_per_second": values, "mean": float(mean),
                         "ci": [float(mean - half), float(mean + half)]}
    base = min(rates)
    ratios = {}
    for v in sorted(rates)[1:]:
        d, se, df = (x.item() for x in welch_t(np.log(rates[v]), np.log(rates[base])))
        half = t_975(df) * se
        ratios[f"{v}:{base}"] = {"ratio": float(np.exp(d)), "ci": [float(np.exp(d - half)), float(np.exp(d + half))],
                                 "log_se": float(se), "df": int(df)}
    return {"per_v": per_v, "ratios": ratios}


def colocate_repeats_command(repeats: int = MIN_REPEATS) -> list[str]:
    """The paper's 7B colocate throughput, measured (notebook 03's GPU section): recipe ``qwen7b_orz_colocate_v1``
    at v = 1 and v = 10, ``repeats`` launches each, DeepSpeed ZeRO-3 on 8 GPUs, into :data:`COLOCATE_OUT`. Paths
    are relative to the checkout: run it there."""
    require_int_at_least("repeats", repeats, MIN_REPEATS)
    return [sys.executable, "-m", "grpo_lab.scale.repeats", "--config", recipe_arg(COLOCATE_RECIPES[1]),
            "--v", *map(str, COLOCATE_RECIPES), "--repeats", str(repeats), "--accelerate-config", "gpu8_zero3",
            "--out", COLOCATE_OUT]


def read_summary(out: str | Path) -> dict[str, Any] | None:
    """``<out>/summary.json`` of :func:`run_repeats`, or None where the driver has not finished there."""
    path = Path(out) / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def summary_lines(summary: Mapping[str, Any]) -> list[str]:
    """:func:`throughput_summary`'s numbers as lines of text."""
    lines = [f"v = {v}: {e['mean']:.4g} steps/s [{e['ci'][0]:.4g}, {e['ci'][1]:.4g}] over {e['repeats']} repeats"
             for v, e in summary["per_v"].items()]
    lines += [f"v {pair.replace(':', ' : v ')}: {e['ratio']:.3f}x [{e['ci'][0]:.3f}, {e['ci'][1]:.3f}] (95 %, "
              f"{e['df']} df)" for pair, e in summary["ratios"].items()]
    return lines


def argument_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m grpo_lab.scale.repeats``."""
    parser = argparse.ArgumentParser(prog="python -m grpo_lab.scale.repeats",
                                     description="Time a launch recipe at several v, repeated, interleaved.")
    parser.add_argument("--config", required=True, help="launch recipe YAML (grpo_lab/configs/*.yaml)")
    parser.add_argument("--v", type=int, nargs="+", required=True, help="the lags to time (at least two)")
    parser.add_argument("--repeats", type=int, default=MIN_REPEATS, help=f"launches per v (at least {MIN_REPEATS})")
    parser.add_argument("--out", required=True, help="folder of the runs and summary.json")
    parser.add_argument("--accelerate-config", choices=ACCELERATE_CONFIGS, help="launch under accelerate with "
                        "this bundled config (without: one process)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a recipe field")
    parser.add_argument("--trl", action="append", default=[], metavar="KEY=VALUE", help="set a TRL config field")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = argument_parser().parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    summary = run_repeats(args.config, args.v, args.repeats, args.out, args.accelerate_config, args.set, args.trl)
    print("\n".join(summary_lines(summary["summary"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
