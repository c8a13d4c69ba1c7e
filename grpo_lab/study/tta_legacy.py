"""Readers of the superseded time-to-accuracy summary (issue 25 §5; its units are in git history), kept only
while notebook 03 §3c still draws it: held-out Pass@1 on ``sum3``, the target read off TRL's own final mean,
crossings of the mean curves. Issue 38 replaced that statistic (:mod:`grpo_lab.study.time_to_accuracy`); once
``results/time_to_accuracy/summary.json`` holds issue 38's schema these functions do not apply to it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

LEGACY_ARMS = ("grpo_lab_v1", "grpo_lab_v8", "trl")
"""The arms of issue 25 §5's comparison."""


def is_legacy(summary: dict[str, Any]) -> bool:
    """Whether ``summary`` is issue 25 §5's (mean curves of held-out Pass@1), not issue 38's."""
    return "mean_curves" in summary and "time_ratios" not in summary


def _require_legacy(summary: dict[str, Any]) -> None:
    if not is_legacy(summary):
        raise ValueError("this summary is issue 38's (exact J, first-passage times): read it with "
                         "grpo_lab.study.time_to_accuracy.ratio_table, not the issue 25 §5 readers")


def summary_table(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """A row per arm: seeds, steps per run, Pass@1 at the budget (mean and 95 % CI over seeds, "-" with
    one seed) and the seconds to TRL's final Pass@1 on the mean curve, with the ratio to TRL's."""
    _require_legacy(summary)
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
    _require_legacy(summary)
    findings = {}
    counts = {arm: sum(r["arm"] == arm for r in summary["runs"]) for arm in LEGACY_ARMS}
    for arm in LEGACY_ARMS[:-1]:
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
