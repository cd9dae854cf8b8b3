"""What the user's code prints never lands inside the engine's event stream: the stream has a
descriptor of its own, and the user's stdout goes to stderr, where the dashboard shows it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ampscope.core import events as ev
from ampscope.core.launch import engine_command
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
