"""Runs that outlive the terminal: --detach, live.json, runs, attach and stop from a new UI."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ampscope.cli.main import main as cli_main
from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.processes.launch import ENGINE_LOG
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.model.follow import AttachSource, RecordTail
from ampscope.tui.model.replay import RecordSource
from ampscope.tui.screens.history import HistoryScreen
from ampscope.tui.screens.presets import PresetsScreen
from ampscope.tui.screens.run import RunScreen
from tests.helpers import (
    ROOT,
    SIZE,
    engine_env,
    gone,
    hello,
    history_of,
    run,
    shown,
    step,
    text,
    wait_for,
    wait_gone,
    wait_until,
)

LONG = ["--set", "steps=100000", "--set", "workload.kind='mlp'", "--set", "device='cpu'"]


def kill(pid: int | None) -> None:
    if pid is None or gone(pid):
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
    wait_gone(pid, 5)


def step_lines(run_dir: Path) -> int:
    try:
        return (run_dir / records.EVENTS_FILE).read_bytes().count(b'"type":"step"')
    except OSError:
        return 0


def runs_json(capsys, root: Path) -> list[dict]:
    capsys.readouterr()
    assert cli_main(["runs", "--json", "--runs-dir", str(root)]) == 0
    return json.loads(capsys.readouterr().out)


# --------------------------------------------------------------------------- a real detached run


@pytest.mark.subprocess
def test_detached_run_outlives_its_launcher_then_attach_and_stop(tmp_path: Path, capsys) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ampscope", "run", "mlp-demo", "--detach", *LONG]
        + ["--runs-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=engine_env(),
        cwd=ROOT,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    run_dir, pid = Path(lines[0]), int(lines[1].split()[1])
    try:
        assert not gone(pid)  # the launcher returned; the run (100000 steps) goes on
        assert run_dir.parent == tmp_path and os.getsid(pid) == pid  # its own session
        assert records.read_live(run_dir)["pid"] == pid
        started = wait_until(lambda: step_lines(run_dir) >= 3 or gone(pid), 60)
        assert started and not gone(pid), (run_dir / ENGINE_LOG).read_text()
        assert step_lines(run_dir) >= 3, "no steps in 60 s"
        seen = step_lines(run_dir)
        assert wait_until(lambda: step_lines(run_dir) > seen, 20)  # it keeps going
        (row,) = runs_json(capsys, tmp_path)
        assert row["state"] == "live" and row["pid"] == pid and row["steps"] >= 3
        assert row["preset"] == "mlp-demo" and row["path"] == str(run_dir)

        async def go() -> None:
            # a first viewer attaches and quits: the run goes on
            app = AmpscopeApp(runs_dir=tmp_path)
            async with app.run_test(size=SIZE) as pilot:
                await shown(pilot, app, PresetsScreen)
                screen = app.open_run(AttachSource(run_dir))
                assert await wait_for(pilot, lambda: screen.state.step_count >= 3, 20)
                assert screen.check_action("stop", ()) is True
                await pilot.press("q")
            assert not gone(pid)
            # a second one attaches, catches up, follows, and stops the run
            app = AmpscopeApp(runs_dir=tmp_path)
            async with app.run_test(size=SIZE) as pilot:
                await shown(pilot, app, PresetsScreen)
                in_file = step_lines(run_dir)
                screen = app.open_run(AttachSource(run_dir))
                assert await shown(pilot, app, RunScreen) is screen
                assert await wait_for(pilot, lambda: screen.state.step_count >= in_file, 20)
                seen = screen.state.step_count
                assert await wait_for(pilot, lambda: screen.state.step_count > seen, 20)
                assert await wait_for(pilot, lambda: "attached" in text(screen, "#run-header"))
                assert "mlp-demo" in text(screen, "#run-header")
                await pilot.press("s")
                assert await wait_for(pilot, lambda: screen.state.done is not None, 30)
                assert screen.state.done.status == "stopped"
                assert await wait_for(pilot, lambda: screen.source.ended, 5)
                assert screen.check_action("stop", ()) is None  # nothing left to stop

        run(go())
        assert wait_gone(pid, 15)
        assert records.load_run(run_dir).state == "stopped"
        assert not (run_dir / records.LIVE_FILE).exists()
        assert (run_dir / records.SUMMARY_FILE).is_file()
    finally:
        kill(pid)


@pytest.mark.subprocess
def test_dashboard_detach_toggle_starts_a_run_that_survives_quitting(tmp_path: Path) -> None:
    pids: list[int] = []

    async def go() -> None:
        app = AmpscopeApp(runs_dir=tmp_path, extra_overrides=["steps=100000", "device='cpu'"])
        async with app.run_test(size=SIZE) as pilot:
            screen = await shown(pilot, app, PresetsScreen)

            def keys() -> set[str]:
                return {b.binding.description for b in screen.active_bindings.values()}

            assert "Detached: off" in keys()
            await pilot.press("d")
            assert await wait_for(pilot, lambda: "Detached: ON" in keys(), 5)
            assert screen.detach and "Detached: off" not in keys()
            options = screen.query_one("#preset-list")
            options.highlighted = [p.name for p in screen.presets].index("mlp-demo")
            options.focus()
            await pilot.press("enter")
            # shown once the detached engine said hello: torch's import, 10 s and more at load 11
            run_screen = await shown(pilot, app, RunScreen, 120)
            assert isinstance(run_screen.source, AttachSource)
            assert app.run_manager.engine is None  # not a child of the app
            (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
            pids.append(int(records.read_live(run_dir)["pid"]))
            assert os.getsid(pids[0]) == pids[0]
            await pilot.press("q")

    try:
        run(go())
        time.sleep(0.5)
        assert pids and not gone(pids[0])  # quitting the dashboard left it running
    finally:
        for pid in pids:
            kill(pid)


@pytest.mark.unit
def test_detach_refuses_a_bad_preset_and_no_record(tmp_path: Path, capsys) -> None:
    assert cli_main(["run", "nope", "--detach", "--runs-dir", str(tmp_path)]) == 2
    assert "nope" in capsys.readouterr().err
    code = cli_main(["run", "fp32", "--detach", "--no-record", "--runs-dir", str(tmp_path)])
    assert code == 2
    assert list(tmp_path.iterdir()) == []


@pytest.mark.unit
def test_detach_refuses_a_model_path_that_is_not_utf8_in_one_line(tmp_path: Path, capsys) -> None:
    # a model file named in Latin-1: its path cannot go into the preset.toml the detached
    # run reads, which ended on a UnicodeEncodeError traceback and left an empty folder
    model = tmp_path / os.fsdecode(b"mod\xe8le.py")
    model.write_text("def make(ctx):\n    raise AssertionError('never built')\n")
    runs = tmp_path / "runs"
    code = cli_main(
        ["run", "fp32", "--detach", "--model", f"{model}:make", "--runs-dir", str(runs)]
    )
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.startswith("ampscope: ") and "not UTF-8 text" in err and "--detach" in err
    assert not runs.exists() or list(runs.iterdir()) == []


# --------------------------------------------------------------------------- liveness


def make_record(root: Path, name: str, pid: int, steps: int = 5, heartbeat_age: float = 0.0):
    run_dir = root / name
    run_dir.mkdir(parents=True, exist_ok=True)
    items = [
        ev.PhaseEvent(phase="setup", state="start"),
        hello(pid=pid, host=socket.gethostname(), started_at=time.time()),
    ]
    items += [step(i) for i in range(steps)]
    data = b"".join(ev.encode(e) for e in items)
    (run_dir / records.EVENTS_FILE).write_bytes(data + b'{"type":"step","st')  # torn last line
    records.write_live(run_dir, pid)
    if heartbeat_age:
        live = records.read_live(run_dir)
        live["heartbeat"] -= heartbeat_age
        (run_dir / records.LIVE_FILE).write_text(json.dumps(live))
    return run_dir


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.subprocess
def test_live_and_crashed_records_in_runs_and_history(tmp_path: Path, capsys) -> None:
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    engine_gone = threading.Event()
    try:
        live = make_record(tmp_path, "20260101T000003Z-fp32", sleeper.pid, steps=7)

        def beat() -> None:
            """A heartbeat a second, as an engine beats while it runs: one written once aged
            past the 10 s that make a run stalled before History read it, at load 19."""
            while not engine_gone.wait(1.0):
                records.write_live(live, sleeper.pid)

        threading.Thread(target=beat, daemon=True).start()
        make_record(tmp_path, "20260101T000002Z-fp32", dead_pid())  # died without done
        # a stale heartbeat from a process that still runs: paused or swapping, not dead
        make_record(tmp_path, "20260101T000001Z-fp32", sleeper.pid, heartbeat_age=60)
        rows = runs_json(capsys, tmp_path)
        assert [r["state"] for r in rows] == ["live", "crashed", "stalled"]
        assert rows[0]["steps"] == 7 and rows[0]["pid"] == sleeper.pid
        assert rows[2]["pid"] == sleeper.pid  # a stalled run's process runs: its pid (was null)
        capsys.readouterr()
        assert cli_main(["runs", "--runs-dir", str(tmp_path)]) == 0
        table = capsys.readouterr().out.splitlines()
        assert table[0].startswith(f"Runs in {tmp_path}")
        assert table[1].split() == ["run", "state", "steps", "median", "step", "final", "loss"]
        assert [line.split()[:2] for line in table[2:]] == [
            [r["path"].rsplit("/", 1)[-1], r["state"]] for r in rows
        ]  # a run's name first: what attach, replay and stop take
        assert max(len(line) for line in table[1:]) <= 80

        async def go() -> None:
            app = AmpscopeApp(runs_dir=tmp_path)
            async with app.run_test(size=SIZE) as pilot:
                history, table = await history_of(pilot, app, 3)
                assert [table.get_row_at(i)[2] for i in range(3)] == ["live", "crashed", "stalled"]
                await pilot.press("enter")  # the live one: attached, not replayed
                screen = await shown(pilot, app, RunScreen)
                assert isinstance(screen.source, AttachSource)
                assert await wait_for(pilot, lambda: screen.state.step_count == 7, 30)
                assert not screen.state.read_only
                # the engine dies without a done: the view says so
                engine_gone.set()
                sleeper.kill()
                sleeper.wait()
                assert await wait_for(pilot, lambda: screen.source.ended, 30)
                assert screen.source.crashed and "crashed" in (screen.state.error or "")
                await pilot.press("escape")
                await shown(pilot, app, HistoryScreen)
                await pilot.press("down", "enter")  # a crashed one: replayed
                replayed = await shown(pilot, app, RunScreen)
                assert isinstance(replayed.source, RecordSource)  # shown whole, not followed
                assert replayed.state.read_only

        run(go())
    finally:
        engine_gone.set()
        sleeper.kill()
        sleeper.wait()


@pytest.mark.subprocess
def test_state_rules() -> None:
    assert records.pid_alive(os.getpid()) and not records.pid_alive(dead_pid())


@pytest.mark.unit
def test_state_of_a_finished_record_and_one_without_live_json(tmp_path: Path) -> None:
    run_dir = make_record(tmp_path, "a", os.getpid())
    assert records.load_run(run_dir, with_events=False).state == "live"
    records.clear_live(run_dir)
    assert records.load_run(run_dir, with_events=False).state == "crashed"
    with (run_dir / records.EVENTS_FILE).open("ab") as fh:
        fh.write(b"\n" + ev.encode(ev.empty_done("stopped")))
    # no summary yet (the engine is finishing): the stream's done counts
    assert records.load_run(run_dir, with_events=False).state == "stopped"


@pytest.mark.unit
def test_tail_keeps_a_torn_line_until_it_is_complete(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    line = ev.encode(step(3))
    path.write_bytes(ev.encode(step(1)) + line[:10])
    tail = RecordTail(path)
    items, more = tail.read()
    assert [e.step for e in items] == [1] and not more
    with path.open("ab") as fh:
        fh.write(line[10:])
    items, _ = tail.read()
    assert [e.step for e in items] == [3]
    assert tail.read() == ([], False)


@pytest.mark.subprocess
def test_attach_with_no_run_named_follows_a_stalled_run(tmp_path: Path, capsys) -> None:
    """A run whose engine is paused (SIGSTOP, swapping) is the one 'ampscope runs' lists as
    stalled and 'ampscope stop' stops: 'ampscope attach' follows it too, instead of saying
    there is no live run, and does not call it not running."""
    from ampscope.cli import runs as runs_cli
    from ampscope.cli.main import command_args

    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        run_dir = make_record(tmp_path, "20260101T000001Z-fp32", sleeper.pid, heartbeat_age=60)
        assert records.load_run(run_dir, with_events=False).state == "stalled"
        opened = []
        args = command_args(["attach", "--runs-dir", str(tmp_path)])
        assert runs_cli.cmd_attach(args, lambda args, source: opened.append(source) or 0) == 0
        assert [source.run_dir for source in opened] == [run_dir]
        err = capsys.readouterr().err
        assert "not running" not in err and "is still running" in err
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.subprocess
def test_quitting_attach_on_a_live_run_says_how_to_return_or_stop(tmp_path: Path, capsys) -> None:
    from ampscope.cli import runs as runs_cli
    from ampscope.cli.main import command_args

    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        make_record(tmp_path, "20260101T000001Z-fp32", sleeper.pid)
        args = command_args(["attach", "20260101T000001Z-fp32", "--runs-dir", str(tmp_path)])
        assert runs_cli.cmd_attach(args, lambda args, source: 0) == 0  # q at once
        err = capsys.readouterr().err
        assert "20260101T000001Z-fp32 is still running" in err
        assert "'ampscope stop 20260101T000001Z-fp32' ends it" in err
    finally:
        sleeper.kill()
        sleeper.wait()
