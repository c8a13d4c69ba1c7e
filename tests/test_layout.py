"""The package's layout: the README's map and grpo_lab/__init__.py's each name every module, and every module
they name exists; the wheel holds grpo_lab alone; the import graph has no circle and no back arrow; the recipes
ship with the package and results/ is found, or named as missing, outside an editable checkout."""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from grpo_lab.files import results_path
from grpo_lab.lm.recipes import CONFIG_DIR, recipe_path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "grpo_lab"


def test_readme_map_names_every_module():
    section = ROOT.joinpath("README.md").read_text().split("## Where things are", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(grpo_lab/[\w/]+\.py)`", section))
    modules = {str(p.relative_to(ROOT)) for p in ROOT.joinpath("grpo_lab").rglob("*.py") if p.name != "__init__.py"}
    assert modules - named == set(), f"modules missing from the README's map: {sorted(modules - named)}"
    assert named - modules == set(), f"the README's map names modules that do not exist: {sorted(named - modules)}"


def package_map(docstring: str) -> dict[str, set[str]]:
    """The modules the map in ``grpo_lab/__init__.py``'s docstring names: ``""`` → the top-level modules (each
    row's ``name``), a subpackage → the ``module`` names of its row (``exact/`` and the lines below it). Only
    names of word characters count (``make demo``, ``grpo-lab`` are not modules)."""
    table = docstring.split("\n=")[1].split("\n=")[0]       # between the table's first two border lines
    named: dict[str, set[str]] = {}
    package = ""
    for line in table.splitlines()[1:]:
        names = re.findall(r"``([^`]+)``", line)
        if not line.startswith(" "):                           # a row's first line: its key
            key = names.pop(0)
            package = key.rstrip("/") if key.endswith("/") else ""
            named.setdefault(package, set())
            if not package:
                named[""].add(key)
        named[package] |= {name for name in names if re.fullmatch(r"\w+", name)}
    return named


def test_the_package_map_names_every_module():
    """``grpo_lab/__init__.py``'s map names every module, and every name in it is a module."""
    import grpo_lab

    found = {"": {p.stem for p in ROOT.joinpath(PACKAGE).glob("*.py") if p.name != "__init__.py"}}
    for init in ROOT.joinpath(PACKAGE).glob("*/__init__.py"):
        found[init.parent.name] = {p.stem for p in init.parent.rglob("*.py") if p.name != "__init__.py"}
    named = package_map(grpo_lab.__doc__)
    assert len(found) >= 6 and sum(map(len, found.values())) >= 50
    for package in sorted(found.keys() | named.keys()):
        where = f"grpo_lab/{package}/" if package else "grpo_lab/"
        missing, stale = found.get(package, set()) - named.get(package, set()), named.get(package, set()) - found.get(
            package, set())
        assert not missing, f"modules of {where} missing from grpo_lab/__init__.py's map: {sorted(missing)}"
        assert not stale, f"grpo_lab/__init__.py's map names {where} modules that do not exist: {sorted(stale)}"


def test_the_map_reader_finds_rows_and_continuations():
    doc = ("Intro ``not_a_row``.\n\n=== ===\n``loop``  the loop\n``lm/``  ``policy`` and\n"
           "         ``sampling``, ``make demo``\n=== ===\n``after`` the table")
    assert package_map(doc) == {"": {"loop"}, "lm": {"policy", "sampling"}}


def test_every_subpackage_says_what_it_holds():
    for init in ROOT.joinpath("grpo_lab").rglob("__init__.py"):
        text = init.read_text().lstrip()
        assert text.startswith('"""') and len(text.split('"""')[1].split()) >= 8, f"{init} has no docstring"


# ----------------------------------------------------------------------------- the import graph

ALLOWED = {
    "core": {"core"},
    "lm": {"core", "lm"},
    "scale": {"core", "lm", "stats", "scale"},
    "exact": {"core", "lm", "scale", "exact"},
    "stats": {"core", "stats"},
    "viz": {"core", "exact", "lm", "scale", "stats", "viz"},
    "cli": {"core", "exact", "lm", "scale", "stats", "cli"},
}
"""Which layer may import which: an import against this table is a back arrow.

======== =================================================== ==================================================
layer    modules                                             may import
======== =================================================== ==================================================
core     the algorithm, ``grpo_lab/*.py`` (advantages,      core only: no subpackage
         objective, plan, schedules, protocols, sync_audit,
         loop, config, checks, files)
lm       ``grpo_lab/lm/``                                    core, lm
scale    ``grpo_lab/scale/``                                 core, lm, stats (repeats' intervals), scale
exact    ``grpo_lab/exact/``                                 core, lm (SmolLM2 exactly), scale (the cost model)
stats    ``grpo_lab/stats/`` (no study's code)               core, stats
viz      ``grpo_lab/viz/`` (drawing only)                    every layer: it draws what they compute
cli      ``grpo_lab/cli.py``, the ``grpo-lab`` command       every layer but viz: the entry point, imported by none
======== =================================================== ==================================================

Nothing imports viz but viz, nothing imports the CLI. The studies (``studies/``) sit outside the library and
import it; the library imports no study."""


def layer(module: str) -> str:
    """``cli`` for the command's module, ``core`` for ``grpo_lab`` and its other top-level modules, else the
    subpackage's name."""
    parts = module.split(".")
    if module == f"{PACKAGE}.cli":
        return "cli"
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else "core"


def module_files(root: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Module name → file, for every ``.py`` under ``root/package`` (a package is its ``__init__``)."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(root: Path, package: str = PACKAGE) -> dict[str, set[str]]:
    """Module → the package's modules it imports, read from the source with ``ast``: every ``import`` and
    ``from … import`` anywhere in the file (module level, in functions, under ``TYPE_CHECKING``), relative ones
    resolved; ``from p import name`` counts as importing ``p.name`` where that is a module, else ``p``."""
    files = module_files(root, package)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        here = module.split(".") if is_package else module.split(".")[:-1]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(here[:len(here) - node.level + 1] if node.level else [])
                target = ".".join(part for part in (base, node.module or "") if part)
                targets = [f"{target}.{alias.name}" if f"{target}.{alias.name}" in files else target
                           for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in files:      # import a.b.c of a package: its deepest module
                    target = target.rpartition(".")[0]
                if target and target != module:
                    edges.add(target)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: every strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def back_arrows(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every import from a layer that :data:`ALLOWED` does not let it import."""
    return sorted((a, b) for a, targets in graph.items() for b in targets if layer(b) not in ALLOWED[layer(a)])


def test_the_package_has_no_import_circle_and_no_back_arrow():
    graph = import_graph(ROOT)
    assert len(graph) >= 50 and sum(map(len, graph.values())) >= 150      # the whole package was read
    assert {"grpo_lab.plan", "grpo_lab.protocols", "grpo_lab.sync_audit"} <= graph["grpo_lab.loop"]
    assert "grpo_lab.lm.policy" in graph["grpo_lab.exact.digits_lm"]       # a subpackage's relative import
    assert "grpo_lab.exact.bandit_lab" in graph["grpo_lab.viz.demo"]          # from ..exact import bandit_lab
    assert cycles(graph) == [], f"import circles: {cycles(graph)}"
    assert back_arrows(graph) == [], f"back arrows (see ALLOWED): {back_arrows(graph)}"


def test_the_library_imports_no_study():
    for module, path in module_files(ROOT).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(name.split(".")[0] == "studies" for name in names), f"{module} imports {names}"


def test_the_checker_finds_a_circle_and_a_back_arrow(tmp_path):
    """The two rules on a made-up package: a top-level circle, one through a function-level import and one
    under TYPE_CHECKING, and algorithm and exact modules importing viz."""
    package = tmp_path / PACKAGE
    for folder in (package, package / "exact", package / "viz"):
        folder.mkdir()
        (folder / "__init__.py").write_text("")
    (package / "loop.py").write_text("from .sync_audit import probe\n")
    (package / "sync_audit.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                           "    from .loop import Rollout\n")
    (package / "plan.py").write_text("def f():\n    from .viz import plots\n")
    (package / "exact" / "demo.py").write_text("from ..viz import plots\nfrom . import bandit\n")
    (package / "exact" / "bandit.py").write_text("def g():\n    from grpo_lab.exact.demo import main\n")
    (package / "viz" / "plots.py").write_text("from . import colours\n")   # no such module: the package
    graph = import_graph(tmp_path)
    assert graph["grpo_lab.viz.plots"] == {"grpo_lab.viz"}
    assert sorted(cycles(graph)) == [["grpo_lab.exact.bandit", "grpo_lab.exact.demo"],
                                     ["grpo_lab.loop", "grpo_lab.sync_audit"]]
    assert back_arrows(graph) == [("grpo_lab.exact.demo", "grpo_lab.viz.plots"),
                                  ("grpo_lab.plan", "grpo_lab.viz.plots")]


# ----------------------------------------------------------------------------- paths outside a checkout

def test_results_outside_a_checkout_name_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "results")) + " does not exist.*checkout"):
        results_path("frontier", root=tmp_path)
    (tmp_path / "results").mkdir()
    found = results_path("frontier", "summary.json", root=tmp_path)
    assert found == tmp_path / "results" / "frontier" / "summary.json"
    assert results_path("frontier") == ROOT / "results" / "frontier"         # default: this checkout


def test_the_recipes_ship_with_the_package():
    """Every recipe is under the package and matched by pyproject's package data, and ``--config`` takes a
    bundled recipe's name from anywhere."""
    assert CONFIG_DIR.parent == ROOT / PACKAGE and not (ROOT / "configs").exists()
    declared = re.search(r"\[tool\.setuptools\.package-data\]\s*grpo_lab = \[([^\]]*)\]",
                         ROOT.joinpath("pyproject.toml").read_text())
    patterns = re.findall(r'"([^"]+)"', declared.group(1))
    files = [str(p.relative_to(CONFIG_DIR.parent)) for p in CONFIG_DIR.rglob("*") if p.is_file()]
    assert len(files) >= 10 and [f for f in files if not any(fnmatch.fnmatch(f, pat) for pat in patterns)] == []
    bundled = CONFIG_DIR / "cpu_arith_smollm2.yaml"
    assert recipe_path("cpu_arith_smollm2") == recipe_path("cpu_arith_smollm2.yaml") == bundled
    with pytest.raises(FileNotFoundError, match=r"'configs/cpu_arith_smollm2.yaml' does not exist, nor is it a "
                                                r"bundled recipe \(one of \[.*'cpu_arith_smollm2'"):
        recipe_path("configs/cpu_arith_smollm2.yaml")


@pytest.mark.slow
def test_the_wheel_holds_the_library_alone(tmp_path):
    """``pip install grpo-lab`` installs ``grpo_lab`` and nothing beside it (no ``studies`` in site-packages), with
    the recipes inside. Built from a copy of the package and of every other top-level package's modules, so a
    pattern in pyproject that picked up ``studies`` would show here."""
    source = tmp_path / "source"
    shutil.copytree(ROOT / PACKAGE, source / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    others = [init.parent for init in ROOT.glob("*/__init__.py") if init.parent.name != PACKAGE]
    assert "studies" in {folder.name for folder in others}
    for folder in others:
        for module in folder.rglob("*.py"):
            target = source / module.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(module, target)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(source),
                    "-w", str(tmp_path / "wheel")], check=True, cwd=tmp_path, capture_output=True)
    (wheel,) = (tmp_path / "wheel").glob("grpo_lab-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    assert top == {PACKAGE, wheel.name.split("-py")[0] + ".dist-info"}, f"the wheel's top level: {sorted(top)}"
    recipes = {str(p.relative_to(ROOT)) for p in CONFIG_DIR.rglob("*.yaml")}
    assert len(recipes) >= 10 and recipes - set(names) == set(), f"recipes missing: {sorted(recipes - set(names))}"
    modules = {str(p.relative_to(ROOT)) for p in ROOT.joinpath(PACKAGE).rglob("*.py")}
    assert modules - set(names) == set(), f"modules missing from the wheel: {sorted(modules - set(names))}"


def test_each_study_readme_shows_its_summary():
    """A study's README table is generated from its summary.json (``python -m studies.readme``): a README edited by
    hand, or a summary rebuilt without regenerating it, fails here."""
    from studies import readme

    for study in readme.TABLES:
        path = ROOT / "studies" / study / "README.md"
        assert path.read_text() == readme.generated_readme(study), f"{path} is stale: run python -m studies.readme"


# ----------------------------------------------------------------------------- module docstrings

DOCSTRING_HISTORY = {
    "an issue number": re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE),
    "a date": re.compile(r"\b\d{4}-\d{2}-\d{2}\b"),
    "a library version": re.compile(r"\b(?:TRL|vLLM(?:-cpu)?|torch|PyTorch|transformers|accelerate|datasets|numpy|"
                                    r"peft|deepspeed|math-verify|reasoning-gym|Python)\s+v?\d+(?:\.\d+)*\b",
                                    re.IGNORECASE),
}
"""What a module docstring must not carry: history and versions live in git and docs/, not in the library."""


def docstring_history(text: str) -> list[str]:
    """The issue numbers, dates and library versions in ``text``, as ``"kind: match"``."""
    return [f"{kind}: {match.group(0)!r}" for kind, pattern in DOCSTRING_HISTORY.items()
            for match in pattern.finditer(text)]


def test_docstring_history_finds_issues_dates_and_versions():
    found = docstring_history("issue 38 §1; 2026-12-02; TRL 1.16, vLLM 0.32, torch 2.13, transformers 5; "
                              "v = 4, 16 blocks, step 2, Pass@1 0.79")
    assert found == ["an issue number: 'issue 38'", "a date: '2026-12-02'", "a library version: 'TRL 1.16'",
                     "a library version: 'vLLM 0.32'", "a library version: 'torch 2.13'",
                     "a library version: 'transformers 5'"]


def test_no_module_docstring_carries_an_issue_a_date_or_a_version():
    """Every module docstring under grpo_lab/ says what and why; issue numbers, dates and library versions live in
    git and docs/ (docs/decisions.md, docs/benchmarks.md, docs/internals.md). Lists every offending module."""
    offenders = {}
    for path in sorted(ROOT.joinpath(PACKAGE).rglob("*.py")):
        found = docstring_history(ast.get_docstring(ast.parse(path.read_text(), str(path))) or "")
        if found:
            offenders[str(path.relative_to(ROOT))] = found
    assert offenders == {}, "module docstrings with history or versions:\n" + "\n".join(
        f"  {module}: {', '.join(found)}" for module, found in offenders.items())


TABLE_CELL_CHARS = 400
"""The longest table cell any Markdown doc may hold, in visible characters (a link counts its text): a longer one
is a paragraph, which belongs below the table."""

INDEX_CELL_CHARS = {"README.md": 160, "docs/benchmarks.md": 160}
"""Tighter limits for the two pages read as indexes."""

NOT_DOCS = {"outputs", "runs", "node_modules", "build", "dist"}
"""Folders whose Markdown is not the project's (hidden folders, such as a virtualenv, are skipped too)."""


def markdown_docs(root: Path = ROOT) -> list[Path]:
    """Every Markdown file of the checkout: README.md, docs/, the studies' READMEs, benchmarks/ and the rest."""
    return sorted(p for p in root.rglob("*.md")
                  if not any(part.startswith(".") or part in NOT_DOCS for part in p.relative_to(root).parts[:-1]))


def long_cells(text: str, limit: int) -> list[str]:
    """``"line: N characters: start…"`` for every table cell of ``text`` longer than ``limit`` visible characters;
    an escaped pipe (``\\|``) stays inside its cell."""
    long = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        for cell in re.split(r"(?<!\\)\|", line.strip().strip("|")):
            visible = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cell).strip()
            if len(visible) > limit:
                long.append(f"{number}: {len(visible)} characters: {visible[:60]}…")
    return long


def test_long_cells_counts_visible_characters_and_escaped_pipes():
    text = ("| a | b |\n|---|---|\n| " + "x" * 11 + " | [" + "y" * 10 + "](" + "z" * 50 + ") |\n"
            "| " + "w" * 6 + " \\| " + "w" * 6 + " | ok |\n")
    assert long_cells(text, 10) == ["3: 11 characters: " + "x" * 11 + "…", "4: 16 characters: wwwwww \\| wwwwww…"]
    assert long_cells(text, 16) == []


def test_no_table_cell_in_any_doc_is_a_paragraph():
    docs = markdown_docs()
    names = {str(p.relative_to(ROOT)) for p in docs}
    assert {"README.md", "docs/metrics.md", "studies/lag_decided/README.md"} <= names and set(INDEX_CELL_CHARS) <= names
    long = [f"{name}:{cell}" for path in docs
            for name in [str(path.relative_to(ROOT))]
            for cell in long_cells(path.read_text(), INDEX_CELL_CHARS.get(name, TABLE_CELL_CHARS))]
    assert not long, "\n".join(long)


CLAIMS_INDEX_WORDS = 4000
"""docs/benchmarks.md is an index (claim, figure, machine, command), read in one sitting; how figures were taken
and what else the data show go to benchmarks/README.md."""


def test_the_claims_index_stays_short():
    words = len(ROOT.joinpath("docs", "benchmarks.md").read_text().split())
    assert words <= CLAIMS_INDEX_WORDS, f"docs/benchmarks.md has {words} words: move prose to benchmarks/README.md"


def test_every_notebook_cell_has_its_own_id():
    """nbformat 4.5 cells carry an id (nbformat warns without one, and will refuse); two cells may not share one."""
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        ids = [cell.get("id") for cell in json.loads(path.read_text())["cells"]]
        assert None not in ids, f"{path.name}: cell {ids.index(None)} has no id"
        assert len(set(ids)) == len(ids), f"{path.name}: repeated cell ids"
