"""The Run view's plots. Drawn from the run state's ring buffers on a timer, never per event."""

from __future__ import annotations

from textual_plotext import PlotextPlot

from ampscope.tui import figures
from ampscope.tui.figures import points_for_width
from ampscope.tui.run_state import RunState

MARKER = "hd"  # cheaper than braille, still two points a column
AXIS_COLUMNS = 10  # what the y axis labels take from the width


class RunPlot(PlotextPlot):
    """A plot that redraws itself from a RunState when the state (or its size) changed."""

    TITLE = ""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._drawn: tuple = ()
        self.points_drawn = 0

    @property
    def max_points(self) -> int:
        return points_for_width(max(1, self.size.width - AXIS_COLUMNS))

    def data_key(self, state: RunState) -> object:
        """Changes when this plot's data changed: no redraw otherwise."""
        return state.step_count

    def draw(self, state: RunState) -> bool:
        key = (id(state), self.data_key(state), self.size.width, self.size.height)
        if key == self._drawn:
            return False
        self._drawn = key
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.TITLE)
        self.points_drawn = self.plot_state(state, self.max_points)
        self.refresh()
        return True

    def plot_state(self, state: RunState, max_points: int) -> int:
        raise NotImplementedError


class StepTimePlot(RunPlot):
    TITLE = "step time (ms) / step"

    def plot_state(self, state: RunState, max_points: int) -> int:
        xs, ys = figures.step_time_series(state, max_points)
        if xs:
            self.plt.plot(xs, ys, marker=MARKER, color="cyan")
        return len(xs)


class LossPlot(RunPlot):
    TITLE = "loss (left) · log2 loss scale (right)"

    def plot_state(self, state: RunState, max_points: int) -> int:
        (lx, ly), (sx, sy) = figures.loss_series(state, max_points)
        if lx:
            self.plt.plot(lx, ly, marker=MARKER, color="green", label="loss")
        if sx:
            self.plt.plot(sx, sy, marker=MARKER, color="magenta", label="log2 scale", yside="right")
        return len(lx) + len(sx)


class MemoryPlot(RunPlot):
    TITLE = "memory (MiB) / s"
    COLORS = {
        "allocated": "cyan",
        "process RSS": "cyan",
        "reserved": "blue",
        "device used": "yellow",
        "device total": "red",
    }

    def data_key(self, state: RunState) -> object:
        return (state.step_count, state.sys_count)

    def plot_state(self, state: RunState, max_points: int) -> int:
        n = 0
        for name, (xs, ys) in figures.memory_series(state, max_points).items():
            self.plt.plot(xs, ys, marker=MARKER, color=self.COLORS.get(name, "white"), label=name)
            n += len(xs)
        return n


class UtilPlot(RunPlot):
    TITLE = "utilization (%) / s"
    COLORS = {"GPU": "green", "CPU": "cyan", "engine CPU": "yellow"}

    def data_key(self, state: RunState) -> object:
        return state.sys_count

    def plot_state(self, state: RunState, max_points: int) -> int:
        n = 0
        for name, (xs, ys) in figures.util_series(state, max_points).items():
            self.plt.plot(xs, ys, marker=MARKER, color=self.COLORS.get(name, "white"), label=name)
            n += len(xs)
        if n:
            self.plt.ylim(0, None)
        return n
