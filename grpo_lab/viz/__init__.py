"""Drawing only: figures, live panels and exercises for the notebooks.

The numbers they draw are computed elsewhere (:mod:`grpo_lab.exact.bandit_lab`,
:mod:`grpo_lab.scale.throughput`, a run's ``metrics.jsonl``).

=================== ============================================================
``display``         the display switch (``GRPO_LAB_DISPLAY``: widget/static/none)
``plots``           notebook 01's figures of the bandit studies
``widgets``         :class:`BanditPanel`, sliders that re-train and redraw in place
``live_panel``      notebook 02's :class:`LivePanel`: knobs over a language-model run, its live exact J
``exercises``       ``check(name, fn)`` against the library, ``show_solution(name)``
``dashboard``       a run's metrics over steps (notebooks 02 and 03)
``throughput``      notebook 03's figures: step times, predicted speed-ups
``demo``            ``make demo``: notebook 01's headline figures without a browser
=================== ============================================================
"""

from .display import display_mode, new_figure, show
from .exercises import check, show_solution
from .widgets import BanditPanel

__all__ = ["display_mode", "new_figure", "show", "check", "show_solution", "BanditPanel"]
