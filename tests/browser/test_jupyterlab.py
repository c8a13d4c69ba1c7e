"""End to end in headless Chromium: notebook 01 runs in JupyterLab, its figures and live panel render,
moving a slider re-trains in the kernel and redraws the panel's figure, and after a page reload the panel
is drawn as the knobs left it and redraws again; notebook 02 runs, its live panel's Run button trains in
the background over the study's cached curves, and Kernel > Interrupt stops that run and leaves the kernel
usable; the gallery page draws every figure offline. Screenshots
go to ``outputs/browser/``. Run with ``make test-browser``."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import ipywidgets as W
import pytest

from grpo_lab.exact.bandit_lab import lab_config
from grpo_lab.viz.widgets import make_controls

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]

NOTEBOOK = "01_bandit.ipynb"
NOTEBOOK02 = "02_lag_frontier.ipynb"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
KERNEL_IDLE = re.compile(r"^Python 3 \(ipykernel\) \| Idle$")   # the status bar, once the kernel is up
# Run All has finished (or stopped at an error): the kernel is idle, the first cell has run, none is queued, and
# so for 3 s on end (on a loaded machine the kernel reads idle between two cells, and a cell whose source is
# hidden shows no prompt, not even [*]).
RUN_ALL_DONE = """() => {
    const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(e => e.textContent.trim());
    const kernel = document.querySelector('.jp-Notebook-ExecutionIndicator');
    const done = kernel && kernel.dataset.status === 'idle' && /^\\[\\d+\\]:$/.test(prompts[0] ?? '')
        && !prompts.includes('[*]:');
    window.grpoDoneSince = done ? (window.grpoDoneSince ?? performance.now()) : null;
    return done && performance.now() - window.grpoDoneSince > 3000;
}"""
# The panel's figure: per trace, its y data (from plotly's graph div) and its drawn SVG paths.
FIGURE_STATE = """gd => gd.data.map((trace, n) => ({
    y: Array.from(trace.y),
    d: [...gd.querySelectorAll('.scatterlayer .trace')][n]?.querySelector('path.js-line, path.js-fill')
           ?.getAttribute('d') ?? null,
}))"""
# The page's own clock, read by event listeners (no polling that would compete for the 2 cores): the
# keydown that moves the slider, then the frame after the first plotly redraw whose trace data differ.
WATCH_REDRAW = """(gd, n) => {
    const y0 = JSON.stringify(Array.from(gd.data[n].y));
    window.grpoPressedAt = window.grpoRedrawnAt = null;
    window.grpoSeen = false;
    document.addEventListener('keydown', () => { window.grpoPressedAt = performance.now(); },
                              {capture: true, once: true});
    gd.on('plotly_afterplot', () => {
        if (!window.grpoSeen && JSON.stringify(Array.from(gd.data[n].y)) !== y0) {
            window.grpoSeen = true;     // drawn: time the next frame, when the new curve is on screen
            requestAnimationFrame(() => { window.grpoRedrawnAt = performance.now(); });
        }
    });
}"""
DRAWN = ".scatterlayer .trace, .heatmaplayer .hm"      # a plotly figure's drawn data (SVG)
CURRENT = 3          # BanditPanel's traces: baseline band, baseline mean, current band, current mean
BASELINE = 1


def slider_labels() -> set[str]:
    """The descriptions of the panel's sliders, as BanditPanel builds them."""
    sliders = (W.IntSlider, W.FloatSlider, W.FloatLogSlider)
    return {c.description for c in make_controls(lab_config(), runs=1).values() if isinstance(c, sliders)}


def saved_notebook(page, path: Path, deadline) -> dict:
    """Save with Ctrl+S, as a user would, and return the notebook once JupyterLab has written all of it
    (the server rewrites the file in place: a new mtime alone may still be a partial file)."""
    before = path.stat().st_mtime_ns
    page.keyboard.press("Control+s")
    while True:
        time.sleep(deadline.ms(0.2) / 1000)
        if path.stat().st_mtime_ns != before:
            try:
                return json.loads(path.read_text())
            except json.JSONDecodeError:
                continue


def redraw(page, figure, before: list[dict], deadline) -> list[dict]:
    """Wait until the current-knobs trace has new data *and* a new drawn path; return the new state."""
    page.wait_for_function(
        f"""([gd, before]) => {{
            const now = ({FIGURE_STATE})(gd)[{CURRENT}];
            return JSON.stringify(now.y) !== JSON.stringify(before.y) && now.d !== before.d;
        }}""", arg=[figure.element_handle(), before[CURRENT]], timeout=deadline.ms(30), polling=200)
    return figure.evaluate(FIGURE_STATE)


def run_all(page, lab_server, name: str, deadline, seconds: float) -> dict:
    """Open notebook ``name``, Run All, wait until it has finished, save it; return the saved notebook after
    checking that no cell raised and every cell ran once, in order."""
    notebook = lab_server.notebook_dir / name
    code_cells = sum(c["cell_type"] == "code" for c in json.loads(notebook.read_text())["cells"])
    page.goto(lab_server.url(f"lab/tree/{name}"), timeout=deadline.ms(60))
    page.locator(".jp-StatusBar-Widget").get_by_text(KERNEL_IDLE).wait_for(timeout=deadline.ms(90))
    assert page.locator(".jp-CodeCell").count() == code_cells
    page.get_by_role("menuitem", name="Run", exact=True).click(timeout=deadline.ms(10))
    page.get_by_role("menuitem", name=re.compile(r"^Run All Cells")).click(timeout=deadline.ms(10))
    page.wait_for_function(RUN_ALL_DONE, timeout=deadline.ms(seconds), polling=500)
    nb = saved_notebook(page, notebook, deadline)
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    assert not [f"{o['ename']}: {o['evalue']}" for o in outputs if o["output_type"] == "error"]
    counts = [c["execution_count"] for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(isinstance(n, int) for n in counts), f"cells not run: {counts}"
    assert counts == sorted(counts) and len(set(counts)) == len(counts) == code_cells
    return nb


def test_notebook01_runs_in_jupyterlab_and_its_panel_redraws_also_after_a_reload(lab_server, chromium_page,
                                                                                   screenshot_dir, deadline):
    page = chromium_page.page
    # What the kernel sent, from JupyterLab's own save: no error, every cell ran once, in order.
    nb = run_all(page, lab_server, NOTEBOOK, deadline, 240)
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    static_figures = sum(PLOTLY_MIME in o.get("data", {}) for o in outputs)
    assert static_figures >= 1 and sum(WIDGET_MIME in o.get("data", {}) for o in outputs) == 1

    # What the browser drew: each static figure as an SVG plot, and the live panel.
    static = page.locator(".jp-RenderedPlotly.js-plotly-plot")      # jupyterlab-plotly's mime renderer
    assert static.count() == static_figures
    assert static.evaluate_all(f"plots => plots.every(p => p.querySelector('{DRAWN}'))")
    panel = page.locator(".jp-OutputArea-output", has=page.locator(".widget-slider"))
    assert panel.count() == 1
    assert set(panel.locator(".widget-slider .widget-label").all_inner_texts()) == slider_labels()
    # Every control's label reads in full: none is cut by the browser (text-overflow shows "…") or ends in "…".
    cut = panel.locator(".widget-label, .widget-dropdown select, .widget-checkbox label").evaluate_all(
        "labels => labels.filter(l => l.scrollWidth > l.clientWidth + 1 || l.textContent.includes('…'))"
        "               .map(l => l.textContent.trim())")
    assert not cut, f"labels cut short on the panel: {cut}"
    figure = panel.locator(".js-plotly-plot")           # the FigureWidget (anywidget)
    figure.locator(".scatterlayer .trace").nth(CURRENT).wait_for(timeout=deadline.ms(30))
    before = figure.evaluate(FIGURE_STATE)
    assert len(before) == 4 and all(t["d"] for t in before)

    # The v slider by keyboard: one step right re-trains the runs in the kernel and redraws the curve.
    v = panel.locator(".widget-slider", has=page.locator(".widget-label", has_text="v (sync)"))
    v0 = int(v.locator(".widget-readout").inner_text())
    v.locator(".noUi-handle").focus()
    figure.evaluate(WATCH_REDRAW, CURRENT)
    page.keyboard.press("ArrowRight")
    page.wait_for_function("() => window.grpoRedrawnAt !== null", timeout=deadline.ms(30), polling=100)
    seconds = page.evaluate("() => (window.grpoRedrawnAt - window.grpoPressedAt) / 1000")
    after_v = redraw(page, figure, before, deadline)
    assert v.locator(".widget-readout").inner_text() == str(v0 + 1)
    status = panel.locator(".widget-html").last.inner_text()
    assert re.search(r"re-run \d+\.\d+ s", status), status
    report = f"v slider -> new curve drawn: {seconds:.2f} s in the browser; the kernel's status line: {status}"
    (screenshot_dir / "replot.txt").write_text(report + "\n")   # a measurement, not a timed assertion
    print(report)
    assert after_v[BASELINE]["y"] == before[BASELINE]["y"]          # the baseline is not re-run

    # The i slider through its readout box, as a user types a value.
    i = panel.locator(".widget-slider", has=page.locator(".widget-label", has_text="i (passes)"))
    readout = i.locator(".widget-readout")
    readout.click()
    page.keyboard.press("Control+a")
    page.keyboard.type("10")
    page.keyboard.press("Enter")
    redraw(page, figure, after_v, deadline)
    assert readout.inner_text() == "10"

    page.locator('.jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current').click()   # more room for the page
    panel.scroll_into_view_if_needed()
    page.screenshot(path=screenshot_dir / "notebook01.png")
    after_i = figure.evaluate(FIGURE_STATE)

    # A browser reload, the kernel still running: the panel is drawn again as it stands, and redraws.
    page.on("dialog", lambda dialog: dialog.accept())        # "leave the page?", if JupyterLab asks
    page.reload(timeout=deadline.ms(60))
    page.locator(".jp-StatusBar-Widget").get_by_text(KERNEL_IDLE).wait_for(timeout=deadline.ms(90))
    panel = page.locator(".jp-OutputArea-output", has=page.locator(".widget-slider"))
    figure = panel.locator(".js-plotly-plot")
    figure.locator(".scatterlayer .trace").nth(CURRENT).wait_for(timeout=deadline.ms(60))
    reloaded = figure.evaluate(FIGURE_STATE)
    assert len(reloaded) == 4 and all(t["y"] and t["d"] for t in reloaded)     # every curve drawn, none empty
    assert [t["y"] for t in reloaded] == [t["y"] for t in after_i]           # the curves as the knobs left them
    x_range = figure.evaluate("gd => gd._fullLayout.xaxis.range")
    assert x_range[1] >= len(reloaded[CURRENT]["y"]) - 1 > 6, x_range        # the steps, not plotly's -1..6
    v = panel.locator(".widget-slider", has=page.locator(".widget-label", has_text="v (sync)"))
    assert v.locator(".widget-readout").inner_text() == str(v0 + 1)
    v.locator(".noUi-handle").focus()
    page.keyboard.press("ArrowRight")
    redraw(page, figure, reloaded, deadline)
    assert v.locator(".widget-readout").inner_text() == str(v0 + 2)
    panel.scroll_into_view_if_needed()
    page.screenshot(path=screenshot_dir / "notebook01_reloaded.png")
    assert not chromium_page.errors, chromium_page.errors


def test_notebook02_live_panel_runs_from_its_button_and_an_interrupt_stops_it(lab_server, chromium_page,
                                                                              screenshot_dir, deadline):
    page = chromium_page.page
    run_all(page, lab_server, NOTEBOOK02, deadline, 600)

    # The live panel: the study's cached curves (a band and a line per arm) and the live run's, which the
    # cell trained for its first steps.
    panel = page.locator(".jp-OutputArea-output", has=page.locator(".widget-button", has_text="Stop"))
    assert panel.count() == 1
    assert "Kernel > Interrupt ends a run" in panel.locator(".widget-html").first.inner_text()
    figure = panel.locator(".js-plotly-plot")
    figure.locator(".scatterlayer .trace").last.wait_for(timeout=deadline.ms(30))
    before = figure.evaluate(FIGURE_STATE)
    cached, live = before[:-1], before[-1]
    assert len(cached) >= 1 and all(t["y"] and t["d"] for t in cached)      # the study's curves are drawn
    assert len(live["y"]) >= 1 and live["d"]

    # Run in the background: new points of the live curve appear over the cached ones, step by step.
    panel.locator(".widget-button", has_text="Run").click(timeout=deadline.ms(10))
    page.wait_for_function(
        """([gd, n]) => gd.data[gd.data.length - 1].y.length > n""", arg=[figure.element_handle(), len(live["y"])],
        timeout=deadline.ms(120), polling=200)
    assert figure.evaluate(FIGURE_STATE)[:-1] == cached                     # the cached curves stay as they were

    # Kernel > Interrupt while the run trains: it stops after its step, and the kernel takes the next cell.
    page.get_by_role("menuitem", name="Kernel", exact=True).click(timeout=deadline.ms(10))
    page.get_by_role("menuitem", name=re.compile(r"^Interrupt Kernel")).click(timeout=deadline.ms(10))
    status = panel.locator(".widget-html").last
    status.get_by_text(re.compile("stopped by Kernel > Interrupt at step")).wait_for(timeout=deadline.ms(120))
    text = status.inner_text()
    stopped_at = int(re.search(r"stopped by Kernel > Interrupt at step (\d+)", text).group(1))
    assert stopped_at < 20 and re.search(r"checkpoint .* GiB, one per panel", text), text
    page.locator(".jp-Notebook .jp-Cell").last.click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")                                                # a new cell below, as a user adds one
    page.keyboard.press("Enter")
    page.keyboard.type("print('kernel usable at step', panel.loop.k)")
    page.keyboard.press("Shift+Enter")
    page.locator(".jp-OutputArea-output", has_text=f"kernel usable at step {stopped_at}").wait_for(
        timeout=deadline.ms(60))
    (screenshot_dir / "notebook02_interrupt.txt").write_text(text + "\n")
    panel.scroll_into_view_if_needed()
    page.screenshot(path=screenshot_dir / "notebook02.png")
    assert not chromium_page.errors, chromium_page.errors


def test_gallery_page_draws_every_figure_offline(tmp_path, chromium_page, screenshot_dir, deadline):
    subprocess.run([sys.executable, "scripts/build_gallery.py", f"notebooks/{NOTEBOOK}", "--out", str(tmp_path)],
                   cwd=ROOT, check=True, timeout=deadline.ms(150) / 1000)
    html = tmp_path / NOTEBOOK.replace(".ipynb", ".html")
    figures = len(re.findall(r'class="plotly-graph-div"', html.read_text(encoding="utf-8")))
    assert figures >= 1

    page = chromium_page.page
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
               else route.abort())                      # offline: no CDN
    page.goto(html.as_uri(), timeout=deadline.ms(30))
    page.wait_for_function(f"[...document.querySelectorAll('.js-plotly-plot')].filter(p => p.querySelector('{DRAWN}'))"
                           f".length >= {figures}", timeout=deadline.ms(30))
    assert page.locator(".js-plotly-plot").count() == figures
    page.locator(".js-plotly-plot").first.scroll_into_view_if_needed()
    page.screenshot(path=screenshot_dir / "gallery01.png")
    assert (tmp_path / "index.html").is_file()
