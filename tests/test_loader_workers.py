"""The DataLoader that docs/model.md shows (workers > 0) gets no word about leftover processes:
its workers serve the iterator ampscope holds. A process the user's code left is still named."""

from __future__ import annotations

import gc
from pathlib import Path

import psutil
import pytest

from ampscope.core import events as ev
from ampscope.engine.lifecycle.run import EXIT_OK, run

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
