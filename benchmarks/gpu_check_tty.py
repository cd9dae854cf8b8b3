"""The GPU check's dashboard stage: ``ampscope`` on a pseudo-terminal, as over SSH.

It starts a run on its own (``AMPSCOPE_AUTOSTART``), must draw it and train, and must leave
on SIGTERM with no engine behind. What was seen goes to a JSON file for the checks.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import struct
import subprocess
import termios
import threading
import time
from pathlib import Path
from typing import Any

from ampscope.core import events as ev
from ampscope.core import records

SIZE = (40, 120)  # rows, columns
ALT_SCREEN_ON = b"\x1b[?1049h"


def steps_in(runs_dir: Path) -> tuple[int, int | None]:
    """Steps recorded under ``runs_dir`` so far, and the engine's pid from its hello."""
    steps, pid = 0, None
    with contextlib.suppress(OSError):
        for folder in runs_dir.iterdir():
            path = folder / records.EVENTS_FILE
            if not path.is_file():
                continue
            events, _ = records.read_events(path)
            steps += sum(isinstance(e, ev.StepEvent) for e in events)
            pid = next((e.pid for e in events if isinstance(e, ev.HelloEvent)), pid)
    return steps, pid


def gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not records.pid_alive(pid):
            return True
        time.sleep(0.2)
    return not records.pid_alive(pid)


def drive_dashboard(
    out: Path, cmd: list[str], runs_dir: Path, autostart: str, seconds: float
) -> int:
    preset = autostart.split()[0]
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", SIZE[0], SIZE[1], 0, 0))
    env = dict(os.environ, TERM="xterm-256color", AMPSCOPE_AUTOSTART=autostart)
    env["AMPSCOPE_RUNS_DIR"] = str(runs_dir)
    runs_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdin=slave, stdout=slave, stderr=slave, start_new_session=True, env=env
    )
    os.close(slave)
    output = bytearray()

    def drain() -> None:
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 65536):
                output.extend(chunk)

    threading.Thread(target=drain, daemon=True).start()
    drawn_at: float | None = None
    steps, pid = 0, None
    while time.monotonic() - started < seconds and proc.poll() is None:
        steps, pid = steps_in(runs_dir)
        if drawn_at is None and ALT_SCREEN_ON in output and preset.encode() in output:
            drawn_at = time.monotonic() - started
        if drawn_at is not None and steps >= 3:
            break
        time.sleep(0.5)
    problems = []
    if proc.poll() is not None:
        problems.append(f"the dashboard exited by itself ({proc.returncode})")
    if drawn_at is None:
        problems.append(f"nothing drawn naming {preset} within {seconds:.0f} s")
    if steps < 3:
        problems.append(f"{steps} steps recorded by the run it started")
    proc.send_signal(signal.SIGTERM)
    try:
        code: int | None = proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        problems.append("still running 15 s after SIGTERM")
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
    if code != 128 + signal.SIGTERM and code != -signal.SIGTERM:
        problems.append(f"exit {code} on SIGTERM, expected {128 + signal.SIGTERM}")
    if pid is not None and not gone(pid, 10):
        problems.append(f"its engine (pid {pid}) was left running")
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.close(master)
    report: dict[str, Any] = {
        "preset": preset,
        "size": f"{SIZE[1]}x{SIZE[0]}",
        "seconds_to_draw": None if drawn_at is None else round(drawn_at, 1),
        "steps": steps,
        "exit_code": code,
        "bytes_drawn": len(output),
        "problems": problems,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    return 1 if problems else 0
