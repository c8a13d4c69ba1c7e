"""Build the notebook gallery: run each notebook in smoke mode and export it, outputs included, to HTML.

    python scripts/build_gallery.py                      # every notebooks/*.ipynb -> docs/gallery/
    python scripts/build_gallery.py notebooks/01_bandit.ipynb --out /tmp/gallery

Each notebook runs in a fresh kernel in its own folder (as JupyterLab would run it) with
``GRPO_LAB_SMOKE=1`` (short runs), ``GRPO_LAB_DISPLAY=static`` (plain figures; no widget is shown, none is stored) and
``PLOTLY_RENDERER=notebook``, so every figure is stored as HTML with plotly.js inlined once per
page: the pages open offline, without a kernel or a CDN. A cell that raises stops the build
(non-zero exit) rather than publishing a page with a traceback. ``docs/gallery/`` is not committed.
"""

from __future__ import annotations

import argparse
import html
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbconvert import HTMLExporter

ROOT = Path(__file__).resolve().parents[1]
GALLERY_ENV = {"GRPO_LAB_SMOKE": "1", "GRPO_LAB_DISPLAY": "static", "PLOTLY_RENDERER": "notebook"}


@dataclass(frozen=True)
class Page:
    """One exported notebook: where its HTML went, its title and how long it ran."""

    notebook: Path
    html: Path
    title: str
    seconds: float


def notebook_title(nb: nbformat.NotebookNode, fallback: str) -> str:
    """The first Markdown heading of the notebook (its title), else ``fallback``."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return fallback


def build_page(notebook: Path, out_dir: Path, timeout: int = 1800) -> Page:
    """Execute ``notebook`` in its own folder with :data:`GALLERY_ENV` and write ``<out_dir>/<stem>.html``.

    ``timeout`` is the limit for one cell in seconds; a failing cell raises ``CellExecutionError``.
    """
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if not notebook.is_file():
        raise ValueError(f"notebook must be an existing .ipynb file, got {str(notebook)!r}")
    nb = nbformat.read(notebook, as_version=4)
    start = time.perf_counter()
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=False,
                            resources={"metadata": {"path": str(notebook.parent)}})
    client.execute(env={**os.environ, **GALLERY_ENV})
    seconds = time.perf_counter() - start
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    out_dir.mkdir(parents=True, exist_ok=True)
    page = out_dir / f"{notebook.stem}.html"
    page.write_text(body, encoding="utf-8")
    return Page(notebook, page, notebook_title(nb, notebook.stem), seconds)


def write_index(pages: list[Page], out_dir: Path) -> Path:
    """``<out_dir>/index.html``: one link per page, with the smoke-mode note and run times."""
    items = "\n".join(f'  <li><a href="{html.escape(p.html.name)}">{html.escape(p.title)}</a> '
                      f"<small>({html.escape(p.notebook.name)}, ran in {p.seconds:.0f} s)</small></li>"
                      for p in pages)
    index = out_dir / "index.html"
    index.write_text(f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>grpo_lab notebook gallery</title></head>
<body>
<h1>grpo_lab notebook gallery</h1>
<p>Each notebook was run in smoke mode (<code>GRPO_LAB_SMOKE=1</code>: short runs, so numbers differ
from a full run) with static figures; open it in JupyterLab (<code>make lab</code>) for the live panels.</p>
<ul>
{items}
</ul>
</body></html>
""", encoding="utf-8")
    return index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "gallery", help="output folder")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds allowed for one cell")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    pages = []
    for notebook in notebooks:
        page = build_page(notebook.resolve(), args.out, args.timeout)
        print(f"{page.html} ({page.seconds:.0f} s)", flush=True)
        pages.append(page)
    print(write_index(pages, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
