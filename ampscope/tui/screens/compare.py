"""Compare runs side by side: the bench table, overlaid step-time and loss curves, a verdict.

Opened from the history (marked runs) or at the end of a sweep. Rows come from
``ampscope.core.comparison``, so the table reads exactly like ``ampscope bench`` prints it.
"""

from __future__ import annotations

from collections import Counter

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import DataTable, Static

from ampscope.core import comparison, records
from ampscope.core import events as ev
from ampscope.core.comparison import significance
from ampscope.core.profiles import compare
from ampscope.core.records.labels import run_model, run_preset
from ampscope.core.text import visible
from ampscope.tui.screens import SCREENS_CSS
from ampscope.tui.text import literal
from ampscope.tui.widgets.chart import LEGEND_GLYPHS, LINE_ORDER
from ampscope.tui.widgets.key_bar import KeyBar
from ampscope.tui.widgets.overlay_plot import COLORS, OverlayPlot
from ampscope.tui.widgets.tables import (
    CELL_PADDING,
    TABLE_CHROME,
    column_scroll,
    column_widths,
    fill,
    off_edges,
)

FIT_ORDER = (
    "preset",
    "step time",
    "speedup",
    "status",
    "peak mem",
    "final loss",
    "samples/s",
    "MFU",
    "skipped",
    "grad zeros",
    "TFLOP/s",
    "tokens/s",
    "mem vs base",
    "loss vs base",
    "compile",
)
"""The columns' order of precedence, most wanted first (all of comparison.COLUMNS)."""
DEMO_COLUMNS = ("grad zeros", "skipped", "final loss")
"""What precision demonstrations are about (underflow zeros, skipped steps, the loss they
cost): first after the preset whenever the runs differ in them."""


def column_order(heads: list[str], body: list[list[object]]) -> tuple[list[int], list[str]]:
    """The columns in the order the table shows them, and the names of those equal in every
    row. The preset first; then the columns in which the runs differ, the demonstrations'
    figures ahead of the rest of ``FIT_ORDER``; the equal ones last, off to the right on a
    narrow terminal, where left/right reaches them. A lone run differs in nothing."""

    if len(body) < 2:
        return [heads.index(h) for h in FIT_ORDER], []

    def differs(i: int) -> bool:
        return len({str(row[i]) for row in body}) > 1

    wanted = dict.fromkeys(["preset", *DEMO_COLUMNS, *FIT_ORDER])
    first, *rest = (heads.index(h) for h in wanted)
    equal = [i for i in rest if not differs(i)]
    return [first, *(i for i in rest if differs(i)), *equal], [heads[i] for i in equal]


ROOMY_WIDTH = 120
"""From this width the step time carries its spread; narrower, the columns after it fit."""

# The columns the sort key cycles through: (title, Row attribute, largest first?)
SORTS = [
    ("order", None, False),
    ("step time", "step_ms", False),
    ("speedup", "speedup", True),
    ("samples/s", "samples_per_s", True),
    ("peak mem", "mem_peak", False),
    ("final loss", "loss_final", False),
    ("skipped", "skipped_steps", True),
    ("preset", "preset", False),
]


def names_for(runs: list[records.RunRecord]) -> list[str]:
    """Preset names, with the model when the runs train different ones."""
    several = len({run_model(r) for r in runs}) > 1
    return [f"{run_preset(r)} {run_model(r)}" if several else run_preset(r) for r in runs]


def labels_for(runs: list[records.RunRecord]) -> list[str]:
    """``names_for``, numbered where the same name appears more than once."""
    names = names_for(runs)
    counts = Counter(names)
    seen: Counter[str] = Counter()
    out = []
    for name in names:
        seen[name] += 1
        out.append(name if counts[name] == 1 else f"{name}#{seen[name]}")
    return out


def repeat_groups(runs: list[records.RunRecord]) -> dict[str, list[records.RunRecord]]:
    """The runs of each name, in the order given (repeat k is the k-th), names in order of
    first appearance: a repeated sweep's rows, as ``ampscope bench --repeats`` makes them."""
    groups: dict[str, list[records.RunRecord]] = {}
    for name, run in zip(names_for(runs), runs, strict=True):
        groups.setdefault(name, []).append(run)
    return groups


def models_of(runs: list[records.RunRecord]) -> Text:
    """``model X`` for the title when every run trains the same one, else '' (each row says);
    the model's name as recorded, its control characters spelled out."""
    models = {run_model(r) for r in runs}
    model = models.pop() if len(models) == 1 else "-"
    return Text.assemble("model ", literal(model), " · ") if model != "-" else Text()


def compare_help(level: float, min_repeats: int) -> str:
    """The help text, with the verdict's rule as ``core.comparison.significance`` applies it."""
    return (
        "Runs side by side, as 'ampscope bench' prints them: speedup, memory and final loss "
        "against the baseline, step time and loss curves overlaid, and a verdict in words. "
        "The columns in which the runs differ come first (grad zeros, skipped steps and the "
        "final loss ahead of the rest), those equal in every run last; left/right scroll to "
        "the columns off the edge, which the title names, and the preset stays. "
        "A speed-up is called only when repeated runs show it: repeat k of a preset is paired "
        f"with repeat k of the baseline, and the {level * 100:g} % confidence interval of their "
        "median step-time ratios must exclude 1.0; ~ marks an interval that includes it (no "
        f"difference shown), ? a preset with fewer than {min_repeats} repeats (untested: run a "
        f"sweep with repeats {min_repeats} or more, x on the Presets screen, or 'ampscope bench "
        f"--repeats {min_repeats}'). With repeats, the curves are each preset's first run. "
        "Under the plots, each run's profile (the last its record holds) against the "
        "baseline's: the change of the ms a step spends in each class (matmul, elementwise, "
        "idle...), largest first; 'ampscope profile PRESET' or p in the Run view records one."
    )


class CompareScreen(Screen):
    CSS_PATH = SCREENS_CSS
    HELP_TITLE = "Compare"
    HELP = compare_help(significance.LEVEL, significance.MIN_REPEATS)
    BINDINGS = [
        Binding("b", "baseline", "Baseline = this row", id="compare.baseline"),
        Binding("o", "sort", "Sort", id="compare.sort"),
        # a column a press, where the table's own keys scroll a character a press
        Binding("left", "column(-1)", "Column left", show=False, priority=True, id="compare.left"),
        Binding(
            "right", "column(1)", "Column right", show=False, priority=True, id="compare.right"
        ),
        Binding("escape", "back", "Back", id="compare.back"),
        Binding("q", "app.quit", "Quit", id="quit"),
    ]

    def __init__(
        self, runs: list[records.RunRecord], baseline: str | None = None, repeated: bool = False
    ) -> None:
        """``repeated``: runs of the same preset are repeats (a sweep with repeats): one row
        each, its speed-up tested over the pairs; otherwise every run is a row of its own."""
        super().__init__()
        self.runs = runs
        if repeated:
            groups = repeat_groups(runs)
            self.labels = list(groups)
            self.base_rows = [comparison.row_from_runs(n, rs) for n, rs in groups.items()]
            self.shown = [rs[0] for rs in groups.values()]  # the curves: each first repeat
            members = list(groups.values())
        else:
            self.labels = labels_for(runs)
            self.base_rows = [
                comparison.row_from_runs(lbl, [r]) for lbl, r in zip(self.labels, runs, strict=True)
            ]
            self.shown = runs
            members = [[r] for r in runs]
        self.repeats = max((r.runs for r in self.base_rows), default=1)
        self.baseline = row_named(baseline, self.labels, members) or default_baseline(
            self.base_rows
        )
        self.sort_index = 0
        self.sorted_by = SORTS[0][0]
        self.rows: list[comparison.Row] = []
        self.heads: list[str] = []  # the table's columns, in the order shown
        self.widths: list[int] = []  # their widths, padding included
        self.equal: list[str] = []  # the columns in which every run is the same
        self.profiled = [  # a row's profile: the last one any of its runs took
            compare.ProfiledRun(lbl, run_preset(rs[0]), compare.last_profile_of(rs))
            for lbl, rs in zip(self.labels, members, strict=True)
        ]

    def compose(self) -> ComposeResult:
        yield Static("", id="compare-title")
        yield DataTable(id="compare-table", cursor_type="row", zebra_stripes=True)
        with Horizontal(id="compare-plots"):
            yield OverlayPlot("step time (ms)", "ms / step", clip=True, id="compare-step")
            yield OverlayPlot("loss", "loss / step", id="compare-loss")
        yield Static("", id="compare-profile")
        yield Static("", id="compare-verdict")
        yield KeyBar()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        self.watch(table, "scroll_x", lambda _x: self.show_title(), init=False)
        self.render_table()
        self.query_one("#compare-step", OverlayPlot).show(self.curves("step_ms"))
        self.query_one("#compare-loss", OverlayPlot).show(self.curves("loss"))
        table.focus()

    def curves(self, field: str) -> list[tuple[str, list[float], list[float]]]:
        out = []
        for label, run in zip(self.labels, self.shown, strict=True):
            steps = [e for e in run.events if isinstance(e, ev.StepEvent)]
            pts = [(e.step, getattr(e, field)) for e in steps if getattr(e, field) is not None]
            out.append((label, [float(x) for x, _ in pts], [float(y) for _, y in pts]))
        return out

    def render_table(self) -> None:
        rows = comparison.compare(
            [comparison.Row(**_fields(r)) for r in self.base_rows], self.baseline
        )
        title, key, largest_first = SORTS[self.sort_index]
        if key is not None:
            present = [r for r in rows if getattr(r, key) is not None]
            missing = [r for r in rows if getattr(r, key) is None]
            rows = sorted(present, key=lambda r: getattr(r, key), reverse=largest_first) + missing
        self.rows = rows
        table = self.query_one(DataTable)
        cursor = table.cursor_row
        body: list[list[object]] = []
        roomy = self.size.width >= ROOMY_WIDTH  # else memory and loss go before the spread
        for row in rows:
            cells = comparison.cells(row, with_spread=roomy)
            cells["status"] = row.status  # the reason is in the verdict under the plots
            line: list[object] = [literal(cells[k]) for _, k in comparison.COLUMNS]
            line[0] = self.legend_cell(row.preset)
            body.append(line)
        heads = [title for title, _ in comparison.COLUMNS]
        order, self.equal = column_order(heads, body)
        self.heads = [heads[i] for i in order]
        body = [[line[i] for i in order] for line in body]
        fill(table, self.heads, body, 1 << 20, keys=[r.preset for r in rows])  # every column
        table.fixed_columns = 1  # the preset stays while left/right scroll the rest
        self.widths = [w + CELL_PADDING for w in column_widths(self.heads, body)]
        if rows:
            table.move_cursor(row=min(cursor, len(rows) - 1))
        self.sorted_by = title
        self.show_title()
        self.call_after_refresh(self.show_title)  # once the table knows its width
        self.query_one("#compare-verdict", Static).update(
            Text("\n").join(literal(v) for v in comparison.verdicts(rows, self.baseline))
        )
        lines = compare.compare_lines(self.profiled, self.baseline, self.size.width - 2)
        self.query_one("#compare-profile", Static).update(
            Text("\n", no_wrap=True, overflow="ellipsis").join(literal(v) for v in lines)
        )

    def show_title(self) -> None:
        """What is compared, and the columns the table's edges cut (left/right reach them);
        those equal in every run are said to be, since they are last."""
        table = self.query_one(DataTable)
        counted = f"{len(self.rows)} runs"
        if self.repeats > 1:
            counted = f"{len(self.rows)} presets × {self.repeats} runs"
        room = table.scrollable_content_region.width or self.size.width - TABLE_CHROME
        left, right = off_edges(self.heads, self.widths, table.scroll_x, room)
        self.query_one("#compare-title", Static).update(
            Text.assemble(
                f"{counted} · ",
                models_of(self.runs),
                "baseline ",
                literal(self.baseline, "bold"),
                f" · sorted by {self.sorted_by}",
                more_note(left, right, self.equal),
            )
        )

    def legend_cell(self, label: str) -> Text:
        """The run's name behind its line's marker, in its colour: the table is the legend."""
        i = self.labels.index(label) if label in self.labels else 0
        return Text.assemble(
            (LEGEND_GLYPHS[LINE_ORDER[i % len(LINE_ORDER)]], COLORS[i % len(COLORS)]),
            " ",
            visible(label),
        )

    def on_resize(self) -> None:
        if self.is_mounted:
            self.render_table()

    def action_baseline(self) -> None:
        table = self.query_one(DataTable)
        if table.row_count:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
            self.baseline = str(key.value)
            self.render_table()

    def action_sort(self) -> None:
        self.sort_index = (self.sort_index + 1) % len(SORTS)
        self.render_table()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        title = str(event.column_key.value)
        for i, (name, _key, _largest) in enumerate(SORTS):
            if name == title:
                self.sort_index = i
                self.render_table()

    def action_column(self, step: int) -> None:
        table = self.query_one(DataTable)
        x = column_scroll(self.widths, table.scroll_x, step)
        table.scroll_to(x=min(x, table.max_scroll_x), animate=False, immediate=True)

    def action_back(self) -> None:
        self.app.pop_screen()


def more_note(left: list[str], right: list[str], equal: list[str], room: int = 24) -> str:
    """`` · → grad zeros, skipped +3 (←/→)`` for the columns off either edge, as many names as
    ``room`` holds; the equal ones are named as such: nothing is silently missing."""
    if not left and not right:
        return ""

    def names(heads: list[str]) -> str:
        said: list[str] = []
        for head in heads:
            if said and len(", ".join([*said, head])) > room:
                break
            said.append(head)
        rest = len(heads) - len(said)
        return ", ".join(said) + (f" +{rest}" if rest else "")

    sides = [f"← {names(left)}" if left else "", f"→ {names(right)}" if right else ""]
    same = right and all(h in equal for h in right)
    tail = ", the same in every run" if same else ""
    return f" · {'  '.join(s for s in sides if s)}{tail} (←/→)"


def row_named(
    preset: str | None, labels: list[str], members: list[list[records.RunRecord]]
) -> str | None:
    """The row a sweep's baseline (a preset's name) is: its label, which also names the model
    when the runs train different ones ('mlp-demo mlp'); None when no row runs it."""
    if not preset:
        return None
    if preset in labels:
        return preset
    return next(
        (lbl for lbl, rs in zip(labels, members, strict=True) if run_preset(rs[0]) == preset),
        None,
    )


def default_baseline(rows: list[comparison.Row]) -> str:
    """fp32 if it has figures, else the first run that has any: never an empty run."""
    measured = [r for r in rows if r.step_ms is not None]
    fp32 = next((r for r in measured if r.preset.split("#")[0].split(" ")[0] == "fp32"), None)
    chosen = fp32 or (measured[0] if measured else rows[0] if rows else None)
    return chosen.preset if chosen else ""


def _fields(row: comparison.Row) -> dict:
    return {f: getattr(row, f) for f in row.__struct_fields__}
