"""The charts: axes a person can read, and the data drawn where plotext itself draws it."""

from __future__ import annotations

import math
import random

import pytest
from textual_plotext.plot import Plot

from ampscope.tui.model.run_state import RunState
from ampscope.tui.widgets.chart import DOT, LEGEND_GLYPHS, LINE_ORDER, Chart, Line, nice_axis
from ampscope.tui.widgets.plots import (
    LossPlot,
    MemoryPlot,
    StepTimePlot,
    UtilPlot,
    changed_cells,
    step_axis,
    time_axis,
)
from tests.helpers import hello, step

pytestmark = pytest.mark.unit


def plotext_canvas(xs, ys, x, y, size, marker):
    """plotext's own drawing of the line, as canvas rows (top first), for comparison."""
    fig = Plot()
    fig.theme("clear")
    fig.plotsize(*size)
    fig._set_size(*size)
    fig.yaxes(True, True)  # the frame's right edge, as the chart draws it
    fig.plot(xs, ys, marker=marker)
    fig.xlim(x.lo, x.hi)
    fig.ylim(y.lo, y.hi)
    fig.xticks(list(x.ticks), list(x.labels))
    fig.yticks(list(y.ticks), list(y.labels))
    fig.scatter([x.lo], [y.lo], marker=" ", yside="right")
    fig.ylim(y.lo, y.hi, yside="right")
    fig.yticks([], [], yside="right")
    fig._set_sizes()
    fig._build_matrix()
    m = fig.monitor.matrix
    return ["".join(m.marker[r][c] for c in m.Cols_canvas) for r in reversed(m.Rows_canvas)], m


@pytest.mark.parametrize("marker", ["hd", "braille"])
def test_lines_land_on_the_cells_plotext_draws(marker: str) -> None:
    size = (60, 16)
    xs = list(range(0, 101))
    ys = [50 + 40 * math.sin(i / 9) for i in xs]
    x = nice_axis(0, 100, 4, whole=True)
    y = nice_axis(0, 100, 4)
    expected, matrix = plotext_canvas(xs, ys, x, y, size, marker)
    chart = Chart()
    rows = chart.draw(size, [[("t", None)]], x, y, [Line("", xs, ys, "cyan", marker)])
    text = ["".join(part for part, _ in row) for row in rows]
    top = len(text) - matrix.Rows_canvas.stop
    cols = slice(matrix.Cols_canvas.start, matrix.Cols_canvas.stop)
    ours = [line[cols] for line in text[top : top + len(matrix.Rows_canvas)]]
    # The same mapping, joining and glyph table: cell for cell. (With several points in one
    # pixel column the chart keeps the column's extremes where plotext joins them in order.)
    cells = [
        (a, b)
        for mine, theirs in zip(ours, expected, strict=True)
        for a, b in zip(mine, theirs, strict=True)
    ]
    differing = sum(1 for a, b in cells if a != b)
    drawn = sum(1 for _a, b in cells if b != " ")
    assert drawn > 50 and differing == 0, "\n".join(ours) + "\n\n" + "\n".join(expected)


def test_tick_labels_are_short_and_round() -> None:
    axis = nice_axis(327.5208, 327.5234, 3, min_span=16)  # a flat memory line
    assert all(len(label) <= 5 for label in axis.labels)
    assert axis.hi - axis.lo >= 16
    steps = nice_axis(0, 7, 4, whole=True)
    assert all("." not in label for label in steps.labels)
    big = nice_axis(0, 12_000, 4, whole=True)
    assert big.labels[-1].endswith("k") and big.labels[0] == "0"
    small = nice_axis(0.0001, 0.0005, 3)
    assert small.labels[0] == "0" and small.labels[1] == "0.0002"


def test_memory_and_utilization_share_one_time_axis() -> None:
    state = RunState()
    state.ingest(hello())
    for i in range(50):
        state.ingest(step(i, t=1.0 + i * 0.3))
    from ampscope.core import events as ev

    state.ingest(ev.SysEvent(t=3.0, cpu_util=50.0, proc_cpu=180.0))
    memory = MemoryPlot().figure(state, (60, 15))
    util = UtilPlot().figure(state, (60, 15))
    assert memory.x == util.x == time_axis(state, 60)
    assert util.y.hi == 100  # percent stays 0-100; the engine's 180 % is 1.8 cores on the right
    assert util.y_right is not None and util.y_right.hi >= 1.8


def test_steps_are_whole_and_lines_differ_without_colour() -> None:
    axis = step_axis([0, 333], 60)
    assert all(t == int(t) for t in axis.ticks)
    state = RunState()
    state.ingest(hello())
    for i in range(40):
        state.ingest(step(i, loss_scale=2.0**16, grad_zero_frac=0.1 if i % 5 == 0 else None))
    fig = LossPlot().figure(state, (60, 15))
    markers = [line.marker for line in fig.lines]
    assert len(set(markers)) == len(markers) == 2
    title = "".join(part for part, _ in fig.titles[0])
    assert all(LEGEND_GLYPHS[m] in title for m in markers)  # the title names lines by marker
    assert set(LINE_ORDER) == set(LEGEND_GLYPHS) and DOT in LEGEND_GLYPHS.values()


def test_without_a_scaler_the_loss_plot_shows_grad_zeros() -> None:
    state = RunState()
    state.ingest(hello())
    for i in range(40):
        state.ingest(step(i, grad_zero_frac=i / 100 if i % 5 == 0 else None))
    fig = LossPlot().figure(state, (60, 15))
    zeros = fig.lines[-1]
    assert zeros.right and zeros.ys[-1] == pytest.approx(35.0)  # percent
    assert "grad zeros" in "".join(part for part, _ in fig.titles[0])


def test_a_scaled_line_lands_where_its_scaled_values_do() -> None:
    """Bytes drawn as GiB through ``scale`` sit exactly where the GiB values would."""
    x, y = nice_axis(0, 10, 2, whole=True), nice_axis(5, 15, 2)  # an axis not from zero
    xs = list(range(11))
    size = (40, 12)
    as_bytes = Chart().draw(
        size, [], x, y, [Line("", xs, [v * 2**30 for v in xs], "c", scale=2**-30)]
    )
    as_gib = Chart().draw(size, [], x, y, [Line("", xs, [float(v) for v in xs], "c")])
    assert as_bytes == as_gib and any("▞" in t or "▗" in t for row in as_gib for t, _ in row)


def test_a_plot_without_a_right_axis_is_closed_on_the_right() -> None:
    """The step time and memory plots (left in the Run view) have no right axis: their frame
    still has its right edge, in its last column, with no tick labels beyond it."""
    state = RunState()
    state.ingest(hello())
    for i in range(30):
        state.ingest(step(i, 40.0 + i % 3))
    fig = StepTimePlot().figure(state, (40, 10))
    assert fig.y_right is None
    rows = Chart().draw((40, 10), fig.titles, fig.x, fig.y, fig.lines)
    text = ["".join(part for part, _ in row) for row in rows]
    frame = text[:-1]  # the x labels below it
    assert frame[0].endswith("┐") and frame[-1].endswith("┘"), "\n".join(text)
    assert all(line[-1] in "│├" for line in frame[1:-1]), "\n".join(text)


def test_an_empty_memory_plot_has_a_readable_axis() -> None:
    state = RunState()
    state.ingest(hello())  # no memory figures yet
    fig = MemoryPlot().figure(state, (40, 12))
    assert len(set(fig.y.labels)) == len(fig.y.labels)  # never "0┤ 0┤ 0┤"


@pytest.mark.parametrize("marker", ["hd", "braille", "dot"])
@pytest.mark.parametrize("size", [(60, 16), (36, 8), (118, 20)])
def test_points_in_step_order_are_drawn_as_every_point_is(marker: str, size) -> None:
    """The Run view's columns only go up: their pixel columns are found by bisection. The
    cells are those of the point-by-point drawing: spikes, repeated and missing steps, points
    off either edge, a ceiling and a scale included."""
    xs = [float(i) for i in range(-40, 4000) if i % 97 != 5] + [4000.0, 4000.0, 4000.0]
    ys = [1e6 * (10 + (i % 17) * 0.3 + (400 if i % 500 == 3 else 0)) for i in range(len(xs))]
    ys[-3:] = [0.0, -5e7, 9e8]
    x = nice_axis(0, 3900, 5, whole=True, tight=True)  # the first and last points are off it
    y = nice_axis(0, 40, 4)
    for ceiling in (None, 30e6):
        drawn = []
        for ascending in (False, True):
            line = Line(
                "", xs, ys, "cyan", marker, scale=1e-6, ceiling=ceiling, ascending=ascending
            )
            drawn.append(Chart().draw(size, [], x, y, [line]))
        assert drawn[0] == drawn[1]
        assert any(
            char not in " │┤├─┬┴└┘┌┐0123456789."
            for row in drawn[1]
            for text, _ in row
            for char in text
        )


def test_a_repainted_row_sends_the_cells_that_changed() -> None:
    """Every cell outside the span is the same before and after; a real change is inside."""

    def cells(row):
        return [(char, color) for text, color in row for char in text]

    def runs(chars, colors):
        out, start = [], 0
        for i in range(1, len(chars) + 1):
            if i == len(chars) or colors[i] != colors[start]:
                out.append(("".join(chars[start:i]), colors[start]))
                start = i
        return out

    rng = random.Random(7)
    for _ in range(2000):
        width = rng.randint(1, 12)
        chars = [rng.choice(" ab") for _ in range(width)]
        colors = [rng.choice([None, "red"]) for _ in range(width)]
        before = runs(chars, colors)
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(width)
            chars[i], colors[i] = rng.choice(" abc"), rng.choice([None, "red", "blue"])
        after = runs(chars, colors)
        if before == after:
            continue
        start, end = changed_cells(before, after)
        old, new = cells(before), cells(after)
        assert 0 <= start < end <= width
        assert old[:start] == new[:start] and old[end:] == new[end:]
        assert old[start] != new[start] and old[end - 1] != new[end - 1]


@pytest.mark.parametrize("size", [(60, 16), (38, 10)])
def test_a_chart_kept_between_redraws_draws_what_a_new_one_draws(size) -> None:
    """A followed run: points come at the right, the ring drops them at the left, the axes
    move now and then. The Run view's charts keep their columns between redraws: each redraw
    is cell for cell what a chart drawing for the first time makes of the same state."""
    state = RunState(maxlen=300)
    state.ingest(hello())
    plots = [StepTimePlot(), LossPlot(), MemoryPlot()]
    kept = [Chart() for _ in plots]
    rng = random.Random(3)
    i = 0
    for _ in range(120):
        for _ in range(rng.choice([0, 1, 3, 17])):
            state.ingest(
                step(
                    i,
                    10 + rng.random() * (40 if i % 97 == 0 else 2),
                    loss=5 / (1 + i / 50),
                    loss_scale=2.0 ** (16 - i // 200),
                    mem_allocated=(1 << 30) + (i % 13) * (1 << 20),
                    mem_reserved=2 << 30,
                    t=i * 0.01,
                )
            )
            i += 1
        for plot, chart in zip(plots, kept, strict=True):
            fig = plot.figure(state, size)
            args = (size, fig.titles, fig.x, fig.y, fig.lines, fig.y_right)
            assert chart.draw(*args) == Chart().draw(*args), (type(plot).__name__, i)
    assert i > 300 and any(chart.kept for chart in kept)


@pytest.mark.parametrize("marker", ["hd", "braille", "dot"])
def test_a_chart_narrowed_to_a_canvas_of_one_column_still_draws(marker: str) -> None:
    """A terminal dragged to 20x5 and then 1x1 during a run left plots whose canvas was one
    pixel wide: the step-time line's bisection divided by zero and the dashboard exited."""
    x, y, right = nice_axis(0, 10, 2, whole=True), nice_axis(0, 2000, 2), nice_axis(0, 1.0, 2)
    line = Line("", [6.6, 7.1], [570.0, 648.0], "c", marker=marker, ascending=True)
    for width in range(8, 20):
        for height in range(4, 8):
            rows = Chart().draw((width, height), [], x, y, [line], y_right=right)
            assert len(rows) == height
