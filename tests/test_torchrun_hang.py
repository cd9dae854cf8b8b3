"""A rank that hangs (its forward sleeps) while its peer waits in a collective: one stop ends
the whole job in seconds, recorded ``stopped`` with the summary of the steps so far, and no
process is left; torch's own timeouts (gloo 30 min, torchrun's SIGKILL at 30 s) never decide."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampscope.core import events as ev
from ampscope.core import records
from tests.helpers import engine_env
from tests.test_torchrun import assert_all_gone, of, rank_pids

pytestmark = [pytest.mark.subprocess, pytest.mark.slow, pytest.mark.xdist_group("torchrun-hang")]

ENDED_WITHIN_S = 25.0
"""The documented 8 s after which a hung step is cut short, and time for the ranks, torchrun
and the launcher to exit on two loaded cores (5 s idle, 6.7 s at load 11): always before
torchrun's own SIGKILL, 30 s after its SIGTERM, could decide."""

HANG = """
HANG_AT = {call}
import time
import torch
from torch import nn
import ampscope


class Net(nn.Module):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 2)
        self.rank, self.calls = rank, 0

    def forward(self, x):
        self.calls += x.device.type != "meta"  # ampscope counts FLOPs on a meta copy
        if self.rank == 1 and self.calls == HANG_AT:  # the step of this call
            open("hung", "w").write("rank 1")
            time.sleep(600)
        return self.fc(x)


def make(ctx):
    x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 64, 8)]
    loss = lambda out, target: nn.functional.cross_entropy(out, target)  # noqa: E731
    return ampscope.Workload(model=Net(ctx.rank), batches=batches, loss=loss)
"""


def hanging_in(step: int) -> str:
    """A model whose rank 1 sleeps in the forward of ``step`` (one forward a step)."""
    return HANG.replace("{call}", str(step + 1))


def test_one_sigterm_ends_a_job_whose_rank_hangs_stopped_with_a_summary(tmp_path: Path) -> None:
    (tmp_path / "hang.py").write_text(hanging_in(7))
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "ampscope", "run", "fp32", "--model", "hang.py:make"]
    cmd += ["--nproc-per-node", "2", "--steps", "1000", "--json", "--runs-dir", str(runs)]
    cmd += ["--set", "device='cpu'", "--set", "warmup_steps=1"]
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, env=engine_env(AMPSCOPE_STALL_S="3"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    events: list[ev.Event] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            event = ev.decode(line)
            if isinstance(event, ev.Event):
                events.append(event)
            if isinstance(event, ev.WarningEvent) and event.code == ev.RANK_STALLED:
                break  # told live, while the job still runs
        assert (tmp_path / "hung").exists(), "rank 1 never reached its sleep"
        asked = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # the user's one stop, to ampscope run
        rest, stderr = proc.communicate(timeout=40)
        took = time.monotonic() - asked
        events += [e for e in map(ev.decode, rest.splitlines()) if isinstance(e, ev.Event)]
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        assert_all_gone([proc.pid, *rank_pids(events)])
    assert took < ENDED_WITHIN_S, f"the stop took {took:.1f} s"
    (stalled,) = [e for e in of(events, ev.WarningEvent) if e.code == ev.RANK_STALLED]
    assert stalled.message.startswith("rank 1 has made no progress for 3 s, in forward of step")
    assert "while rank 0 waits for it" in stalled.message
    assert proc.returncode == 130, stderr.decode()[-2000:]
    (done,) = of(events, ev.DoneEvent)
    assert done.status == "stopped" and done.steps_done >= 2
    (run_dir,) = runs.iterdir()
    record = records.load_run(run_dir)
    assert record.status == "stopped"
    assert (run_dir / records.SUMMARY_FILE).is_file()
    assert not (run_dir / records.LIVE_FILE).exists()


def test_ampscope_stop_ends_a_detached_job_whose_rank_hangs_in_step_1(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """Step 1 is named too (eager: no compile to wait for), and a stop of the detached job
    reaches every rank through its launcher, not rank 0 alone."""
    from ampscope.cli.main import main as cli_main
    from ampscope.core.presets.parallel import Launch
    from ampscope.core.processes.launch import launch_detached
    from tests.helpers import gone, model_set, wait_until

    (tmp_path / "hang.py").write_text(hanging_in(1))
    monkeypatch.setenv("AMPSCOPE_STALL_S", "3")
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs"
    sets = [model_set(tmp_path / "hang.py"), "device='cpu'", "warmup_steps=1", "steps=1000"]
    run_dir, launcher = launch_detached("fp32", sets, runs, launch=Launch(nproc_per_node=2))
    events = run_dir / records.EVENTS_FILE
    pids = [launcher]

    def stalled() -> list[ev.WarningEvent]:
        found = [e for e in records.tail_events(events) if isinstance(e, ev.WarningEvent)]
        return [e for e in found if e.code == ev.RANK_STALLED]

    try:
        assert wait_until(lambda: bool(stalled()), 120), records.tail_events(events)[-3:]
        hello = records.load_run(run_dir).hello
        assert hello is not None and hello.ranks is not None
        pids += [r.pid for r in hello.ranks]
        (warning,) = stalled()
        assert warning.step == 1
        assert warning.message.startswith(
            "rank 1 has made no progress for 3 s, in forward of step 1"
        )
        asked = time.monotonic()
        assert cli_main(["stop", run_dir.name, "--runs-dir", str(runs)]) == 0
        assert wait_until(lambda: all(gone(pid) for pid in pids), ENDED_WITHIN_S)
        took = time.monotonic() - asked
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        assert_all_gone(pids)
    assert took < ENDED_WITHIN_S, f"the job took {took:.1f} s to end"
    assert capsys.readouterr().out.strip() == f"{run_dir}: stopped"
    record = records.load_run(run_dir)
    assert record.status == "stopped" and record.done is not None and record.done.steps_done >= 1
    assert (run_dir / records.SUMMARY_FILE).is_file()
    assert not (run_dir / records.LIVE_FILE).exists()
