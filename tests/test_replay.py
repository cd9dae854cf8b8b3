"""Replays: the shipped examples, played at a pace, paused and sought, in the Run view."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ampscope.cli import runs as runs_cli
from ampscope.cli.main import command_args
from ampscope.cli.main import main as cli_main
from ampscope.core import events as ev
from ampscope.core import records
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.model.follow import AttachSource
from ampscope.tui.model.replay import ReplaySource
from ampscope.tui.model.run_state import RunState
from ampscope.tui.screens.run import RunScreen
from ampscope.tui.widgets.event_log import EventLogView
from tests.helpers import (
    ROOT,
    SIZE,
    hello,
    run,
    shown,
    step,
    text,
    wait_for,
    write_finished_record,
)

EXAMPLE = "amp-fp16-skipped-step"


def example(name: str = EXAMPLE) -> Path:
    path = runs_cli.EXAMPLES_DIR / name
    assert (path / records.EVENTS_FILE).is_file()
    return path


@pytest.mark.unit
def test_examples_are_complete_records() -> None:
    names = [p.name for p in runs_cli.example_runs()]
    assert EXAMPLE in names and "fp16-nan" in names
    total = 0
    for path in runs_cli.example_runs():
        record = records.load_run(path)
        assert record.hello is not None and record.done is not None and not record.unreadable_lines
        assert record.state == record.done.status
        total += sum(f.stat().st_size for f in path.iterdir())
    assert total < 400_000
    skipped = records.load_run(example())
    assert skipped.done.status == "ok" and skipped.done.skipped_steps == 1
    nan = records.load_run(example("fp16-nan"))
    assert nan.done.status == "failed" and any(isinstance(e, ev.ErrorEvent) for e in nan.events)


@pytest.mark.ui
def test_replay_reaches_the_end_with_the_records_summary() -> None:
    record = records.load_run(example())

    async def go() -> None:
        app = AmpscopeApp()
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            screen = app.open_run(ReplaySource.load(example(), speed=100))
            assert await shown(pilot, app, RunScreen) is screen and screen.state.read_only
            source = screen.source
            assert await wait_for(pilot, lambda: source.at_end, 60), source.label()
            state = screen.state
            assert state.done is not None
            assert ev.to_dict(state.done) == ev.to_dict(record.done)
            last_step = max(e.step for e in record.events if isinstance(e, ev.StepEvent))
            assert state.step == last_step and state.skipped == 1 and state.status == "done"
            log = screen.query_one(EventLogView)
            assert await wait_for(pilot, lambda: "run ok" in "\n".join(log.texts), 5)
            assert "step skipped" in "\n".join(log.texts)
            assert await wait_for(pilot, lambda: "end 100%" in text(screen, "#run-header"), 5)
            assert "replay" in text(screen, "#run-header")
            assert screen.check_action("stop", ()) is False  # not offered: no engine
            assert screen.check_action("restart", ()) is False
            assert screen.check_action("pause", ()) is True

    run(go())


@pytest.mark.ui
def test_a_replay_of_a_nan_run_numbers_its_steps_one_way() -> None:
    """The header counts the steps done; the event log and the messages name a step by its
    number from 0, as the record does: 2 steps done, the second one (step 1) went NaN."""

    async def go() -> None:
        app = AmpscopeApp()
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            screen = app.open_run(ReplaySource.load(example("fp16-nan"), speed=100))
            assert await wait_for(pilot, lambda: screen.source.at_end, 60), screen.source.label()
            log = screen.query_one(EventLogView)
            assert await wait_for(pilot, lambda: "run failed" in "\n".join(log.texts), 5)
            header = text(screen, "#run-header")
            assert "failed · 2/150 steps ·" in header and "step 2" not in header
            (nan,) = [line for line in log.texts if "Loss became nan" in line]
            assert re.match(r"step +1 error .*Loss became nan at step 1:", nan)
            assert not [line for line in log.texts if re.match(r"step +2\b", line)]

    run(go())


@pytest.mark.ui
def test_pause_and_seek() -> None:
    async def go() -> None:
        app = AmpscopeApp()
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            screen = app.open_run(ReplaySource.load(example(), speed=1))
            source = screen.source
            assert await wait_for(pilot, lambda: source.position > 0, 5)
            await pilot.press("space")
            assert source.paused
            position, steps = source.position, screen.state.step_count
            await pilot.pause(0.5)
            assert source.position == position and screen.state.step_count == steps
            assert "paused" in source.label()
            await pilot.press("right")  # +10 % of the run
            assert source.position == pytest.approx(position + 0.1 * source.duration, abs=0.01)
            await pilot.press("right", "right", "right", "right")
            ahead = screen.state.step_count
            assert ahead > steps
            await pilot.press("left")  # back: rebuilt from the start, fewer steps
            assert screen.state.step_count < ahead and source.state is screen.state
            await pilot.press("end")
            assert source.at_end and screen.state.done is not None
            await pilot.press("home")
            assert source.position == 0 and screen.state.step is None
            assert screen.state.done is None
            await pilot.press("space")  # resume
            assert not source.paused

    run(go())


@pytest.mark.unit
def test_speed_scales_the_clock() -> None:
    events = records.load_run(example()).events
    slow, fast = ReplaySource(events, speed=1.0), ReplaySource(events, speed=20.0)
    for source in (slow, fast):
        source.advance_to(0.0)
        source.tick(0.5)
    assert slow.position == pytest.approx(0.5)
    assert fast.position == pytest.approx(min(10.0, fast.duration))
    assert fast.state.step_count > slow.state.step_count
    slow.toggle_pause()
    slow.tick(5.0)
    assert slow.position == pytest.approx(0.5)  # paused: the clock stands


@pytest.mark.unit
def test_a_replay_reaches_its_done_whatever_its_times_round_to() -> None:
    """hello at 0.0194 s, done at 0.297 s: 0.0194 + (0.297 - 0.0194) is below 0.297 in floats,
    so the clock stopped at 100 % one event short, 'playing 100%' for ever and no done shown
    (an engine run at load 19 recorded such times)."""
    events = [hello(), step(0), ev.empty_done("ok")]
    for e, t in zip(events, (0.0194, 0.1, 0.297), strict=True):
        e.t = t
    source = ReplaySource(events, speed=1000.0)
    source.advance_to(0.0)
    source.tick(1.0)
    assert source.at_end and source.state.done is not None and source.label().startswith("end")


@pytest.mark.unit
def test_a_record_with_an_event_stamped_at_1e300_replays_to_its_end() -> None:
    """Before: a done stamped t = 1e300 (a damaged record) made the run last 1e300 s: the
    replay played on for ever, never showing its end."""
    events = [hello(), step(0), step(1), ev.empty_done("ok")]
    for e, t in zip(events, (0.0, 0.5, 1.0, 1e300), strict=True):
        e.t = t
    source = ReplaySource(events, speed=1.0)
    assert source.duration == pytest.approx(11.0)
    source.advance_to(0.0)
    source.tick(12.0)
    assert source.at_end and source.state.done is not None
    assert any("each such gap is played as 10 s" in entry.text for entry in source.state.log)


@pytest.mark.unit
@pytest.mark.parametrize("command", ["replay", "attach"])
def test_an_empty_run_name_is_refused_not_taken_for_the_newest(
    tmp_path: Path, capsys, command: str
) -> None:
    """Before: 'replay ""' (a variable left empty in a script) replayed the newest run, and
    'attach ""' attached to the newest live one, as if no run had been named."""
    write_finished_record(tmp_path, "fp32")
    opened: list = []
    args = command_args([command, "--runs-dir", str(tmp_path), ""])
    how = runs_cli.cmd_replay if command == "replay" else runs_cli.cmd_attach
    assert how(args, lambda args, start: opened.append(start) or 0) == 2
    assert not opened and "no run record ''" in capsys.readouterr().err


@pytest.mark.ui
def test_replay_command_checks_and_defaults(tmp_path: Path, capsys) -> None:
    from ampscope.cli.main import command_args

    assert cli_main(["replay", "--speed", "500"]) == 2
    assert "--speed" in capsys.readouterr().err
    assert cli_main(["replay", "no-such-run"]) == 2
    assert "fp16-nan" in capsys.readouterr().err  # names the examples
    opened: list = []
    # no finished run in the runs dir: the first shipped example
    args = command_args(["replay", "--runs-dir", str(tmp_path), "--speed", "50"])
    assert runs_cli.cmd_replay(args, lambda args, start: opened.append(start) or 0) == 0
    (start,) = opened

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, open_run=start)
        async with app.run_test(size=SIZE) as pilot:
            screen = await shown(pilot, app, RunScreen)
            assert screen.source is start and start.speed == 50
            # the first example (read in a thread once the view is up)
            assert await wait_for(pilot, lambda: screen.state.label == "amp-fp16", 10)
            # the dashboard covers what was printed: its header says it is an example
            header = screen.state.header()
            assert header.endswith("shipped example replay"), header
            await pilot.press("escape")
            assert await wait_for(pilot, lambda: not isinstance(app.screen, RunScreen), 5)

    run(go())
    # a finished run in the runs dir is preferred; a name under it resolves
    dest = tmp_path / "20260101T000000Z-fp16"
    dest.mkdir()
    for f in example("fp16-nan").iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    assert runs_cli.latest(tmp_path, runs_cli.FINISHED).path == dest
    assert runs_cli.resolve_run(dest.name, tmp_path) == dest
    assert runs_cli.resolve_run("fp16-nan", tmp_path) == example("fp16-nan")


@pytest.mark.subprocess
def test_wheel_ships_the_examples(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("ampscope-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in runs_cli.example_runs():
        for f in ("events.jsonl", "config.json", "summary.json"):
            assert f"ampscope/example_runs/{path.name}/{f}" in names
    assert {
        "ampscope/cli/runs.py",
        "ampscope/tui/model/follow.py",
        "ampscope/tui/model/replay.py",
        "ampscope/cli/serve/viewer.py",
    } <= names


def newer(item: ev.Event, **extra) -> bytes:
    """``item`` as a newer engine would write it: a higher ``v`` and a field this one lacks."""
    data = ev.to_dict(item)
    data.update(v=ev.SCHEMA_VERSION + 1, **extra)
    return json.dumps(data).encode()


@pytest.mark.unit
def test_a_newer_schema_is_read_for_what_is_known_and_said_once() -> None:
    state = RunState()
    lines = [newer(hello(), new_field=1)]
    lines += [newer(step(i), flops_breakdown={"attn": 1.0}) for i in range(3)]
    lines.append(b'{"type":"moe_router","v":2,"t":1.5,"experts":8}')  # a type this one lacks
    lines.append(b"not json at all")
    state.ingest_many(ev.decode(line) for line in lines)
    assert state.step == 2 and state.hello is not None  # what it knows, it shows
    warnings = [e.text for e in state.log if e.level == "warning"]
    assert len([w for w in warnings if "schema version 2" in w]) == 1
    assert "this ampscope reads version 1" in warnings[0] and "upgrade" in warnings[0]
    # the newer type is covered by that warning; a broken line is still its own warning
    assert [w for w in warnings if w.startswith("unreadable line")] == [
        "unreadable line: not json at all"
    ]
    same = RunState()
    same.ingest_many([hello(), step(0)])
    assert not [e for e in same.log if e.level == "warning"]


@pytest.mark.ui
def test_the_run_view_says_a_record_is_from_a_newer_schema(tmp_path: Path) -> None:
    record = records.load_run(example())
    run_dir = tmp_path / "20260101T000000Z-amp-fp16"
    run_dir.mkdir()
    lines = [newer(e) for e in record.events]
    (run_dir / records.EVENTS_FILE).write_bytes(b"\n".join(lines) + b"\n")

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            screen = app.open_run(AttachSource(run_dir))
            assert await wait_for(pilot, lambda: screen.state.done is not None, 60)
            log = screen.query_one(EventLogView)
            assert await wait_for(pilot, lambda: any("run ok" in t for t in log.texts), 5)
            said = [t for t in log.texts if "schema version 2" in t]
            assert len(said) == 1 and said[0].split()[0] == "warning"
            assert screen.state.skipped == record.done.skipped_steps

    run(go())


@pytest.mark.unit
def test_a_replay_sought_back_to_its_start_still_names_the_runs_settings() -> None:
    source = ReplaySource([hello(t=1.0), step(0, t=2.0), step(1, t=3.0)], label="a-run")
    source.seek_to(source.duration)
    source.seek_to(0.0)  # before the hello: the header reads the record's settings anyway
    header = source.state.header()
    assert "?" not in header and "compile off" in header and "cpu" in header
    assert source.label().endswith("at 1x")


@pytest.mark.ui
@pytest.mark.parametrize("how", ["replay", "attach"])
def test_a_record_with_numerics_shows_them_in_replay_and_attach(tmp_path: Path, how: str) -> None:
    """An engine run whose skipped step 3 was run again: its record, replayed or attached to,
    opens the Numerics view with the layers and the first inf."""
    from ampscope.engine.lifecycle.run import EXIT_OK
    from ampscope.engine.lifecycle.run import run as run_engine
    from ampscope.tui.screens.numerics import NumericsScreen

    model = ROOT / "tests" / "data" / "skipped_numerics.py"
    overrides = [
        "device='cpu'", "warmup_steps=0", "steps=6", "numerics.every=1000",
        f"workload.model='{model}:make_skip'",
    ]  # fmt: skip
    assert run_engine("amp-fp16", overrides, runs_dir=tmp_path) == EXIT_OK
    (run_dir,) = records.list_runs(tmp_path)

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            source = (
                ReplaySource.load(run_dir.path, speed=1000)
                if how == "replay"
                else AttachSource(run_dir.path)
            )
            screen = app.open_run(source)
            assert await wait_for(pilot, lambda: screen.state.done is not None, 60), source.label()
            await pilot.press("n")
            numerics = await shown(pilot, app, NumericsScreen)
            await pilot.pause()
            assert "2 sampled steps" in text(numerics, "#numerics-header")
            said = text(numerics, "#numerics-verdict")
            assert "First inf/NaN: lin's gradients, step 3." in said
            assert "lin" in text(numerics, "#numerics-grid")

    run(go())


@pytest.mark.unit
def test_a_record_stamped_before_zero_replays_to_its_end() -> None:
    """Before: a hello stamped -1e300 (a damaged record) made the run last 1e300 s, so the
    replay sat at 0 % and never reached its end."""
    events = [
        hello(t=-1e300),
        step(0, t=-2e300),
        step(1, t=0.5),
        step(2, t=1.0),
        ev.empty_done("ok"),
    ]
    events[-1].t = 1.0
    source = ReplaySource(events, speed=1.0)
    assert source.duration == pytest.approx(1.0)
    source.advance_to(0.0)
    source.tick(2.0)
    assert source.at_end and source.state.step_count == 3


@pytest.mark.ui
def test_a_replay_of_a_run_still_going_says_so_at_its_end_never_cut_short(
    tmp_path: Path,
) -> None:
    """``ampscope replay`` of a run in progress played what was written, then said "the
    record has no 'done' event (the run was cut short)" of a run that was still training."""
    run_dir = tmp_path / "20260101T000009Z-live"
    run_dir.mkdir()
    events = [hello(run_dir=str(run_dir)), step(0), step(1)]
    (run_dir / records.EVENTS_FILE).write_bytes(b"".join(ev.encode(e) for e in events))
    records.write_live(run_dir, os.getpid())  # this process: alive, its heartbeat fresh
    cut = tmp_path / "20260101T000010Z-cut"
    cut.mkdir()
    (cut / records.EVENTS_FILE).write_bytes(b"".join(ev.encode(e) for e in events))

    texts: list[str] = []

    async def go(folder: Path) -> None:
        texts.clear()
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            screen = app.open_run(ReplaySource.load(folder, speed=100))
            assert await wait_for(pilot, lambda: screen.source.at_end), screen.source.label()
            log = screen.query_one(EventLogView)
            assert await wait_for(pilot, lambda: "record" in "\n".join(log.texts))
            texts.extend(log.texts)

    run(go(run_dir))
    said = "\n".join(texts)
    assert "the run is still going" in said and "ampscope attach" in said
    assert "cut short" not in said
    run(go(cut))  # no engine behind it: cut short, as before
    said = "\n".join(texts)
    assert "cut short" in said and "still going" not in said
