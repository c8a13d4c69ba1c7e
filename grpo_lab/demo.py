"""``make demo`` / ``python -m grpo_lab.demo --out DIR``: the bandit lab without a browser.

Runs notebook 01's headline experiments (the paper's findings with 8 runs each,
and Theorem 1 along a lagged run), prints a table of final rewards, and writes
the figures to ``DIR`` as interactive HTML (plotly.js alongside) and, when
``kaleido`` and a Chrome/Chromium are available, as PNG.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

import plotly.graph_objects as go

from . import bandit_studies as studies
from .bandit import run_bandit
from .viz import plots


def write_figure(fig: go.Figure, out: Path, name: str, png: bool) -> list[Path]:
    """``name.html`` always; ``name.png`` when asked and an image exporter works."""
    written = [out / f"{name}.html"]
    fig.write_html(written[0], include_plotlyjs="directory")
    if png:
        try:
            fig.write_image(out / f"{name}.png", width=1100, height=int(fig.layout.height or 500), scale=1)
            written.append(out / f"{name}.png")
        except Exception as exc:  # kaleido missing, or no Chrome for it to drive
            print(f"PNG of {name} skipped ({type(exc).__name__}: {exc}); the HTML has the figure")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/demo", help="folder for the figures")
    parser.add_argument("--no-png", action="store_true", help="write HTML only")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if "BROWSER_PATH" not in os.environ and shutil.which("chromium"):
        os.environ["BROWSER_PATH"] = shutil.which("chromium")  # kaleido drives the system Chromium
    size = studies.lab_size()
    problem, config = studies.lab_problem(), studies.lab_config()
    print(f"bandit: {problem.contexts} contexts × {problem.arms} arms, {size.steps} steps × {size.runs} runs")

    findings = studies.run_findings(problem, config, runs=size.runs)
    print(f"{'configuration':32s} final J (mean ± std over runs)   optimiser passes")
    for name, run in findings.items():
        mean, std = studies.final_reward(run)
        print(f"{name:32s} {mean:.3f} ± {std:.3f}                   {int(run.optimizer_passes[-1])}")
    lagged = {f"v = {v}": run_bandit(problem, config.replace(v=v), runs=size.runs, track_bound=True) for v in (1, 10)}
    violations = sum(int((r.improvement < r.bound).sum()) for r in lagged.values())
    print(f"Theorem 1: {violations} violations over {sum(r.bound.size for r in lagged.values())} (step, run, context)")

    written = []
    written += write_figure(plots.findings_figure(findings), out, "findings", not args.no_png)
    written += write_figure(plots.bound_figure(lagged), out, "theorem1_bound", not args.no_png)
    written += write_figure(plots.wall_clock_figure(findings, ["on-policy + mask", "v = 10", "sample reuse i = 10"],
                                                    studies.lab_cost_model()), out, "wall_clock", not args.no_png)
    print("wrote", ", ".join(str(p) for p in written))
    return 0 if violations == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
