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
from collections.abc import Sequence
from dataclasses import dataclass, field
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
            _rasterise(line, x, axis, frame, chars, colors)
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


def _columns(line: Line, x: Axis, y: Axis, width_px: int, height_px: int) -> dict[int, list[int]]:
    """Per pixel column: [first, last, lowest, highest] pixel row of the line's points there.

    plotext's mapping (``get_matrix_data``), inlined: this runs over every kept point.
    """
    if x.hi <= x.lo or y.hi <= y.lo:
        return {}
    kx = (width_px - 1) / (x.hi - x.lo)
    ky = (height_px - 1) / (y.hi - y.lo)
    x0 = 0.5 - x.lo * kx + 1e-9
    y0 = 0.5 - y.lo * ky + 1e-9
    ky *= line.scale  # the data times scale, on the axis's own mapping
    columns: dict[int, list[int]] = {}
    top = height_px - 1
    floor = math.floor
    isfinite = math.isfinite
    get = columns.get
    for xv, yv in zip(line.xs, line.ys, strict=False):
        if yv is None or not isfinite(yv):
            continue
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


def _rasterise(
    line: Line,
    x: Axis,
    y: Axis,
    frame: Frame,
    chars: list[list[str]],
    colors: list[list[str | None]],
) -> None:
    """Draw ``line`` joined point to point, as plotext would, into the canvas cells."""
    xf, yf = MARKERS.get(line.marker, (1, 1))
    width, height = len(frame.cols), len(frame.rows)
    columns = _columns(line, x, y, width * xf, height * yf)
    pixels: set[tuple[int, int]] = set()
    previous: tuple[int, int] | None = None
    for px in sorted(columns):
        first, last, low, high = columns[px]
        pixels.update((px, py) for py in range(low, high + 1))
        if previous is not None:
            pixels.update(_segment(previous, (px, first)))
        previous = (px, last)
    cells: dict[tuple[int, int], int] = {}
    for px, py in pixels:
        cell = (px // xf, py // yf)
        cells[cell] = cells.get(cell, 0) | _bit(line.marker, px % xf, py % yf)
    col0, row0 = frame.cols.start, frame.rows.start
    for (cx, cy), mask in cells.items():
        col, row = col0 + cx, row0 + cy
        if frame.chars[row][col] != " ":  # a tick label or the legend stays readable
            continue
        chars[row][col] = _glyph(line.marker, mask)
        colors[row][col] = line.color


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
    for i in range(1, len(chars) + 1):
        if i == len(chars) or colors[i] != colors[start]:
            runs.append(("".join(chars[start:i]), colors[start]))
            start = i
    return runs
