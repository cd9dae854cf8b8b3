from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(autouse=True)
def _isolated_user_config(tmp_path_factory, monkeypatch):
    """User presets and run records never leak between tests or into the developer's home."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg")))
    monkeypatch.setenv("AMPSCOPE_RUNS_DIR", str(tmp_path_factory.mktemp("runs")))


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_in_ps(tmp_path_factory):
    """No test leaves a process behind: none of this session's children, and no process
    (a detached engine, a viewer) that works in this session's temporary folders."""
    yield
    ours = str(tmp_path_factory.getbasetemp()) + os.sep
    deadline = time.monotonic() + 10.0  # what was just stopped may take a moment to go
    while True:
        left = _left_behind(ours)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    assert not left, "processes left behind: " + "; ".join(
        f"{p.pid} {' '.join(p.info['cmdline'] or [])[:200]}" for p in left
    )


def _left_behind(ours: str) -> list[psutil.Process]:
    me = psutil.Process()
    mine = {p.pid for p in me.children(recursive=True)}
    left = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.info["pid"] == me.pid or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["pid"] in mine or ours in cmdline:
            left.append(proc)
    return left
