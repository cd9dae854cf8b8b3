"""Charts for the dashboard: plotext lays out the frame, the data is drawn into its canvas.

plotext spends most of a figure's build interpolating and grouping the data point by point,
then writes the figure as ANSI text that the widget parses back into styled segments. Here
plotext builds only the frame (title, axes, ticks), and only when the size, the axes or the
title change; each redraw rasterises the series into the frame's canvas with plotext's own
mapping and glyph tables, and hands rows of (text, colour) runs to the widget. A redraw costs
a pass over the points and the cells, with no text round trip.

The widget itself is ``textual_plotext``'s ``Plot``; ``ampscope.tui.widgets.plots`` turns the
runs into the series drawn here.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from textual_plotext.plot import Plot

from ampscope.tui.private_apis import braille_codes, hd_codes

Run = tuple[str, "str | None"]
"""A stretch of one row: its text, and a plotext colour name (None: the widget's colour)."""

# marker: (pixels across a cell, pixels up a cell)
MARKERS = {"hd": (2, 2), "braille": (2, 4), "dot": (1, 1)}
DOT = "•"
LEGEND_GLYPHS = {"hd": "▞", "braille": "⢕", "dot": DOT}
"""How a title names a line drawn with each marker."""
LINE_ORDER = ("hd", "braille", "dot")
"""Markers given to a chart's lines in turn, so that lines differ without colour (NO_COLOR)."""


def _glyphs(codes: dict[tuple[int, ...], str]) -> dict[int, str]:
    """plotext's glyph table keyed by a bit mask (first tuple element = highest bit)."""
    out = {}
    for code, char in codes.items():
        mask = 0
        for bit in code:
            mask = (mask << 1) | bit
        out[mask] = char
    return out


HD_GLYPHS = _glyphs(hd_codes)  # bits: top-left, top-right, bottom-left, bottom-right
BRAILLE_GLYPHS = _glyphs(braille_codes)  # bits: rows from the top, left then right


def _bit(marker: str, sx: int, sy: int) -> int:
    """The mask bit of sub-pixel (sx, sy) of a cell (sy counts up from the bottom)."""
    if marker == "hd":
        return 1 << (3 - ((1 - sy) * 2 + sx))
    if marker == "braille":
        return 1 << (7 - ((3 - sy) * 2 + sx))
    return 1


def _glyph(marker: str, mask: int) -> str:
    if marker == "hd":
        return HD_GLYPHS.get(mask, "█")
    if marker == "braille":
        return BRAILLE_GLYPHS.get(mask, "⣿")
    return DOT


# --------------------------------------------------------------------------- axes


@dataclass(frozen=True)
class Axis:
    lo: float
    hi: float
    ticks: tuple[float, ...]
    labels: tuple[str, ...]


def nice_step(span: float, intervals: int) -> float:
    """A step of 1, 2, 2.5 or 5 times a power of ten that cuts ``span`` in about ``intervals``."""
    raw = span / max(1, intervals)
    if not math.isfinite(raw) or raw <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 2.5, 5, 10):
        if factor * magnitude >= raw * (1 - 1e-9):
            return factor * magnitude
    return 10 * magnitude


def tick_labels(ticks: Sequence[float], step: float) -> tuple[str, ...]:
    """Labels as short as the step allows: 0.25, 1.5k, 12M; never 327.5234."""
    top = max((abs(t) for t in ticks), default=0.0)
    scale, suffix = 1.0, ""
    for size, name in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if top >= 10 * size:
            scale, suffix = size, name
            break
    scaled = step / scale
    decimals = 0 if scaled >= 1 else min(6, math.ceil(-math.log10(scaled) - 1e-9))
    if scaled * 10**decimals % 1 > 1e-6:  # 2.5, 0.25: one more digit
        decimals += 1
    labels = []
    for t in ticks:
        text = f"{t / scale:.{decimals}f}"
        if float(text) == 0:
            text = "0"
        labels.append(text + (suffix if text != "0" else ""))
    return tuple(labels)


AXIS_LIMIT = 1e15
"""The largest magnitude an axis spans (the series leave out points beyond it, tui.figures)."""


def nice_axis(
    lo: float,
    hi: float,
    intervals: int,
    *,
    min_span: float = 0.0,
    from_zero: bool = False,
    whole: bool = False,
    tight: bool = False,
) -> Axis:
    """Round limits and ticks around ``lo..hi``.

    ``min_span`` keeps a flat series from filling the plot (a 0.02 MiB wobble is not a cliff);
    ``from_zero`` starts at 0 (memory, utilization); ``whole`` ticks whole numbers (steps);
    ``tight`` rounds the limits to a quarter of a tick step only (an x axis wastes little
    width, and its frame is rebuilt every quarter tick rather than every redraw).
    """
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = 0.0, 1.0
    lo, hi = (min(max(v, -AXIS_LIMIT), AXIS_LIMIT) for v in (lo, hi))  # 1e308 from a record
    if from_zero:
        lo = min(0.0, lo)
    if lo == hi == 0.0:  # nothing yet, or all zero: 0..1, never an axis of 0 0 0
        hi = 1.0
    span = max(hi - lo, min_span, abs(hi) * 1e-9, 1e-12)
    if hi - lo < span:
        middle = (hi + lo) / 2
        lo, hi = middle - span / 2, middle + span / 2
        if from_zero and lo < 0:
            lo, hi = 0.0, span
    step = nice_step(hi - lo, max(1, intervals))
    if whole:
        step = max(1.0, round(step))
    grid = step / 4 if tight else step
    if whole:
        grid = max(1.0, round(grid))
    first = math.floor(lo / grid + 1e-9) * grid
    last = math.ceil(hi / grid - 1e-9) * grid
    if last <= first:
        last = first + grid
    k = math.ceil(first / step - 1e-9)
    ticks = []
    while k * step <= last + step * 1e-9:
        ticks.append(k * step)
        k += 1
    return Axis(first, last, tuple(ticks), tick_labels(ticks, step))


# --------------------------------------------------------------------------- lines


@dataclass(frozen=True)
class Line:
    label: str
    xs: Sequence[float]
    ys: Sequence[float]
    color: str
    marker: str = "hd"
    right: bool = False  # drawn against the right y axis
    scale: float = 1.0  # ys are drawn times this (bytes as GiB) without a copy
    ceiling: float | None = None  # ys above it are drawn at it (a stall at the top)
    ascending: bool = False
    """xs never go down (steps, seconds): each pixel column's points are found by bisection
    and summarised by C-level min and max, with no Python step per point."""


@dataclass
class Frame:
    """plotext's frame of one chart: characters and colours, rows from the bottom."""

    key: tuple
    chars: list[list[str]]
    colors: list[list[str | None]]
    cols: range
    rows: range


@dataclass
class Chart:
    """One chart's frame, rebuilt by plotext only when what it shows around the data changes."""

    figure: Plot = field(default_factory=Plot)
    frame: Frame | None = None
    title: str = ""
    kept: dict[tuple, Kept] = field(default_factory=dict)  # each line's last columns

    def draw(
        self,
        size: tuple[int, int],
        titles: Sequence[Sequence[Run]],
        x: Axis,
        y: Axis,
        lines: Sequence[Line],
        y_right: Axis | None = None,
        note: str = "",
    ) -> list[list[Run]]:
        """The chart's rows, top first, as runs of (text, colour). ``note`` is written in the
        middle of the canvas (a chart with nothing to draw says why).

        ``titles``: ways to say what the chart shows, longest first; the first that fits is
        written into the frame's top line (the title is also the legend: it names each line
        by its marker).
        """
        width, height = size
        if width < 8 or height < 4:
            return [[(" " * max(0, width), None)] for _ in range(max(0, height))]
        frame = self._frame(width, height, x, y, y_right)
        chars = [row[:] for row in frame.chars]
        colors = [row[:] for row in frame.colors]
        for line in lines:
            axis = y_right if line.right and y_right is not None else y
            _rasterise(line, x, axis, frame, chars, colors, self.kept)
        self.title = _title(titles, frame, chars, colors)
        if note:
            _note(note, frame, chars, colors)
        return [_runs(chars[r], colors[r]) for r in reversed(range(len(chars)))]

    def _frame(self, width: int, height: int, x: Axis, y: Axis, y_right: Axis | None) -> Frame:
        key = (width, height, x, y, y_right)
        if self.frame is not None and self.frame.key == key:
            return self.frame
        # Any: the frame is built through plotext's own untyped steps (_set_sizes,
        # _build_matrix, monitor), which its typed face does not show.
        fig: Any = self.figure
        fig.clear_data()  # every setting below is set anew; clear_figure would deep-copy defaults
        fig.theme("clear")
        fig.plotsize(width, height)
        fig._set_size(width, height)
        fig.yaxes(True, True)  # a right axis without ticks where none is asked: the right edge
        right = y_right if y_right is not None else Axis(y.lo, y.hi, (), ())
        # invisible points: they tell plotext which axes are in use
        fig.scatter([x.lo], [y.lo], marker=" ")
        fig.xlim(x.lo, x.hi)
        fig.ylim(y.lo, y.hi)
        fig.xticks(list(x.ticks), list(x.labels))
        fig.yticks(list(y.ticks), list(y.labels))
        fig.scatter([x.lo], [right.lo], marker=" ", yside="right")
        fig.ylim(right.lo, right.hi, yside="right")
        fig.yticks(list(right.ticks), list(right.labels), yside="right")
        fig._set_sizes()
        fig._build_matrix()
        matrix = fig.monitor.matrix
        colors = [[None if c == "default" else c for c in row] for row in matrix.fullground]
        self.frame = Frame(
            key, [row[:] for row in matrix.marker], colors, matrix.Cols_canvas, matrix.Rows_canvas
        )
        return self.frame


def _columns(
    line: Line,
    x: Axis,
    y: Axis,
    width_px: int,
    height_px: int,
    kept: dict[tuple, Kept] | None = None,
) -> dict[int, list[int]]:
    """Per pixel column: [first, last, lowest, highest] pixel row of the line's points there.

    plotext's mapping (``get_matrix_data``), inlined: this runs over every kept point, unless
    the line's xs are ``ascending`` (``_ordered_columns``: the same columns, found faster).
    """
    if x.hi <= x.lo or y.hi <= y.lo:
        return {}
    kx = (width_px - 1) / (x.hi - x.lo)
    ky = (height_px - 1) / (y.hi - y.lo)
    x0 = 0.5 - x.lo * kx + 1e-9
    y0 = 0.5 - y.lo * ky + 1e-9
    ky *= line.scale  # the data times scale, on the axis's own mapping
    # a canvas one pixel wide (a terminal dragged very small) maps every x to one column:
    # kx is 0 there, and the bisection divides by it
    if line.ascending and kx > 0 and isinstance(line.xs, list) and isinstance(line.ys, list):
        return _ordered_columns(line, kx, x0, ky, y0, width_px, height_px, kept)
    columns: dict[int, list[int]] = {}
    top = height_px - 1
    floor = math.floor
    isfinite = math.isfinite
    get = columns.get
    ceiling = line.ceiling
    for xv, yv in zip(line.xs, line.ys, strict=False):
        if yv is None or not isfinite(yv):
            continue
        if ceiling is not None and yv > ceiling:
            yv = ceiling
        px = floor(x0 + xv * kx)
        if px < 0 or px >= width_px:
            continue
        py = floor(y0 + yv * ky)
        py = 0 if py < 0 else top if py > top else py
        col = get(px)
        if col is None:
            columns[px] = [py, py, py, py]
        else:
            col[1] = py
            if py < col[2]:
                col[2] = py
            elif py > col[3]:
                col[3] = py
    return columns


@dataclass
class Kept:
    """A line's pixel columns as last drawn, and what they were drawn from."""

    mapping: tuple  # data to pixels: every number that places a point
    count: int  # the line's points
    last: tuple[float, float]  # its last point
    columns: dict[int, list[int]]


def _ordered_columns(
    line: Line,
    kx: float,
    x0: float,
    ky: float,
    y0: float,
    width_px: int,
    height_px: int,
    kept: dict[tuple, Kept] | None = None,
) -> dict[int, list[int]]:
    """``_columns`` for xs that never go down: a pixel column's points are one slice of the
    line, found by bisection, and its lowest and highest are the slice's min and max (the
    mapping to pixels keeps order). The result is the same, pixel for pixel; the Python work
    is per column instead of per point (and inlined: this runs on every redraw).

    With ``kept`` (the chart's memory of its last drawing), a line drawn again on the same
    axes recomputes only its columns at either end: a followed run adds points at the right
    and its ring drops them at the left, and every column between holds what it held.
    """
    xs, ys = line.xs, line.ys
    n = min(len(xs), len(ys))
    floor = math.floor
    top = height_px - 1
    ceiling = math.inf if line.ceiling is None else line.ceiling
    columns: dict[int, list[int]] = {}

    def start_of(px: int) -> int:
        """The index of the first point in pixel column ``px`` or after it."""
        i = bisect_left(xs, (px - x0) / kx, 0, n)  # about there: the mapping decides
        while i > 0 and floor(x0 + xs[i - 1] * kx) >= px:
            i -= 1
        while i < n and floor(x0 + xs[i] * kx) < px:
            i += 1
        return i

    def scan(i: int, stop: int) -> None:
        """Columns from the one of point ``i`` up to pixel column ``stop`` (not included)."""
        while i < n:
            px = floor(x0 + xs[i] * kx)
            if px >= stop:
                return
            j = bisect_left(xs, (px + 1 - x0) / kx, i + 1, n)  # about the next column's first
            while j < n and floor(x0 + xs[j] * kx) <= px:
                j += 1
            while j > i + 1 and floor(x0 + xs[j - 1] * kx) > px:
                j -= 1
            if j == i + 1:
                first = last = low = high = ys[i]
            else:
                part = ys[i:j]
                first, last, low, high = ys[i], ys[j - 1], min(part), max(part)
            pixels = []
            for v in (first, last, low, high):
                py = floor(y0 + (v if v < ceiling else ceiling) * ky)
                pixels.append(0 if py < 0 else top if py > top else py)
            columns[px] = pixels
            i = j

    mapping = (kx, x0, ky, y0, width_px, height_px, ceiling)
    name = (line.label, line.marker, line.right)
    was = kept.get(name) if kept is not None else None
    begin = start_of(0)
    if was is not None and was.mapping == mapping and begin < n:
        last_x, last_y = was.last
        k = bisect_right(xs, last_x, 0, n) - 1  # where the last point drawn is now
        first_px = floor(x0 + xs[begin] * kx)
        end_px = floor(x0 + last_x * kx)
        if k >= 0 and xs[k] == last_x and ys[k] == last_y and first_px < end_px:
            dropped = k != was.count - 1  # points left at the start: its column changed
            for px, pixels in was.columns.items():
                if first_px + dropped <= px < end_px:
                    columns[px] = pixels
            if dropped:
                scan(begin, first_px + 1)
            scan(start_of(end_px), width_px)
            was.count, was.last, was.columns = n, (xs[n - 1], ys[n - 1]), columns
            return columns
    scan(begin, width_px)
    if kept is not None and n:
        kept[name] = Kept(mapping, n, (xs[n - 1], ys[n - 1]), columns)
    return columns


def _rasterise(
    line: Line,
    x: Axis,
    y: Axis,
    frame: Frame,
    chars: list[list[str]],
    colors: list[list[str | None]],
    kept: dict[tuple, Kept] | None = None,
) -> None:
    """Draw ``line`` joined point to point, as plotext would, into the canvas cells.

    Each pixel column's lit pixels are the bits of one int (its points' span, and the join
    from the column before), so that a cell's glyph is a lookup of its columns' bits.
    """
    xf, yf = MARKERS.get(line.marker, (1, 1))
    width, height = len(frame.cols), len(frame.rows)
    columns = _columns(line, x, y, width * xf, height * yf, kept)
    lit: dict[int, int] = {}
    before: tuple[int, int] | None = None  # the last pixel of the column before
    for px in sorted(columns):
        first, last, low, high = columns[px]
        lit[px] = lit.get(px, 0) | _span(low, high)
        if before is not None:
            bx, by = before
            if px - bx == 1:  # the join is a run of the column before, between the two rows
                if first - by > 1:
                    lit[bx] |= _span(by + 1, first - 1)
                elif by - first > 1:
                    lit[bx] |= _span(first + 1, by - 1)
            else:
                for sx, sy in _segment(before, (px, first)):
                    lit[sx] = lit.get(sx, 0) | (1 << sy)
        before = (px, last)
    glyphs = _cell_glyphs(line.marker)
    rows_mask = (1 << yf) - 1
    col0, row0 = frame.cols.start, frame.rows.start
    empty, color = frame.chars, line.color
    for cx in sorted({px // xf for px in lit}):
        left = lit.get(cx * xf, 0)
        right = lit.get(cx * xf + 1, 0) if xf == 2 else 0  # a cell is one or two columns wide
        both = left | right
        col = col0 + cx
        for cy in range(((both & -both).bit_length() - 1) // yf, (both.bit_length() - 1) // yf + 1):
            shift = cy * yf
            index = (left >> shift) & rows_mask | ((right >> shift) & rows_mask) << yf
            row = row0 + cy
            if index and empty[row][col] == " ":  # a tick label or the legend stays readable
                chars[row][col] = glyphs[index]
                colors[row][col] = color


def _span(low: int, high: int) -> int:
    """Pixel rows ``low`` to ``high`` as bits."""
    return (2 << high) - (1 << low)


_CELL_GLYPHS: dict[str, dict[int, str]] = {}


def _cell_glyphs(marker: str) -> dict[int, str]:
    """A cell's glyph by its pixels: bit ``sx * rows + sy`` is sub-pixel (sx, sy), ``sy``
    counted up from the bottom (plotext's glyph tables, keyed for ``_rasterise``)."""
    table = _CELL_GLYPHS.get(marker)
    if table is None:
        xf, yf = MARKERS.get(marker, (1, 1))
        table = {}
        for index in range(1, 1 << (xf * yf)):
            mask = 0
            for sx in range(xf):
                for sy in range(yf):
                    if index >> (sx * yf + sy) & 1:
                        mask |= _bit(marker, sx, sy)
            table[index] = _glyph(marker, mask)
        _CELL_GLYPHS[marker] = table
    return table


def _segment(a: tuple[int, int], b: tuple[int, int]) -> list[tuple[int, int]]:
    """The pixels from a to b, one per step of the longer side (plotext's ``get_line``)."""
    (x0, y0), (x1, y1) = a, b
    n = max(abs(x1 - x0), abs(y1 - y0))
    if n <= 1:
        return [b]
    return [(int(x0 + (x1 - x0) * i / n), int(y0 + (y1 - y0) * i / n)) for i in range(1, n + 1)]


def _title(
    titles: Sequence[Sequence[Run]],
    frame: Frame,
    chars: list[list[str]],
    colors: list[list[str | None]],
) -> str:
    """The first title that fits, centred on the frame's top line; '' when none fits."""
    row = frame.rows.stop  # the top line of the frame (rows count from the bottom)
    if row >= len(chars):
        return ""
    first, last = frame.cols.start, frame.cols.stop - 1  # the line between the corners
    for runs in titles:
        text = "".join(part for part, _ in runs)
        if len(text) + 2 > last - first + 1:
            continue
        col = first + (last - first + 1 - len(text) - 2) // 2
        for part, color in [(" ", None), *runs, (" ", None)]:
            for char in part:
                chars[row][col] = char
                colors[row][col] = color
                col += 1
        return text
    return ""


def _note(note: str, frame: Frame, chars: list[list[str]], colors: list[list[str | None]]) -> None:
    width = len(frame.cols)
    if len(note) > width or not len(frame.rows):
        return
    row = frame.rows.start + len(frame.rows) // 2
    col = frame.cols.start + (width - len(note)) // 2
    for i, char in enumerate(note):
        chars[row][col + i] = char
        colors[row][col + i] = None


def _runs(chars: list[str], colors: list[str | None]) -> list[Run]:
    runs: list[Run] = []
    start = 0
    for color, same in groupby(colors):
        end = start + len(list(same))
        runs.append(("".join(chars[start:end]), color))
        start = end
    return runs
