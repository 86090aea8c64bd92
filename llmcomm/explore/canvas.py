"""An Agg canvas that remembers the glyph images of the texts it drew, so that a redrawn figure does not lay out
and rasterize its tick labels, titles and cell labels again: the explorer's panels redraw the same texts at
the same places view after view, and text is about half of what matplotlib spends drawing them.

Matplotlib's Agg renderer (``RendererAgg.draw_text``, matplotlib 3.11) lays out a string with FreeType
(``FT2Font._layout``), renders each glyph at its sub-pixel position (``FT2Font._render_glyph``) and blends each
glyph bitmap into the canvas with ``draw_text_image(bitmap, left, top, 0, gc)``. The bitmaps and their places
depend only on the string, the font (its properties and size), the canvas's dpi and height, the text's position
and angle, the antialiasing flag, the font features and language, and the hinting flag; the colour, alpha and
clipping are applied by ``draw_text_image`` from ``gc``. :class:`TextCache` records, on the first drawing of one
such key, the ``draw_text_image`` calls ``draw_text`` makes (copies of the bitmaps), and replays them with the
current ``gc`` on a later drawing: the same calls with the same arguments, so the pixels are the same (tested
against a plain Agg canvas). A ``draw_text`` that touches the renderer in any other way (mathtext boxes, TeX) is
never recorded, and math text is drawn as matplotlib draws it.

Bounded: at most :data:`MAX_BYTES` of bitmaps are kept (least recently used first out).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg, get_hinting_flag
from matplotlib.figure import Figure

MAX_BYTES = 32 * 2**20  # glyph bitmaps kept per cache


class TextCache:
    """The recorded ``draw_text_image`` calls per text key (least recently used dropped beyond
    :data:`MAX_BYTES`); ``hits`` and ``misses`` count replays and recordings."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.calls: OrderedDict[tuple, tuple[tuple[np.ndarray, int, int, float], ...]] = OrderedDict()
        self.nbytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple) -> tuple[tuple[np.ndarray, int, int, float], ...] | None:
        calls = self.calls.get(key)
        if calls is not None:
            self.calls.move_to_end(key)
            self.hits += 1
        return calls

    def put(self, key: tuple, calls: tuple[tuple[np.ndarray, int, int, float], ...]) -> None:
        self.misses += 1
        size = sum(c[0].nbytes for c in calls) + 200  # + the key and tuples, roughly
        if size > self.max_bytes:
            return
        self.calls[key] = calls
        self.nbytes += size
        while self.nbytes > self.max_bytes:
            _, old = self.calls.popitem(last=False)
            self.nbytes -= sum(c[0].nbytes for c in old) + 200


class _Recorder:
    """Stands for the C++ renderer while ``draw_text`` runs: forwards every call, records the
    ``draw_text_image`` ones and notes any other use (then the text is not recorded)."""

    def __init__(self, renderer: Any) -> None:
        self._renderer = renderer
        self.calls: list[tuple[np.ndarray, int, int, float]] = []
        self.other = False

    def draw_text_image(self, image: Any, x: Any, y: Any, angle: Any, gc: Any) -> None:
        self.calls.append((np.array(image, copy=True), x, y, angle))
        self._renderer.draw_text_image(image, x, y, angle, gc)

    def __getattr__(self, name: str) -> Any:
        self.other = True
        return getattr(self._renderer, name)


class CachedTextRenderer(RendererAgg):
    """:class:`RendererAgg` whose plain-text ``draw_text`` replays the glyph images :class:`TextCache` recorded
    for the same key (module doc)."""

    def __init__(self, width: int, height: int, dpi: float, cache: TextCache) -> None:
        super().__init__(width, height, dpi)
        self.text_cache = cache

    def draw_text(self, gc: Any, x: float, y: float, s: str, prop: Any, angle: float, ismath: Any = False,
                  mtext: Any = None) -> None:
        if ismath:
            return super().draw_text(gc, x, y, s, prop, angle, ismath, mtext)
        features = mtext.get_fontfeatures() if mtext is not None else None
        language = mtext.get_language() if mtext is not None else None
        key = (s, tuple(prop.__dict__.values()), self.dpi, self.height, float(x), float(y), float(angle),
               bool(gc.get_antialiased()), None if features is None else tuple(features), language,
               get_hinting_flag())
        calls = self.text_cache.get(key)
        if calls is not None:
            for image, bx, by, bangle in calls:
                self._renderer.draw_text_image(image, bx, by, bangle, gc)
            return None
        real = self._renderer
        rec = _Recorder(real)
        self._renderer = rec  # the recorder forwards every call
        try:
            super().draw_text(gc, x, y, s, prop, angle, ismath, mtext)
        finally:
            self._renderer = real
        if not rec.other:
            self.text_cache.put(key, tuple(rec.calls))
        return None


class CachedTextCanvas(FigureCanvasAgg):
    """An Agg canvas drawing with :class:`CachedTextRenderer` and the given :class:`TextCache`."""

    def __init__(self, figure: Figure, cache: TextCache) -> None:
        self.text_cache = cache
        super().__init__(figure)

    def get_renderer(self) -> RendererAgg:
        w, h = self.get_width_height(physical=True)
        key = w, h, self.figure.dpi
        if self._lastKey != key:
            self.renderer = CachedTextRenderer(w, h, self.figure.dpi, self.text_cache)
            self._lastKey = key  # type: ignore[assignment]  # FigureCanvasAgg declares it None
        return self.renderer


def attach(fig: Figure, cache: TextCache) -> Figure:
    """Draw ``fig`` on a :class:`CachedTextCanvas` sharing ``cache`` (a no-op when it already does)."""
    canvas = fig.canvas
    if not (isinstance(canvas, CachedTextCanvas) and canvas.text_cache is cache):
        CachedTextCanvas(fig, cache)
    return fig
