"""Attached views and stalls: a paused engine is stalled, not crashed, and Stop signals only a
verified engine."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.records import folders
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.model import follow
from ampscope.tui.model.follow import AttachSource
from ampscope.tui.screens.dialogs import ConfirmDialog
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.screens.run import RunScreen
from tests.helpers import (
    ROOT,
    SIZE,
    engine_env,
    gone,
    hello,
    run,
    shown,
    step,
    text,
    wait_for,
    wait_gone,
)

SMALL = (80, 24)
FAKE_ENGINE = """
import json, os, signal, sys, time
from pathlib import Path
from ampscope.core import records

signal.signal(signal.SIGINT, signal.default_int_handler)  # as a script run from a terminal

run_dir, lines = Path(sys.argv[1]), Path(sys.argv[2]).read_bytes().splitlines(keepends=True)
extra = json.loads(sys.argv[3])
started = time.time()
with open(run_dir / records.EVENTS_FILE, "ab", buffering=0) as fh:
    fh.write(lines[0])
    while True:
        records.write_live(run_dir, os.getpid(), started, extra)
        fh.write(lines[1])
        time.sleep(0.1)
"""


def start_fake_engine(run_dir: Path, watched: bool = False) -> subprocess.Popen:
    """A process that writes a record and a heartbeat like an engine, without torch (or
    anything heavier than ampscope.core to import); ``watched``: like a user's own training
    loop under ``ampscope.watch(..., allow_stop=True)``."""
    run_dir.mkdir(parents=True)
    lines = run_dir.parent / "lines.jsonl"
    extra = {"source": "watch", "allow_stop": True} if watched else {}
    first = hello(preset="fake", **extra)
    lines.write_bytes(ev.encode(first) + ev.encode(step(0)))
    return subprocess.Popen(
        [sys.executable, "-c", FAKE_ENGINE, str(run_dir), str(lines), json.dumps(extra)],
        cwd=ROOT,
        env=engine_env(),
        start_new_session=True,
    )


@pytest.mark.subprocess
def test_a_paused_engine_is_stalled_then_followed_again_and_stop_still_works(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(folders, "LIVE_STALE_S", 1.0)  # where is_stalled reads it
    monkeypatch.setattr(follow, "LIVENESS_S", 0.2)
    run_dir = tmp_path / "20260101T000000Z-fake"
    engine = start_fake_engine(run_dir)
    try:

        async def go() -> None:
            app = AmpscopeApp(runs_dir=tmp_path)
            async with app.run_test(size=SIZE) as pilot:
                await shown(pilot, app, PresetsScreen)
                screen = app.open_run(AttachSource(run_dir))
                source = screen.source
                assert await wait_for(pilot, lambda: screen.state.step_count >= 3, 60)

                os.kill(engine.pid, signal.SIGSTOP)  # paused: no heartbeat, no steps
                assert await wait_for(pilot, lambda: source.stalled, 10)
                assert await wait_for(pilot, lambda: "stalled" in text(screen, "#run-header"))
                assert not source.ended and not source.crashed
                assert records.load_run(run_dir, with_events=False).state == "stalled"
                assert screen.check_action("stop", ()) is True  # Stop is still offered

                os.kill(engine.pid, signal.SIGCONT)  # it goes on: so does the view
                seen = screen.state.step_count
                assert await wait_for(pilot, lambda: screen.state.step_count > seen + 3, 10)
                assert await wait_for(pilot, lambda: not source.stalled, 10)
                assert await wait_for(pilot, lambda: "stalled" not in text(screen, "#run-header"))

                os.kill(engine.pid, signal.SIGSTOP)
                assert await wait_for(pilot, lambda: source.stalled, 10)
                await pilot.press("s")  # stops a paused engine too (SIGTERM, then SIGCONT)
                assert await wait_for(pilot, lambda: source.ended, 15)
                assert screen.state.status == "stopped" and not source.crashed

        run(go())
        assert wait_gone(engine.pid, 10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(engine.pid, signal.SIGKILL)
        engine.wait()


@pytest.mark.subprocess
def test_stop_never_signals_a_process_live_json_merely_names(tmp_path: Path) -> None:
    """A stale record after pid reuse, or a crafted one: the pid is alive, but it is not the
    engine that started this record (its start time differs)."""
    innocent = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        run_dir = tmp_path / "20260101T000000Z-fp32"
        run_dir.mkdir()
        (run_dir / records.EVENTS_FILE).write_bytes(b"")
        records.write_live(run_dir, innocent.pid)
        live = records.read_live(run_dir)
        live["proc_start"] -= 3600  # the record's engine started an hour before this process
        (run_dir / records.LIVE_FILE).write_text(json.dumps(live))

        source = AttachSource(run_dir, grace_s=0.5)
        # fresh heartbeat, pid alive, but not the engine: not live (ampscope stop agrees)
        assert records.live_owner(run_dir) is None
        assert source.engine_pid() is None and not source.can_stop
        asyncio.run(source.stop())
        time.sleep(0.5)
        assert not gone(innocent.pid)
    finally:
        innocent.kill()
        innocent.wait()


@pytest.mark.subprocess
def test_stop_asks_before_it_stops_someones_own_watched_training(tmp_path: Path) -> None:
    run_dir = tmp_path / "20260101T000000Z-fake"
    process = start_fake_engine(run_dir, watched=True)
    try:

        async def go() -> None:
            app = AmpscopeApp(runs_dir=tmp_path)
            async with app.run_test(size=SMALL) as pilot:
                await shown(pilot, app, PresetsScreen)
                screen = app.open_run(AttachSource(run_dir))
                assert await wait_for(pilot, lambda: screen.state.step_count >= 3, 60)
                assert screen.check_action("stop", ()) is True
                await pilot.press("s")
                dialog = await shown(pilot, app, ConfirmDialog)
                assert "someone's own training process" in text(dialog, "#confirm-question")
                await pilot.press("n")  # No: it trains on
                await shown(pilot, app, RunScreen)
                await pilot.pause(0.5)
                assert process.poll() is None and not screen.source.stopping
                await pilot.press("s")
                await shown(pilot, app, ConfirmDialog)
                await pilot.press("y")
                assert await wait_for(pilot, lambda: screen.source.ended, 15)

        run(go())
        assert wait_gone(process.pid, 10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.mark.subprocess  # a 'sleep' stands for the engine, alive all along
def test_a_followed_run_whose_record_is_removed_is_not_said_to_have_crashed(
    tmp_path: Path,
) -> None:
    """Removing a live run's folder took its live.json with it, and the view said 'crashed:
    the engine is gone' of an engine still running: the record's removal is what it says."""
    import shutil

    run_dir = tmp_path / "20260101T000000Z-live"
    run_dir.mkdir()
    events = [hello(run_dir=str(run_dir)), ev.PhaseEvent(phase="train", state="start"), step(0)]
    (run_dir / records.EVENTS_FILE).write_bytes(b"".join(ev.encode(e) for e in events))
    sleeper = subprocess.Popen(["sleep", "120"], start_new_session=True)
    records.write_live(run_dir, sleeper.pid)

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await shown(pilot, app, PresetsScreen)
            screen = app.open_run(AttachSource(run_dir))
            assert await wait_for(pilot, lambda: screen.state.step_count == 1)
            shutil.rmtree(run_dir)
            assert await wait_for(pilot, lambda: screen.source.ended)
            lines = [line.text for line in screen.state.log]
            assert screen.state.status == "incomplete" and not screen.source.crashed
            assert any("the record was removed (" in t for t in lines), lines
            assert not any("crashed" in t for t in lines), lines
            await pilot.pause(0.6)
            assert "crashed" not in text(screen, "#run-header")

    try:
        run(go())
    finally:
        sleeper.kill()
        sleeper.wait()
