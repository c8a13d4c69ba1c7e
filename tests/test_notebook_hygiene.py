"""What a learner opens: notebooks committed without outputs, checks out of sight, the threads chosen and said,
the practitioner's page one link away, and no ``nan`` where a number has no value."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_lab.lm.recipes import RUNS_DIR_ENV, recipe
from studies.lag_frontier.side_by_side import Arm

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def hidden(cell: dict) -> bool:
    return bool(cell["metadata"].get("jupyter", {}).get("source_hidden"))


def test_there_are_notebooks_to_check():
    assert {p.name for p in NOTEBOOKS} >= {"01_bandit.ipynb", "01b_theorem1_smollm2.ipynb", "02_lag_frontier.ipynb",
                                           "03_what_v_buys.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs_or_execution_counts(path):
    code = [c for c in cells(path) if c["cell_type"] == "code"]
    assert code
    assert [c["id"] for c in code if c["outputs"]] == []
    assert [c["id"] for c in code if c["execution_count"] is not None] == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_as_the_git_filter_writes_them(path):
    """``make setup``'s filter (nbstripout, ids kept) leaves a committed notebook byte for byte as it is, so a
    notebook JupyterLab saved with outputs shows no change in git."""
    stripped = subprocess.run([sys.executable, "-m", "nbstripout", "--keep-id", "-t"], input=path.read_bytes(),
                              capture_output=True, check=True).stdout
    assert stripped == path.read_bytes()


def test_the_filter_is_named_for_notebooks():
    attributes = (ROOT / ".gitattributes").read_text().splitlines()
    assert "*.ipynb filter=nbstripout" in attributes and "*.ipynb diff=ipynb" in attributes


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_visible_cell_asserts(path):
    """A cell whose job is checking is collapsed and tagged ``check``; no visible code asserts."""
    code = [c for c in cells(path) if c["cell_type"] == "code"]
    visible = [c["id"] for c in code if not hidden(c) and "assert" in source(c)]
    assert visible == []
    checks = [c for c in code if hidden(c)]
    assert checks and all("check" in c["metadata"].get("tags", []) for c in checks)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_first_code_cell_chooses_the_threads_and_says_so(path):
    first = next(c for c in cells(path) if c["cell_type"] == "code")
    assert "print(use_threads())" in source(first)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_takeaway_links_the_practitioners_page(path):
    takeaway = next(source(c) for c in cells(path) if c["cell_type"] == "markdown" and "Takeaway" in source(c))
    assert "](../docs/choosing_v.md)" in takeaway


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_an_exercise_check_echoes_nothing(path):
    """``check`` returns which function it checked, for tests; a cell ending on it would print ``'reference'``."""
    last_lines = [source(c).rstrip().splitlines()[-1] for c in cells(path) if c["cell_type"] == "code" and c["source"]]
    assert [line for line in last_lines if line.startswith("check(") and not line.endswith(";")] == []


def test_the_notebook_runs_folder_is_the_librarys():
    conftest = (ROOT / "notebooks" / "conftest.py").read_text()
    assert f'RUNS_DIR_ENV = "{RUNS_DIR_ENV}"' in conftest


def test_a_drift_without_a_trained_step_is_undefined_with_its_reason():
    def step(lag, skipped=False):
        return SimpleNamespace(lag=lag, skipped=skipped, log_ratio_k_abs=0.1 * lag)

    base = recipe("cpu_arith_smollm2")
    lagged = Arm("v4_ratio", base.replace(v=4), history=[step(0), step(1), step(2), step(3, skipped=True)])
    on_policy = Arm("v1", base.replace(v=1), history=[step(0), step(0)])
    assert lagged.drift_text(2) == "drift at lag 2: 0.20 nats a token"
    assert lagged.drift_text(3) == ("drift at lag 3: undefined (its steps there were skipped: every group's rewards "
                                    "agreed)")
    assert on_policy.drift_text(3) == "drift at lag 3: undefined (v = 1 syncs α at every step: the lag is always 0)"
    assert lagged.drift_text(5) == "drift at lag 5: undefined (v = 4 syncs α before the lag reaches 4)"
    assert "nan" not in lagged.drift_text(3) + on_policy.drift_text(3)


def test_make_lab_opens_ignored_working_copies_and_keeps_your_edits(tmp_path):
    """``make lab`` serves lab/ (git ignores it, so a save with outputs leaves the checkout clean), beside notebooks/
    (the notebooks read ".."), copied once: a second ``make lab`` keeps an edited copy and says when the tracked one
    is newer."""
    shutil.copy(ROOT / "Makefile", tmp_path)
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks", ignore=shutil.ignore_patterns("*.py", "runs"))
    make = ["make", "-s", "-C", str(tmp_path), "lab-copies"]
    subprocess.run(make, check=True, capture_output=True, text=True)
    copies = sorted((tmp_path / "lab").glob("*.ipynb"))
    assert [c.name for c in copies] == [p.name for p in NOTEBOOKS]
    assert all(c.read_bytes() == (ROOT / "notebooks" / c.name).read_bytes() for c in copies)
    copies[0].write_text("my edits")
    (tmp_path / "notebooks" / copies[0].name).touch()        # the tracked notebook changes after the copy
    os.utime(copies[0], (1, 1))
    again = subprocess.run(make, check=True, capture_output=True, text=True)
    assert copies[0].read_text() == "my edits" and f"{copies[0].name} is newer" in again.stdout
    ignored = subprocess.run(["git", "check-ignore", "-q", "lab/01_bandit.ipynb"], cwd=ROOT)
    assert ignored.returncode == 0, "lab/ must be ignored by git"
