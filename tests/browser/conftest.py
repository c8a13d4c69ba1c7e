"""Fixtures for the end-to-end browser tests: a private JupyterLab server and headless Chromium.

The tests here run only when asked for (``make test-browser`` sets ``GRPO_LAB_BROWSER=1``); a plain
``pytest tests`` reports them as skipped. When asked for, a missing Chromium or Playwright is a
failure, not a skip: ``scripts/browser_deps.sh`` installs both.

=========================== ===================================================================
``GRPO_LAB_BROWSER=1``      run the browser tests
``CHROMIUM``                the browser binary (default ``/usr/bin/chromium``, Debian's package)
``GRPO_LAB_BROWSER_OUT``    where screenshots go (default ``outputs/browser/``)
``GRPO_LAB_BROWSER_FULL=1`` the notebook at full size (300 steps × 8 runs), to measure a slider's
                            real re-plot time; default: smoke mode, as CI runs it
=========================== ===================================================================

JupyterLab serves a *copy* of ``notebooks/`` (its autosave would otherwise write outputs into the
committed notebooks) with its own config, runtime and settings folders, on 127.0.0.1 only, with a
random token, ``GRPO_LAB_SMOKE=1`` (unless ``GRPO_LAB_BROWSER_FULL=1``) and no network use of its own
(no news, no extension manager).
Every wait draws on one :class:`Deadline` (900 s for the session); the server, its kernels and the browser are killed at
teardown, and teardown fails if any of their processes survive.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
REQUEST_ENV = "GRPO_LAB_BROWSER"
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_FLAGS = ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]   # Playwright adds --headless, --no-sandbox
VIEWPORT = {"width": 1400, "height": 1000}
# JupyterLab user settings: every cell in the DOM (no windowing), no news or update checks.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false",
                                                                        "checkForUpdates": False},
}


def requested() -> bool:
    """True when the browser tests were asked for (``GRPO_LAB_BROWSER=1``)."""
    return os.environ.get(REQUEST_ENV, "").strip() not in ("", "0")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"browser: drives a real browser; runs only with {REQUEST_ENV}=1 "
                                       "(make test-browser)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if requested():
        return
    skip = pytest.mark.skip(reason=f"browser test not requested: `make test-browser` (sets {REQUEST_ENV}=1)")
    for item in items:
        if "browser" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Keep each phase's report on the item, so a fixture can tell that its test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


class Deadline:
    """One time budget shared by many waits, so that together they are bounded."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def ms(self, cap_s: float) -> float:
        """Milliseconds for the next wait: at most ``cap_s``, at most what is left (fails when nothing is)."""
        left = self.end - time.monotonic()
        if left <= 0:
            pytest.fail("the browser tests ran out of their time budget")
        return 1000 * min(cap_s, left)


@dataclass
class LabServer:
    """A running JupyterLab: its process, base URL, token and the folder it serves."""

    process: subprocess.Popen
    base_url: str
    token: str
    notebook_dir: Path
    log: Path

    def url(self, path: str) -> str:
        return f"{self.base_url}/{path}?token={self.token}"

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(server: LabServer, timeout_s: float) -> None:
    """Poll ``/api/status`` until the server answers; fail early if it exits."""
    end = time.monotonic() + timeout_s
    request = urllib.request.Request(f"{server.base_url}/api/status",
                                     headers={"Authorization": f"token {server.token}"})
    while time.monotonic() < end:
        if server.process.poll() is not None:
            pytest.fail(f"JupyterLab exited with {server.process.returncode}:\n{server.log_tail()}")
        try:
            with urllib.request.urlopen(request, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"JupyterLab did not answer within {timeout_s:.0f} s:\n{server.log_tail()}")


def stop(process: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the server (it shuts its kernels down), then SIGKILL whatever of its tree is left,
    and fail if any process of the tree is still alive."""
    try:
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(tree, timeout=grace_s)
    for p in alive:
        p.kill()
    _, alive = psutil.wait_procs(alive, timeout=5)
    process.wait(timeout=5)
    assert not alive, f"processes left after stopping JupyterLab: {[p.pid for p in alive]}"


@pytest.fixture
def lab_server(tmp_path: Path, deadline: Deadline) -> Iterator[LabServer]:
    """JupyterLab on a free 127.0.0.1 port, serving a copy of notebooks/ (in smoke mode by default)."""
    notebook_dir, config_dir = tmp_path / "notebooks", tmp_path / "jupyter-config"
    shutil.copytree(ROOT / "notebooks", notebook_dir, ignore=shutil.ignore_patterns("runs", ".ipynb_checkpoints"))
    for name, values in LAB_SETTINGS.items():
        path = config_dir / "lab" / "user-settings" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    smoke = "0" if os.environ.get("GRPO_LAB_BROWSER_FULL", "") not in ("", "0") else "1"
    env = {**os.environ, "GRPO_LAB_SMOKE": smoke, "JUPYTER_CONFIG_DIR": str(config_dir),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime"),
           # the copies import studies/ from this checkout, as the originals do from the folder beside notebooks/
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    env.pop("GRPO_LAB_DISPLAY", None)                        # auto: live widgets in the kernel
    port, token, log = free_port(), secrets.token_hex(16), tmp_path / "jupyterlab.log"
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--port={port}", "--ServerApp.port_retries=0", f"--ServerApp.token={token}",
               f"--notebook-dir={notebook_dir}", "--LabApp.extension_manager=readonly"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=notebook_dir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    server = LabServer(process, f"http://127.0.0.1:{port}", token, notebook_dir, log)
    try:
        wait_until_up(server, timeout_s=deadline.ms(60) / 1000)
        yield server
    finally:
        stop(process)


@dataclass
class BrowserPage:
    """A Playwright page and the uncaught JavaScript errors it has seen."""

    page: object
    errors: list[str]


@pytest.fixture
def chromium_page(request: pytest.FixtureRequest, tmp_path: Path, screenshot_dir: Path) -> Iterator[BrowserPage]:
    """A page in headless Chromium (the system binary, a new empty profile), driven by Playwright.
    If the test fails, the page is saved as ``failed-<test>.png`` next to the screenshots."""
    if not CHROMIUM.is_file():
        pytest.fail(f"Chromium not found at {CHROMIUM}: run scripts/browser_deps.sh (or set CHROMIUM)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the Python package playwright is missing: run scripts/browser_deps.sh")
    failed_png = screenshot_dir / f"failed-{request.node.name}.png"
    failed_png.unlink(missing_ok=True)
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            tmp_path / "chromium-profile", executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS,
            viewport=VIEWPORT)
        try:
            page = context.pages[0] if context.pages else context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            yield BrowserPage(page, errors)
            if getattr(request.node, "report_call", None) is None or request.node.report_call.failed:
                page.screenshot(path=failed_png, timeout=10_000)
        finally:
            context.close()


@pytest.fixture(scope="session")
def deadline() -> Deadline:
    """One budget for every wait of every browser test in the session: under 15 minutes in all (notebook
    02 loads SmolLM2 and trains in smoke mode on 2 cores)."""
    return Deadline(900)


@pytest.fixture
def screenshot_dir() -> Path:
    """Where screenshots are kept after the test (outputs/ is not committed)."""
    path = Path(os.environ.get("GRPO_LAB_BROWSER_OUT", ROOT / "outputs" / "browser"))
    path.mkdir(parents=True, exist_ok=True)
    return path
