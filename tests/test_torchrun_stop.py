"""``ampscope run --nproc-per-node``'s own stop, with a stand-in for torchrun that ignores
SIGTERM and starts its "rank" in a session of its own, as torchrun does: a second signal, or
the grace after the first, kills torchrun and the rank alike."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, engine_env, gone, wait_until

pytestmark = pytest.mark.subprocess

TORCHRUN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
rank = subprocess.Popen(
    [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
    start_new_session=True,
)
open(sys.argv[1], "w").write(str(rank.pid))
time.sleep(600)
"""

WATCH = """
import sys
from ampscope.cli.torchrun import TorchrunWatch
from ampscope.core.presets.parallel import Launch

watch = TorchrunWatch([sys.executable, "-c", sys.argv[1], sys.argv[2]], Launch(2))
watch.kill_after_s = float(sys.argv[3])
sys.exit(watch.run(lambda event: None))
"""


def start_watch(tmp_path: Path, kill_after_s: float) -> tuple[subprocess.Popen, int, int]:
    """The watch, torchrun's pid and its rank's."""
    pid_file = tmp_path / "rank.pid"
    watch = subprocess.Popen(
        [sys.executable, "-c", WATCH, TORCHRUN, str(pid_file), str(kill_after_s)],
        env=engine_env(), cwd=ROOT, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    assert wait_until(lambda: pid_file.exists() and pid_file.read_text() != "", 60)
    rank = int(pid_file.read_text())
    (torchrun,) = [
        int(p) for p in Path(f"/proc/{watch.pid}/task/{watch.pid}/children").read_text().split()
    ]
    return watch, torchrun, rank


def end(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


@pytest.mark.parametrize("second", [True, False], ids=["second-signal", "grace-ends"])
def test_a_stop_that_torchrun_ignores_still_ends_torchrun_and_its_ranks(
    tmp_path: Path, second: bool
) -> None:
    watch, torchrun, rank = start_watch(tmp_path, kill_after_s=600.0 if second else 1.0)
    try:
        watch.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        if second:
            watch.send_signal(signal.SIGTERM)
        assert watch.wait(timeout=20) == 130  # stopped, no word from rank 0
        assert wait_until(lambda: gone(torchrun) and gone(rank), 10), "left running"
    finally:
        end([watch.pid, torchrun, rank])


def test_the_dashboards_stop_kills_torchrun_and_its_ranks_after_its_grace(tmp_path: Path) -> None:
    import asyncio

    from ampscope.tui.model.engine_process import EngineProcess

    pid_file = tmp_path / "rank.pid"
    found: list[int] = []

    async def go() -> None:
        command = [sys.executable, "-c", TORCHRUN, str(pid_file)]
        engine = EngineProcess("fp32", command=command, grace_s=1.0)
        runner = asyncio.ensure_future(engine.run())
        await engine.wait_started()
        assert engine.pid is not None
        found.append(engine.pid)
        for _ in range(600):
            if pid_file.exists() and pid_file.read_text():
                break
            await asyncio.sleep(0.1)
        found.append(int(pid_file.read_text()))
        await engine.stop()  # SIGTERM (ignored), then SIGKILL after the grace
        await asyncio.wait_for(runner, 10)  # the rank held its output open: gone too

    try:
        asyncio.run(go())
        assert wait_until(lambda: all(gone(pid) for pid in found), 10), "left running"
    finally:
        end(found)


def test_a_stop_while_torchrun_is_starting_is_passed_on_once_it_has(tmp_path: Path) -> None:
    """A Ctrl+C (or SIGTERM) that lands while torchrun is being started: the stop signals
    were not ours yet, so it ended ampscope at once and left the job running. Now they are
    ours first, and the stop reaches the job as soon as it exists."""
    from ampscope.cli.torchrun import TorchrunWatch
    from ampscope.core.presets.parallel import Launch

    pid_file = tmp_path / "rank.pid"
    watch = TorchrunWatch([sys.executable, "-c", TORCHRUN, str(pid_file)], Launch(2))
    watch.kill_after_s = 1.0
    watch._on_signal(signal.SIGTERM, None)  # before run(): no torchrun yet
    guard = threading.Timer(30.0, watch.kill_job)  # a stop that never came: end it anyway
    guard.start()
    started = time.monotonic()
    try:
        code = watch.run(lambda event: None)
    finally:
        guard.cancel()
    assert time.monotonic() - started < 15, "the stop did not reach the job"
    assert code == 130
    if pid_file.exists() and pid_file.read_text():
        assert wait_until(lambda: gone(int(pid_file.read_text())), 10)
