"""scripts/build_gallery.py: notebook 01 runs in smoke mode and exports to self-contained HTML with its figures."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_build_gallery():
    """Import scripts/build_gallery.py (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location("build_gallery", ROOT / "scripts" / "build_gallery.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


build_gallery = load_build_gallery()


@pytest.mark.slow
def test_notebook01_page_has_its_figures_inline_and_no_error(tmp_path):
    page = build_gallery.build_page(ROOT / "notebooks" / "01_bandit.ipynb", tmp_path)
    html = page.html.read_text(encoding="utf-8")
    divs = re.findall(r'<div class="plotly-graph-div" id="([^"]+)"', html)
    drawn = re.findall(r'Plotly\.newPlot\(\s*"([^"]+)"', html)
    assert len(divs) >= 8 and sorted(drawn) == sorted(divs)                 # each figure div is drawn
    assert '"type":"scatter"' in html and '"type":"heatmap"' in html        # with its data
    assert "plotly.js v" in html and not re.search(r'<script[^>]*src="[^"]*plotly', html)  # plotly.js inlined
    assert "(smoke mode)" in html                                           # GRPO_LAB_SMOKE reached the kernel
    assert '<script type="application/vnd.jupyter.widget' not in html     # static figures, no dead widgets
    assert 'data-mime-type="application/vnd.jupyter.stderr"' not in html and "Traceback" not in html
    assert "lr = 30, v = 20, truncated" in html                             # the last cell ran
    assert page.title.startswith("01 · The bandit lab")

    index = build_gallery.write_index([page], tmp_path).read_text(encoding="utf-8")
    assert 'href="01_bandit.html"' in index and "The bandit lab" in index


def test_bad_input_names_the_parameter(tmp_path):
    notebook = ROOT / "notebooks" / "01_bandit.ipynb"
    with pytest.raises(ValueError, match="timeout"):
        build_gallery.build_page(notebook, tmp_path, timeout=0)
    with pytest.raises(ValueError, match="notebook.*missing.ipynb"):
        build_gallery.build_page(tmp_path / "missing.ipynb", tmp_path)
