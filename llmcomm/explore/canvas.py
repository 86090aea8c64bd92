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

Three finer caches serve the texts met for the first time (a new figure's cell labels, ticks and titles at new
places): the layout of a string (``font._layout``: its glyphs and their offsets from the text's origin) is kept
per string, font object, size, dpi, hinting flag, font features and language; the size of a string (``get_text_width_height_descent``: FreeType's ``set_text`` of the whole string,
about half a millisecond, asked for every text of every new figure because matplotlib caches it per renderer,
``text._get_text_metrics_function``) is kept per string, font object, size, dpi and hinting flag, which are
all it depends on; and each glyph's bitmap is kept per font object, size, dpi, glyph, transform, hinting flag,
render mode and the fractional part (in FreeType's 1/64 pixels) of the place matplotlib renders it at
(``RendererAgg._draw_text_glyphs_and_boxes``: ``font._set_transform`` with the pen position rounded to 1/64
pixel, then ``font._render_glyph``), with its offset from the whole-pixel part: FreeType moves an outline by
the transform's translation after hinting (``FT_Load_Glyph``) and rasterizes in 1/64-pixel integers, so a
glyph placed whole pixels further is the same bitmap placed whole pixels further. The replayed glyphs go to
the same ``draw_text_image`` calls as matplotlib's (tested against a plain Agg canvas, texts at many places).

A string's size is not asked of FreeType when its layout is at hand: ``set_text`` (matplotlib 3.11
``src/ft2font.cpp``, ``FT2Font::set_text``; ``get_width_height`` and ``get_descent``) loads each glyph at its pen
position and returns the pen's advance after the last glyph as the width and the union of the glyphs' control
boxes as the height and descent; at angle 0 every pen position lies on the baseline and is a glyph's place in
the layout (``font._layout``, which the drawing needs anyway), and a glyph's control box moved along the
baseline keeps its vertical extent. So the size of a string whose layout has one glyph per character, in order,
on the baseline, all from the font's tables, is the last glyph's place plus its advance, and the lowest and
highest edges of its glyphs, each glyph's advance and edges measured once (``set_text`` of that one character,
kept per font object, glyph, size, dpi and hinting flag): the same integers in 1/64 pixel, so the same floats
(tested on thousands of strings against ``RendererAgg``'s). Any other string is measured by FreeType.

While a figure is drawn on a :class:`CachedTextCanvas`, the font each text's properties name
(``get_font(fontManager._find_fonts_by_props(prop))``, whose cache key reads eleven rcParams at every call) and
the hinting flag (an rcParam) are looked up once per set of properties (the rcParams do not change while a
figure draws); outside a drawing they are looked up at each call, as matplotlib does.

Bounded: at most :data:`MAX_BYTES` of bitmaps are kept (least recently used first out), and at most
:data:`MAX_SIZES` string sizes (and as many string layouts, and glyph extents).

Only on the matplotlib it was written against (:data:`SUPPORTED`: matplotlib 3.11 with the Agg and FreeType
internals named above present): on any other version :func:`attach` leaves a figure on matplotlib's own Agg
canvas, so the explorer draws the same figures, only without the cache's saving.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg, get_hinting_flag
from matplotlib.figure import Figure
from matplotlib.font_manager import fontManager, get_font
from matplotlib.ft2font import FT2Font, RenderMode


def _supported() -> bool:
    """Whether this matplotlib is the one the overrides below follow line by line (3.11) and still has every
    private name they call or override."""
    import matplotlib

    major_minor = tuple(int(p) for p in matplotlib.__version__.split(".")[:2] if p.isdigit())
    return (major_minor == (3, 11)
            and hasattr(RendererAgg, "_draw_text_glyphs_and_boxes")
            and all(hasattr(FT2Font, n) for n in ("_layout", "_render_glyph", "_set_transform"))
            and hasattr(FigureCanvasAgg, "_lastKey"))


SUPPORTED: bool = _supported()  # False: attach() keeps matplotlib's own canvas (module doc)
MAX_BYTES = 32 * 2**20  # glyph bitmaps kept per cache (texts' and single glyphs' together)
MAX_SIZES = 65_536  # string sizes kept per cache


class TextCache:
    """The recorded ``draw_text_image`` calls per text key (least recently used dropped beyond
    :data:`MAX_BYTES`); ``hits`` and ``misses`` count replays and recordings."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.calls: OrderedDict[tuple, tuple[tuple[np.ndarray, int, int, float], ...]] = OrderedDict()
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self.sizes: dict[tuple, tuple[float, float, float]] = {}  # string sizes (module doc)
        self.layouts: dict[tuple, tuple] = {}  # string layouts: (font, glyph, x, y, char) per glyph (module doc)
        self.extents: dict[tuple, tuple[int, int, int] | None] = {}  # glyph advance, lowest, highest edge (1/64 px)
        self.heights: dict[tuple, tuple] = {}  # fonts' ascent, descent, line gap per size and dpi
        self.glyphs: OrderedDict[tuple, tuple[np.ndarray, int, int]] = OrderedDict()  # bitmap, left, top
        self.glyph_hits = 0

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

    def size(self, key: tuple) -> tuple[float, float, float] | None:
        return self.sizes.get(key)

    def put_size(self, key: tuple, value: tuple[float, float, float]) -> None:
        if len(self.sizes) >= MAX_SIZES:
            self.sizes.clear()
        self.sizes[key] = value

    def layout(self, key: tuple) -> tuple | None:
        return self.layouts.get(key)

    def put_layout(self, key: tuple, items: tuple) -> None:
        if len(self.layouts) >= MAX_SIZES:
            self.layouts.clear()
        self.layouts[key] = items

    def extent(self, key: tuple) -> tuple[int, int, int] | None | bool:
        """A glyph's advance, lowest and highest edge in 1/64 pixel; ``None`` when its size cannot be measured
        alone (module doc); ``False`` when not measured yet."""
        return self.extents.get(key, False)

    def put_extent(self, key: tuple, value: tuple[int, int, int] | None) -> None:
        if len(self.extents) >= MAX_SIZES:
            self.extents.clear()
        self.extents[key] = value

    def glyph(self, key: tuple) -> tuple[np.ndarray, int, int] | None:
        g = self.glyphs.get(key)
        if g is not None:
            self.glyph_hits += 1
        return g

    def put_glyph(self, key: tuple, value: tuple[np.ndarray, int, int]) -> None:
        self.glyphs[key] = value
        self.nbytes += value[0].nbytes + 100
        while self.nbytes > self.max_bytes and self.glyphs:
            _, old = self.glyphs.popitem(last=False)
            self.nbytes -= old[0].nbytes + 100


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
        self._fonts: dict[tuple, FT2Font] | None = None  # while a figure draws: font object per font properties
        self._flags: Any = None  # while a figure draws: the hinting flag

    @contextmanager
    def drawing(self) -> Iterator[None]:
        """While the body runs (one figure's drawing), look up each font properties' font and the hinting flag
        once (module doc)."""
        self._fonts, self._flags = {}, get_hinting_flag()
        try:
            yield
        finally:
            self._fonts, self._flags = None, None

    def _font_of(self, prop: Any) -> FT2Font:
        """``get_font(fontManager._find_fonts_by_props(prop))``, once per font properties while a figure draws."""
        fonts = self._fonts
        if fonts is None:
            return get_font(fontManager._find_fonts_by_props(prop))
        key = tuple(prop.__dict__.values())
        font = fonts.get(key)
        if font is None:
            font = fonts[key] = get_font(fontManager._find_fonts_by_props(prop))
        return font

    def _hinting(self) -> Any:
        return get_hinting_flag() if self._flags is None else self._flags

    def draw_text(self, gc: Any, x: float, y: float, s: str, prop: Any, angle: float, ismath: Any = False,
                  mtext: Any = None) -> None:
        if ismath:
            return super().draw_text(gc, x, y, s, prop, angle, ismath, mtext)
        features = mtext.get_fontfeatures() if mtext is not None else None
        language = mtext.get_language() if mtext is not None else None
        key = (s, tuple(prop.__dict__.values()), self.dpi, self.height, float(x), float(y), float(angle),
               bool(gc.get_antialiased()), None if features is None else tuple(features), language,
               self._hinting())
        calls = self.text_cache.get(key)
        if calls is not None:
            for image, bx, by, bangle in calls:
                self._renderer.draw_text_image(image, bx, by, bangle, gc)
            return None
        real = self._renderer
        rec = _Recorder(real)
        self._renderer = rec  # the recorder forwards every call
        try:
            self._draw_plain(gc, x, y, s, prop, angle, features, language)
        finally:
            self._renderer = real
        if not rec.other:
            self.text_cache.put(key, tuple(rec.calls))
        return None


    def _draw_plain(self, gc: Any, x: float, y: float, s: str, prop: Any, angle: float, features: Any,
                    language: Any) -> None:
        """``RendererAgg.draw_text`` of plain text (matplotlib 3.11 ``backends/backend_agg.py``, lines 235-249:
        FreeType's layout of the string, ``font._layout``, then its glyphs drawn) with the layout kept
        (:meth:`_layout_items`)."""
        flags = self._hinting()
        size = prop.get_size_in_points()
        items = self._layout_items(s, prop, self._font_of(prop), size, flags, features, language)
        self._draw_text_glyphs_and_boxes(gc, x, y, angle,
                                         ((f, size, g, 0, 1, gx, gy) for f, g, gx, gy, _ in items), ())

    def _layout_items(self, s: str, prop: Any, font: Any, size: float, flags: Any, features: Any,
                      language: Any) -> tuple:
        """FreeType's layout of ``s`` (``font._layout``) as ``(font object, glyph, x, y, character)`` per glyph,
        kept per string, font object, size, dpi, hinting flag, font features and language, which are all it
        depends on (the glyphs and their offsets from the text's origin; the origin is added when they are
        drawn)."""
        key = (s, font, size, self.dpi, flags, None if features is None else tuple(features), language)
        items = self.text_cache.layout(key)
        if items is None:
            laid = self._prepare_font(prop)._layout(s, flags=flags, features=features, language=language)
            items = tuple((i.ft_object, i.glyph_index, i.x, i.y, i.char) for i in laid)
            self.text_cache.put_layout(key, items)
        return items

    def _get_font_height_metrics(self, prop: Any) -> tuple[float | None, float | None, float | None]:
        """A font's ascent, descent and line gap in pixels, which ``Text._get_layout`` reads from the font's
        OS/2 table, else its hhea table, for every text it lays out (matplotlib 3.11 ``text.py``, lines 440-461;
        a renderer may answer through this method), kept per font object, size and dpi: the same tables and the
        same arithmetic (scale ``1 / unitsPerEm * size * dpi / 72``; the renderer's dpi is its figure's, a
        canvas makes a new renderer when the figure's dpi changes). ``None`` three times for a font without
        either table: ``Text`` then measures ``"lp"`` as it does."""
        font = self._font_of(prop)
        size = prop.get_size_in_points()
        key = (font, size, self.dpi)
        got = self.text_cache.heights.get(key)
        if got is None:
            got = (None, None, None)
            for name, gap, ascent, descent in (("OS/2", "sTypoLineGap", "sTypoAscender", "sTypoDescender"),
                                               ("hhea", "lineGap", "ascent", "descent")):
                table: Any = font.get_sfnt_table(name)  # type: ignore[call-overload]  # "OS/2" or "hhea"
                if table is None:
                    continue
                head = font.get_sfnt_table("head")
                if head is None:
                    continue
                scale = 1 / head["unitsPerEm"] * size * self.dpi / 72
                got = (table[ascent] * scale, -table[descent] * scale, table[gap] * scale)
                break
            self.text_cache.heights[key] = got
        return got

    def get_text_width_height_descent(self, s: str, prop: Any, ismath: Any) -> tuple[float, float, float]:
        """RendererAgg's, kept per string, font object, size, dpi and hinting flag for plain text, and taken from
        the string's layout where :meth:`_size_from_layout` can (module doc)."""
        if ismath:
            return super().get_text_width_height_descent(s, prop, ismath)
        font = self._font_of(prop)
        size = prop.get_size_in_points()
        flags = self._hinting()
        key = (s, font, size, self.dpi, flags)
        got = self.text_cache.size(key)
        if got is None:
            got = self._size_from_layout(s, prop, font, size, flags)
            if got is None:
                got = super().get_text_width_height_descent(s, prop, ismath)
            self.text_cache.put_size(key, got)
        return got

    def _size_from_layout(self, s: str, prop: Any, font: Any, size: float, flags: Any
                          ) -> tuple[float, float, float] | None:
        """What ``RendererAgg.get_text_width_height_descent`` returns for plain ``s`` (FreeType's ``set_text`` at
        angle 0: the advance after the last glyph, the height and the descent of the union of the glyphs' control
        boxes, in 1/64 pixel), from the layout of ``s`` and each glyph's :meth:`_glyph_extent`; ``None`` when the
        layout is not one glyph of the font's per character, in order, on the baseline (module doc)."""
        if not s or not s.isprintable():
            return None
        items = self._layout_items(s, prop, font, size, flags, None, None)
        if len(items) != len(s):
            return None
        low, high = 32000, -32000  # set_text's start
        advance = 0
        for (f, g, _, gy, ch), c in zip(items, s, strict=True):
            got = self._glyph_extent(f, g, ch, prop, font, size, flags) if ch == c and gy == 0 and g else None
            if got is None:
                return None
            advance, lo, hi = got
            low, high = min(low, lo), max(high, hi)
        width = round(items[-1][2] * 64) + advance  # the last pen position (whole 1/64 pixels) plus its advance
        return width / 64, (high - low) / 64, -low / 64

    def _glyph_extent(self, f: Any, g: int, ch: str, prop: Any, font: Any, size: float, flags: Any
                      ) -> tuple[int, int, int] | None:
        """Glyph ``g`` of font object ``f`` (character ``ch``): its advance, lowest and highest edge in 1/64 pixel,
        measured by ``RendererAgg.get_text_width_height_descent`` of ``ch`` alone where the layout of ``ch`` is
        that glyph at the origin (else ``None``), kept per font object, glyph, size, dpi and hinting flag."""
        key = (f, g, size, self.dpi, flags)
        got = self.text_cache.extent(key)
        if got is False:
            got = None
            alone = self._layout_items(ch, prop, font, size, flags, None, None)
            if len(alone) == 1 and alone[0][0] is f and alone[0][1:4] == (g, 0.0, 0.0):
                w, h, d = RendererAgg.get_text_width_height_descent(self, ch, prop, False)
                low = -round(d * 64)
                got = (round(w * 64), low, round(h * 64) + low)
            self.text_cache.put_extent(key, got)
        return got  # type: ignore[return-value]  # not False once measured

    def _draw_text_glyphs_and_boxes(self, gc: Any, x: float, y: float, angle: float, glyphs: Any, boxes: Any
                                    ) -> None:
        """``RendererAgg._draw_text_glyphs_and_boxes`` (matplotlib 3.11 ``backends/backend_agg.py``, lines
        175-223) with each glyph's bitmap taken from :class:`TextCache` where one was rendered at the same
        fraction of a pixel (module doc): the pen position is rounded to 1/64 pixel as matplotlib does, the
        bitmap blended by the same ``draw_text_image`` call; boxes (math text rules) are drawn by matplotlib."""
        cos, sin = math.cos(math.radians(angle)), math.sin(math.radians(angle))
        flags = get_hinting_flag()
        aa = bool(gc.get_antialiased())
        height = self.height
        matrices: dict[tuple[float, float], tuple[np.ndarray, bytes]] = {}  # per slant and extend (one, mostly)
        for font, size, index, slant, extend, dx, dy in glyphs:  # dy upwards, as in matplotlib
            got_matrix = matrices.get((slant, extend))
            if got_matrix is None:
                m = (0x10000 * np.array([[cos, -sin], [sin, cos]]) @ [[extend, extend * slant], [0, 1]]
                     ).round().astype(int)
                got_matrix = matrices[(slant, extend)] = (m, m.tobytes())
            matrix, matrix_key = got_matrix
            px = round(0x40 * (x + dx * cos - dy * sin))
            py = round(0x40 * (height - y + dx * sin + dy * cos))  # FreeType's y is upwards
            key = (font, size, self.dpi, index, matrix_key, px % 64, py % 64, flags, aa)
            got = self.text_cache.glyph(key)
            if got is None:
                font.set_size(size, self.dpi)
                font._set_transform(matrix, [px, py])
                bitmap = font._render_glyph(index, flags, RenderMode.NORMAL if aa else RenderMode.MONO)
                buffer = np.array(bitmap.buffer, copy=True)
                if not aa:
                    buffer *= 0xFF
                got = (buffer, bitmap.left - px // 64, bitmap.top - py // 64)
                self.text_cache.put_glyph(key, got)
            buffer, left, top = got
            self._renderer.draw_text_image(buffer, left + px // 64, int(height) - (top + py // 64)
                                           + buffer.shape[0], 0, gc)
        boxes = list(boxes)
        if boxes:  # math text's rules
            super()._draw_text_glyphs_and_boxes(gc, x, y, angle, (), boxes)


class CachedTextCanvas(FigureCanvasAgg):
    """An Agg canvas drawing with :class:`CachedTextRenderer` and the given :class:`TextCache`."""

    def __init__(self, figure: Figure, cache: TextCache) -> None:
        self.text_cache = cache
        super().__init__(figure)

    def draw(self) -> None:
        """``FigureCanvasAgg.draw`` with each font looked up once (:meth:`CachedTextRenderer.drawing`)."""
        renderer = self.get_renderer()
        assert isinstance(renderer, CachedTextRenderer)
        with renderer.drawing():
            super().draw()

    def get_renderer(self) -> RendererAgg:
        w, h = self.get_width_height(physical=True)
        key = w, h, self.figure.dpi
        if self._lastKey != key:
            self.renderer = CachedTextRenderer(w, h, self.figure.dpi, self.text_cache)
            self._lastKey = key  # type: ignore[assignment]  # FigureCanvasAgg declares it None
        return self.renderer


def attach(fig: Figure, cache: TextCache) -> Figure:
    """Draw ``fig`` on a :class:`CachedTextCanvas` sharing ``cache`` (a no-op when it already does, and on a
    matplotlib other than :data:`SUPPORTED`'s)."""
    if not SUPPORTED:
        return fig
    canvas = fig.canvas
    if not (isinstance(canvas, CachedTextCanvas) and canvas.text_cache is cache):
        CachedTextCanvas(fig, cache)
    return fig
