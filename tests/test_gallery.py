"""scripts/build_gallery.py: a notebook runs in smoke mode and exports to self-contained HTML with its figures."""

import re
from pathlib import Path

import nbformat
import pytest
from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]


build_gallery = load_script("scripts/build_gallery.py")


def small_notebook(folder: Path) -> Path:
    """A notebook with a title, a scatter, a heatmap, a widget and the settings it ran with (notebook 01 itself
    runs under the notebook tests; running it again here would only repeat them)."""
    cells = [nbformat.v4.new_markdown_cell("# 01 · A small page\n\nText."),
             nbformat.v4.new_code_cell("import os\nimport ipywidgets\nimport plotly.graph_objects as go\n"
                                       "print('smoke' if os.environ.get('GRPO_LAB_SMOKE') == '1' else 'full', "
                                       "os.environ.get('GRPO_LAB_DISPLAY'))"),
             nbformat.v4.new_code_cell("go.Figure(go.Scatter(y=[1, 3, 2]))"),
             nbformat.v4.new_code_cell("go.Figure(go.Heatmap(z=[[1, 2], [3, 4]]))"),
             nbformat.v4.new_code_cell("ipywidgets.IntSlider()")]
    notebook = folder / "01_small.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), notebook)
    return notebook


def test_a_page_has_its_figures_inline_and_no_error(tmp_path):
    page = build_gallery.build_page(small_notebook(tmp_path), tmp_path / "out")
    html = page.html.read_text(encoding="utf-8")
    divs = re.findall(r'<div class="plotly-graph-div" id="([^"]+)"', html)
    drawn = re.findall(r'Plotly\.newPlot\(\s*"([^"]+)"', html)
    assert len(divs) == 2 and sorted(drawn) == sorted(divs)                 # each figure div is drawn
    assert '"type":"scatter"' in html and '"type":"heatmap"' in html        # with its data
    assert "plotly.js v" in html and not re.search(r'<script[^>]*src="[^"]*plotly', html)  # plotly.js inlined
    assert "smoke static" in html                                           # GALLERY_ENV reached the kernel
    assert '<script type="application/vnd.jupyter.widget' not in html     # static figures, no dead widgets
    assert 'data-mime-type="application/vnd.jupyter.stderr"' not in html and "Traceback" not in html
    assert page.title == "01 · A small page"

    index = build_gallery.write_index([page], tmp_path / "out").read_text(encoding="utf-8")
    assert 'href="01_small.html"' in index and "A small page" in index


def test_bad_input_names_the_parameter(tmp_path):
    notebook = ROOT / "notebooks" / "01_bandit.ipynb"
    with pytest.raises(ValueError, match="timeout"):
        build_gallery.build_page(notebook, tmp_path, timeout=0)
    with pytest.raises(ValueError, match="notebook.*missing.ipynb"):
        build_gallery.build_page(tmp_path / "missing.ipynb", tmp_path)
