"""The Numerics view: which layer, which format, over the sampled steps of one run.

A heatmap of layers (repeated blocks grouped into one row) x sampled steps, for one format
(fp16, bf16, e4m3, e5m2) and one measure (overflow share, underflow share, headroom in bits),
with the verdict a lecturer can read out above it. The first inf/NaN is marked with an X.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from ampscope.core.numerics import FORMATS, LIMITS, MODULE_CAP
from ampscope.core.numerics.grid import METRICS, GridRow, build_grid
from ampscope.core.numerics.names import fold_names
from ampscope.core.numerics.report import NumericsSummary, limit, verdict
from ampscope.core.presets.run_args import DEFAULT_REFRESH_HZ
from ampscope.core.presets.workload_spec import config_model
from ampscope.core.text import visible
from ampscope.tui.messages import PlanRequested
from ampscope.tui.model.source import RunSource
from ampscope.tui.screens import SCREENS_CSS
from ampscope.tui.widgets.key_bar import KeyBar

LABEL_MIN = 12  # the label column's least width ("layer", and a folded name)
PASS_COLUMNS = 6  # " pass " and the space after
CELL = 2  # characters a sampled step takes
SHARE_STEPS = ((0.5, "█", "bold red"), (0.1, "▓", "red"), (0.01, "▒", "dark_orange"))
HEADROOM_STEPS = ((0.0, "█", "bold red"), (2.0, "▓", "red"), (6.0, "▒", "dark_orange"))
NO_NUMERICS = (
    "No per-layer numerics in this run yet. They are measured every numerics.every steps "
    "(0: never) of a run that does not compile; 'ampscope numerics PRESET' measures every step."
)


def cell(value: float | None, metric: str) -> tuple[str, str]:
    """The character and colour of one cell: the darker and redder, the more is lost."""
    if value is None:
        return " ", ""
    if metric == "headroom":
        for below, char, style in HEADROOM_STEPS:
            if value < below:
                return char, style
        return ("░", "yellow") if value < 12 else ("·", "green")
    for at_least, char, style in SHARE_STEPS:
        if value >= at_least:
            return char, style
    return ("░", "yellow") if value > 0 else ("·", "green")


def legend(metric: str) -> Text:
    out = Text("")
    if metric == "headroom":
        parts = [("█", "bold red", "beyond"), ("▓", "red", "<2 bits"), ("▒", "dark_orange", "<6")]
        parts += [("░", "yellow", "<12"), ("·", "green", "12+")]
    else:
        parts = [("█", "bold red", ">=50%"), ("▓", "red", ">=10%"), ("▒", "dark_orange", ">=1%")]
        parts += [("░", "yellow", ">0"), ("·", "green", "none")]
    for char, style, words in parts:
        out.append(char * CELL, style=style)
        out.append(f" {words}  ")
    out.append("X", style="bold magenta")
    out.append(" first inf/NaN")
    return out


def label_width(labels: list[str], steps: int, width: int) -> int:
    """The label column: as wide as the longest label, up to half the screen, or more where
    the sampled steps leave room."""
    longest = max((len(label) for label in labels), default=LABEL_MIN)
    room = max(width // 2, width - PASS_COLUMNS - CELL * steps)
    return max(LABEL_MIN, min(longest, room))


def grid_text(steps: list[int], rows: list[GridRow], metric: str, width: int) -> Text:
    labels = list(dict.fromkeys(visible(row.label, 2000) for row in rows))
    column = label_width(labels, len(steps), width)
    shown = dict(zip(labels, fold_names(labels, column), strict=True))
    column = max([LABEL_MIN, *(len(label) for label in shown.values())])
    columns = max(1, (width - column - PASS_COLUMNS) // CELL)
    kept_steps = slice(max(0, len(steps) - columns), len(steps))
    out = Text(f"{'layer':<{column}} pass ", style="bold")
    kept = steps[kept_steps]
    if kept:
        out.append(f"steps {kept[0]}..{kept[-1]}" if len(kept) > 1 else f"step {kept[0]}")
    for row in rows:
        label = shown[visible(row.label, 2000)]
        out.append("\n" + f"{label:<{column}} {row.pass_label:<4} ")
        offset = kept_steps.start
        for index, value in enumerate(row.cells[kept_steps], start=offset):
            if index == row.first_nonfinite:
                out.append("X" * CELL, style="bold magenta")
                continue
            char, style = cell(value, metric)
            out.append(char * CELL, style=style)
    return out


class NumericsScreen(Screen):
    CSS_PATH = SCREENS_CSS
    HELP_TITLE = "Numerics"
    HELP = (
        "Per-layer numerics of the run on the sampled steps: for each leaf module's outputs "
        "(out) and their gradients (grad), and each parameter's gradient (out.bias grad), the "
        "share of values a format would overflow or round to zero, or the headroom in bits to "
        "its largest value. Repeated blocks share a row (their worst member); long names lose "
        "their first parts (…). f switches the format, m the measure; the arrows scroll."
    )
    BINDINGS = [
        Binding("f", "next_format", "Format", id="numerics.format"),
        Binding("m", "next_metric", "Measure", id="numerics.metric"),
        Binding("l", "plan", "Layer plan", id="numerics.plan"),
        Binding("escape", "back", "Back", id="numerics.back"),
        Binding("q", "app.quit", "Quit", id="quit"),
    ]

    def __init__(self, source: RunSource, refresh_hz: float = DEFAULT_REFRESH_HZ) -> None:
        super().__init__()
        self.source = source
        self.refresh_hz = refresh_hz
        self.format_key = "fp16"
        self.metric = "overflow"
        self.drawn_version = -1

    @property
    def summary(self) -> NumericsSummary:
        return self.source.state.numerics

    def compose(self) -> ComposeResult:
        yield Static("", id="numerics-header", markup=False)
        yield Static("", id="numerics-verdict", markup=False)
        with VerticalScroll(id="numerics-scroll"):
            yield Static("", id="numerics-grid", markup=False)
        yield Static("", id="numerics-legend", markup=False)
        yield KeyBar()

    def on_mount(self) -> None:
        self.redraw()
        self.set_interval(1.0 / self.refresh_hz, self.redraw_if_new, name="redraw")
        self.query_one("#numerics-scroll").focus()

    def redraw_if_new(self) -> None:
        if self.source.state.version != self.drawn_version:
            self.redraw()

    def redraw(self) -> None:
        self.drawn_version = self.source.state.version
        summary = self.summary
        key, metric = self.format_key, self.metric
        header = f"Numerics · {key} (largest {limit(LIMITS[key].largest)}) · {METRICS[metric]}"
        if summary.steps:
            measured = summary.layers()
            sampled = len(summary.steps)
            header += f" · {sampled} sampled step"
            header += f"{'s' if sampled != 1 else ''} · {measured} layers"
            idle = len(summary.never_ran())
            if summary.modules_total > measured:
                header += f" of {summary.modules_total}"
                if idle:
                    header += f" ({idle} never ran)"
                if summary.modules_total > measured + idle:
                    header += f" (at most {MODULE_CAP} measured)"
        self.query_one("#numerics-header", Static).update(header)
        if not summary.steps:
            self.query_one("#numerics-verdict", Static).update(NO_NUMERICS)
            self.query_one("#numerics-grid", Static).update("")
            self.query_one("#numerics-legend", Static).update("")
            return
        said = verdict(summary, key)
        first = summary.first_nonfinite
        if first:
            said += f" First inf/NaN: {visible(first.place(), 400)}, step {first.step}."
        self.query_one("#numerics-verdict", Static).update(said)
        steps, rows = build_grid(list(summary.recent), key, metric)
        width = self.size.width or 80
        self.query_one("#numerics-grid", Static).update(grid_text(steps, rows, metric, width))
        self.query_one("#numerics-legend", Static).update(legend(metric))

    def on_resize(self) -> None:
        self.redraw()

    def action_next_format(self) -> None:
        keys = list(FORMATS)
        self.format_key = keys[(keys.index(self.format_key) + 1) % len(keys)]
        self.redraw()

    def action_next_metric(self) -> None:
        keys = list(METRICS)
        self.metric = keys[(keys.index(self.metric) + 1) % len(keys)]
        self.redraw()

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_plan(self) -> None:
        """l: the layer plan of this run's model: for fp16 while fp16 is shown, else fp8."""
        model = config_model(self.source.state.config)
        if model is not None:
            self.post_message(PlanRequested("fp16" if self.format_key == "fp16" else "fp8", model))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "plan":  # a built-in model's run: left out (the help says why)
            return config_model(self.source.state.config) is not None
        return True

    def key_note(self, action: str) -> str:
        if action == "plan":
            return "this run trains a built-in model; a plan is of your own (--model)"
        return ""
