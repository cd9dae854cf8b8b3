"""The DataLoader that docs/model.md shows (workers > 0) gets no word about leftover processes:
its workers serve the iterator ampscope holds, and their ending at each epoch never stops the
run. A process the user's code left is still named."""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.engine.lifecycle.run import EXIT_OK, run
from tests.helpers import engine_env

LOADER = """
import subprocess
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import ampscope


def make(ctx, persistent=False, leave=False):
    if leave:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open(LEFT, "w").write(str(child.pid))
    x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    loader = DataLoader(
        TensorDataset(x, y), batch_size=16, shuffle=True, num_workers=2,
        persistent_workers=persistent,
    )
    return ampscope.Workload(model=nn.Linear(8, 2), batches=loader, loss=nn.functional.cross_entropy)


def make_persistent(ctx):
    return make(ctx, persistent=True)


def make_and_leave(ctx):
    return make(ctx, leave=True)
"""


def _train(tmp_path: Path, factory: str) -> list[ev.WarningEvent]:
    path = tmp_path / "loader_model.py"
    path.write_text(LOADER.replace("LEFT", repr(str(tmp_path / "left.pid"))))
    seen: list[ev.Event] = []
    sets = ["device='cpu'", "steps=10", f"workload.model='{path}:{factory}'"]
    assert run("fp32", sets, record=False, on_event=seen.append) == EXIT_OK
    return [e for e in seen if isinstance(e, ev.WarningEvent) and e.code == "children-ended"]


def _children() -> set[int]:
    gc.collect()  # the workload and its loader: their workers go with them
    return {c.pid for c in psutil.Process().children() if c.status() != psutil.STATUS_ZOMBIE}


@pytest.mark.subprocess
@pytest.mark.parametrize("factory", ["make", "make_persistent"])
def test_the_workers_of_the_loader_ampscope_iterates_are_not_the_users_leftovers(
    tmp_path: Path, factory: str
) -> None:
    """'your code left 2 processes running ... join or terminate the processes your code
    starts', on every run: those were the loader's two workers, three epochs in."""
    before = _children()
    assert _train(tmp_path, factory) == []
    assert psutil.wait_procs(
        [psutil.Process(p) for p in _children() - before], timeout=10
    )  # and they end with the loader


@pytest.mark.subprocess
def test_a_process_the_users_code_left_beside_the_loader_is_still_named(tmp_path: Path) -> None:
    (warning,) = _train(tmp_path, "make_and_leave")
    left = int((tmp_path / "left.pid").read_text())
    assert warning.message.startswith("your code left 1 process running at the end of the run")
    assert f"{left} (" in warning.message
    assert not psutil.pid_exists(left) or psutil.Process(left).status() == psutil.STATUS_ZOMBIE


SLOW_LOADER = """
import time
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import ampscope


class Slow(nn.Linear):
    def forward(self, x):
        time.sleep(0.15)  # each step outlasts the stop watch's grace after an epoch's end
        return super().forward(x)


def make(ctx):
    x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    loader = DataLoader(TensorDataset(x, y), batch_size=16, num_workers=2)
    return ampscope.Workload(model=Slow(8, 2), batches=loader, loss=nn.functional.cross_entropy)
"""


@pytest.mark.subprocess
def test_a_loaders_workers_ending_at_each_epoch_never_stop_the_run(tmp_path: Path) -> None:
    """The loader's workers end with each epoch; torch handles their SIGCHLD, which woke the
    stop watch as a stop: a 100-step run ended 'stopped' at step 12, 2.5 s after its first
    epoch, with no stop asked for."""
    (tmp_path / "slow.py").write_text(SLOW_LOADER)
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "ampscope", "run", "fp32", "--model", "slow.py:make"]
    cmd += ["--steps", "30", "--set", "device='cpu'", "--set", "warmup_steps=1"]
    done = subprocess.run(
        [*cmd, "--runs-dir", str(runs)], cwd=tmp_path, env=engine_env(), capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (run_dir,) = runs.iterdir()
    record = records.load_run(run_dir)
    assert record.status == "ok" and record.done is not None and record.done.steps_done == 30


@pytest.mark.unit
def test_only_the_stop_signals_among_those_a_handler_saw_ask_to_stop() -> None:
    from ampscope.engine.lifecycle.stopping import stops_among

    assert stops_among(bytes([signal.SIGCHLD, signal.SIGCHLD, signal.SIGUSR1])) == 0
    assert stops_among(bytes([signal.SIGCHLD, signal.SIGTERM, signal.SIGINT])) == 2
    assert stops_among(bytes([signal.SIGHUP])) == 1
