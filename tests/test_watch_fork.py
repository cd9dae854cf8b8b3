"""A watched script that forks a child which keeps training: the record stays the parent's.

The child steps the same monitor (it is a copy), holds no proof that it runs the record (a
stop of the run must never signal it), then leaves by ``sys.exit(0)`` or
``os._exit(0)``. The parent waits for it with a deadline and kills it past that, so a child
that hangs at exit fails the test instead of leaving a process behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ampscope.core import events as ev
from ampscope.core import records
from tests.helpers import engine_env

pytestmark = pytest.mark.subprocess

SCRIPT = """
import json, os, signal, sys, time
import torch
import ampscope
from ampscope.core.processes import ownership

leave = sys.argv[1]
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
mon = ampscope.watch(model, opt, name="forking")

def one_step():
    loss = model(torch.randn(4, 8)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    mon.step(loss, samples=4)

for _ in range(5):
    one_step()
pid = os.fork()
if pid == 0:  # the child trains on with its copy of everything, then leaves
    for _ in range(5):
        one_step()
    time.sleep(0.3)
    owns = ownership.holds_owner(os.getpid(), mon.run_dir)  # the proof a stop looks for
    with open("child.json", "w") as f:
        json.dump({"holds_owner": owns}, f)
    if leave == "sys.exit":
        sys.exit(0)
    os._exit(0)
forked = time.monotonic()
for _ in range(5):
    one_step()
    time.sleep(0.02)
status = None
while time.monotonic() - forked < 30:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.05)
else:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
took = time.monotonic() - forked
for _ in range(3):
    one_step()
print(json.dumps({"run_dir": str(mon.run_dir), "child_s": took, "status": status}))
"""


@pytest.mark.parametrize("leave", ["sys.exit", "os._exit"])
def test_a_forked_child_writes_nothing_into_the_parents_record_and_exits(
    tmp_path: Path, leave: str
) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), leave],
        cwd=tmp_path,
        env=engine_env(AMPSCOPE_RUNS_DIR=str(tmp_path / "runs")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    assert facts["status"] == 0, facts  # it left by itself, before the script's kill at 30 s

    child = json.loads((tmp_path / "child.json").read_text())
    assert child["holds_owner"] is False  # so no stop of the run ever signals the child

    run_dir = Path(facts["run_dir"])
    run = records.load_run(run_dir)
    kinds = [type(e).__name__ for e in run.events]
    assert kinds.count("HelloEvent") == 1 and kinds.count("DoneEvent") == 1, kinds
    assert not any(isinstance(e, ev.ErrorEvent) for e in run.events)
    steps = [e.step for e in run.events if isinstance(e, ev.StepEvent)]
    assert steps == list(range(13))  # the parent's steps, once each
    assert run.status == "ok" and run.done is not None and run.done.steps_done == 13
    assert run.unreadable_lines == 0
    assert not (run_dir / records.LIVE_FILE).exists()
