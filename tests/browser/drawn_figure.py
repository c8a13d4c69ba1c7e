"""What a plotly figure looks like once Chromium has drawn it, and the rules that drawing must keep to read.

:func:`draw` plots a figure in a Playwright page at a notebook's width and returns, in the figure's pixels, the
box of every piece of text the browser laid out (point and bar labels, annotations, tick labels, axis titles,
the figure's title), the legend's box, each subplot's plot area, and each trace's markers as plotly resolved them
(colour, symbol, size, pixel positions). :func:`problems` reads only that drawing, so it holds every figure to
the same rules: no label on another or on a tick label, no axis title inside another subplot or on the legend,
no text cut by the figure's edge, and series that stay apart (distinct series never share colour and marker in
one subplot, and no series hides whole under another).
"""

from __future__ import annotations

import json
from functools import cache
from itertools import combinations
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

NOTEBOOK_WIDTH = 700
"""Width (px) an unsized figure is drawn at: a ``FigureWidget``'s in JupyterLab, the narrowest a notebook shows."""
OVERLAP_PX = 2.0
"""Two boxes overlap when they share more than this many pixels both across and down (text boxes include the
font's line spacing, so stacked lines touch by about a pixel)."""
NEAR_TICK_PX = 6.0
"""A label nearer than this to a tick label, level with it, reads as part of that tick label."""
SMALLEST_TEXT_PX = 8.0
"""Text drawn smaller than this (plotly shrinks a bar's label to fit the bar) cannot be read."""
HIDDEN_PX = 2.0
"""A marker within this many pixels of a filled marker's centre, and not larger than it, is hidden by it."""

MEASURE = """() => {
    const gd = document.getElementById('figure'), fl = gd._fullLayout;
    const origin = gd.querySelector('.main-svg').getBoundingClientRect();
    const box = el => { const r = el.getBoundingClientRect();
        return [r.left - origin.left, r.top - origin.top, r.right - origin.left, r.bottom - origin.top]; };
    const texts = [];
    const add = (kind, owner, el) => { const t = el.textContent.trim(), b = box(el), m = el.getCTM();
        const size = parseFloat(getComputedStyle(el).fontSize) * Math.hypot(m.a, m.b);
        if (t && b[2] - b[0] > 0 && b[3] - b[1] > 0) texts.push({kind, owner, text: t, box: b, size}); };
    gd.querySelectorAll('.textpoint text, text.bartext').forEach(el => add('label', '', el));
    gd.querySelectorAll('.annotation-text').forEach(el => add('annotation', '', el));
    gd.querySelectorAll('.xaxislayer-above text, .yaxislayer-above text').forEach(
        el => add('tick', el.parentNode.getAttribute('class').replace('tick', ''), el));
    gd.querySelectorAll('text').forEach(el => { const c = el.getAttribute('class') || '';
        if (/^[xy]\\d*title$/.test(c)) add('axis title', c.slice(0, -5), el); });
    gd.querySelectorAll('.gtitle').forEach(el => add('title', '', el));
    gd.querySelectorAll('.legend .legendtext').forEach(el => add('legend entry', '', el));
    const legend = gd.querySelector('.legend .bg');
    const panels = Object.values(fl._plots).map(p => ({x: p.xaxis._id, y: p.yaxis._id,
        box: [p.xaxis._offset, p.yaxis._offset, p.xaxis._offset + p.xaxis._length,
              p.yaxis._offset + p.yaxis._length]}));
    const markers = gd._fullData.filter(t => t.visible === true && t.type === 'scatter'
                                            && (t.mode || '').includes('markers')).map(t => {
        const xa = fl[t.xaxis.replace('x', 'xaxis')], ya = fl[t.yaxis.replace('y', 'yaxis')];
        const at = (t.x || []).map((x, i) => [xa._offset + xa.l2p(xa.d2l(x)), ya._offset + ya.l2p(ya.d2l(t.y[i]))])
                              .filter(p => isFinite(p[0]) && isFinite(p[1]));
        return {index: t.index, name: t.name || '', group: t.legendgroup || '', panel: t.xaxis + t.yaxis,
                color: JSON.stringify(t.marker.color), symbol: JSON.stringify(t.marker.symbol),
                size: Math.max(...[].concat(t.marker.size)), at};
    });
    const categories = Object.fromEntries(Object.keys(fl).filter(k => /^[xy]axis\\d*$/.test(k))
        .map(k => [fl[k]._id, fl[k].type === 'category' && fl[k].visible && fl[k].showticklabels
                               ? fl[k]._categories.length : 0]));
    return {width: fl.width, height: fl.height, texts, panels, markers, categories,
            legend: legend ? box(legend) : null};
}"""


@cache
def page_html() -> str:
    """One page with plotly.js inlined (no network) and a figure div :data:`NOTEBOOK_WIDTH` px wide."""
    return (f"<html><head><meta charset='utf-8'><script>{get_plotlyjs()}</script></head>"
            f"<body style='margin:0'><div id='figure' style='width:{NOTEBOOK_WIDTH}px'></div></body></html>")


def draw(page: Any, fig: go.Figure) -> dict[str, Any]:
    """Plot ``fig`` in ``page`` (a page showing :func:`page_html`) and return what :data:`MEASURE` reads."""
    spec = json.loads(fig.to_json())
    page.evaluate("spec => { Plotly.purge('figure'); "
                  "return Plotly.newPlot('figure', spec.data, spec.layout, {responsive: false}); }", spec)
    return page.evaluate(MEASURE)


def overlap(a: list[float], b: list[float], across: float = -OVERLAP_PX) -> bool:
    """Two boxes [left, top, right, bottom] share more than :data:`OVERLAP_PX` down and more than ``-across``
    across (``across`` > 0: they are nearer than that across)."""
    return (min(a[2], b[2]) - max(a[0], b[0]) > -across) and (min(a[3], b[3]) - max(a[1], b[1]) > OVERLAP_PX)


def problems(drawing: dict[str, Any]) -> list[str]:
    """What keeps the drawn figure from reading, one line each (empty: it reads)."""
    out: list[str] = []
    texts, width, height = drawing["texts"], drawing["width"], drawing["height"]
    labels = [t for t in texts if t["kind"] in ("label", "annotation")]
    # a label on another label, or on (or next to) a tick label, on an axis title, the title or the legend
    for a, b in combinations(labels, 2):
        if overlap(a["box"], b["box"]):
            out.append(f"the {a['kind']}s {a['text']!r} and {b['text']!r} overlap")
    for a in labels:
        for b in texts:
            if b["kind"] == "tick" and overlap(a["box"], b["box"], across=NEAR_TICK_PX):
                out.append(f"the {a['kind']} {a['text']!r} lies on or next to the tick label {b['text']!r}")
            elif b["kind"] in ("axis title", "title", "legend entry") and overlap(a["box"], b["box"]):
                out.append(f"the {a['kind']} {a['text']!r} lies on the {b['kind']} {b['text']!r}")
    # text too small to read; a tick label under the legend; a category axis that labels only some categories
    for t in texts:
        if t["size"] < SMALLEST_TEXT_PX:
            out.append(f"the {t['kind']} {t['text']!r} is drawn at {t['size']:.1f} px, under {SMALLEST_TEXT_PX:g}")
        if t["kind"] == "tick" and drawing["legend"] and overlap(t["box"], drawing["legend"]):
            out.append(f"the tick label {t['text']!r} lies under the legend")
    for axis, count in drawing["categories"].items():
        shown = sum(1 for t in texts if t["kind"] == "tick" and t["owner"] == axis)
        if count and shown < count:
            out.append(f"the axis {axis} labels {shown} of its {count} categories")
    # an axis title inside a subplot other than its own, or on the legend
    for t in (t for t in texts if t["kind"] == "axis title"):
        for panel in drawing["panels"]:
            if t["owner"] not in (panel["x"], panel["y"]) and overlap(t["box"], panel["box"]):
                out.append(f"the axis title {t['text']!r} ({t['owner']}) lies inside the subplot "
                           f"{panel['x']}{panel['y']}")
        if drawing["legend"] and overlap(t["box"], drawing["legend"]):
            out.append(f"the axis title {t['text']!r} lies on the legend")
    # text cut by the figure's edge
    for t in texts:
        left, top, right, bottom = t["box"]
        if left < -1 or top < -1 or right > width + 1 or bottom > height + 1:
            out.append(f"the {t['kind']} {t['text']!r} is cut by the figure's edge "
                       f"(box {[round(v) for v in t['box']]}, figure {width}×{height})")
    # distinct series never share colour and marker in one subplot; no series hides whole under one drawn later
    for a, b in combinations(drawing["markers"], 2):
        if a["panel"] != b["panel"] or a["name"] == b["name"] or (a["group"] and a["group"] == b["group"]):
            continue
        if (a["color"], a["symbol"]) == (b["color"], b["symbol"]):
            out.append(f"series {a['name']!r} and {b['name']!r} share colour {a['color']} and marker {a['symbol']}")
        elif a["at"] and "open" not in b["symbol"] and a["size"] <= b["size"] and all(
                any(abs(p[0] - q[0]) <= HIDDEN_PX and abs(p[1] - q[1]) <= HIDDEN_PX for q in b["at"]) for p in a["at"]):
            out.append(f"series {a['name']!r} lies whole under {b['name']!r}'s markers, drawn over it and as large")
    return sorted(set(out))
