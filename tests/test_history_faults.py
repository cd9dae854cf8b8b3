"""A corpus of bad records through History, the Run view, Compare, replay and the planner:
each is listed and opened, never raised; values near the float limit are drawn or left out."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ampscope.cli.main import main as cli_main
from ampscope.core import events as ev
from ampscope.core import records
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.model.replay import RecordSource, ReplaySource
from ampscope.tui.model.run_log import LOG_LINE_CHARS, MAX_LOG
from ampscope.tui.screens.compare import CompareScreen
from ampscope.tui.screens.history import HistoryScreen
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.screens.run import RunScreen
from ampscope.tui.widgets.event_log import EventLogView
from ampscope.tui.widgets.plots import RunPlot
from tests.helpers import SIZE, done, hello, history_of, run, shown, step, terminal_output, wait_for

HUGE = 1e308


def write_record(root: Path, name: str, events: bytes, summary: object = None) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / records.EVENTS_FILE).write_bytes(events)
    if summary is not None:
        text = summary if isinstance(summary, str) else json.dumps(summary)
        (path / records.SUMMARY_FILE).write_text(text)
    return path


def encoded(*events: ev.Event) -> bytes:
    return b"".join(ev.encode(e) for e in events)


def bad_records(root: Path) -> int:
    """Records as a crash, a hand edit or a newer ampscope may leave them; how many."""
    good = encoded(hello(), step(0), step(1), done("ok", 2))
    absurd = encoded(
        hello(started_at=HUGE, param_count=2**62, flops_per_step=HUGE),
        step(0, ms=HUGE, loss=HUGE, loss_scale=HUGE, t=HUGE, mem_allocated=2**62),
        step(1, ms=-HUGE, loss=-HUGE, loss_scale=5e-324, mem_peak=2**62),
        ev.SysEvent(gpu_util=HUGE, cpu_util=-HUGE, gpu_mem_used=2**62, gpu_mem_total=1, t=2.0),
        done("ok", 2),
    )
    write_record(root, "20260101T000001Z-list", good, [1, 2])
    write_record(root, "20260101T000002Z-text", good, "not json")
    write_record(root, "20260101T000003Z-empty", b"")
    write_record(root, "20260101T000004Z-garbage", b"\x00\xff garbage\n{]\n" + good[:50])
    write_record(root, "20260101T000005Z-future", b'{"type": "hello", "v": 99}\n' + good)
    write_record(root, "20260101T000006Z-absurd", absurd)
    folder = write_record(root, "20260101T000007Z-unreadable", good[:-20])
    (folder / records.SUMMARY_FILE).mkdir()  # reading it fails with an OSError
    write_record(root, "20260101T000008Z-fine", good)
    sweep = root / "20260101T000009Z-sweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text(json.dumps([{"rows": "not a list"}]))
    return 8


@pytest.mark.ui
def test_bad_records_are_listed_opened_and_compared_without_a_traceback(tmp_path: Path) -> None:
    count = bad_records(tmp_path)

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            history, table = await history_of(pilot, app, count)
            await pilot.press("c")  # nothing marked, and the last sweep's file is malformed
            await pilot.pause()
            assert isinstance(app.screen, HistoryScreen)
            for row in range(count):
                table.move_cursor(row=row)
                await pilot.press("enter")
                screen = await shown(pilot, app, RunScreen)
                assert await wait_for(pilot, lambda s=screen: s.state.finished, 10)
                redrawn = screen.redraws
                assert await wait_for(pilot, lambda s=screen, n=redrawn: s.redraws > n, 30)
                plain, _raw = terminal_output(app)
                assert "cannot be plotted" not in plain
                await pilot.press("escape")
                await shown(pilot, app, HistoryScreen)
                await pilot.press("space")  # mark it for the comparison
            await pilot.press("c")
            await shown(pilot, app, CompareScreen)
            await pilot.pause(0.5)
            terminal_output(app)

    run(go())


@pytest.mark.ui
@pytest.mark.parametrize("value", [HUGE, -HUGE, math.inf, -math.inf, math.nan, 1e-308, 5e-324])
def test_values_near_the_float_limit_never_crash_the_plots(value: float, tmp_path: Path):
    events = [hello()]
    for i in range(8):
        odd = value if i % 2 else 10.0
        events.append(step(i, ms=odd, loss=odd, loss_scale=odd, samples_per_s=odd, t=1.0 + i))
        events.append(ev.SysEvent(gpu_util=odd, cpu_util=odd, gpu_mem_used=1, t=1.0 + i))
    events.append(step(8, t=value, mem_allocated=2**62))

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, open_run=RecordSource(events, "x"))
        async with app.run_test(size=SIZE) as pilot:
            screen = await shown(pilot, app, RunScreen)
            assert await wait_for(pilot, lambda: screen.redraws >= 1, 30)
            plain, _raw = terminal_output(app)
            assert "cannot be plotted" not in plain
            for plot in screen.query(RunPlot):  # the ordinary points are still drawn
                assert plot.points_drawn > 0, type(plot).__name__

    run(go())


@pytest.mark.ui
def test_a_10_mb_warning_is_cut_and_the_log_stays_bounded(tmp_path: Path) -> None:
    huge = "W" * 10_000_000
    events = [hello(), step(0)]
    events += [ev.WarningEvent(code="big", message=huge, t=1.0) for _ in range(3)]
    events += [ev.ErrorEvent(kind="exception", message=huge, traceback=huge + "\nlast", t=1.1)]
    run_dir = write_record(tmp_path, "20260101T000000Z-big", encoded(*events, done("failed")))

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, open_run=ReplaySource.load(run_dir, speed=100))
        async with app.run_test(size=SIZE) as pilot:
            screen = await shown(pilot, app, RunScreen)
            assert await wait_for(pilot, lambda: screen.source.at_end, 30)
            state = screen.state
            assert len(state.log) <= MAX_LOG
            assert all(len(entry.text) < LOG_LINE_CHARS + 50 for entry in state.log)
            assert any("more characters" in entry.text for entry in state.log)
            assert len(state.error or "") < LOG_LINE_CHARS + 50
            log = screen.query_one(EventLogView)  # drawn on the view's next redraw tick
            assert await wait_for(pilot, lambda: bool(log.texts), 30)
            assert max(len(t) for t in log.texts) < LOG_LINE_CHARS + 100

    run(go())


@pytest.mark.ui
def test_q_quits_while_a_record_is_still_loading(tmp_path: Path, monkeypatch) -> None:
    """A record on a slow disk: the view is up at once, reads in a thread, and q works."""
    import threading

    from ampscope.tui.model import replay

    released = threading.Event()

    def slow_load(run_dir: Path):
        released.wait(30)
        return [], "slow"

    monkeypatch.setattr(replay, "_load_events", slow_load)
    run_dir = write_record(tmp_path, "20260101T000000Z-slow", encoded(hello()))

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, open_run=ReplaySource.load(run_dir))
        async with app.run_test(size=SIZE) as pilot:
            screen = await shown(pilot, app, RunScreen)
            assert "loading" in screen.source.label()
            await pilot.press("q")
            assert await wait_for(pilot, lambda: not app.is_running, 10)
            assert not released.is_set()  # it quit while the read was still going
            released.set()  # let the reading thread end: no need to sit out its 30 s

    try:
        run(go())
    finally:
        released.set()


@pytest.mark.unit
def test_memory_run_on_a_bad_record_is_a_message(tmp_path: Path, capsys) -> None:
    config = {"workload": ["not", "a", "table"], "batch_size": "huge"}
    path = write_record(tmp_path, "20260101T000000Z-odd", encoded(hello(config=config)))
    assert cli_main(["memory", "--run", str(path)]) == 2
    assert "configuration cannot be read" in capsys.readouterr().err
    empty = write_record(tmp_path, "20260101T000001Z-empty", b"\x00garbage\n")
    assert cli_main(["memory", "--run", str(empty)]) == 2
    assert "no hello event" in capsys.readouterr().err


@pytest.mark.unit
def test_a_runs_start_time_is_the_same_while_it_runs_and_after(tmp_path: Path) -> None:
    import calendar

    from ampscope.core.units import fmt_time
    from ampscope.tui.screens.history import started

    stamp = calendar.timegm((2026, 1, 1, 0, 0, 1, 0, 0, 0))
    running = records.RunRecord(tmp_path / "20260101T000001Z-fp32")  # no hello read yet
    ended = records.RunRecord(
        tmp_path / "20260101T000001Z-fp32", hello=hello(started_at=stamp + 4.0)
    )  # hello comes after torch's import
    assert started(running) == started(ended) == fmt_time(stamp)
    odd = records.RunRecord(tmp_path / "my-folder", hello=hello(started_at=stamp + 4.0))
    assert started(odd) == fmt_time(stamp + 4.0)


@pytest.mark.ui
@pytest.mark.parametrize(
    ("spoil", "said"),
    [
        ("removed", "the record is gone: "),
        ("fifo", "events.jsonl is not a regular file"),
        ("folder", "events.jsonl is not a regular file"),
    ],
)
@pytest.mark.parametrize("source", [RecordSource, ReplaySource])
def test_a_record_removed_or_unreadable_after_it_was_listed_says_so_when_opened(
    spoil: str, said: str, source: type, tmp_path: Path
) -> None:
    """A finished record whose folder went (deleted from another terminal while History
    listed it), or whose events file is no file, opened as 'incomplete: the run was cut
    short', which said a finished run had broken off."""
    import os
    import shutil

    path = write_record(tmp_path, "20260101T000000Z-ok", encoded(hello(), step(0), done("ok", 1)))
    (path / records.EVENTS_FILE).unlink()
    if spoil == "removed":
        shutil.rmtree(path)
    elif spoil == "fifo":
        os.mkfifo(path / records.EVENTS_FILE)
    else:
        (path / records.EVENTS_FILE).mkdir()

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await shown(pilot, app, PresetsScreen)
            screen = app.open_run(source.load(path))
            assert await wait_for(pilot, lambda: screen.state.status == "incomplete")
            lines = [line.text for line in screen.state.log]
            assert any(said in t and "nothing of the run can be shown" in t for t in lines), lines
            assert not any("cut short" in t for t in lines), lines

    run(go())


@pytest.mark.ui
def test_history_says_when_its_runs_folder_is_gone_not_that_there_are_no_runs_yet(
    tmp_path: Path,
) -> None:
    """The runs folder removed while History showed it: f5 said 'No runs recorded yet'."""
    import shutil

    from tests.helpers import write_finished_record

    runs_dir = tmp_path / "runs"
    write_finished_record(runs_dir, "fp32")

    async def go() -> None:
        app = AmpscopeApp(runs_dir=runs_dir)
        async with app.run_test(size=SIZE) as pilot:
            history, table = await history_of(pilot, app, 1)
            shutil.rmtree(runs_dir)
            await pilot.press("f5")
            assert await wait_for(pilot, lambda: table.row_count == 0, 10)
            said = str(history.query_one("#history-empty").render())
            assert "is not there any more" in said and "No runs recorded yet" not in said
            assert str(runs_dir) in said

    run(go())
