"""A watched script as its own process: live in `ampscope runs`, and every way it can end.

The script below is a user's: it imports ampscope, watches its loop and never closes the
monitor, so the record's end comes from ampscope's exit hooks (atexit, excepthook, signals).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from ampscope.cli.main import main as cli_main
from ampscope.core import events as ev
from ampscope.core import records
from ampscope.tui.model.follow import AttachSource
from tests.helpers import ROOT, engine_env, wait_gone

pytestmark = pytest.mark.subprocess

SCRIPT = """
import signal, sys, time
from pathlib import Path
import torch
import ampscope

gate, mode = Path(sys.argv[1]), sys.argv[2]
if mode == "chained":
    def own_handler(signum, frame):
        Path(str(gate) + ".chained").write_text("called")
        sys.exit(7)
    signal.signal(signal.SIGTERM, own_handler)

torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mon = ampscope.watch(model, opt, name="script-" + mode, allow_stop=(mode == "allow-stop"))
for i in range(100000):
    loss = model(torch.randn(4, 8)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    mon.step(loss, samples=4)
    if i == 3:
        Path(str(gate) + ".running").write_text(str(mon.run_dir))
    if mode == "fail" and i == 5:
        raise RuntimeError("the user's own bug")
    if i > 3 and gate.exists():
        break
    time.sleep(0.01)
"""


def start(
    tmp_path: Path, mode: str, source: str = SCRIPT, name: str = "train.py"
) -> tuple[subprocess.Popen, Path]:
    """Start the script and wait until it has run a few steps; returns it and its run folder."""
    tmp_path.mkdir(exist_ok=True)
    script = tmp_path / name
    script.write_text(source)
    gate = tmp_path / "gate"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(gate), mode],
        cwd=tmp_path,
        env=engine_env(AMPSCOPE_RUNS_DIR=str(tmp_path / "runs")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    running = Path(str(gate) + ".running")
    deadline = time.monotonic() + 120
    while not running.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running.exists(), proc.communicate(timeout=30)[1][-3000:]
    return proc, Path(running.read_text())


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def runs_rows(capsys, root: Path) -> list[dict]:
    capsys.readouterr()
    assert cli_main(["runs", "--json", "--runs-dir", str(root)]) == 0
    return json.loads(capsys.readouterr().out)


def test_runs_lists_a_watched_script_live_while_it_trains_and_ok_after(tmp_path, capsys) -> None:
    proc, run_dir = start(tmp_path, "gate")
    try:
        (row,) = runs_rows(capsys, tmp_path / "runs")
        assert (row["state"], row["preset"], row["pid"]) == ("live", "script-gate", proc.pid)
        assert row["steps"] is None or row["steps"] >= 1
        live = records.read_live(run_dir)
        assert live is not None and live["source"] == "watch" and live["allow_stop"] is False
    finally:
        (tmp_path / "gate").touch()
        code, err = finish(proc)
    assert code == 0, err[-2000:]
    (row,) = runs_rows(capsys, tmp_path / "runs")
    assert row["state"] == "ok" and row["steps"] >= 5
    assert records.load_run(run_dir, with_events=False).done is not None  # summary.json


def test_an_uncaught_exception_leaves_done_failed_and_the_traceback(tmp_path) -> None:
    proc, run_dir = start(tmp_path, "fail")
    code, err = finish(proc)
    assert code == 1
    assert "RuntimeError: the user's own bug" in err  # the previous excepthook still ran
    run = records.load_run(run_dir)
    assert run.status == "failed" and run.done is not None
    assert run.done.error == "RuntimeError: the user's own bug" and run.done.steps_done == 6


OS_EXIT = """
import os, sys
import torch
import ampscope

model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mon = ampscope.watch(model, opt, name="fast")
x = torch.randn(4, 8)
for i in range(200):
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    mon.step(loss, samples=4)
print(mon.run_dir, flush=True)
os._exit(0)  # skips a teardown that hangs (NCCL, DataLoader workers): no hook runs
"""


def test_os_exit_right_after_a_fast_loop_loses_no_step(tmp_path) -> None:
    script = tmp_path / "fast.py"
    script.write_text(OS_EXIT)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=engine_env(AMPSCOPE_RUNS_DIR=str(tmp_path / "runs")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    run_dir = Path(done.stdout.strip())
    run = records.load_run(run_dir)
    assert run.hello is not None and run.status == "ok", run.events[:3]
    assert run.done is not None and run.done.steps_done == 200
    steps = [e.step for e in run.events if isinstance(e, ev.StepEvent)]
    assert steps == list(range(200))
    assert not (run_dir / records.LIVE_FILE).exists()  # not listed live, nor crashed


def test_sigterm_leaves_done_stopped_and_exits_as_sigterm_would(tmp_path) -> None:
    proc, run_dir = start(tmp_path, "plain")
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 128 + signal.SIGTERM, err[-2000:]
    run = records.load_run(run_dir)
    assert run.status == "stopped" and run.done is not None and run.done.steps_done >= 4
    assert not (run_dir / records.LIVE_FILE).exists()


def test_sigterm_reaches_the_scripts_own_handler_too(tmp_path) -> None:
    proc, run_dir = start(tmp_path, "chained")
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 7, err[-2000:]  # the script's handler decided how to leave
    assert (tmp_path / "gate.chained").read_text() == "called"
    assert records.load_run(run_dir).status == "stopped"


def test_the_viewer_stops_a_watched_run_only_when_it_allows_it(tmp_path, capsys) -> None:
    proc, run_dir = start(tmp_path, "plain")
    try:
        source = AttachSource(run_dir)
        assert source.can_stop is False
        assert records.stop_rule(records.read_live(run_dir) or {}) == (
            False,
            "this training loop was watched without allow_stop=True",
        )
        asyncio.run(source.stop())  # refused: the process trains on
        time.sleep(0.5)
        assert proc.poll() is None and not source.stopping
        capsys.readouterr()
        assert cli_main(["stop", str(run_dir)]) == 2  # nor does 'ampscope stop' go around it
        assert "without allow_stop=True" in capsys.readouterr().err
        time.sleep(0.5)
        assert proc.poll() is None
    finally:
        (tmp_path / "gate").touch()
        finish(proc)

    allowed, allowed_dir = start(tmp_path / "allowed", "allow-stop")
    source = AttachSource(allowed_dir)
    assert source.can_stop is True
    asyncio.run(source.stop())  # SIGINT, as Ctrl+C
    assert wait_gone(allowed.pid, 60)
    code, err = finish(allowed)
    assert code != 0 and "KeyboardInterrupt" in err
    assert records.load_run(allowed_dir).status == "stopped"

    by_command, command_dir = start(tmp_path / "by-command", "allow-stop")
    assert cli_main(["stop", str(command_dir), "--wait", "60"]) == 0  # SIGINT too, no kill
    code, err = finish(by_command)
    assert "KeyboardInterrupt" in err and records.load_run(command_dir).status == "stopped"


CTRL_C_SCRIPT = """
import sys, time
from pathlib import Path
import torch
import ampscope

def train(mon, model, opt):
    for i in range(100000):
        loss = model(torch.randn(4, 8)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.step(loss)
        if i == 3:
            Path(sys.argv[1] + ".running").write_text(str(mon.run_dir))
        time.sleep(0.01)

model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
if sys.argv[2] == "with":
    with ampscope.watch(model, opt, name="ctrl-c") as mon:
        train(mon, model, opt)
else:
    train(ampscope.watch(model, opt, name="ctrl-c"), model, opt)
"""


@pytest.mark.parametrize("mode", ["with", "never-closed"])
def test_the_ctrl_c_traceback_of_a_watched_loop_ends_in_the_users_own_frame(
    tmp_path: Path, mode: str
) -> None:
    proc, run_dir = start(tmp_path, mode, CTRL_C_SCRIPT, "my_training.py")
    proc.send_signal(signal.SIGINT)
    code, err = finish(proc)
    assert code != 0 and err.rstrip().endswith("KeyboardInterrupt"), err[-2000:]
    frames = [line for line in err.splitlines() if line.lstrip().startswith("File ")]
    assert not [line for line in frames if "/ampscope/" in line], err[-2000:]
    # it ends in the user's frame, or below it in torch (and the standard library torch calls:
    # typing.cast inside torch.autograd.backward, once) where the signal landed inside an op
    users = [i for i, line in enumerate(frames) if "my_training.py" in line and "in train" in line]
    assert users, err[-2000:]
    stdlib = sysconfig.get_paths()["stdlib"]
    below = frames[users[-1] + 1 :]
    assert all("/torch/" in line or stdlib in line for line in below), err[-2000:]
    assert records.load_run(run_dir).status == "stopped"


@pytest.mark.parametrize(
    "statement",
    [
        "import ampscope; assert 'torch' not in sys.modules",
        "import ampscope; ampscope.watch; import ampscope.integrations",
    ],
)
def test_importing_ampscope_and_its_watch_loads_no_torch(statement: str) -> None:
    code = f"import sys; {statement}; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=engine_env(), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
