"""Past runs, from their records. Enter replays one in the Run view."""

from __future__ import annotations

import calendar
import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, TypeVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.dom import DOMNode
from textual.screen import Screen
from textual.widgets import DataTable, Static

from ampscope.core import records
from ampscope.core.records import files
from ampscope.core.records.labels import run_model, run_preset
from ampscope.core.units import fmt_final_loss, fmt_ms, fmt_steps, fmt_time
from ampscope.tui.messages import RecordOpened
from ampscope.tui.screens import SCREENS_CSS
from ampscope.tui.screens.compare import CompareScreen
from ampscope.tui.text import literal
from ampscope.tui.widgets.key_bar import KeyBar
from ampscope.tui.widgets.tables import fill, hidden_note

HEADS = ("preset", "model", "state", "steps", "median step", "final loss", "started")
ORDER = (0, 1, 2, 6, 4, 5, 3)
"""Which columns stay on a narrow terminal: the preset, its model, its state, when, then its
figures."""

NAME_CELLS = 32
"""The most a preset's or a model's name takes of a row (cut with '…'): a long one left no
room for the run's state at 120 columns. The whole name shows in the run opened."""

T = TypeVar("T")
STAMP = "%Y%m%dT%H%M%SZ"
"""How a run folder's name starts (``records.new_run_dir``): its start, in UTC."""


def started(run: records.RunRecord) -> str:
    """When the run started, in local time: its folder's time stamp (the same while it runs
    and after), else the time its hello gives."""
    try:
        return fmt_time(calendar.timegm(time.strptime(run.name.split("-", 1)[0], STAMP)))
    except ValueError:
        return fmt_time(run.hello.started_at) if run.hello is not None else "-"


READ_WAIT_S = 0.5
"""How long the UI waits for the records to be read before it shows the screen without them
(they are shown once read): a slow disk (a network folder that stalls) never freezes it."""


class HistoryRow(NamedTuple):
    """One run as History shows it, read off the UI thread."""

    name: str
    path: Path
    state: str
    preset: str
    cells: list[str]
    """The columns after the preset."""


def named(name: str) -> Text:
    """A preset's or model's name as its cell shows it: literal, at most ``NAME_CELLS`` wide."""
    text = literal(name)
    text.truncate(NAME_CELLS, overflow="ellipsis")
    return text


def read_history(runs_dir: Path) -> list[HistoryRow]:
    """Every run under ``runs_dir`` with what History shows of it (this reads the records)."""
    rows = []
    for run in records.list_runs(runs_dir):
        state = run.state  # fills in ``done`` from the stream
        done = run.done
        cells = [
            run_model(run),
            state,
            fmt_steps(done.steps_done if done else None),
            fmt_ms(done.step_ms_median if done else None),
            fmt_final_loss(done.loss_final, done.loss_nonfinite, done.loss_final_step)
            if done
            else "-",
            started(run),
        ]
        rows.append(HistoryRow(run.name, run.path, state, run_preset(run), cells))
    return rows


def off_ui_thread(screen: DOMNode, read: Callable[[], T], then: Callable[[T | None], None]) -> None:
    """``then(read())`` on the UI thread, with ``read`` run on a thread of its own: at once
    when it ends within READ_WAIT_S, else when it does. ``then(None)`` if ``read`` failed.
    A daemon thread: one stuck in a read never holds up the app's exit."""
    lock, ended = threading.Lock(), threading.Event()
    waiting = True  # the UI thread still waits: it takes the result itself
    found: list[T | None] = []

    def work() -> None:
        try:
            value: T | None = read()
        except Exception:  # noqa: BLE001 - said to ``then`` as None
            value = None
        with lock:
            found.append(value)
            ended.set()
            if waiting:
                return
        with contextlib.suppress(RuntimeError):  # the app has gone meanwhile
            screen.app.call_from_thread(then, value)

    threading.Thread(target=work, name="ampscope-history", daemon=True).start()
    ended.wait(READ_WAIT_S)
    with lock:
        waiting = False
        if not found:
            return  # ``work`` calls ``then`` once it has read
    then(found[0])


class HistoryScreen(Screen):
    CSS_PATH = SCREENS_CSS
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
        self.seen_runs = False  # a runs folder that had runs and is gone is not 'no runs yet'
        self.states: dict[str, str] = {}  # live, crashed, ok, failed, stopped
        self.marked: list[str] = []
        self.presets: dict[str, str] = {}
        self._reading = False

    def compose(self) -> ComposeResult:
        yield Static(
            Text.assemble("History · reading the records in ", literal(self.runs_dir)),
            id="history-title",
        )
        yield DataTable(id="history-table", cursor_type="row", zebra_stripes=True)
        yield Static("", id="history-empty")
        yield KeyBar()

    def on_mount(self) -> None:
        self.query_one(DataTable).focus()

    def on_screen_resume(self) -> None:
        """The runs as they are now, each time History is shown: back from a run's view, a
        live run the user watched end read live, and a run recorded meanwhile was missing."""
        self.action_reload()

    def on_resize(self) -> None:
        self.action_reload()

    def preset_cell(self, name: str, preset: str) -> Text:
        """The preset, behind a dot when it is marked for comparison."""
        return Text.assemble("● " if name in self.marked else "  ", named(preset))

    def action_reload(self) -> None:
        """The runs, read off the UI thread (``off_ui_thread``): shown at once when the
        records read as quickly as they should, else once they have been read."""
        if self._reading:
            return  # a read under way shows its runs when it ends
        self._reading = True
        off_ui_thread(self, lambda: read_history(self.runs_dir), self._show_runs)

    def _show_runs(self, runs: list[HistoryRow] | None) -> None:
        self._reading = False
        if runs is None or not self.is_mounted:
            return
        table = self.query_one(DataTable)
        row = table.cursor_row
        self.paths.clear()
        self.seen_runs = self.seen_runs or bool(runs)
        rows = []
        for run in runs:
            self.states[run.name] = run.state
            self.presets[run.name] = run.preset
            model, *figures = run.cells
            rows.append([self.preset_cell(run.name, run.preset), named(model), *figures])
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
        self.query_one("#history-empty", Static).update("" if runs else self.empty_words())

    def empty_words(self) -> Text:
        """Why there is no run: none yet, or no runs folder there any more (removed, moved)."""
        try:
            there = self.runs_dir.is_dir()
        except OSError:  # a folder that cannot be looked into reads as there: runs say why
            there = True
        if there or not self.seen_runs:
            return Text("No runs recorded yet. Start one from the presets (enter).")
        return Text.assemble(
            "The runs folder ", literal(self.runs_dir), " is not there any more (removed or moved)."
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
        table.update_cell(name, "preset", self.preset_cell(name, self.presets.get(name, name)))
        table.move_cursor(row=min(table.cursor_row + 1, table.row_count - 1))

    def action_compare(self) -> None:
        """Compare the marked runs, or, with none marked, the most recent sweep's runs (read
        off the UI thread: each record is read whole)."""
        paths = [self.paths[n] for n in self.marked if n in self.paths]
        if len(paths) == 1:
            self._compare(None)
        elif paths:
            off_ui_thread(
                self, lambda: ([records.load_run(p) for p in paths], False), self._compare
            )
        else:
            off_ui_thread(self, lambda: latest_sweep_runs(self.runs_dir), self._compare)

    def _compare(self, found: tuple[list[records.RunRecord], bool] | None) -> None:
        if found is None or len(found[0]) < 2:
            self.notify("Mark two or more runs with space, then press c.", title="Compare")
        elif self.is_mounted and self.app.screen is self:
            runs, repeated = found
            self.app.push_screen(CompareScreen(runs, repeated=repeated))

    def action_back(self) -> None:
        self.app.pop_screen()


def latest_sweep_groups(runs_dir: Path) -> list[list[Path]]:
    """The most recent sweep record's run folders, one list per row (a preset's repeats);
    none from a file that is not what a sweep writes (any JSON may be in that file)."""
    try:
        sweeps = sorted(runs_dir.glob("*-sweep*/sweep.json")) if runs_dir.is_dir() else []
        data = files.read_json(sweeps[-1]) if sweeps else {}
    except (OSError, ValueError, RecursionError):
        return []
    rows = data.get("rows") if isinstance(data, dict) else None
    groups = [
        [Path(d) for d in row["run_dirs"] if isinstance(d, str) and Path(d).is_dir()]
        for row in (rows if isinstance(rows, list) else [])
        if isinstance(row, dict) and isinstance(row.get("run_dirs"), list)
    ]
    return [g for g in groups if g]


def latest_sweep_runs(runs_dir: Path) -> tuple[list[records.RunRecord], bool]:
    """The last sweep's records (none: no sweep), and whether a preset was repeated."""
    groups = latest_sweep_groups(runs_dir)
    if sum(len(g) for g in groups) < 2:
        return [], False
    return [records.load_run(d) for g in groups for d in g], any(len(g) > 1 for g in groups)
