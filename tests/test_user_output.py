"""What the user's code prints never lands inside the engine's event stream: the stream has a
descriptor of its own, and the user's stdout goes to stderr, where the dashboard shows it."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampscope.core import events as ev
from ampscope.core.processes.launch import engine_command
from tests.helpers import engine_env

MODEL = """
import os
import torch
from torch import nn
import ampscope


class Noisy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        print(".", end="")  # a progress dot, no newline, through sys.stdout
        os.write(1, b'{"kind": "step", "not": "ours"')  # straight to fd 1, half a line
        os.write(1, b"x" * 200_000)  # a long burst with no newline
        return self.fc(x)


def make(ctx):
    x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 64, 8)]
    loss = lambda out, target: nn.functional.cross_entropy(out, target)  # noqa: E731
    return ampscope.Workload(model=Noisy(), batches=batches, loss=loss, name="noisy")
"""


@pytest.mark.subprocess
def test_user_prints_and_raw_writes_to_stdout_stay_out_of_the_event_stream(tmp_path: Path) -> None:
    (tmp_path / "noisy.py").write_text(MODEL)
    cmd = engine_command(
        "fp32", ["steps=4"], tmp_path / "runs", exit_with_parent=False,
        extra=["--model", "noisy.py:make"],
    )  # fmt: skip
    out = subprocess.run(
        cmd, cwd=tmp_path, env=engine_env(), capture_output=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    events = [ev.decode(ln) for ln in lines]  # every line is one of ours
    kinds = [type(e).__name__ for e in events]
    assert "HelloEvent" in kinds and kinds[-1] == "DoneEvent", kinds
    hello = next(e for e in events if isinstance(e, ev.HelloEvent))
    assert "noisy" in hello.workload
    assert sum(isinstance(e, ev.StepEvent) for e in events) == 4
    assert out.stderr.count(b'"not": "ours"') >= 4  # the user's output, kept, on stderr


SPAWNER = """
import subprocess
import sys
import torch
from torch import nn
import ampscope


DAEMON = '''
import os, time
if os.fork() == 0:  # the parent exits at once: this one is reparented, in a session of its own
    os.setsid()
    open("daemon.pid", "w").write(str(os.getpid()))
    time.sleep(300)
'''


def make(ctx):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    open("child.pid", "w").write(str(child.pid))
    quiet = subprocess.DEVNULL  # a daemon holds none of the engine's pipes
    subprocess.run([sys.executable, "-c", DAEMON], stdout=quiet, stderr=quiet, check=True)
    x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 32, 8)]
    loss = lambda out, target: nn.functional.cross_entropy(out, target)  # noqa: E731
    return ampscope.Workload(model=nn.Linear(8, 2), batches=batches, loss=loss)
"""


@pytest.mark.subprocess
def test_a_process_the_users_code_left_running_is_ended_and_named(tmp_path: Path) -> None:
    import psutil

    from ampscope.core import records

    (tmp_path / "spawner.py").write_text(SPAWNER)
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "ampscope", "run", "fp32", "--model", "spawner.py:make"]
    out = subprocess.run(
        [*cmd, "--steps", "3", "--runs-dir", str(runs)],
        cwd=tmp_path, env=engine_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    pid = int((tmp_path / "child.pid").read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    (run_dir,) = runs.iterdir()
    events = records.load_run(run_dir).events
    warnings = [w for w in events if isinstance(w, ev.WarningEvent) and w.code == "children-ended"]
    daemon = int((tmp_path / "daemon.pid").read_text())
    try:
        assert len(warnings) == 1 and f"{pid} (" in warnings[0].message, warnings
        assert isinstance(events[-1], ev.DoneEvent)  # part of the run: before done, not after
        assert "your code left 1 process running" in out.stderr
        # the daemon left the engine's tree: named, and left running as it was made to
        assert "it also left 1 process that left the engine's process tree" in out.stderr
        assert f"{daemon} (" in warnings[0].message.split("it also left", 1)[1]
        assert psutil.Process(daemon).status() != psutil.STATUS_ZOMBIE
    finally:
        with contextlib.suppress(psutil.Error):
            psutil.Process(daemon).kill()


@pytest.mark.subprocess
def test_inductors_own_compilers_are_ended_without_blaming_the_users_code(tmp_path: Path) -> None:
    """A stop during torch.compile said 'your code left 2 processes' about inductor's g++
    and its cc1plus. Here this process stands for the engine: a 'compiler' whose command
    line names inductor's cache (with a child of its own, as g++ has cc1plus) and one
    process of the user's."""
    import psutil

    from ampscope.engine.emitter import EventWriter
    from ampscope.engine.lifecycle.children import end_users_children

    cache = tmp_path / "torchinductor_someone"
    compiler = subprocess.Popen(["sh", "-c", f"sleep 60; : {cache}/c7.cpp"])
    users = subprocess.Popen(["sleep", "61"])
    try:
        wait = time.monotonic() + 10
        while not psutil.Process(compiler.pid).children() and time.monotonic() < wait:
            time.sleep(0.05)
        (cc1,) = psutil.Process(compiler.pid).children()
        got: list[ev.Event] = []
        writer = EventWriter(on_event=got.append)
        ended = end_users_children(writer)
        assert ended == [users.pid]
        (warning,) = got
        assert isinstance(warning, ev.WarningEvent) and "left 1 process" in warning.message
        assert f"{users.pid} (sleep 61)" in warning.message
        assert "sh -c" not in warning.message and str(cc1.pid) not in warning.message
        assert compiler.wait(timeout=10) is not None and users.wait(timeout=10) is not None
        assert not cc1.is_running() or cc1.status() == psutil.STATUS_ZOMBIE
    finally:
        for proc in (compiler, users):
            proc.kill()
            proc.wait()


@pytest.mark.subprocess
def test_inductors_compilers_are_killed_at_once_with_no_grace_to_wait_out(tmp_path: Path) -> None:
    """A stop during torch.compile sent the compilers SIGTERM and waited up to 2 s for them,
    after the loop's 2.5 s: past the dashboard's 3 s before SIGKILL, so the engine was killed
    before its record had done (crashed, for a run stopped from the dashboard). Here the
    'compiler' notes a SIGTERM in a file and carries on, as one still writing would."""
    import psutil

    from ampscope.engine.emitter import EventWriter
    from ampscope.engine.lifecycle.children import end_users_children

    cache = tmp_path / "torchinductor_someone"
    termed = tmp_path / "termed"
    notes_term = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: open(sys.argv[1], 'w').close())\n"
        "open(sys.argv[1] + '.up', 'w').close()\n"
        "time.sleep(60)\n"
    )
    compiler = subprocess.Popen([sys.executable, "-c", notes_term, str(termed), f"{cache}/c7.cpp"])
    try:
        wait = time.monotonic() + 30
        while not Path(f"{termed}.up").exists() and time.monotonic() < wait:
            time.sleep(0.05)
        got: list[ev.Event] = []
        assert end_users_children(EventWriter(on_event=got.append)) == [] and not got
        assert compiler.wait(timeout=10) == -signal.SIGKILL
        assert not termed.exists()  # never asked to finish first
        assert not psutil.pid_exists(compiler.pid)
    finally:
        compiler.kill()
        compiler.wait()
