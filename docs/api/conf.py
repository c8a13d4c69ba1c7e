"""Sphinx configuration of the API reference: every module of grpo_lab, from its docstrings (``make api``, which
builds with warnings as errors)."""

import re

project = "grpo_lab"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.autosummary", "sphinx.ext.napoleon"]
autosummary_generate = True
# A name re-exported by a package (grpo_lab.GRPOConfig) is documented once, where it is defined.
autodoc_default_options = {"members": True, "show-inheritance": True, "ignore-module-all": True}
autodoc_member_order = "bysource"
napoleon_numpy_docstring = False
exclude_patterns = ["_build", "generated/*.tmp"]
html_theme = "alabaster"

BAR = re.compile(r"(?<!\\)\|")
LITERAL = re.compile(r"(``.*?``)")


def escape(text: str) -> str:
    """``text`` with its bars escaped, except inside ``inline literals``."""
    return "".join(part if part.startswith("``") else BAR.sub(r"\\|", part) for part in LITERAL.split(text))


def escape_bars(app, what, name, obj, options, lines: list[str]) -> None:
    """The docstrings write maths as docs/theory.md does: |x| is an absolute value and π(y|x) a conditional, where
    reStructuredText would read a substitution. Escape those bars in running text and in the last column of a
    table (where the added backslash moves no column); literal blocks (after ``::``), ``inline literals``, line
    blocks and grid tables keep theirs."""
    literal_indent, last_column = None, None
    for i, line in enumerate(lines):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if literal_indent is not None:
            if not stripped or indent > literal_indent:
                continue
            literal_indent = None
        if stripped and set(stripped) <= {"=", " "}:   # a simple table's border: it opens, splits or closes
            closes = last_column is not None and (i + 1 == len(lines) or not lines[i + 1].strip())
            last_column = None if closes else line.rstrip().rindex(" ") + 1
            continue
        if last_column is not None:
            lines[i] = line[:last_column] + escape(line[last_column:])
        elif not (stripped.startswith(("| ", "+-", "+=")) or stripped == "|"):
            lines[i] = escape(line)
        if stripped.endswith("::"):
            literal_indent = indent


def setup(app) -> None:
    app.connect("autodoc-process-docstring", escape_bars)
