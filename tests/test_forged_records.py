"""A forged ``live.json`` never gets a foreign process signalled.

Pid, host and start time are public for every process, so a forged record can name a foreign
process with its true start time. Only a process that holds the record's ``.owner`` open is
ever signalled (``core.processes.ownership``), and a whole group only when ampscope created it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ampscope.cli.main import main as cli_main
from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.processes import ownership, stopping
from ampscope.tui.model.follow import AttachSource
from tests.helpers import gone, hello, owning_sleeper, step, wait_gone

SHELL_WITH_CHILDREN = "sleep 60 & sleep 60 & wait"


def forged_record(run_dir: Path, pid: int) -> None:
    """What anyone can write: the pid, this host and the process's true start time."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / records.EVENTS_FILE).write_bytes(ev.encode(hello()) + ev.encode(step(0)))
    records.write_live(run_dir, pid)


def family(leader: subprocess.Popen) -> list[psutil.Process]:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        kids = psutil.Process(leader.pid).children()
        if len(kids) == 2:
            return [psutil.Process(leader.pid), *kids]
        time.sleep(0.05)
    raise AssertionError("the shell did not start its children")


def end(leader: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(leader.pid, signal.SIGKILL)
    leader.wait()


@pytest.mark.subprocess
def test_no_stop_signals_a_foreign_group_that_a_forged_record_names(tmp_path: Path, capsys):
    shell = subprocess.Popen(["sh", "-c", SHELL_WITH_CHILDREN], start_new_session=True)
    try:
        procs = family(shell)
        run_dir = tmp_path / "20260101T000000Z-forged"
        forged_record(run_dir, shell.pid)
        os.close(ownership.claim_for_child(run_dir))  # even an .owner of its own is no help
        (run_dir / ownership.OWNER_FILE).write_text(f'{{"group": {shell.pid}}}')
        assert records.same_process(records.read_live(run_dir) or {}) == shell.pid

        assert cli_main(["stop", str(run_dir), "--wait", "0.5"]) == 1
        err = capsys.readouterr().err
        assert f"(pid {shell.pid}) does not prove that it runs this record" in err

        source = AttachSource(run_dir, grace_s=0.2)
        assert source.engine_pid() is None and not source.can_stop
        asyncio.run(source.stop())
        assert not stopping.signal_engine(run_dir, shell.pid, signal.SIGTERM)
        assert not stopping.ask_to_stop(run_dir, {"source": "watch"}, shell.pid)
        time.sleep(0.3)
        assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs)
    finally:
        end(shell)


@pytest.mark.subprocess
def test_an_owner_file_linked_to_a_file_the_foreign_process_holds_is_no_proof(tmp_path: Path):
    held = tmp_path / "held"
    held.write_text("")
    os.chmod(held, 0o600)
    holder = subprocess.Popen(
        [sys.executable, "-c", f"f = open({str(held)!r}); import time; time.sleep(60)"]
    )
    try:
        time.sleep(0.5)
        for n, link in enumerate((os.symlink, os.link)):
            run_dir = tmp_path / f"run{n}"
            forged_record(run_dir, holder.pid)
            link(held, run_dir / ownership.OWNER_FILE)
            assert stopping.verified_pid(records.read_live(run_dir) or {}, run_dir) is None
        assert holder.poll() is None
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.subprocess
def test_an_engine_holding_the_record_is_stopped_and_its_group_only_when_ampscope_made_it(
    tmp_path: Path,
) -> None:
    engine = owning_sleeper(tmp_path / "run")
    try:
        records.write_live(tmp_path / "run", engine.pid)
        live = records.read_live(tmp_path / "run") or {}
        assert stopping.verified_pid(live, tmp_path / "run") == engine.pid
        assert stopping.ask_to_stop(tmp_path / "run", live, engine.pid)
        assert wait_gone(engine.pid, 5)
    finally:
        engine.kill()
        engine.wait()

    run_dir = tmp_path / "group"
    run_dir.mkdir()
    fd = ownership.claim_for_child(run_dir)
    shell = subprocess.Popen(
        ["sh", "-c", SHELL_WITH_CHILDREN], pass_fds=(fd,), start_new_session=True
    )
    try:
        procs = family(shell)
        assert stopping.signal_engine(run_dir, shell.pid, signal.SIGKILL)  # no group noted
        assert wait_gone(shell.pid, 5) and not any(gone(p.pid) for p in procs[1:])
        for p in procs[1:]:
            p.kill()
        shell.wait()
        shell = subprocess.Popen(
            ["sh", "-c", SHELL_WITH_CHILDREN], pass_fds=(fd,), start_new_session=True
        )
        procs = family(shell)
        ownership.note_group(fd, shell.pid)  # what launch_detached records
        assert stopping.signal_engine(run_dir, shell.pid, signal.SIGKILL)
        assert all(wait_gone(p.pid, 5) for p in procs)
    finally:
        os.close(fd)
        end(shell)


@pytest.mark.unit
@pytest.mark.parametrize("forged", ["huge-pid", "nan-start", "string-pid"])
def test_a_live_json_naming_no_real_pid_or_start_is_not_live_and_nothing_crashes(
    tmp_path: Path, capsys, forged: str
) -> None:
    """A pid of 10**30 made runs, runs --json and stop die with OverflowError; a
    proc_start of NaN passed the pid-reuse check, so a record naming pid 1 was listed live."""
    import json
    import socket

    runs = tmp_path / "runs"
    run_dir = runs / "20260101T000000Z-forged"
    run_dir.mkdir(parents=True)
    (run_dir / records.EVENTS_FILE).write_bytes(ev.encode(hello()) + ev.encode(step(0)))
    pid = {"huge-pid": 10**30, "nan-start": 1, "string-pid": "1"}[forged]
    start = math.nan if forged == "nan-start" else (records.process_start(1) or 0.0)
    live = {"pid": pid, "host": socket.gethostname(), "heartbeat": time.time(),
            "started_at": time.time(), "proc_start": start}  # fmt: skip
    (run_dir / records.LIVE_FILE).write_text(json.dumps(live))
    assert records.same_process(records.read_live(run_dir) or {}) is None
    assert records.live_owner(run_dir) is None
    assert cli_main(["runs", "--runs-dir", str(runs), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["state"] != "live"
    assert cli_main(["runs", "--runs-dir", str(runs)]) == 0
    assert cli_main(["stop", str(run_dir), "--wait", "0"]) == 1
    assert "is not running on this host (crashed): nothing to stop" in capsys.readouterr().err


@pytest.mark.unit
def test_stop_names_the_user_whose_process_a_record_names(monkeypatch) -> None:
    """Another user's engine cannot prove it holds the record's .owner (its descriptors are
    hidden in /proc): 'stop' said the proof failed; it now says whose process it is."""
    from ampscope.cli import stop as stop_cli

    assert stop_cli._another_users(os.getpid()) is None  # this user's own
    monkeypatch.setattr(stop_cli.os, "getuid", lambda: 54321)
    assert (
        stop_cli._another_users(os.getpid()) == pwd.getpwuid(os.stat("/proc/self").st_uid).pw_name
    )
    assert stop_cli._another_users(2**22 + 12345) is None  # no such process: nothing to say
