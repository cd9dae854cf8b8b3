"""Compare's plots: one line per run against the step."""

from __future__ import annotations

from ampscope.core.text import visible
from ampscope.tui.model.figures import clip_outliers_across, plottable
from ampscope.tui.widgets.chart import LINE_ORDER, Line
from ampscope.tui.widgets.plots import ChartView, Figure, data_axis, say, step_axis

COLORS = ["cyan", "green", "magenta", "yellow", "red", "blue", "white", "orange"]


class OverlayPlot(ChartView):
    """One line per run against the step; lines differ by marker as well as by colour."""

    def __init__(self, title: str, short: str, clip: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.quantity, self.short, self.clipping = title, short, clip
        self.series: list[tuple[str, list[float], list[float]]] = []

    def show(self, series: list[tuple[str, list[float], list[float]]]) -> None:
        self.series = series
        self.redraw()

    def on_resize(self) -> None:
        self.redraw()

    def redraw(self) -> None:
        width, height = self.size
        if width <= 0 or height <= 0:
            return
        # 1e308, inf: left out, and a run with nothing left is no line
        series = [(label, *plottable(xs, ys)) for label, xs, ys in self.series]
        series = [(label, xs, ys) for label, xs, ys in series if xs]
        ceiling, clipped = None, 0
        if self.clipping:  # step times: a compile step would squash the rest
            series, ceiling, clipped = clip_outliers_across(series)
        lines = [
            Line(
                visible(label, 40),  # a name goes into the title: never raw
                xs,
                ys,
                COLORS[i % len(COLORS)],
                LINE_ORDER[i % len(LINE_ORDER)],
            )
            for i, (label, xs, ys) in enumerate(series)
        ]
        first = min((line.xs[0] for line in lines), default=0)
        last = max((line.xs[-1] for line in lines), default=1)
        values = [y for line in lines for y in (min(line.ys), max(line.ys))]
        named = [part for line in lines for part in (" ", (line, line.label))]
        mark = f" · {clipped} over {ceiling:.4g} at top ▲" if ceiling is not None else ""
        short = f" · {clipped} clipped ▲" if ceiling is not None else ""
        titles = [
            say(f"{self.quantity} / step{mark}:", *named),
            say(f"{self.short}{short}:", *named),
            say(f"{self.short}:", *named),
            say(f"{self.quantity} / step{mark}"),
            say(f"{self.quantity} / step"),
        ]
        fig = Figure(titles, step_axis([first, last], width), data_axis(values, height), lines)
        self.paint(fig, (width, height))
