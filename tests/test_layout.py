"""The README's map names every module of the package, and every module it names exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_map_names_every_module():
    section = ROOT.joinpath("README.md").read_text().split("## Where things are", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(grpo_lab/[\w/]+\.py)`", section))
    modules = {str(p.relative_to(ROOT)) for p in ROOT.joinpath("grpo_lab").rglob("*.py") if p.name != "__init__.py"}
    assert modules - named == set(), f"modules missing from the README's map: {sorted(modules - named)}"
    assert named - modules == set(), f"the README's map names modules that do not exist: {sorted(named - modules)}"


def test_every_subpackage_says_what_it_holds():
    for init in ROOT.joinpath("grpo_lab").rglob("__init__.py"):
        text = init.read_text().lstrip()
        assert text.startswith('"""') and len(text.split('"""')[1].split()) >= 8, f"{init} has no docstring"
