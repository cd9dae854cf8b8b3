"""The Run view's plots, drawn from the run state on a timer, never per event.

Each plot is a ``Chart`` (plotext's frame, the data rasterised into it) handed to Textual as
strips through the line API: a redraw is one pass over the points and the cells, and a plot
whose data, size and axes are unchanged is not redrawn at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from os.path import commonprefix

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

from ampscope.tui.model import figures
from ampscope.tui.model.run_state import RunState
from ampscope.tui.widgets.chart import LEGEND_GLYPHS, Axis, Chart, Line, Run, nice_axis

ALL_POINTS = 1 << 30
"""Series are not thinned before drawing: the chart keeps each pixel column's extremes."""
GIB = 1 << 30
MIB = 1 << 20


def x_intervals(width: int) -> int:
    return max(1, min(8, (width - 10) // 12))


def y_intervals(height: int) -> int:
    return max(2, min(5, (height - 3) // 3))


def step_axis(xs: Sequence[float], width: int) -> Axis:
    """Whole steps, from the first kept to the last (never fractional labels)."""
    lo = xs[0] if xs else 0
    hi = xs[-1] if xs else 1
    return nice_axis(lo, max(hi, lo + 1), x_intervals(width), whole=True, tight=True)


def time_axis(state: RunState, width: int) -> Axis:
    """Seconds since the run started: one range for every plot against time, so they align."""
    return nice_axis(0.0, max(state.last_t, 1.0), x_intervals(width), from_zero=True, tight=True)


def in_order(state: RunState) -> bool:
    """The kept steps only go up (a chart then finds each pixel column's points by bisection)."""
    return state.steps.ascending("step")


FLAT = 0.05
"""A y axis spans at least this fraction of its values: a 0.02 MiB wobble is not a cliff."""


def data_axis(
    ys: Sequence[float], height: int, min_span: float = 0.0, scale: float = 1.0, **kwargs
) -> Axis:
    """A y axis for ``ys`` (times ``scale``); present values are finite (``Columns``)."""
    if not ys:
        return nice_axis(0.0, 1.0, y_intervals(height), min_span=min_span, **kwargs)
    lo, hi = min(ys) * scale, max(ys) * scale
    span = max(min_span, FLAT * max(abs(lo), abs(hi)))
    return nice_axis(lo, hi, y_intervals(height), min_span=span, **kwargs)


@dataclass(frozen=True)
class Figure:
    titles: list[Title]
    """What the plot shows, longest first: the chart writes the first that fits."""
    x: Axis
    y: Axis
    lines: list[Line]
    y_right: Axis | None = None


Title = list[Run]


def say(*parts: str | tuple[Line, str]) -> Title:
    """A title: plain words, and (line, name) pairs shown as the line's marker and its name."""
    runs: Title = []
    for part in parts:
        if isinstance(part, str):
            runs.append((part, None))
        else:
            line, name = part
            runs += [(LEGEND_GLYPHS.get(line.marker, "•"), line.color), (f" {name}", None)]
    return runs


_STYLES: dict[str | None, Style] = {None: Style()}


def style_for(color: str | None) -> Style:
    style = _STYLES.get(color)
    if style is None:
        name = color or "default"
        name = f"bright_{name[:-1]}" if name.endswith("+") else name
        try:
            style = Style(color=name)
        except Exception:  # a colour rich does not know: the widget's own
            style = Style()
        _STYLES[color] = style
    return style


def changed_cells(before: list[Run], after: list[Run]) -> tuple[int, int]:
    """The cells ``[start, end)`` of a row that differ between two drawings of it (runs of
    one width); at least one cell."""
    start, i = 0, 0
    while i < min(len(before), len(after)) and before[i] == after[i]:
        start += len(after[i][0])
        i += 1
    if i < min(len(before), len(after)) and before[i][1] == after[i][1]:
        start += len(commonprefix([before[i][0], after[i][0]]))
    width = sum(len(text) for text, _ in after)
    end, j = width, 1
    while j <= min(len(before), len(after)) - i and before[-j] == after[-j]:
        end -= len(after[-j][0])
        j += 1
    if j <= min(len(before), len(after)) - i and before[-j][1] == after[-j][1]:
        end -= len(commonprefix([before[-j][0][::-1], after[-j][0][::-1]]))
    end = min(width, max(end, start + 1))
    return min(start, end - 1), end


class ChartView(Widget):
    """A chart as a widget: its rows are kept as strips and handed out by the line API."""

    DEFAULT_CSS = """
    ChartView {
        width: 1fr;
        height: 1fr;
    }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.chart = Chart()
        self.strips: list[Strip] = []
        self.rows: list[list[Run]] = []  # what the strips show, as the chart drew it
        self.pad_style = Style()
        self.points_drawn = 0
        self.title = ""

    def paint(self, fig: Figure, size: tuple[int, int], note: str = "") -> None:
        """Draw ``fig``; only the cells that changed since the last paint go to the terminal
        (a new point moves a few cells at the right end of a plot, not all of them)."""
        if any(line.xs for line in fig.lines):
            note = ""
        rows = self.chart.draw(size, fig.titles, fig.x, fig.y, fig.lines, fig.y_right, note)
        self.title = self.chart.title
        self.points_drawn = sum(len(line.xs) for line in fig.lines)
        style = self.rich_style  # computed once a paint: per line it is costly
        width = size[0]
        whole = style != self.pad_style or len(rows) != len(self.rows) or not self.strips
        whole = whole or self.strips[0].cell_length != width
        self.pad_style = style
        strips = [] if whole else self.strips
        changed: list[Region] = []
        for y, row in enumerate(rows):
            if not whole and row == self.rows[y]:
                continue
            segments = [Segment(text, style_for(color)) for text, color in row]
            strip = Strip(segments).adjust_cell_length(width, style)
            if whole:
                strips.append(strip)
                continue
            strips[y] = strip
            start, end = changed_cells(self.rows[y], row)
            changed.append(Region(start, y, end - start, 1))
        self.strips, self.rows = strips, rows
        if whole:
            self.refresh()
        elif changed:
            self.refresh(*changed)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        style = self.pad_style  # every segment styled: a None style breaks NO_COLOR's filter
        if y < len(self.strips):
            strip = self.strips[y]
            return strip if strip.cell_length == width else strip.adjust_cell_length(width, style)
        return Strip.blank(width, style)

    @property
    def text(self) -> str:
        """What the plot shows, as plain text (tests, copy)."""
        return "\n".join(strip.text for strip in self.strips)


class RunPlot(ChartView):
    """A plot that redraws itself from a RunState when its data, size or axes changed."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._drawn: tuple = ()
        self._state: RunState | None = None

    def data_key(self, state: RunState) -> object:
        """Changes when this plot's data changed: no redraw otherwise."""
        return state.step_count

    def figure(self, state: RunState, size: tuple[int, int]) -> Figure:
        raise NotImplementedError

    def draw(self, state: RunState) -> bool:
        self._state = state
        size = (self.size.width, self.size.height)
        if size[0] <= 0 or size[1] <= 0:
            return False
        key = (id(state), self.data_key(state), size, state.finished)  # the note changes too
        if key == self._drawn:
            return False
        self._drawn = key
        note = "none recorded" if state.finished else "waiting for the first samples"
        self.paint(self.figure(state, size), size, note)
        return True

    def on_resize(self) -> None:
        if self._state is not None:
            self.draw(self._state)


class StepTimePlot(RunPlot):
    def figure(self, state: RunState, size: tuple[int, int]) -> Figure:
        xs, ys = figures.step_time_series(state, ALL_POINTS)
        ordered = sorted(ys)  # C-level: the median, the outliers and the range at once
        ceiling, clipped = figures.outlier_ceiling(ordered)
        mark = f" · {clipped} over {ceiling:.4g} drawn at top ▲" if ceiling is not None else ""
        short = f" · {clipped} clipped ▲" if ceiling is not None else ""
        span = ordered[:1] + [ordered[-1] if ceiling is None else ceiling] if ordered else []
        return Figure(
            [
                say(f"step time (ms) / step{mark}"),
                say(f"step ms / step{short}"),
                say(f"ms / step{short}"),
                say("ms / step"),
            ],
            step_axis(xs, size[0]),
            data_axis(span, size[1], tight=ceiling is not None),  # clipped points at the top
            [Line("step time", xs, ys, "cyan", "hd", ceiling=ceiling, ascending=in_order(state))],
        )


class LossPlot(RunPlot):
    """Loss on the left; on the right the loss scale (log2), or without a scaler, grad zeros."""

    def figure(self, state: RunState, size: tuple[int, int]) -> Figure:
        (lx, ly), (sx, sy) = figures.loss_series(state, ALL_POINTS)
        width, height = size
        x = step_axis(sorted({*lx[:1], *lx[-1:], *sx[:1], *sx[-1:]}), width)
        ordered = in_order(state)
        loss = Line("loss", lx, ly, "green", "hd", ascending=ordered)
        titles, right, lines = [say("loss / step"), say("loss")], None, [loss]
        if sx:
            scale = Line("log2 scale", sx, sy, "magenta", "braille", right=True, ascending=ordered)
            right, lines = data_axis(sy, height, whole=True, min_span=2), [loss, scale]
            titles = [
                say((loss, "loss"), " · ", (scale, "log2 loss scale (right)"), " / step"),
                say((loss, "loss"), " · ", (scale, "log2 loss scale (right)")),
                say((loss, "loss"), " · ", (scale, "log2 scale (right)")),
                say((loss, "loss"), " ", (scale, "scale (right)")),
            ]
        else:
            zx, zy = figures.grad_zero_series(state, ALL_POINTS)
            if zx:
                zeros = Line(
                    "grad zeros %", zx, zy, "yellow", "braille", right=True, ascending=ordered
                )
                right = data_axis(zy, height, from_zero=True, min_span=1.0)
                lines = [loss, zeros]
                titles = [
                    say((loss, "loss"), " · ", (zeros, "grad zeros % (right)"), " / step"),
                    say((loss, "loss"), " · ", (zeros, "grad zeros % (right)")),
                    say((loss, "loss"), " ", (zeros, "zeros % (right)")),
                ]
        return Figure(titles, x, data_axis(ly, height), lines, right)


class MemoryPlot(RunPlot):
    STYLE = {
        "allocated": ("cyan", "hd", "alloc"),
        "process RSS": ("cyan", "hd", "RSS"),
        "reserved": ("blue", "braille", "resv"),
        "device used": ("yellow", "dot", "device"),
    }

    def data_key(self, state: RunState) -> object:
        return (state.step_count, state.sys_count)

    def figure(self, state: RunState, size: tuple[int, int]) -> Figure:
        series = figures.memory_series(state, ALL_POINTS)
        series.pop("device total", None)  # the headroom is the device's, not the run's
        top = max((max(ys) for _, ys in series.values() if ys), default=0)
        unit, scale = ("GiB", GIB) if top >= 4 * GIB else ("MiB", MIB)
        lines, values = [], [0.0, top]
        long: list = [f"memory ({unit}) / s:"]
        short: list = [f"{unit}:"]
        for name, (xs, ys) in series.items():
            color, marker, brief = self.STYLE.get(name, ("white", "dot", name))
            by_sample = name == "device used"  # sys events'; the others are steps'
            in_time = state.samples.ascending("t") if by_sample else state.steps.ascending("t")
            line = Line(name, xs, ys, color, marker, scale=1 / scale, ascending=in_time)
            lines.append(line)
            long += [" ", (line, name)]
            short += [" ", (line, brief)]
        titles = [say(*long), say(f"{unit} / s:", *long[1:]), say(*short)]
        if not lines:
            titles = [say(f"memory ({unit}) / s")]
        return Figure(
            titles,
            time_axis(state, size[0]),
            data_axis(values, size[1], scale=1 / scale, from_zero=True),
            lines,
        )


class UtilPlot(RunPlot):
    """GPU and system CPU in percent (0-100); the engine's own CPU in cores, on the right."""

    STYLE = {
        "GPU": ("green", "hd", "GPU", "GPU%"),
        "CPU": ("cyan", "braille", "CPU", "CPU%"),
        "engine CPU": ("yellow", "dot", "engine CPU cores (right)", "cores (right)"),
    }

    def data_key(self, state: RunState) -> object:
        return (state.sys_count, time_axis(state, self.size.width))

    def figure(self, state: RunState, size: tuple[int, int]) -> Figure:
        series = figures.util_series(state, ALL_POINTS)
        width, height = size
        percent = nice_axis(0.0, 100.0, 4 if height >= 14 else 2)
        lines, right = [], None
        in_time = state.samples.ascending("t")
        long: list = ["utilization (%) / s:"]
        short: list = []
        for name, (xs, ys) in series.items():
            color, marker, label, brief = self.STYLE.get(name, ("white", "dot", name, name))
            is_engine = name == "engine CPU"
            if is_engine:
                right = data_axis(ys, height, from_zero=True, min_span=1.0)
            line = Line(name, xs, ys, color, marker, right=is_engine, ascending=in_time)
            lines.append(line)
            long += [" ", (line, label)]
            short += [" ", (line, brief)]
        titles = [say(*long), say("% / s:", *long[1:]), say(*short[1:]), say(*short[1:4])]
        if not lines:
            titles = [say("utilization (%) / s")]
        return Figure(titles, time_axis(state, width), percent, lines, right)
