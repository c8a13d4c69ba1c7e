"""``make demo`` (``HEADLESS=1 make lab``): the bandit figures as HTML, and as PNG when kaleido finds a
Chrome; without one, a single line says how to get PNGs."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest

from grpo_lab.viz import demo


def test_without_a_browser_one_line_says_how_to_get_pngs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRPO_LAB_SMOKE", "1")
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))   # no chromium, chrome, … on the PATH
    monkeypatch.setenv("HOME", str(tmp_path))             # no Playwright download under ~/.cache
    assert demo.find_browser() is None
    assert demo.main(["--out", str(tmp_path / "figures")]) == 0
    printed = capsys.readouterr().out.splitlines()
    png_lines = [line for line in printed if "PNG" in line]
    assert png_lines == [f"PNG figures skipped: kaleido needs a Chrome and none was found; {demo.HOW_TO_GET_PNGS}"]
    written = sorted(p.name for p in (tmp_path / "figures").iterdir())
    assert {"findings.html", "theorem1_bound.html", "wall_clock.html"} <= set(written)
    assert not [name for name in written if name.endswith(".png")]


@pytest.mark.skipif(demo.find_browser() is None, reason="no Chrome here (scripts/browser_deps.sh installs one)")
def test_with_chromium_the_figures_are_pngs(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    assert demo.png_export_ready()
    fig = go.Figure(go.Scatter(x=[0, 1, 2], y=[0, 1, 4]), layout=dict(height=300))
    written = demo.write_figure(fig, tmp_path, "curve", png=True)
    assert [p.name for p in written] == ["curve.html", "curve.png"], capsys.readouterr().out
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
