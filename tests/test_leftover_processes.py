"""The session's own check that no test leaves a process behind also catches orphans: a forked
child whose parent exited, and one in a session of its own (as torchrun starts each rank)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, gone, wait_until

ORPHANS = '''
import os
import subprocess
import sys

import pytest


def leave_an_orphan(new_session: bool, pid_file: str) -> None:
    """A child that forks a grandchild and exits at once: the grandchild is reparented."""
    code = (
        "import os, sys, time\\n"
        "if os.fork() == 0:\\n"
        f"    {'os.setsid()' if new_session else 'pass'}\\n"
        "    open(sys.argv[1], 'w').write(str(os.getpid()))\\n"
        "    time.sleep(120)\\n"
    )
    subprocess.run([sys.executable, "-c", code, pid_file], check=True)


@pytest.mark.subprocess
@pytest.mark.parametrize("new_session", [False, True], ids=["forked", "own-session"])
def test_leaves_an_orphan(new_session: bool) -> None:
    leave_an_orphan(new_session, os.environ["ORPHAN_PID_FILE"] + str(new_session))
'''


@pytest.mark.subprocess
def test_the_session_check_catches_orphaned_processes(tmp_path: Path) -> None:
    (tmp_path / "test_orphans.py").write_text(ORPHANS)
    pid_file = str(tmp_path / "orphan.pid.")
    env = {**os.environ, "ORPHAN_PID_FILE": pid_file, "AMPSCOPE_TEST_LEFTOVER_WAIT_S": "1"}
    inner = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider"]
        + ["-p", "tests.conftest", "-c", str(ROOT / "pyproject.toml"), str(tmp_path)]
        + ["--basetemp", str(tmp_path / "inner")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    pids = []
    for suffix in ("False", "True"):
        with contextlib.suppress(OSError, ValueError):
            pids.append(int(Path(pid_file + suffix).read_text()))
    try:
        assert len(pids) == 2, inner.stdout[-2000:]
        assert inner.returncode != 0, inner.stdout[-2000:]
        said = inner.stdout + inner.stderr
        assert "processes left behind: " in said
        assert all(f"{pid} " in said.split("processes left behind: ", 1)[1] for pid in pids)
        assert wait_until(lambda: all(gone(pid) for pid in pids), 10)  # and it ended them
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
