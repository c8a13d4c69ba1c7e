"""What a learner reads is in plain words: README.md, docs/ (but the decision log) and the notebooks carry no study
codes (machine keys such as I2, benchmark codes such as P1), no amendment numbers, dates, "Renamed:" notes, issue
numbers or commit hashes. That provenance lives in the study READMEs, the result files and git."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HISTORY = {
    "a study code": re.compile(r"\b[CEIP]\d{1,2}\b"),
    "an amendment": re.compile(r"\bamendments?\b", re.IGNORECASE),
    "a date": re.compile(r"\b\d{4}-\d{2}-\d{2}\b"),
    "a rename note": re.compile(r"\bRenamed\b"),
    "an issue number": re.compile(r"(?<![\w(])#\d{2,}\b|\b(?:issues?|PRs?|pull requests?)\s+#?\d+", re.IGNORECASE),
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"),
}
"""What learner text must not carry, by kind. A study code is a capital C, E, I or P and one or two digits (the
paper's DeepSeek-R1 and an L1 distance are not); an issue number is ``#`` and two or more digits outside a link's
anchor (``theory.md#10-…`` is a section), or "issue 53"; a commit hash is 7 to 40 lower-case hex digits with at
least one digit and one letter."""

LOG = "docs/decisions.md"
"""The decision log: history is its subject."""


def history(text: str) -> list[str]:
    """Every match of :data:`HISTORY` in ``text``, as ``"kind: 'match'"``, in the order of the table."""
    return [f"{kind}: {match.group(0)!r}" for kind, pattern in HISTORY.items() for match in pattern.finditer(text)]


def learner_docs() -> list[Path]:
    """README.md and every page of docs/ but the decision log."""
    return [ROOT / "README.md"] + [p for p in sorted((ROOT / "docs").glob("*.md")) if p != ROOT / LOG]


def offenders(texts: dict[str, str]) -> dict[str, list[str]]:
    """Name → what it carries, for each text that carries any history."""
    return {name: found for name, text in texts.items() if (found := history(text))}


def report(found: dict[str, list[str]]) -> str:
    return "history in learner text (move it to a study README or a result file):\n" + "\n".join(
        f"  {name}: {', '.join(items)}" for name, items in found.items())


def test_history_finds_each_kind_and_spares_plain_text():
    text = ("On I2 and C2 (P1 0.53, amendment 5) fixed 2026-12-03; Renamed: a is b; TRL #5312, issue 53, "
            "issues #3197; commit 6466ca3.")
    assert history(text) == ["a study code: 'I2'", "a study code: 'C2'", "a study code: 'P1'",
                             "an amendment: 'amendment'", "a date: '2026-12-03'", "a rename note: 'Renamed'",
                             "an issue number: '#5312'", "an issue number: 'issue 53'",
                             "an issue number: 'issues #3197'", "a commit hash: '6466ca3'"]
    plain = ("DeepSeek-R1 on an L1 distance; see [§10](theory.md#10-what-the-lag-costs); 1e-5, 49152 tokens, "
             "colour #17becf, a 64-digit SHA-256 " + "ab12" * 16 + ", OpenReview XXfOf22o3K, Pass@1 0.789, H200.")
    assert history(plain) == []


def test_readme_and_docs_carry_no_history():
    found = offenders({str(p.relative_to(ROOT)): p.read_text() for p in learner_docs()})
    assert found == {}, report(found)


def notebook_text(path: Path) -> str:
    """The text of a notebook's markdown and code cells (not their outputs: committed notebooks have none)."""
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] in ("markdown", "code"))


def test_notebooks_carry_no_history():
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert len(notebooks) >= 4
    found = offenders({path.name: notebook_text(path) for path in notebooks})
    assert found == {}, report(found)
