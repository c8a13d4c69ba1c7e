"""``make demo`` with a Chrome present: kaleido writes each figure as PNG beside its HTML. Runs under
``make test-browser``, which installs Chromium first (a missing one fails here, it is not skipped); the
no-browser path is tested in ``tests/test_demo.py``."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

from grpo_lab.viz import demo

pytestmark = pytest.mark.browser


def test_with_chromium_the_figures_are_pngs(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    assert demo.find_browser() is not None, "no Chrome found: scripts/browser_deps.sh installs one"
    assert demo.png_export_ready()
    fig = go.Figure(go.Scatter(x=[0, 1, 2], y=[0, 1, 4]), layout=dict(height=300))
    written = demo.write_figure(fig, tmp_path, "curve", png=True)
    assert [p.name for p in written] == ["curve.html", "curve.png"], capsys.readouterr().out
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
