"""The dashboard ended by SIGTERM gives the terminal back: cooked mode, no mouse tracking."""

from __future__ import annotations

import contextlib
import os
import signal
import termios
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import dashboard_on_a_terminal, wait_until

MOUSE_ON, MOUSE_OFF = b"\x1b[?1000h", b"\x1b[?1000l"
ALT_SCREEN_ON, ALT_SCREEN_OFF = b"\x1b[?1049h", b"\x1b[?1049l"


@pytest.mark.subprocess
def test_sigterm_leaves_the_terminal_as_it_was(tmp_path: Path) -> None:
    term = dashboard_on_a_terminal(AMPSCOPE_RUNS_DIR=str(tmp_path))
    proc, master, slave, output = term.proc, term.master, term.slave, term.output
    before = term.before
    assert before[3] & termios.ICANON and before[3] & termios.ECHO  # a cooked terminal
    try:
        up = wait_until(lambda: MOUSE_ON in output and b"fp32" in output, 60)
        assert up, bytes(output[-2000:])
        assert not termios.tcgetattr(slave)[3] & termios.ICANON  # raw while it runs
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 128 + signal.SIGTERM
        time.sleep(0.3)  # the last bytes reach the reader
        last_on = output.rfind(MOUSE_ON)
        assert output.find(MOUSE_OFF, last_on) > last_on, "mouse tracking left on"
        assert output.find(ALT_SCREEN_OFF, output.rfind(ALT_SCREEN_ON)) > 0
        after = termios.tcgetattr(slave)
        assert after[3] & termios.ICANON and after[3] & termios.ECHO, "left in raw mode"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
        os.close(slave)


@pytest.mark.subprocess
def test_a_terminal_that_goes_without_a_hang_up_ends_the_dashboard_and_its_engine(
    tmp_path: Path,
) -> None:
    """Started where no session holds the terminal (setsid), the dashboard got no SIGHUP when
    the terminal closed: it and its engine ran on, drawing to nothing, an hour later still."""
    term = dashboard_on_a_terminal(
        AMPSCOPE_RUNS_DIR=str(tmp_path),
        AMPSCOPE_AUTOSTART="fp32 device=cpu workload.kind=mlp steps=1000000",
    )
    proc, output = term.proc, term.output
    engines: list[psutil.Process] = []

    def training() -> bool:
        with contextlib.suppress(psutil.Error):
            engines[:] = [
                p
                for p in psutil.Process(proc.pid).children(recursive=True)
                if "ampscope.engine" in " ".join(p.cmdline())
            ]
        return bool(engines)

    try:
        assert wait_until(training, 60), bytes(output[-2000:])
        os.close(term.master)  # the terminal window closes: its side of the pty goes
        os.close(term.slave)
        assert proc.wait(timeout=30) == 128 + signal.SIGHUP
        assert wait_until(lambda: not any(e.is_running() for e in engines), 15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for engine in engines:
            with contextlib.suppress(psutil.Error):
                engine.kill()


@pytest.mark.subprocess
@pytest.mark.parametrize("size", [("30", "10"), ("100000", "100000")])
def test_columns_and_lines_left_in_the_environment_do_not_size_the_dashboard(
    tmp_path: Path, size: tuple[str, str]
) -> None:
    """A COLUMNS and LINES exported in another window (or a script's) are not the terminal's
    size: the dashboard is drawn for the 80x24 terminal it is in. Taken as its size, 30x10
    had it say 'terminal too small' on a terminal large enough, and 100000x100000 had it
    build a screen of 10^10 cells: gigabytes and no first screen."""
    columns, lines = size
    term = dashboard_on_a_terminal(AMPSCOPE_RUNS_DIR=str(tmp_path), COLUMNS=columns, LINES=lines)
    proc, output = term.proc, term.output
    try:
        drawn = wait_until(lambda: b"amp-bf16" in output or b"too small" in output, 60)
        assert drawn, bytes(output[-2000:])
        assert b"too small" not in output
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(term.master)
        os.close(term.slave)
