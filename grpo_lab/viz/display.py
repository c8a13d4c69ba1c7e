"""Where figures go: a live widget, a static figure, or nowhere (headless runs).

One switch, in this order: the ``mode`` argument, else the environment variable
``GRPO_LAB_DISPLAY``, else ``auto``.

========== ====================================================================
mode       effect
========== ====================================================================
``widget`` ``plotly.graph_objects.FigureWidget`` (needs ``anywidget``): a panel's
           sliders redraw the figure in place
``static`` plain ``go.Figure``, displayed once (nbconvert, HTML export)
``none``   figures are built but not displayed (scripts, tests)
``auto``   ``widget`` inside a Jupyter kernel, ``none`` elsewhere
========== ====================================================================

Every code path runs in every mode: only the display differs, so a notebook
executed without a front end (nbval, ``jupyter nbconvert --execute``) builds the
same figures and raises no error.

A live panel changes its figure inside :func:`redraw`, so that a page reloaded (or the notebook
reopened) while the kernel runs draws the figure as it now is; it prints a one-line hint above
itself for after a kernel restart (:data:`RESTART_HINT`), and a title placed by
:func:`title_below_toolbar` stays clear of plotly's toolbar.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from copy import deepcopy
from typing import Any

import plotly.graph_objects as go

from ..checks import require_choice

DISPLAY_ENV = "GRPO_LAB_DISPLAY"
DISPLAY_MODES = ("auto", "widget", "static", "none")


def in_kernel() -> bool:
    """True inside a Jupyter kernel (a front end may be listening)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def display_mode(mode: str | None = None) -> str:
    """Resolve the display mode: argument > ``GRPO_LAB_DISPLAY`` > ``auto``; never returns ``auto``."""
    chosen = mode if mode is not None else os.environ.get(DISPLAY_ENV, "auto").strip().lower() or "auto"
    require_choice("mode" if mode is not None else DISPLAY_ENV, chosen, DISPLAY_MODES)
    if chosen == "auto":
        return "widget" if in_kernel() else "none"
    return chosen


def new_figure(mode: str | None = None, **layout: Any) -> go.Figure:
    """An empty figure: a ``FigureWidget`` in widget mode (plain ``go.Figure`` if
    ``anywidget`` is missing), a ``go.Figure`` otherwise."""
    if display_mode(mode) == "widget":
        try:
            return go.FigureWidget(layout=layout)
        except ImportError:
            pass
    return go.Figure(layout=layout)


@contextlib.contextmanager
def redraw(figure: go.Figure) -> Iterator[None]:
    """Change ``figure``'s traces and layout inside this block. A ``FigureWidget``'s open views redraw once, at
    the block's end, and the widget's synced state takes the figure as it now is.

    A ``FigureWidget`` sends its traces to the browser whole only when it is built or displayed on its own;
    every later change goes as a message to the views open at that moment (a restyle, an added trace). A
    view opened later (a reloaded page, the notebook reopened while the kernel runs) is drawn from the
    synced state, which without this block still holds the figure as it was built: no traces added since,
    axes at plotly's default -1..6, and restyles of traces that view does not have. A plain figure only
    takes the changes."""
    if not isinstance(figure, go.FigureWidget):
        yield
        return
    with figure.batch_update():
        yield
    figure._widget_data = deepcopy(figure._data)               # what plotly's own display does, for new views
    figure._widget_layout = deepcopy(figure._layout_obj._props)


def show(obj: Any, mode: str | None = None) -> None:
    """Display a figure or widget in a kernel unless the mode is ``none``; outside
    a kernel nothing is displayed (no browser is opened)."""
    if display_mode(mode) == "none" or not in_kernel():
        return
    from IPython.display import display

    display(obj)


RESTART_HINT = 'After a kernel restart this panel reads "Error displaying widget: model not found": re-run this cell.'
"""Printed above a live panel: a notebook saved with its outputs keeps this line, while the panel's widgets
lived in the kernel and are gone once it restarts."""


def show_panel(mode: str, widget: Callable[[], Any], figure: Any, status: str) -> None:
    """A live panel: in widget mode the whole widget, under a one-line hint for after a kernel restart
    (:data:`RESTART_HINT`); in static mode its figure as it is now, then its status line (the knobs do
    nothing without a front end)."""
    if mode == "widget":
        if in_kernel():
            print(RESTART_HINT)
        show(widget(), mode)
    elif mode == "static":
        show(figure, mode)
        print(status)


TOOLBAR_PX = 32
"""Height of plotly's toolbar (the mode bar), drawn over the top right corner of a figure on hover."""
TITLE_LINE_PX = 24
"""Height of one line of a figure's title (plotly's 17 px title font, with its line spacing)."""


def title_below_toolbar(text: str, height: int, headroom: int = 0) -> dict[str, Any]:
    """Layout of a figure ``height`` px tall whose title plotly's toolbar cannot cover: the title's top
    sits :data:`TOOLBAR_PX` below the figure's top, and the top margin holds the toolbar, the title's
    lines (``<br>`` breaks them) and ``headroom`` px more (subplots' own titles)."""
    lines = text.count("<br>") + 1 if text else 0
    return dict(height=height, title=dict(text=text, y=1 - TOOLBAR_PX / height, yref="container", yanchor="top"),
                margin=dict(t=TOOLBAR_PX + lines * TITLE_LINE_PX + headroom))
