"""Figures, live panels and exercises for the notebooks (notebook 01: the bandit lab).

=================== ============================================================
``display``         the display switch (``GRPO_LAB_DISPLAY``: widget/static/none)
``lab``             the runs and exact studies behind each figure (``GRPO_LAB_SMOKE``)
``plots``           plotly figures built from those results
``widgets``         :class:`BanditPanel`, sliders that re-train and redraw in place
``exercises``       ``check(name, fn)`` against the library, ``show_solution(name)``
=================== ============================================================
"""

from .display import display_mode, new_figure, show
from .exercises import check, show_solution
from .widgets import BanditPanel

__all__ = ["display_mode", "new_figure", "show", "check", "show_solution", "BanditPanel"]
