#!/usr/bin/env bash
# Install what `make test-browser` needs, only when missing (safe to re-run):
#   - Chromium from the distribution (apt; Debian's `chromium` package -> /usr/bin/chromium)
#   - the Python `playwright` package in the project's venv (driver only: Playwright's own
#     browser download is never used; the test launches the system Chromium).
# Usage: scripts/browser_deps.sh [VENV]   (default .venv; CHROMIUM=/path overrides the browser)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
PY="$VENV/bin/python"
CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"

if [ -x "$CHROMIUM" ]; then
    echo "chromium: $("$CHROMIUM" --version 2>/dev/null || echo "$CHROMIUM")"
else
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    echo "chromium: installing with apt-get"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-liberation
    "$CHROMIUM" --version
fi

if [ ! -x "$PY" ]; then
    echo "no venv at $VENV: run 'make setup' first" >&2
    exit 1
fi
if "$PY" -c "import playwright.sync_api" 2>/dev/null; then
    echo "playwright: $("$PY" -m pip show playwright 2>/dev/null | sed -n 's/^Version: //p')"
else
    echo "playwright: installing into $VENV"
    "$PY" -m pip install -q --disable-pip-version-check playwright
fi
