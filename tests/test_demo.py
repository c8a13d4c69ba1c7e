"""``make demo`` (``HEADLESS=1 make lab``): the bandit figures as HTML, and as PNG when kaleido finds a
Chrome; without one, a single line says how to get PNGs. The PNG path runs under ``make test-browser``
(``tests/browser/test_png_export.py``), where a Chrome is installed."""

from __future__ import annotations

from grpo_lab.viz import demo


def test_without_a_browser_one_line_says_how_to_get_pngs(tmp_path, monkeypatch, capsys):
    """What is checked is the PNG line and the files written, not the curves: the bandit runs are cut to 10 steps ×
    2 runs (notebook 01 runs the same experiments at its smoke size)."""
    monkeypatch.setattr(demo.bandit_lab, "lab_size", lambda: demo.bandit_lab.LabSize(steps=10, runs=2))
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

