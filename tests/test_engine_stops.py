"""A stop that lands while torch is still importing: never an import cut half-way."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import pytest

from ampscope.engine.lifecycle import stopping


@pytest.mark.unit
def test_a_signal_while_torch_imports_marks_the_stop_and_leaves_the_import_alone() -> None:
    """Raised inside an import, KeyboardInterrupt left numpy and torch half made: the next
    import raised 'cannot load module more than once per process', or the process died by
    the signal at its exit (exit -2 for a run that said stopped). The stop is noted instead,
    the run ends once the import returns, and outside an import setup is cut at once."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    stop, in_loop, importing = threading.Event(), threading.Event(), threading.Event()
    ended = threading.Event()
    try:
        stopping.install_signal_handlers(stop, in_loop, ended.set, importing=importing)
        importing.set()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs here, between bytecodes, and raises nothing
        assert stop.is_set()
        importing.clear()
        stop.clear()
        with pytest.raises(KeyboardInterrupt):  # in setup, out of an import: cut at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


@pytest.mark.unit
def test_the_writer_takes_nothing_after_done_nor_from_others_once_a_thread_ends_the_run() -> None:
    """One done per record, and nothing after it: a telemetry sample or a second ending
    (the main thread's step failing because the ending killed its child) is left out."""
    from ampscope.core import events as ev
    from ampscope.engine.emitter import EventWriter
    from tests.helpers import done, step

    got: list[ev.Event] = []
    writer = EventWriter(on_event=got.append)
    writer.emit(step(0))
    ender = threading.Thread(target=writer.end_here)
    ender.start()
    ender.join()
    writer.emit(ev.ErrorEvent(kind="exception", message="child died", step=1))  # not the ender
    writer.emit(done("failed"))
    assert got == [got[0]] and writer.done is None  # only the ender may write the end
    writer = EventWriter(on_event=got.append)
    got.clear()
    writer.emit(done("stopped"), urgent=True)
    writer.emit(ev.WarningEvent(code="children-ended", message="late"))
    writer.emit(done("failed"), urgent=True)
    writer.close()
    assert [type(e).__name__ for e in got] == ["DoneEvent"]
    assert writer.done is not None and writer.done.status == "stopped"


CHILD_MODEL = """
import subprocess
import torch
from torch import nn
import ampscope


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls > 3:  # past setup's forward, inside step 2: waits on a child
            open("waiting", "w").close()
            subprocess.run(["sleep", "60"], check=True)
        return self.fc(x)


def make(ctx):
    x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 64, 8)]
    return ampscope.Workload(model=Net(), batches=batches, loss=nn.functional.cross_entropy)
"""


@pytest.mark.subprocess
def test_a_stop_while_a_step_waits_on_a_child_ends_the_record_once_stopped(tmp_path) -> None:
    """The stop the loop could not answer ended the child; the step then failed with
    CalledProcessError, and the record had done stopped, an error, then done failed (the
    summary said failed, the exit code 130)."""
    import subprocess
    import sys

    from ampscope.core import events as ev
    from ampscope.core import records
    from tests.helpers import engine_env, events_of, wait_until

    (tmp_path / "net.py").write_text(CHILD_MODEL)
    runs = tmp_path / "runs"
    argv = [sys.executable, "-m", "ampscope", "run", "fp32", "--model", "net.py:make"]
    proc = subprocess.Popen(
        [*argv, "--steps", "6", "--runs-dir", str(runs)],
        cwd=tmp_path,
        env=engine_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert wait_until(lambda: (tmp_path / "waiting").exists(), 120)
        proc.send_signal(signal.SIGTERM)
        said, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, said
    (run_dir,) = runs.iterdir()
    events, _ = records.read_events(run_dir / records.EVENTS_FILE)
    (done,) = [e for e in events if isinstance(e, ev.DoneEvent)]
    assert events[-1] is done and done.status == "stopped"  # nothing after done
    assert not events_of(run_dir, ev.ErrorEvent)
    (ended,) = [w for w in events_of(run_dir, ev.WarningEvent) if w.code == "children-ended"]
    assert "sleep 60" in ended.message
    assert records.load_run(run_dir, with_events=False).status == "stopped"  # summary.json
    assert "failed" not in said and said.count("status ") == 1, said
    assert said.index("sleep 60") < said.index("run record:")  # told before the record line


@pytest.mark.subprocess
def test_a_stop_sent_to_the_engines_group_while_a_step_waits_on_a_child_is_a_stop(tmp_path):
    """The dashboard stops a run by signalling the engine's process group, so the step's own
    children (a compile's g++, a DataLoader's workers, the user's subprocess) get the SIGTERM
    too and end at once: the step then failed on their end, and the run stopped from the
    dashboard was recorded failed, with that failure as its error (exit 1)."""
    import subprocess
    import sys

    from ampscope.core import events as ev
    from ampscope.core import records
    from ampscope.engine.lifecycle.exits import EXIT_STOPPED
    from tests.helpers import engine_env, events_of, wait_until

    (tmp_path / "net.py").write_text(CHILD_MODEL)
    runs = tmp_path / "runs"
    argv = [sys.executable, "-m", "ampscope.engine", "fp32", "--model", "net.py:make"]
    proc = subprocess.Popen(
        [*argv, "--set", "steps=6", "--runs-dir", str(runs)],
        cwd=tmp_path,
        env=engine_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # as the dashboard starts it
    )
    try:
        assert wait_until(lambda: (tmp_path / "waiting").exists(), 120)
        assert wait_until(
            lambda: (
                "sleep"
                in subprocess.run(
                    ["ps", "-o", "args=", "--ppid", str(proc.pid)], capture_output=True, text=True
                ).stdout
            ),
            30,
        )
        os.killpg(proc.pid, signal.SIGTERM)  # the dashboard's stop
        proc.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == EXIT_STOPPED
    (run_dir,) = runs.iterdir()
    events, _ = records.read_events(run_dir / records.EVENTS_FILE)
    (done,) = [e for e in events if isinstance(e, ev.DoneEvent)]
    assert done.status == "stopped" and done.error is None
    assert not events_of(run_dir, ev.ErrorEvent)
    assert records.load_run(run_dir, with_events=False).status == "stopped"  # summary.json
