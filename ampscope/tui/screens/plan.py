"""The plan screen: which layer of the user's model to train in which format, and why.

It runs ``ampscope plan fp8|fp16 --model SPEC --json`` as a child (``tui.model.plan_process``),
shows its progress, then a row per layer (``tui.model.layer_plan``): the layer, its GEMM's
M,K,N, the predicted speed-up, the cast that decided and the decision; under the table, the
highlighted layer in full with the plan's reason. Enter trains the plan's preset as a preset
run is trained, in the Run view. A plan that fails or is refused is said here, never more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Static

from ampscope.core.text import visible
from ampscope.tui.messages import RunRequested
from ampscope.tui.model.layer_plan import (
    SORTS,
    Plan,
    PlanFault,
    as_target,
    count_words,
    detail_lines,
    files_words,
    gpu_words,
    legend_words,
    plan_table,
    speed_words,
)
from ampscope.tui.model.plan_process import PLAN_PROGRAM, PlanRequest, PlanRun
from ampscope.tui.screens import SCREENS_CSS
from ampscope.tui.text import literal
from ampscope.tui.widgets.key_bar import KeyBar
from ampscope.tui.widgets.tables import CELL_PADDING, TABLE_CHROME

BAND_STYLES = {
    "fine": "green",
    "warn": "yellow",
    "critical": "dark_orange",
    "severe": "bold red",
    "nonfinite": "bold magenta",
}
REDRAW_S = 0.5
SORT_HELP = "Order the rows by the next of: " + ", ".join(SORTS) + " (the highlighted layer stays)"
TARGET_HELP = "Plan again for the other target: fp16 (layers kept in fp32) or fp8"


class PlanScreen(Screen):
    CSS_PATH = SCREENS_CSS
    HELP_TITLE = "Layer plan"
    HELP = (
        "Which linear layer of your model to train in fp8 (or fp16) and which to keep in "
        "bf16 (fp32), from 'ampscope plan': a real step of your model measures every cast of "
        "every recipe, a speed model (or this GPU's timings) predicts each layer's speed-up "
        "at the shapes that ran. A row per layer: M,K,N of its forward GEMM, the predicted "
        "speed-up, the cast that decided (the chosen recipe's worst; for a kept layer, the "
        "best recipe's) and the decision; the highlighted layer's reason is under the table. "
        "Enter trains the plan's preset and shows it in the Run view."
    )
    BINDINGS = [
        Binding("enter", "train", "Train the plan", id="plan.train", priority=True),
        # one of each shows (check_action): the one naming the current state
        *(
            Binding("o", f"sort({i})", f"Sort: {name}", id="plan.sort", tooltip=SORT_HELP)
            for i, name in enumerate(SORTS)
        ),
        Binding("t", "switch_target('fp16')", "Target: fp8", id="plan.target", tooltip=TARGET_HELP),
        Binding("t", "switch_target('fp8')", "Target: fp16", id="plan.target", tooltip=TARGET_HELP),
        Binding("r", "plan_again", "Plan again", id="plan.again"),
        Binding("escape", "back", "Back", id="plan.back"),
        Binding("q", "app.quit", "Quit", id="quit"),
    ]
    DEFAULT_CSS = """
    PlanScreen #plan-title { height: auto; padding: 0 1; text-style: bold; }
    PlanScreen #plan-summary { height: auto; padding: 0 1; color: $text-muted; }
    PlanScreen #plan-progress { height: 1fr; padding: 0 1; }
    PlanScreen #plan-table { height: 1fr; }
    PlanScreen #plan-detail { height: 5; padding: 0 1; }
    PlanScreen #plan-legend { height: auto; padding: 0 1; color: $text-muted; }
    """

    def __init__(
        self,
        request: PlanRequest,
        program: Sequence[str] = PLAN_PROGRAM,
    ) -> None:
        """``program``: the command before the plan's arguments (a test's stand-in script)."""
        super().__init__()
        self.request = request
        self.program = tuple(program)
        self.planning: PlanRun | None = None
        self.plan: Plan | None = None
        self.fault: PlanFault | None = None
        self.sort = 0
        self.highlighted: int | None = None  # the plan's layer index under the cursor

    def compose(self) -> ComposeResult:
        yield Static("", id="plan-title", markup=False)
        yield Static("", id="plan-summary", markup=False)
        yield Static("", id="plan-progress", markup=False)
        yield DataTable(id="plan-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="plan-detail", markup=False)
        yield Static("", id="plan-legend", markup=False)
        yield KeyBar()

    def on_mount(self) -> None:
        self.set_interval(REDRAW_S, self.tick, name="plan-progress")
        self.start()

    def tick(self) -> None:
        """The seconds so far, while the plan runs."""
        if self.planning is not None and self.planning.running:
            self.show_progress()

    # ------------------------------------------------------------------ the child

    def start(self) -> None:
        """Start the plan (stopping one still running), and show its progress."""
        if self.planning is not None and self.planning.running:
            self.planning.kill_now()
        self.plan, self.fault, self.highlighted = None, None, None
        self.planning = PlanRun(self.request, self.program, on_progress=self.said)
        self.run_worker(self.follow(self.planning), group="plan", exclusive=True)
        self.show()

    async def follow(self, planning: PlanRun) -> None:
        try:
            outcome: Plan | PlanFault = await planning.run()
        except Exception as exc:  # noqa: BLE001 - said on the screen: the dashboard stays up
            planning.kill_now()
            outcome = PlanFault("ampscope plan could not run", f"{type(exc).__name__}: {exc}")
            planning.outcome = outcome
        if planning is not self.planning or not self.is_attached:
            return  # a newer plan replaced it, or the screen has gone
        if isinstance(outcome, PlanFault):
            self.fault = outcome
        else:
            self.plan = outcome
        self.show()

    def said(self, line: str) -> None:
        """A line of the plan's progress: shown as it comes."""
        if self.is_attached:
            self.show_progress()

    def on_unmount(self) -> None:
        """Leaving (or the dashboard closing) ends a plan still running, with its group."""
        if self.planning is not None and self.planning.running:
            self.planning.kill_now()

    # ------------------------------------------------------------------ drawing

    def show(self) -> None:
        planned = self.plan is not None
        self.query_one("#plan-progress").display = not planned
        for part in ("#plan-table", "#plan-detail", "#plan-legend"):
            self.query_one(part).display = planned
        title = f"Layer plan · {self.request.target} for {self.request.model}"
        if self.plan is not None and self.plan.target == "fp8":  # an fp16 plan is for any GPU
            title += f" · {gpu_words(self.plan.gpu)}"
        self.query_one("#plan-title", Static).update(literal(title))
        if self.plan is not None:
            self.show_plan(self.plan)
            self.query_one("#plan-table", DataTable).focus()  # the arrows move in it
        else:
            self.query_one("#plan-summary", Static).update("")
            self.show_progress()
        self.refresh_bindings()

    def show_progress(self) -> None:
        """While it runs: the command, the seconds so far and its last lines; then a fault."""
        if self.plan is not None or self.planning is None:
            return
        progress = self.query_one("#plan-progress", Static)
        if self.fault is not None:
            text = Text(visible(self.fault.title), style="bold red")
            text.append("\n\n" + visible(self.fault.message, keep_newlines=True))
            text.append(
                f"\n\nr plans again; in a terminal: {visible(self.request.typed())}", style="dim"
            )
            progress.update(text)
            return
        planning = self.planning
        pid = f", pid {planning.pid}" if planning.pid else ""
        head = f"planning: {self.request.typed()} ({planning.elapsed_s():.0f} s{pid})"
        room = max(1, progress.size.height - 2)
        lines = list(planning.progress)[-room:]
        text = Text(visible(head), style="bold")
        body = "\n".join(visible(line, 400) for line in lines)
        text.append("\n\n" + (body or "waiting for its first line ..."))
        progress.update(text)

    def show_plan(self, plan: Plan) -> None:
        summary = f"{speed_words(plan)} · {count_words(plan)}\n{files_words(plan.files)}"
        self.query_one("#plan-summary", Static).update(literal(summary, keep_newlines=True))
        self.fill_table(plan)

    def fill_table(self, plan: Plan) -> None:
        table = self.query_one("#plan-table", DataTable)
        width = (self.size.width or 80) - TABLE_CHROME
        fitted = plan_table(plan, SORTS[self.sort], width, CELL_PADDING)
        keep = self.under_cursor(table)
        table.clear(columns=True)
        widths = [len(head) for head in fitted.heads]
        for _i, cells in fitted.rows:
            widths = [max(w, len(c)) for w, c in zip(widths, cells, strict=True)]
        for head, w in zip(fitted.heads, widths, strict=True):
            table.add_column(head, width=w, key=head)
        self.query_one("#plan-legend", Static).update(legend_words(fitted.heads[3]))
        for i, cells in fitted.rows:
            styled = [Text(c) for c in cells]
            band = fitted.bands.get(i)
            if band:
                styled[3].stylize(BAND_STYLES[band])
            if plan.layers[i].decision == plan.target:
                styled[4].stylize("bold green")
            table.add_row(*styled, key=str(i))
        order = [i for i, _cells in fitted.rows]
        if order:
            table.move_cursor(row=order.index(keep) if keep in order else 0)
            self.show_detail(order[table.cursor_row])
        else:
            self.query_one("#plan-detail", Static).update("")

    def under_cursor(self, table: DataTable) -> int | None:
        """The layer the cursor is on, read from the table: keys typed in one burst ('down
        down o') reach o before the table's highlight messages, and the sort kept the layer
        highlighted before them."""
        if table.row_count and table.is_valid_row_index(table.cursor_row):
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
            if key is not None:
                return int(key)
        return self.highlighted

    def show_detail(self, index: int) -> None:
        self.highlighted = index
        if self.plan is None or not 0 <= index < len(self.plan.layers):
            return
        lines = detail_lines(self.plan, self.plan.layers[index])
        self.query_one("#plan-detail", Static).update(Text("\n".join(lines)))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key.value is not None:
            self.show_detail(int(event.row_key.value))

    def on_resize(self) -> None:
        if self.plan is not None:
            self.fill_table(self.plan)
        else:
            self.show_progress()

    # ------------------------------------------------------------------ keys

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "train":
            return None if self.preset_path() is None else True
        if action == "sort":
            return self.plan is not None and parameters[0] == self.sort
        if action == "switch_target":
            return parameters[0] != self.request.target
        return True

    def key_note(self, action: str) -> str:
        if action == "train":
            if self.plan is None:
                return "the plan has not finished" if self.fault is None else "there is no plan"
            return "the plan wrote no preset"
        if action == "sort":
            return "once the plan is in"
        return ""

    def preset_path(self) -> Path | None:
        preset = self.plan.files.preset if self.plan is not None else None
        return Path(preset) if preset else None

    def action_train(self) -> None:
        """Train the plan's preset, as a preset run is trained (the Run view follows it)."""
        preset = self.preset_path()
        if preset is None:
            return
        if not preset.is_file():
            self.notify(
                visible(f"The plan's preset {preset} is not there any more: r plans again."),
                severity="error",
                title="Not started",
                markup=False,
            )
            return
        self.post_message(RunRequested(str(preset)))

    def action_sort(self, shown: int) -> None:
        """o: the next order of the rows (the highlighted layer stays highlighted)."""
        self.sort = (self.sort + 1) % len(SORTS)
        if self.plan is not None:
            self.fill_table(self.plan)
        self.refresh_bindings()

    def action_switch_target(self, target: str) -> None:
        """t: plan for the other target (fp8 or fp16) of the same model."""
        if as_target(target) != self.request.target:
            self.request = dataclasses.replace(self.request, target=as_target(target))
            self.start()

    def action_plan_again(self) -> None:
        self.start()

    def action_back(self) -> None:
        self.app.pop_screen()
