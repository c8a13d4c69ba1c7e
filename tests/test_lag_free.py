"""When is lag free: the committed design file is what the design's code computes (margin, spread, sizing, power),
every unit descends from the commit that fixed its part, the decision rule is the one the power simulation
simulates, and the summary reads a look only when it is due."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from studies.lag_decided.summary import load
from studies.lag_free import design
from studies.lag_free.summary import UNITS, is_open, rebuild_summary

ROOT = Path(__file__).resolve().parents[1]
DESIGN = design.HERE / "design.json"


def test_the_committed_design_file_is_the_design():
    """Every number of design.json (margin, paired SD, n_max, boundaries, power table) recomputed by its code."""
    record = design.design_record()
    assert json.loads(DESIGN.read_text()) == json.loads(json.dumps(record))
    confirmatory = record["confirmatory"]
    assert confirmatory["margin"]["computed"] == design.MARGIN == 0.032
    assert confirmatory["sizing"]["n_max"] == design.N_MAX == len(design.SEEDS)
    assert round(confirmatory["paired_sd"], 3) == 0.040
    assert design.PLAN.looks == (8, 12, 16)


def test_the_seeds_are_fresh():
    """No unit of another study, nor of the decided study's second regime, used part 1's seeds."""
    mine = {design.HERE / folder for folder in UNITS.values()}
    used = {u["seed"] for folder in (ROOT / "studies").rglob("units*") if folder.is_dir() and folder not in mine
            for u in load(folder).values()}
    assert used and not used & set(design.SEEDS)


# ----------------------------------------------------------------------------- the commit order


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def design_commit(part: str) -> str | None:
    """The oldest commit since which design.json's record of ``part`` has been what it is now (None if the file's
    record differs from every commit's): the commit that fixed the part."""
    path = DESIGN.relative_to(ROOT).as_posix()
    now = json.loads(DESIGN.read_text())[part]
    fixed = None
    for commit in git("log", "--format=%H", "--", path).stdout.split():
        shown = git("show", f"{commit}:{path}")
        if shown.returncode or json.loads(shown.stdout).get(part) != now:
            break
        fixed = commit
    return fixed


def early_units(part: str, units: dict[tuple[str, int], dict[str, Any]]) -> list[str]:
    """The units of ``part`` that did not run from a clean tree at or after the part's design commit, or that ran
    an arm, lr or seed the design does not name, each as "arm seed: why"."""
    fixed = design_commit(part)
    record = json.loads(DESIGN.read_text())[part]
    arms = record.get("arms") or {record.get("arm"): {**record.get("fields", {}), "sync_threshold": record.get(
        "budget")}}
    problems = []
    for (arm, seed), unit in units.items():
        why = []
        if fixed is None or git("merge-base", "--is-ancestor", fixed, unit["git_commit"]).returncode != 0:
            why.append(f"commit {unit['git_commit'][:10]} is not at or after the design commit {fixed}")
        if unit["tree_dirty"]:
            why.append("the tree had changes")
        if arm not in arms or seed not in record["seeds"] or unit["lr"] != record["lr"] or \
                any(unit.get(k) != v for k, v in arms.get(arm, {}).items()):
            why.append("not an arm, seed or lr of the design")
        if why:
            problems.append(f"{arm} {seed}: {'; '.join(why)}")
    return problems


@pytest.mark.parametrize("part", list(UNITS))
def test_every_unit_descends_from_its_parts_design_commit(part):
    units = load(design.HERE / UNITS[part])
    assert early_units(part, units) == []
    if units:
        assert design_commit(part) is not None


def test_units_paired_by_seed_ran_on_one_cpu_model():
    """Parts 1 and 2 pair units by seed: every unit at a seed ran on the same CPU model and vector extensions (a
    seed's trajectory is only comparable on the same kernels)."""
    units = load(design.HERE / UNITS["confirmatory"]) | load(design.HERE / UNITS["drift"])
    cpus: dict[int, set] = {}
    for (_, seed), unit in units.items():
        cpus.setdefault(seed, set()).add((unit["cpu_model"], tuple(unit["cpu_vector"])))
    assert {seed: found for seed, found in cpus.items() if len(found) > 1} == {}


def test_a_unit_from_before_the_design_is_caught():
    """A made-up unit that ran at the parent of part 1's design commit (or from a dirty tree, or at another lr)
    is flagged; one at the design commit itself is not."""
    fixed = design_commit("confirmatory")
    assert fixed is not None, "design.json's part 1 is not committed"
    before = git("rev-parse", f"{fixed}^").stdout.strip()
    good = {"git_commit": fixed, "tree_dirty": False, "lr": design.LR, "v": 10, "is_correction": "ratio"}
    assert early_units("confirmatory", {("v10_ratio", 300): good}) == []
    problems = early_units("confirmatory", {("v10_ratio", 300): good | {"git_commit": before},
                                            ("v1", 301): good | {"v": 1, "tree_dirty": True},
                                            ("v10_ratio", 302): good | {"lr": 1e-5}})
    assert [p.split(":")[0] for p in problems] == ["v10_ratio 300", "v1 301", "v10_ratio 302"]
    assert "not at or after the design commit" in problems[0] and "changes" in problems[1] and "lr" in problems[2]


# ----------------------------------------------------------------------------- the decision rule


def test_decide_agrees_with_the_power_simulation():
    from studies.lag_decided.design import simulate

    rng = np.random.default_rng(3)
    x = -0.01 + 0.04 * rng.standard_normal((80, design.N_MAX))
    sim = simulate(x, "C1", design.PLAN, design.MARGIN, design.ALPHA)
    for row in range(80):
        verdict = design.decide(x[row].tolist())
        assert (verdict.differs, verdict.equivalent) == (sim["differs"][row], sim["equivalent"][row])
        assert verdict.look is None or design.PLAN.looks[verdict.look] == sim["seeds"][row]
    assert 0 < sim["equivalent"].sum() < 80 and 0 < sim["open"].sum()


def test_tost_interval_inside_the_margin_is_equivalence():
    rng = np.random.default_rng(4)
    for _ in range(40):
        diffs = (0.03 * rng.standard_normal(8)).tolist()
        low, high = design.tost_interval(diffs, 0)
        verdict = design.decide(diffs)
        assert verdict.equivalent == (-design.MARGIN < low and high < design.MARGIN)


# ----------------------------------------------------------------------------- the summary


def _unit(arm: str, seed: int, j_auc: float, drift: float = 0.1) -> dict:
    per_question = {str(k): [j_auc] * 363 for k in (0, 32, 64, 96, 128)}
    records = [{"skipped": False, "lag": lag, "log_ratio_k_abs": drift * lag, "synced": lag == 0}
               for lag in range(design.arm_fields(arm)["v"])]
    return {"arm": arm, "seed": seed, "j_auc": j_auc, "j_final": j_auc, "j_curve": {k: j_auc for k in per_question},
            "j_per_question": per_question, "records": records}


def _write(folder: Path, arm: str, seed: int, j_auc: float, drift: float = 0.1) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"{arm}_s{seed}.json").write_text(json.dumps(_unit(arm, seed, j_auc, drift)))


def test_the_summary_reads_a_look_only_when_it_is_due(tmp_path):
    """No units, no verdict; 7 pairs and a lone v1 at the 8th, still none; the 8th pair brings the first look, and
    further seeds short of the second look change nothing. Part 2 waits for all its units and for the first look;
    part 3's budget waits for part 1 to stop or end."""
    units = tmp_path / UNITS["confirmatory"]
    empty = rebuild_summary(tmp_path, write=False)
    assert empty["confirmatory"]["verdict"] is None and empty["confirmatory"]["arms"] == {}
    assert empty["budget"] is None and empty["drift"]["arms"] == {}
    spread = [0.06, -0.05, 0.07, -0.04, 0.05, -0.06, 0.02, -0.05, 0.09, -0.08, 0.01]   # open at 8 seeds
    for i, seed in enumerate(design.SEEDS[:7]):
        _write(units, "v1", seed, 0.40)
        _write(units, "v10_ratio", seed, 0.40 + spread[i])
    _write(units, "v1", design.SEEDS[7], 0.40)
    for arm in design.DRIFT_ARMS:
        for seed in design.DRIFT_SEEDS:
            _write(tmp_path / UNITS["drift"], arm, seed, 0.38)
    pending = rebuild_summary(tmp_path, write=False)
    assert pending["confirmatory"]["verdict"] is None and pending["confirmatory"]["seeds_in"] == 7
    assert pending["drift"]["arms"] == {}   # its v1 pairs are in, but part 1's first look is not due
    _write(units, "v10_ratio", design.SEEDS[7], 0.40 + spread[7])
    first = rebuild_summary(tmp_path, write=False)["confirmatory"]
    assert first["looks_reached"] == [8] and first["verdict"] == "not resolved" and first["seeds"] == \
        list(design.SEEDS[:8])
    diffs = spread[:8]
    assert first["estimate"] == pytest.approx(np.mean(diffs))
    for i, seed in enumerate(design.SEEDS[8:11]):
        _write(units, "v1", seed, 0.40)
        _write(units, "v10_ratio", seed, 0.40 + spread[8 + i])
    later = rebuild_summary(tmp_path, write=False)
    assert later["confirmatory"]["looks_reached"] == [8] and later["confirmatory"]["estimate"] == first["estimate"]
    assert later["drift"]["differences"]["v20_ratio - v1"]["mean"] == pytest.approx(-0.02)
    assert later["budget"] is None and is_open(tmp_path)


def test_part_1_runs_no_seed_after_it_stops(tmp_path):
    """Eight pairs a hair apart are equivalent at the first look: the runner's queue for part 1 is then empty,
    and the budget reads part 1's v10_ratio (the only free arm: part 2's arms cost too much)."""
    from studies.lag_free.run import queue

    rng = np.random.default_rng(5)
    units = tmp_path / UNITS["confirmatory"]
    for seed in design.SEEDS[:8]:
        _write(units, "v1", seed, 0.40)
        _write(units, "v10_ratio", seed, 0.40 + 0.002 * rng.standard_normal(), drift=0.03)
    summary = rebuild_summary(tmp_path, write=False)
    assert summary["confirmatory"]["verdict"] == "equivalent" and summary["confirmatory"]["stopped_at_seeds"] == 8
    assert list(queue("confirmatory", tmp_path)) == [] and not is_open(tmp_path)
    assert summary["budget"] is None   # part 2 not in
    for arm in design.DRIFT_ARMS:
        for seed in design.DRIFT_SEEDS:
            _write(tmp_path / UNITS["drift"], arm, seed, 0.30)
    budget = rebuild_summary(tmp_path, write=False)["budget"]
    assert budget == {"free": ["v10_ratio"], "shown_free": True, "value": round(0.03 * 9, 3)}


def test_the_budget_is_the_largest_free_arms_last_lag_drift():
    units = {(arm, s): _unit(arm, s, 0.4, drift) for arm, drift in (("v10_ratio", 0.03), ("v20_ratio", 0.02),
                                                                    ("v40_ratio", 0.01)) for s in (1, 2)}
    seeds = {arm: (1, 2) for arm in ("v10_ratio", "v20_ratio", "v40_ratio")}
    assert design.drift_budget(units, ["v10_ratio", "v20_ratio"], seeds) == round(0.02 * 19, 3)
    assert design.drift_budget(units, [], seeds) == round(0.03 * 9, 3)   # none free: v10_ratio's all the same


def test_part_3_waits_for_its_budget(tmp_path):
    from studies.lag_free.run import queue

    if design.DRIFT_BUDGET is None:
        with pytest.raises(ValueError, match="drift budget is not fixed"):
            list(queue("adaptive", tmp_path))
    else:
        assert [u[:2] for u in queue("adaptive", tmp_path)] == [(design.ADAPTIVE_ARM, s)
                                                                for s in design.ADAPTIVE_SEEDS]


def test_both_runners_take_the_units_options_from_one_place(tmp_path):
    """``--units``, ``--threads``, ``--out`` and ``--summary`` mean the same in this study's command and the decided
    study's, whose runner both use."""
    from studies.lag_decided.run import arguments as decided_arguments
    from studies.lag_free.run import arguments

    argv = ["--units", "3", "--threads", "2", "--out", str(tmp_path), "--summary"]
    for parser in (arguments(), decided_arguments()):
        args = parser.parse_args(argv)
        assert (args.units, args.threads, args.out, args.summary) == (3, 2, tmp_path, True)
    assert arguments().parse_args([]).out == ROOT / "studies" / "lag_free"
    assert arguments().parse_args(["--part", "drift"]).part == "drift"
