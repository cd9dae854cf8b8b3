"""Past runs, from their records. Enter replays one in the Run view."""

from __future__ import annotations

import calendar
import time
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Static

from ampscope.core import record_files, records
from ampscope.core.run_labels import run_model, run_preset
from ampscope.core.units import fmt_final_loss, fmt_ms, fmt_time
from ampscope.tui.messages import RecordOpened
from ampscope.tui.screens.compare import CompareScreen
from ampscope.tui.text import literal
from ampscope.tui.widgets.key_bar import KeyBar
from ampscope.tui.widgets.tables import fill, hidden_note

HEADS = ("preset", "model", "state", "steps", "median step", "final loss", "started")
ORDER = (0, 1, 2, 6, 4, 5, 3)
"""Which columns stay on a narrow terminal: the preset, its model, its state, when, then its
figures."""

STAMP = "%Y%m%dT%H%M%SZ"
"""How a run folder's name starts (``records.new_run_dir``): its start, in UTC."""


def started(run: records.RunRecord) -> str:
    """When the run started, in local time: its folder's time stamp (the same while it runs
    and after), else the time its hello gives."""
    try:
        return fmt_time(calendar.timegm(time.strptime(run.name.split("-", 1)[0], STAMP)))
    except ValueError:
        return fmt_time(run.hello.started_at) if run.hello is not None else "-"


class HistoryScreen(Screen):
    HELP_TITLE = "History"
    HELP = (
        "Every run recorded in the runs folder, newest first. Enter opens one (a live run is "
        "followed as it goes, a finished one shown whole); space marks runs and c compares "
        "the marked ones (with none marked, the last sweep's)."
    )
    BINDINGS = [
        Binding("enter", "open", "Open", show=True, id="history.open"),
        Binding("home", "cursor(0)", "First run", show=False, priority=True, id="history.first"),
        Binding("end", "cursor(-1)", "Last run", show=False, priority=True, id="history.last"),
        Binding("space", "mark", "Mark", id="history.mark"),
        Binding("c", "compare", "Compare", id="history.compare"),
        Binding("f5", "reload", "Reload", id="history.reload"),
        Binding("escape", "back", "Back", id="history.back"),
        Binding("b", "back", "Back", show=False, id="history.back-alt"),
        Binding("q", "app.quit", "Quit", id="quit"),
    ]

    def __init__(self, runs_dir: Path) -> None:
        super().__init__()
        self.runs_dir = runs_dir
        self.paths: dict[str, Path] = {}
        self.states: dict[str, str] = {}  # live, crashed, ok, failed, stopped
        self.marked: list[str] = []

    def compose(self) -> ComposeResult:
        yield Static("", id="history-title")
        yield DataTable(id="history-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="history-empty")
        yield KeyBar()

    def on_mount(self) -> None:
        self.action_reload()
        self.query_one(DataTable).focus()

    def on_resize(self) -> None:
        self.action_reload()

    def preset_cell(self, name: str, preset: str) -> Text:
        """The preset, behind a dot when it is marked for comparison."""
        return Text.assemble("● " if name in self.marked else "  ", literal(preset))

    def action_reload(self) -> None:
        table = self.query_one(DataTable)
        row = table.cursor_row
        self.paths.clear()
        runs = records.list_runs(self.runs_dir)
        rows = []
        for run in runs:
            self.states[run.name] = state = run.state  # fills in ``done`` from the stream
            done = run.done
            rows.append(
                [
                    self.preset_cell(run.name, run_preset(run)),
                    literal(run_model(run)),
                    state,
                    "-" if done is None else str(done.steps_done),
                    fmt_ms(done.step_ms_median if done else None),
                    fmt_final_loss(done.loss_final, done.loss_nonfinite, done.loss_final_step)
                    if done
                    else "-",
                    started(run),
                ]
            )
            self.paths[run.name] = run.path
        shown = fill(table, HEADS, rows, self.size.width, ORDER, keys=[r.name for r in runs])
        if rows:
            table.move_cursor(row=min(row, len(rows) - 1))
        count = f"{len(runs)} run{'s' if len(runs) != 1 else ''}"
        self.query_one("#history-title", Static).update(
            Text.assemble(
                f"History · {count} in ",
                literal(self.runs_dir),
                " · newest first",
                hidden_note(HEADS, shown, ORDER) if rows else "",
            )
        )
        self.query_one("#history-empty", Static).update(
            "" if runs else "No runs recorded yet. Start one from the presets (enter)."
        )

    def action_cursor(self, row: int) -> None:
        table = self.query_one(DataTable)
        if table.row_count:
            table.move_cursor(row=row % table.row_count)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self._open(str(event.row_key.value))

    def action_open(self) -> None:
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        self._open(str(key.value))

    def _open(self, name: str) -> None:
        path = self.paths.get(name)
        if path is not None:  # a live one is followed rather than replayed as it is now
            self.post_message(RecordOpened(path, live=self.states.get(name) == "live"))

    def action_mark(self) -> None:
        """Mark or unmark the highlighted run for comparison."""
        table = self.query_one(DataTable)
        if table.row_count == 0:
            return
        name = str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)
        if name in self.marked:
            self.marked.remove(name)
        else:
            self.marked.append(name)
        preset = records.load_run(self.paths[name], with_events=False).preset
        table.update_cell(name, "preset", self.preset_cell(name, preset))
        table.move_cursor(row=min(table.cursor_row + 1, table.row_count - 1))

    def action_compare(self) -> None:
        """Compare the marked runs, or, with none marked, the most recent sweep's runs."""
        paths = [self.paths[n] for n in self.marked if n in self.paths]
        screen = None
        if len(paths) >= 2:
            screen = CompareScreen([records.load_run(p) for p in paths])
        elif not paths:
            screen = compare_latest_sweep(self.runs_dir)
        if screen is None:
            self.notify("Mark two or more runs with space, then press c.", title="Compare")
            return
        self.app.push_screen(screen)

    def action_back(self) -> None:
        self.app.pop_screen()


def latest_sweep_groups(runs_dir: Path) -> list[list[Path]]:
    """The most recent sweep record's run folders, one list per row (a preset's repeats);
    none from a file that is not what a sweep writes (any JSON may be in that file)."""
    try:
        sweeps = sorted(runs_dir.glob("*-sweep*/sweep.json")) if runs_dir.is_dir() else []
        data = record_files.read_json(sweeps[-1]) if sweeps else {}
    except (OSError, ValueError, RecursionError):
        return []
    rows = data.get("rows") if isinstance(data, dict) else None
    groups = [
        [Path(d) for d in row["run_dirs"] if isinstance(d, str) and Path(d).is_dir()]
        for row in (rows if isinstance(rows, list) else [])
        if isinstance(row, dict) and isinstance(row.get("run_dirs"), list)
    ]
    return [g for g in groups if g]


def compare_latest_sweep(runs_dir: Path) -> CompareScreen | None:
    """Compare for the last sweep (a row a preset, repeats together), or None: no sweep."""
    groups = latest_sweep_groups(runs_dir)
    if sum(len(g) for g in groups) < 2:
        return None
    runs = [records.load_run(d) for g in groups for d in g]
    return CompareScreen(runs, repeated=any(len(g) > 1 for g in groups))
