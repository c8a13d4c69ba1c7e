"""The API reference builds from the docstrings with warnings as errors (what ``make api`` runs), so a docstring
that reStructuredText cannot read fails the tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_api_reference_builds_without_a_warning(tmp_path):
    source = tmp_path / "api"
    shutil.copytree(ROOT / "docs" / "api", source, ignore=shutil.ignore_patterns("generated", "_build"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(source),
                             str(tmp_path / "html")], capture_output=True, text=True, env=env, timeout=1200)
    assert result.returncode == 0, result.stderr[-6000:]
    pages = {p.name for p in (tmp_path / "html" / "generated").glob("*.html")}
    # every module of the package has its page, the primitives among them
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "grpo_lab").rglob("*.py")}
    expected = {m.removesuffix(".__init__") + ".html" for m in modules}
    assert expected <= pages, sorted(expected - pages)
    assert "clipped_surrogate" in (tmp_path / "html" / "generated" / "grpo_lab.objective.html").read_text()
