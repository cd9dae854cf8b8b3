"""User code that leaves the process (sys.exit, os._exit) ends the run failed, and says so."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ampscope.core import events as ev
from ampscope.core import records
from tests.helpers import engine_env, events_of, gone, wait_until

MODEL = """
import os, subprocess, sys
import torch
from torch import nn
import ampscope

WHERE = os.environ["LEAVE_IN"]
if WHERE == "import":
    sys.exit(0)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 2)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if WHERE == "forward" and self.calls > 3:  # past setup's forward: inside a step
            sys.exit(0)
        if WHERE == "os_exit" and self.calls > 3:
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            open("child.pid", "w").write(str(child.pid))
            os._exit(3)
        return self.fc(x)


def make(ctx):
    if WHERE == "make":
        sys.exit(0)
    x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 64, 8)]
    loss = lambda out, target: nn.functional.cross_entropy(out, target)  # noqa: E731
    return ampscope.Workload(model=Net(), batches=batches, loss=loss)
"""


def leave(tmp_path: Path, where: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    (tmp_path / "net.py").write_text(MODEL)
    runs = tmp_path / "runs"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ampscope",
            "run",
            "fp32",
            "--model",
            "net.py:make",
            "--steps",
            "6",
            "--runs-dir",
            str(runs),
        ],  # fmt: skip
        cwd=tmp_path,
        env=engine_env(LEAVE_IN=where),
        capture_output=True,
        text=True,
        timeout=300,
    )
    (run_dir,) = runs.iterdir()
    return out, run_dir


@pytest.mark.subprocess
@pytest.mark.parametrize("where", ["forward", "make", "import"])
def test_sys_exit_in_user_code_ends_the_run_failed_and_says_where(tmp_path, where) -> None:
    out, run_dir = leave(tmp_path, where)
    said = out.stdout + out.stderr
    assert out.returncode == 1, said
    assert "your code called sys.exit(0)" in said
    assert ("at step" in said) == (where == "forward"), said
    (error,) = events_of(run_dir, ev.ErrorEvent)
    assert error.kind == "exception" and "sys.exit(0)" in error.message
    assert error.traceback and "net.py" in error.traceback
    assert events_of(run_dir, ev.DoneEvent)[-1].status == "failed"
    assert not (run_dir / "live.json").exists()  # closed, not left "crashed"


@pytest.mark.subprocess
def test_os_exit_in_forward_is_recorded_before_the_process_goes(tmp_path) -> None:
    out, run_dir = leave(tmp_path, "os_exit")
    assert out.returncode == 3, out.stderr
    assert "your code called os._exit(3) at step 3," in out.stdout + out.stderr
    (error,) = events_of(run_dir, ev.ErrorEvent)
    assert error.step == 3
    (done,) = events_of(run_dir, ev.DoneEvent)
    assert done.status == "failed" and "os._exit(3) at step 3" in (done.error or "")
    assert done.steps_done == 3 and done.step_ms_median is not None  # the steps before it
    record = records.load_run(run_dir, with_events=False)  # summary.json
    assert record.hello is not None and record.done == done
    assert not (run_dir / "live.json").exists()
    child = int((tmp_path / "child.pid").read_text())  # started by the user's forward
    assert wait_until(lambda: gone(child), 10)
    (ended,) = [w for w in events_of(run_dir, ev.WarningEvent) if w.code == "children-ended"]
    assert str(child) in ended.message


FORKING = """
import os
import torch
from torch import nn
import ampscope


def make(ctx):
    os.fork()  # both processes go on: the child returns into ampscope's run
    open(f"after-fork-{os.getpid()}", "w").close()
    x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 64, 8)]
    loss = nn.functional.cross_entropy
    return ampscope.Workload(model=nn.Linear(8, 2), batches=batches, loss=loss)
"""


@pytest.mark.subprocess
def test_a_factory_that_forks_leaves_one_run_in_the_record(tmp_path) -> None:
    """The child went on into the engine: 2 hellos, 2 dones and every step twice."""
    (tmp_path / "net.py").write_text(FORKING)
    runs = tmp_path / "runs"
    out = subprocess.run(
        [sys.executable, "-m", "ampscope", "run", "fp32", "--model", "net.py:make",
         "--steps", "6", "--runs-dir", str(runs)],
        cwd=tmp_path, env=engine_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (run_dir,) = runs.iterdir()
    assert len(events_of(run_dir, ev.HelloEvent)) == 1
    assert [s.step for s in events_of(run_dir, ev.StepEvent)] == list(range(6))
    (done,) = events_of(run_dir, ev.DoneEvent)
    assert done.status == "ok" and records.load_run(run_dir).status == "ok"
    assert len(list(tmp_path.glob("after-fork-*"))) == 2  # both went on past the fork
    said = re.search(r"ampscope: process (\d+), forked by your code from the engine", out.stderr)
    assert said is not None and "so this copy leaves" in out.stderr, out.stderr
    assert wait_until(lambda: gone(int(said.group(1))), 10)
    assert (out.stdout + out.stderr).count("run record:") == 1  # one summary printed


@pytest.mark.unit
def test_ctrl_c_where_a_command_has_no_word_of_its_own_is_a_message(monkeypatch, capsys) -> None:
    """Before: Ctrl+C while memory imported torch or planned printed a raw KeyboardInterrupt
    traceback."""
    from ampscope.cli.main import main
    from ampscope.core.memory import plan

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(plan, "plan", interrupted)
    assert main(["memory", "--params", "7B"]) == 130
    said = capsys.readouterr()
    assert said.err == "ampscope: stopped (Ctrl+C).\n"
