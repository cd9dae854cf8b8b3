"""The number-format explorer: what each format stores for a value, its facts, and the demos.

``ampscope.core.formats`` (numpy, ml_dtypes: seconds to import) is imported when the screen
opens, never with the dashboard.
"""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import (
    DataTable,
    Input,
    Label,
    OptionList,
    Static,
    TabbedContent,
    TabPane,
)

from ampscope.tui.screens.tool import ESC_BINDINGS, ToolScreen
from ampscope.tui.widgets.key_bar import KeyBar
from ampscope.tui.widgets.tables import fill, hidden_note
from ampscope.tui.widgets.text_field import TextField

DEFAULT_VALUES = "65504, 65520, 1e-8, 1 + 2**-8, 0.1"
FIELD_STYLES = ("bold red", "bold cyan", "bold green")  # sign, exponent, mantissa


def bits_text(fields: tuple[str, ...]) -> Text:
    """The bit pattern with sign, exponent and mantissa told apart by colour and a bar."""
    text = Text()
    for i, (bits, style) in enumerate(zip(fields, FIELD_STYLES, strict=False)):
        if i:
            text.append("|", style="dim")
        text.append(bits, style=style)
    return text


def split_values(text: str) -> list[str]:
    return [part.strip() for part in text.replace(";", ",").split(",") if part.strip()]


VALUE_COLUMNS = ("value", "format", "stored", "rel. error", "flags")
"""The Values tab's columns, in the order its rows are written. The bits (66 columns for an
fp64) are spelled out under the table for the highlighted row: no terminal is wide enough to
show them in a column beside the rest."""
FACT_COLUMNS = (
    "format",
    "bits",
    "e/m",
    "max",
    "min normal",
    "min subn.",
    "eps",
    "digits",
    "decades",
    "past the range",
)
FACT_ORDER = [FACT_COLUMNS.index(c) for c in (
    "format", "max", "min normal", "min subn.", "eps", "decades", "e/m", "digits", "bits",
    "past the range",
)]  # fmt: skip
"""The Formats tab's columns, most wanted first: at 80 columns the range and precision the
lecture points at (fp16's 6.1e-5 and 5.96e-8) stay; bits (1 + e + m) and digits (the mantissa
bits x log10 2) follow from the others and give way first."""


def _fm():
    from ampscope.core import formats

    return formats


class FormatsScreen(ToolScreen):
    TABLE = "#formats-table"
    HELP_TITLE = "Number formats"
    HELP = (
        "What each number format stores for a value. Values: type numbers or expressions "
        "(1 + 2**-9, 1e-8), enter shows every format's stored value, its relative error, "
        "flags (overflow, underflow, saturated) and its bits; the line under the table spells "
        "out the highlighted row's bits. Formats: each format's range and precision. Demos: "
        "the lecture's cases (fp16 overflow, underflow, loss scaling): up/down shows one. "
        "v, f and d open the Values, Formats and Demos tabs from anywhere but the text field "
        "(esc leaves it first); a click on a tab does too."
    )
    BINDINGS = [
        *ESC_BINDINGS,
        Binding("escape", "back", "Back", id="formats.back"),
        Binding("v", "open_tab('tab-values')", "Values", id="formats.values"),
        Binding("f", "open_tab('tab-facts')", "Formats", id="formats.facts"),
        Binding("d", "open_tab('tab-demos')", "Demos", id="formats.demos"),
        Binding("q", "app.quit", "Quit", id="quit"),
    ]
    TAB_FOCUS = {
        "tab-values": "#formats-input",
        "tab-facts": "#facts-table",
        "tab-demos": "#demo-list",
    }
    """What each tab hands the focus to: the field to type a value in, the table, the list."""

    def compose(self) -> ComposeResult:
        with TabbedContent(id="formats-tabs"):
            with TabPane("Values", id="tab-values"):
                yield Label("Values or expressions, separated by commas (e.g. 1 + 2**-9):")
                yield TextField(value=DEFAULT_VALUES, id="formats-input")
                yield Label("", id="formats-error", classes="error", markup=False)
                yield DataTable(id="formats-table", zebra_stripes=True, cursor_type="row")
                yield Static("", id="formats-bits", markup=False)
            with TabPane("Formats", id="tab-facts"):
                yield DataTable(id="facts-table", zebra_stripes=True, cursor_type="row")
                yield Static("", id="facts-note", markup=False)
            with TabPane("Demos", id="tab-demos"):
                yield OptionList(id="demo-list")
                yield Static("", id="demo-text")
        yield KeyBar()

    def __init__(self) -> None:
        super().__init__()
        self.bits: list[tuple[str, str, tuple[str, ...]]] = []
        self.value_rows: list[list[object]] = []
        self.fact_rows: list[list[str]] = []

    def on_mount(self) -> None:
        fm = _fm()
        self.fact_rows = [
            [
                f["label"],
                str(f["bits"]),
                f"{f['exponent_bits']}/{f['mantissa_bits']}" if f["kind"] == "float" else "int",
                _g(f["max"]),
                _g(f["smallest_normal"]),
                _g(f["smallest_subnormal"]),
                _g(f["eps"]),
                _g(f["decimal_digits"]),
                _g(f["range_decades"]),
                f["overflow"],
            ]
            for f in fm.facts_table()
        ]
        demos = self.query_one("#demo-list", OptionList)
        for name, (title, _fn) in fm.DEMOS.items():
            demos.add_option(f"{name}: {title}")
        demos.highlighted = 0  # the first demo is lit and shown: down goes to the second
        self.show_values(DEFAULT_VALUES)
        self.query_one("#formats-input", Input).focus()

    def action_open_tab(self, pane: str) -> None:
        self.query_one("#formats-tabs", TabbedContent).active = pane
        self.query_one(self.TAB_FOCUS[pane]).focus()

    @on(TabbedContent.TabActivated)
    def _tab(self, event: TabbedContent.TabActivated) -> None:
        """Each tab gives the focus to what it is about, its first row lit: esc then goes
        back in one press, and the tab keys work at once."""
        self.query_one(self.TAB_FOCUS.get(event.pane.id or "", "#formats-input")).focus()

    @on(Input.Submitted, "#formats-input")
    def _submitted(self, event: Input.Submitted) -> None:
        self.show_values(event.value)

    def show_values(self, text: str) -> None:
        fm = _fm()
        error = self.query_one("#formats-error", Label)
        try:
            described = [fm.describe(v) for v in split_values(text)]
        except (fm.ExpressionError, ValueError, ZeroDivisionError) as exc:
            error.update(str(exc))
            return
        error.update("")
        self.value_rows = []
        self.bits = []
        for d in described:
            for row in d.rows:
                cells = {
                    "value": d.input,
                    "format": row.format,
                    "stored": row.text,
                    "rel. error": "-" if row.rel_error is None else f"{row.rel_error:.2e}",
                    "flags": Text(", ".join(row.flags), style="bold yellow" if row.flags else ""),
                }
                self.value_rows.append([cells[c] for c in VALUE_COLUMNS])
                self.bits.append((d.input, row.format, tuple(row.fields)))
        self.fit_tables()
        self.show_bits(0)

    def fit_tables(self) -> None:
        width = self.size.width
        fill(self.query_one("#formats-table", DataTable), VALUE_COLUMNS, self.value_rows, width)
        facts = self.query_one("#facts-table", DataTable)
        shown = fill(facts, FACT_COLUMNS, self.fact_rows, width, FACT_ORDER)
        note = "e/m: exponent/mantissa bits; min subn.: the smallest subnormal"
        hidden = hidden_note(FACT_COLUMNS, shown, FACT_ORDER, room=width - len(note) - 16)
        self.query_one("#facts-note", Static).update(note + hidden)

    def on_resize(self) -> None:
        if self.is_mounted and self.fact_rows:
            self.fit_tables()

    @on(DataTable.RowHighlighted, "#formats-table")
    def _row(self, event: DataTable.RowHighlighted) -> None:
        self.show_bits(event.cursor_row)

    def show_bits(self, index: int) -> None:
        """The highlighted row's bits, spelled out: at 80 columns the bits column is off screen."""
        line = self.query_one("#formats-bits", Static)
        if not 0 <= index < len(self.bits):
            line.update("")
            return
        value, name, fields = self.bits[index]
        names = ("sign", "exponent", "mantissa") if len(fields) == 3 else ("bits",)
        text = Text(f"{value} as {name}, bits ({' | '.join(names[: len(fields)])}):\n")
        text.append_text(bits_text(fields))
        line.update(text)

    @on(OptionList.OptionHighlighted, "#demo-list")
    @on(OptionList.OptionSelected, "#demo-list")
    def _demo(self, event: OptionList.OptionHighlighted | OptionList.OptionSelected) -> None:
        """The lit demo is shown as the cursor reaches it: a presenter steps through them
        with up/down alone."""
        fm = _fm()
        name = list(fm.DEMOS)[event.option_index]
        self.query_one("#demo-text", Static).update("\n".join(fm.run_demo(name).lines))


def _g(x: object) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if x.is_integer() and abs(x) < 1e7:  # a format's exact maxima: 65504, 57344, 448
            return f"{x:.0f}"
        return f"{x:.4g}"
    return str(x)
