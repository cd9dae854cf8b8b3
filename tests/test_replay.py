"""Replays: the shipped examples, played at a pace, paused and sought, in the Run view."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ampscope.cli import runs as runs_cli
from ampscope.cli.main import main as cli_main
from ampscope.core import events as ev
from ampscope.core import records
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.replay import ReplaySource
from ampscope.tui.screens.run import RunScreen
from ampscope.tui.widgets.event_log import EventLog
from tests.conftest import ROOT
from tests.helpers import SIZE, run, wait_for

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


@pytest.mark.unit
def test_replay_reaches_the_end_with_the_records_summary() -> None:
    record = records.load_run(example())

    async def go() -> None:
        app = AmpscopeApp()
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            screen = app.open_run(ReplaySource.load(example(), speed=100))
            await pilot.pause(0.2)
            assert isinstance(app.screen, RunScreen) and screen.state.read_only
            source = screen.source
            assert await wait_for(pilot, lambda: source.at_end, 20), source.label()
            state = screen.state
            assert state.done is not None
            assert ev.to_dict(state.done) == ev.to_dict(record.done)
            last_step = max(e.step for e in record.events if isinstance(e, ev.StepEvent))
            assert state.step == last_step and state.skipped == 1 and state.status == "done"
            await pilot.pause(0.6)
            log = "\n".join(screen.query_one(EventLog).texts)
            assert "step skipped" in log and "run ok" in log
            header = str(screen.query_one("#run-header").render())
            assert "replay" in header and "end 100%" in header
            assert screen.check_action("stop", ()) is None  # shown disabled: no engine
            assert screen.check_action("pause", ()) is True

    run(go())


@pytest.mark.unit
def test_pause_and_seek() -> None:
    async def go() -> None:
        app = AmpscopeApp()
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            screen = app.open_run(ReplaySource.load(example(), speed=1))
            source = screen.source
            await pilot.pause(0.3)
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
def test_replay_command_checks_and_defaults(tmp_path: Path, monkeypatch, capsys) -> None:
    assert cli_main(["replay", "--speed", "500"]) == 2
    assert "--speed" in capsys.readouterr().err
    assert cli_main(["replay", "no-such-run"]) == 2
    assert "fp16-nan" in capsys.readouterr().err  # names the examples
    opened: list = []
    monkeypatch.setattr(runs_cli, "_dashboard", lambda args, start: opened.append(start) or 0)
    # no finished run in the runs dir: the first shipped example
    assert cli_main(["replay", "--runs-dir", str(tmp_path), "--speed", "50"]) == 0
    (start,) = opened

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, open_run=start)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause(0.3)
            screen = app.screen
            assert isinstance(screen, RunScreen) and screen.source.speed == 50
            assert screen.state.label == "amp-fp16"  # the first example
            await pilot.press("escape")
            await pilot.pause(0.1)
            assert not isinstance(app.screen, RunScreen)

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
            assert f"ampscope/examples/{path.name}/{f}" in names
    assert {
        "ampscope/cli/runs.py",
        "ampscope/tui/follow.py",
        "ampscope/tui/replay.py",
        "ampscope/cli/viewer.py",
    } <= names
