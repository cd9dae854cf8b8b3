"""Long records in History and replays: read in a bounded amount of memory, thinned as the
plots are, with what a user looks for kept (stalls, skipped steps, the last steps, the end)."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
import weakref
from pathlib import Path

import pytest

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.records import thinned
from ampscope.tui.model.replay import RecordSource, ReplaySource
from tests.helpers import SIZE, done, hello, run, shown, step, wait_for

STEPS, STALL, SKIPPED = 50_000, 12_345, (5, 20_000, 37_777)


def write_record(run_dir: Path, steps: int) -> Path:
    """A run of ``steps`` 1 ms steps with a 900 ms stall, three skipped steps, a sys sample
    every 100 steps, and its done."""
    run_dir.mkdir(parents=True)
    lines = [ev.encode(hello(t=2.0, config={"steps": steps, "precision": "fp32"}))]
    for i in range(steps):
        t = round(3.0 + i * 0.001, 4)
        lines.append(
            ev.encode(
                step(i, 900.0 if i == STALL else 1.0 + (i % 7) * 0.01, t=t, skipped=i in SKIPPED)
            )
        )
        if i % 100 == 0:
            lines.append(ev.encode(ev.SysEvent(cpu_util=50.0, t=t)))
    end = done(steps=steps)
    end.t, end.skipped_steps = 3.0 + steps * 0.001, len(SKIPPED)
    lines.append(ev.encode(end))
    (run_dir / records.EVENTS_FILE).write_bytes(b"".join(lines))
    return run_dir


@pytest.fixture(scope="module")
def long_record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_record(tmp_path_factory.mktemp("runs") / "20260101T000000Z-fp32", STEPS)


BOUND = 3 * thinned.STEP_BUCKETS + thinned.MARKED_STEPS + thinned.RECENT_STEPS


@pytest.mark.unit
def test_a_long_record_is_read_thinned_keeping_the_stall_the_skips_and_the_end(
    long_record: Path,
) -> None:
    record = records.load_run(long_record, thinned=True)
    steps = [e for e in record.events if isinstance(e, ev.StepEvent)]
    assert len(steps) <= BOUND  # of 50,000
    kept = {s.step for s in steps}
    assert STALL in kept and max(s.step_ms for s in steps) == 900.0  # a stall still shows
    assert set(SKIPPED) <= kept  # every skipped step: the Skipped steps card counts them all
    assert [s.step for s in steps[-thinned.RECENT_STEPS :]] == list(range(STEPS - 20, STEPS))
    assert min(kept) == 0 and steps == sorted(steps, key=lambda s: s.step)  # the whole run
    assert record.hello is not None and record.done is not None and record.status == "ok"
    assert "read thinned" in record.note and "of its 50,000 steps are shown" in record.note
    sys_events = [e for e in record.events if isinstance(e, ev.SysEvent)]
    assert len(sys_events) == STEPS // 100  # under the bound: all of them


@pytest.mark.unit
def test_a_short_record_is_read_whole_even_when_thinning_is_asked_for(tmp_path: Path) -> None:
    path = write_record(tmp_path / "run", 2_000)
    whole = records.load_run(path)
    assert records.load_run(path, thinned=True).events == whole.events
    assert records.load_run(path, thinned=True).note == ""


@pytest.mark.unit
def test_reading_a_long_record_holds_a_bounded_amount_of_memory(long_record: Path) -> None:
    """Read whole, the 50,000 steps hold some 25 MB; thinned, what is held at most (the kept
    steps and a chunk of the file) does not depend on the record's length."""
    tracemalloc.start()
    try:
        record = records.load_run(long_record, thinned=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(record.events) < 6000
    assert peak < 12 << 20, peak


@pytest.mark.unit
def test_history_shows_a_long_record_whole_with_its_own_counts(long_record: Path) -> None:
    source = RecordSource.load(long_record)
    asyncio.run(source.feed())
    state = source.state
    assert state.step == STEPS - 1 and state.status == "done"
    assert state.skipped == len(SKIPPED)
    assert state.steps["step"][0] == 0  # the plots span the whole run
    assert any("of its 50,000 steps are shown" in entry.text for entry in state.log)
    assert state.median_step_ms() == pytest.approx(1.0 + 3 * 0.01, abs=0.03)  # the last 20


@pytest.mark.unit
def test_a_replay_starts_at_the_hello_with_the_runs_settings_in_its_header(
    tmp_path: Path,
) -> None:
    """Before the hello the engine was importing torch and building the model: a replay shows
    the run from its hello, at once, and names its preset and settings from the start."""
    path = tmp_path / "20260101T000000Z-fp32"
    path.mkdir()
    lines = [ev.PhaseEvent(phase="setup", state="start", t=0.0), hello(t=8.0)]
    lines += [step(i, t=9.0 + i) for i in range(3)]
    (path / records.EVENTS_FILE).write_bytes(b"".join(ev.encode(e) for e in lines))
    source = ReplaySource.load(path)

    async def opened() -> None:
        task = asyncio.create_task(source.feed())
        for _ in range(200):
            await asyncio.sleep(0.01)
            if source.run_dir is None:
                break
        task.cancel()

    asyncio.run(opened())
    assert source.state.hello is not None  # shown at once, not 8 s later
    header = source.state.header()
    assert "?" not in header and "fp32" in header and "compile off" in header
    assert source.duration == pytest.approx(3.0)  # from the hello (t 8 s) to the last step


@pytest.mark.ui
def test_the_replay_view_lets_go_of_its_record_when_it_closes(long_record: Path) -> None:
    from ampscope.tui.app import AmpscopeApp
    from ampscope.tui.screens.run import RunScreen

    async def go() -> None:
        app = AmpscopeApp()
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            source = ReplaySource.load(long_record, speed=100)
            held = weakref.ref(source)
            state = weakref.ref(source.state)
            screen = app.open_run(source)
            assert await shown(pilot, app, RunScreen) is screen
            assert await wait_for(pilot, lambda: getattr(held(), "run_dir", 0) is None, 20)
            del source, screen
            await pilot.press("escape")
            await pilot.pause()
            assert not isinstance(app.screen, RunScreen)
            gc.collect()
            assert held() is None and state() is None

    run(go())


@pytest.mark.unit
def test_a_flood_of_notes_is_thinned_without_crowding_out_the_warnings(tmp_path: Path) -> None:
    """Older records noted every new pass over a short list of batches: thousands of notes.
    They are thinned as steps are, apart from the warnings, which are all kept."""
    path = tmp_path / "run"
    path.mkdir()
    lines = [hello(t=1.0)]
    for i in range(5000):
        lines.append(ev.WarningEvent(code=ev.EPOCH_NOTE, message=f"pass {i}", step=i, t=2.0 + i))
        if i == 4321:
            lines.append(ev.WarningEvent(code="input-bound", message="waiting", step=i, t=2.0 + i))
    (path / records.EVENTS_FILE).write_bytes(b"".join(ev.encode(e) for e in lines))
    record = records.load_run(path, thinned=True)
    notes = [e for e in record.events if isinstance(e, ev.WarningEvent)]
    assert [e.step for e in notes if e.code == "input-bound"] == [4321]
    assert len(notes) <= thinned.OTHERS_KEPT + 2 and notes[-2:][-1].message == "pass 4999"
    assert f"{5000 - len(notes) + 1:,} warning events are left out" in record.note


@pytest.mark.unit
def test_step_lines_that_cannot_be_read_are_said_as_such_not_as_thinning(tmp_path: Path) -> None:
    """A step line whose figures read but whose other fields do not (a version of 1e999, a
    loss written as text) is an unreadable line: the replay says how many, and never that a
    30-step record was thinned to none."""
    run_dir = tmp_path / "20260101T000000Z-fp32"
    run_dir.mkdir()
    lines = [ev.encode(hello(t=1.0, config={"steps": 30, "precision": "fp32"}))]
    lines += [ev.encode(step(i, 1.0, t=2.0 + i)).replace(b'"v":1', b'"v":1e999') for i in range(20)]
    lines += [ev.encode(step(i, 1.0, t=30.0 + i)) for i in range(20, 30)]
    (run_dir / records.EVENTS_FILE).write_bytes(b"".join(lines))
    record = records.load_run(run_dir, thinned=True)
    assert len([e for e in record.events if isinstance(e, ev.StepEvent)]) == 10
    assert "thinned" not in record.note
    assert "20 lines of the record cannot be read" in record.note
