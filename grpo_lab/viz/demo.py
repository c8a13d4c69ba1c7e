"""``make demo`` / ``python -m grpo_lab.viz.demo --out DIR``: the bandit lab without a browser.

Runs notebook 01's headline experiments (the paper's findings with 8 runs each,
and Theorem 1 along a lagged run), prints a table of final rewards, and writes
the figures to ``DIR`` as interactive HTML (plotly.js alongside) and, when
``kaleido`` and a Chrome/Chromium are available, as PNG (else one line says how to get them).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
from pathlib import Path

import plotly.graph_objects as go

from ..exact import bandit_lab
from ..exact.bandit import run_bandit
from . import plots

HOW_TO_GET_PNGS = ("for PNGs, install Chromium (apt-get install chromium, or pip install playwright && playwright "
                   "install chromium) or point BROWSER_PATH at a Chrome")


def find_browser() -> str | None:
    """A Chrome/Chromium for kaleido: ``$BROWSER_PATH``, one on the PATH (the browser test's
    ``/usr/bin/chromium``), or a Chromium that Playwright downloaded."""
    if os.environ.get("BROWSER_PATH"):
        return os.environ["BROWSER_PATH"]
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    playwright = sorted(Path.home().glob(".cache/ms-playwright/chromium-*/chrome-linux*/chrome"))
    return str(playwright[-1]) if playwright else None


def png_export_ready() -> bool:
    """Point kaleido at a browser and say yes, or say in one line why PNGs are skipped and how to get them."""
    if importlib.util.find_spec("kaleido") is None:
        print("PNG figures skipped: kaleido is not installed (pip install kaleido); the HTML files hold the figures")
        return False
    browser = find_browser()
    if browser is None:
        print(f"PNG figures skipped: kaleido needs a Chrome and none was found; {HOW_TO_GET_PNGS}")
        return False
    os.environ["BROWSER_PATH"] = browser
    return True


def write_figure(fig: go.Figure, out: Path, name: str, png: bool) -> list[Path]:
    """``name.html`` always; ``name.png`` when asked (and :func:`png_export_ready`)."""
    written = [out / f"{name}.html"]
    fig.write_html(written[0], include_plotlyjs="directory")
    if png:
        try:
            fig.write_image(out / f"{name}.png", width=1100, height=int(fig.layout.height or 500), scale=1)
            written.append(out / f"{name}.png")
        except Exception as exc:  # the browser found would not run: one line, not kaleido's page of text
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            print(f"PNG of {name} skipped ({type(exc).__name__}: {reason}); {HOW_TO_GET_PNGS}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/demo", help="folder for the figures")
    parser.add_argument("--no-png", action="store_true", help="write HTML only")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    png = not args.no_png and png_export_ready()
    size = bandit_lab.lab_size()
    problem, config = bandit_lab.lab_problem(), bandit_lab.lab_config()
    print(f"bandit: {problem.contexts} contexts × {problem.arms} arms, {size.steps} steps × {size.runs} runs")

    findings = bandit_lab.run_findings(problem, config, runs=size.runs)
    print(f"{'configuration':32s} final J (mean ± std over runs)   optimiser passes")
    for name, run in findings.items():
        mean, std = bandit_lab.final_reward(run)
        print(f"{name:32s} {mean:.3f} ± {std:.3f}                   {int(run.optimizer_passes[-1])}")
    lagged = {f"v = {v}": run_bandit(problem, config.replace(v=v), runs=size.runs, track_bound=True) for v in (1, 10)}
    violations = sum(int((r.improvement < r.bound).sum()) for r in lagged.values())
    print(f"Theorem 1: {violations} violations over {sum(r.bound.size for r in lagged.values())} (step, run, context)")

    written = []
    written += write_figure(plots.findings_figure(findings), out, "findings", png)
    written += write_figure(plots.bound_figure(lagged), out, "theorem1_bound", png)
    written += write_figure(plots.wall_clock_figure(findings, ["on-policy + mask", "v = 10", "sample reuse i = 10"],
                                                    bandit_lab.lab_cost_model()), out, "wall_clock", png)
    print("wrote", ", ".join(str(p) for p in written))
    return 0 if violations == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
