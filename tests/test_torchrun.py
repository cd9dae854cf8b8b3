"""Two ranks on the CPU (gloo) through torchrun: one record, replicas in step, failures and
stops that leave no process behind. Tiny models: two processes share two cores."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.presets.parallel import Launch
from ampscope.core.processes.launch import engine_command
from tests.helpers import ROOT, engine_env, wait_gone

# one worker runs them all, one after the other: two ranks each, and rendezvous timeouts
pytestmark = [pytest.mark.subprocess, pytest.mark.slow, pytest.mark.xdist_group("torchrun")]

FAST = ["--set", "workload.kind='mlp'", "--set", "device='cpu'", "--set", "warmup_steps=2"]
STEPS = 24
TIMEOUT_S = 240


def ampscope_run(*args: str, runs_dir: Path) -> tuple[int, list[ev.Event], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "ampscope", "run", *args, "--json", "--runs-dir", str(runs_dir)],
        capture_output=True,
        env=engine_env(),
        cwd=ROOT,
        timeout=TIMEOUT_S,
    )
    events = [ev.decode(line) for line in proc.stdout.splitlines() if line.strip()]
    return proc.returncode, [e for e in events if isinstance(e, ev.Event)], proc.stderr.decode()


def of(events: list, kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


def rank_pids(events: list[ev.Event]) -> list[int]:
    hello = of(events, ev.HelloEvent)
    return [r.pid for r in (hello[0].ranks or [])] if hello else []


def assert_all_gone(pids: list[int]) -> None:
    left = [pid for pid in pids if not wait_gone(pid, 15)]
    for pid in left:  # never leave them to the next test
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    assert not left, f"processes left behind: {left}"


def reference_losses(steps: int) -> list[float]:
    """The same two-rank DDP run done by hand in this process: one model, both ranks' batches,
    the gradient of their mean loss (what DDP's averaged gradients are), clipped, AdamW."""
    import torch
    from torch.nn import functional as F

    from ampscope.core import presets
    from ampscope.engine.workloads import build_workload

    preset = presets.load_preset("fp32", ["workload.kind='mlp'", "device='cpu'"])
    dims, batch = presets.resolve_workload(preset, on_cuda=False)
    torch.manual_seed(preset.seed)
    wl = build_workload("mlp", dims, batch, torch.device("cpu"), preset.seed)
    pools = []
    for rank in (0, 1):
        other = build_workload("mlp", dims, batch, torch.device("cpu"), preset.seed).pool
        other.shard(rank, 2)
        pools.append(other)
    opt = torch.optim.AdamW(wl.model.parameters(), lr=preset.lr, weight_decay=0.0)
    losses = []
    for step in range(steps):
        per_rank = [F.cross_entropy(wl.model(x), y) for x, y in (p.get(step) for p in pools)]
        loss = sum(per_rank) / 2
        loss.backward()
        torch.nn.utils.clip_grad_norm_(wl.model.parameters(), preset.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def assert_trained_in_step(events: list[ev.Event], strategy: str, preset: str) -> None:
    """Two ranks trained every step into one record, ending with identical replicas, and the
    loss is the global batch's, as DDP's math computed by hand gives it."""
    hello = of(events, ev.HelloEvent)[0]
    assert (hello.world_size, hello.backend, hello.strategy) == (2, "gloo", strategy)
    assert [(r.rank, r.device) for r in hello.ranks] == [(0, "cpu"), (1, "cpu")]
    steps = of(events, ev.StepEvent)
    assert [s.step for s in steps] == list(range(STEPS))  # every step once, in order
    assert all([r.rank for r in s.ranks] == [0, 1] for s in steps)
    first = steps[0]
    assert first.ranks[0].loss != first.ranks[1].loss  # each rank trained its own batch
    scaled = [s.loss_scale is not None for s in steps]
    assert scaled == [preset == "amp-fp16"] * STEPS  # the (sharded) scaler ran on every step
    assert first.step_ms == max(r.step_ms for r in first.ranks)
    assert first.samples_per_s == pytest.approx(
        2 * hello.samples_per_step / first.step_ms * 1000, rel=1e-4
    )  # step_ms is written rounded to 0.1 us
    expected = reference_losses(STEPS)
    got = [s.loss for s in steps]
    assert got == pytest.approx(expected, rel=1e-3)
    assert sum(got[-4:]) < 0.7 * sum(got[:4])  # and it falls
    done = of(events, ev.DoneEvent)[0]
    assert done.status == "ok" and done.world_size == 2 and done.steps_done == STEPS
    sums = [r.param_checksum for r in done.ranks]
    assert sums[0] is not None and sums == [sums[0]] * 2  # replicas end identical
    record = records.load_run(Path(hello.run_dir))
    assert len(of(record.events, ev.StepEvent)) == STEPS and record.status == "ok"
    assert record.done.ranks == done.ranks
    assert records.read_live(Path(hello.run_dir)) is None


def test_two_fsdp2_ranks_under_amp_fp16_train_into_one_record_and_end_in_step(
    tmp_path: Path,
) -> None:
    """FSDP2 under amp-fp16: its ShardedGradScaler beside AdamW on DTensors, on every step. Its
    losses stay within 2e-4 of the fp32 math (fp16's rounding of a tiny MLP's activations).
    DDP's two ranks are the two nodes' below."""
    code, events, stderr = ampscope_run(
        "amp-fp16",
        "--nproc-per-node",
        "2",
        "--steps",
        str(STEPS),
        *FAST,
        "--set",
        "parallel.strategy='fsdp2'",
        runs_dir=tmp_path,
    )
    try:
        assert code == 0, stderr[-3000:]
        assert_trained_in_step(events, "fsdp2", "amp-fp16")
    finally:
        assert_all_gone(rank_pids(events))


def test_a_rank_that_fails_fails_the_run_naming_it(tmp_path: Path) -> None:
    code, events, stderr = ampscope_run(
        "fp32",
        "--nproc-per-node",
        "2",
        "--steps",
        "50",
        *FAST,
        "--set",
        "debug.raise_at_step=3",
        "--set",
        "debug.rank=1",
        runs_dir=tmp_path,
    )
    pids = rank_pids(events)
    try:
        assert code == 1, stderr[-3000:]
        error = of(events, ev.ErrorEvent)[0]
        assert error.rank == 1 and error.step == 3
        assert error.message == (
            "rank 1: RuntimeError: failure injected at step 3 (debug.raise_at_step)"
        )
        done = of(events, ev.DoneEvent)[0]
        assert done.status == "failed" and done.error == error.message
        record = records.load_run(Path(of(events, ev.HelloEvent)[0].run_dir))
        assert record.status == "failed" and record.done.error.startswith("rank 1: ")
        assert "Traceback" not in stderr  # torchrun's report is kept in the record instead
        assert (record.path / "torchrun.log").is_file()
    finally:
        assert_all_gone(pids)


def free_port() -> int:
    """A port for a rendezvous endpoint, which torchrun binds itself: drawn at random below the
    kernel's own range (32768 up), where two tests asking the kernel at once were given the same
    free port (serve's tests, at load 12), and bindable when drawn."""
    draw = random.SystemRandom()
    while True:
        port = draw.randrange(20000, 32768)
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.bind(("127.0.0.1", port))
            return port


def test_two_nodes_on_one_machine_meet_at_node_0s_endpoint(tmp_path: Path) -> None:
    """Multi-node as a user runs it: the same command twice, each with its own --node-rank.
    Its two ranks are DDP's (the default strategy): they train in step, as by hand."""
    endpoint = f"127.0.0.1:{free_port()}"

    def node(rank: int) -> subprocess.Popen[bytes]:
        flags = ["--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", endpoint]
        return subprocess.Popen(
            [sys.executable, "-m", "ampscope", "run", "fp32", "--nproc-per-node", "1", *flags]
            + ["--steps", str(STEPS), *FAST, "--json", "--runs-dir", str(tmp_path / f"node{rank}")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=engine_env(OMP_NUM_THREADS="1"),
            cwd=ROOT,
        )

    second = node(1)
    first = node(0)
    out0, err0 = first.communicate(timeout=TIMEOUT_S)
    out1, err1 = second.communicate(timeout=TIMEOUT_S)
    events = [e for e in map(ev.decode, out0.splitlines()) if isinstance(e, ev.Event)]
    try:
        assert first.returncode == 0 and second.returncode == 0, (err0 + err1)[-3000:]
        assert_trained_in_step(events, "ddp", "fp32")
        assert out1 == b""  # node 1 writes no stream and no record: rank 0 speaks for the job
        assert not (tmp_path / "node1").exists()
        assert b"node 1 of 2: rank 1 trains here" in err1
    finally:
        assert_all_gone(rank_pids(events))


def test_a_rendezvous_that_times_out_says_what_to_check(tmp_path: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    proc = subprocess.run(
        [sys.executable, "-m", "ampscope", "run", "fp32", "--nproc-per-node", "1"]
        + ["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", endpoint, "--rdzv-timeout", "3"]
        + [*FAST, "--runs-dir", str(tmp_path)],
        capture_output=True,
        env=engine_env(),
        cwd=ROOT,
        timeout=TIMEOUT_S,
    )
    err = proc.stderr.decode()
    assert proc.returncode == 1
    assert err.startswith(f"ampscope: the rendezvous at {endpoint} timed out: not every node")
    assert "--node-rank (0 to 1)" in err and "Traceback" not in err


def test_a_stop_reaches_a_rank_still_waiting_for_its_peer(tmp_path: Path) -> None:
    """Rank 0 of two, whose peer never comes, waits inside torch's rendezvous, where Python
    runs no signal handler. A stop still ends it in seconds, ``stopped``, not after torch's
    30-minute timeout (or torchrun's SIGKILL, 30 s on)."""
    port = free_port()
    env = engine_env(
        RANK="0", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )  # fmt: skip
    proc = subprocess.Popen(
        engine_command("fp32", runs_dir=tmp_path, extra=FAST),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 120
        waiting = False
        while not waiting and time.monotonic() < deadline and proc.poll() is None:
            with socket.socket() as probe:  # rank 0 hosts the store it waits at
                waiting = probe.connect_ex(("127.0.0.1", port)) == 0
            time.sleep(0.2)
        assert waiting, "rank 0 never reached the rendezvous"
        time.sleep(1.0)  # well inside the wait for rank 1
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)  # seconds, even loaded: torch's own wait is 30 minutes
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 130, proc.stderr.read().decode() if proc.stderr else code
    (run_dir,) = tmp_path.iterdir()
    events, _ = records.read_events(run_dir / records.EVENTS_FILE)
    done = [e for e in events if isinstance(e, ev.DoneEvent)]
    assert [d.status for d in done] == ["stopped"]


def test_the_dashboard_follows_a_two_rank_run_and_stops_every_rank(tmp_path: Path) -> None:
    """The stop is SIGTERM to torchrun, as a user's ``kill`` would send: every rank stops at a
    step's end, in step with the other, and the record says ``stopped``."""
    from ampscope.tui.app import AmpscopeApp
    from ampscope.tui.widgets.ranks import RankStrip
    from tests.helpers import SIZE, run, wait_for

    pids: list[int] = []

    async def go() -> None:
        overrides = ["workload.kind='mlp'", "device='cpu'", "steps=100000"]
        app = AmpscopeApp(runs_dir=tmp_path, processes=Launch(2), extra_overrides=overrides)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            manager = app.run_manager
            await manager.start_run("fp32")
            pids.append(manager.engine.pid)
            assert await wait_for(pilot, lambda: (manager.state.step or 0) >= 5, 180), (
                manager.state.error
            )
            pids.extend(r.pid for r in manager.state.hello.ranks or [])
            strip = app.screen.query_one(RankStrip)
            assert await wait_for(
                pilot, lambda: strip.display and "slowest r" in str(strip.render()), 30
            )
            lines = str(strip.render()).splitlines()
            assert lines[0].startswith("2 ranks ddp/gloo · slowest r")
            assert lines[0].endswith("ms, RSS, CPU")
            assert [cell.split()[0] for cell in lines[1].split("  ") if cell.strip()][:1] == ["r0"]
            assert " r1 " in lines[1]
            await pilot.press("s")  # stop: SIGTERM to torchrun, which passes it to every rank
            assert await wait_for(pilot, lambda: manager.state.status == "stopped", 60)
            done = manager.state.done
            assert done is not None and done.status == "stopped" and done.world_size == 2
            assert manager.state.error is None
            sums = [r.param_checksum for r in done.ranks or []]
            assert len(sums) == 2 and sums[0] is not None and sums == [sums[0]] * 2  # in step
            record = records.load_run(Path(manager.state.hello.run_dir))
            assert record.status == "stopped" and record.done == done

    run(go())
    assert_all_gone(pids)


def test_a_killed_dashboard_takes_torchrun_and_every_rank_with_it(tmp_path: Path) -> None:
    master, slave = os.openpty()
    env = engine_env(
        AMPSCOPE_AUTOSTART="fp32 workload.kind=mlp device=cpu steps=100000",
        AMPSCOPE_RUNS_DIR=str(tmp_path),
        TERM="xterm-256color",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "ampscope", "--nproc-per-node", "2"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        env=env,
        cwd=ROOT,
    )
    os.close(slave)
    threading.Thread(target=_drain, args=(master,), daemon=True).start()
    family: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(family) < 3:  # torchrun and two ranks
            with contextlib.suppress(psutil.Error):
                family = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
            time.sleep(0.5)
        assert len(family) >= 3, "torchrun did not start two ranks"
        proc.kill()  # no handler runs: only the kernel's parent-death signal is left
        proc.wait(timeout=10)
    finally:
        os.close(master)
        assert_all_gone([proc.pid, *family])


def _drain(fd: int) -> None:
    """A terminal that reads what the dashboard writes."""
    with contextlib.suppress(OSError):
        while os.read(fd, 65536):
            pass


LEAVING_RANK = """
import os
import random
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
        if os.environ.get("RANK") == "1" and self.calls > 5:  # past setup's passes
            os._exit(7)
        return self.fc(x)


def make(ctx):
    x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 64, 8)]
    return ampscope.Workload(model=Net(), batches=batches, loss=nn.functional.cross_entropy)
"""


def test_a_rank_that_calls_os_exit_is_named_with_how_it_left(tmp_path: Path) -> None:
    """It was recorded as 'rank 0: gloo Connection closed by peer'."""
    (tmp_path / "net.py").write_text(LEAVING_RANK)
    code, events, stderr = ampscope_run(
        "fp32", "--nproc-per-node", "2", "--steps", "50", "--model", f"{tmp_path}/net.py:make",
        "--set", "device='cpu'", "--set", "warmup_steps=2", runs_dir=tmp_path / "runs",
    )  # fmt: skip
    pids = rank_pids(events)
    try:
        assert code != 0, stderr[-3000:]
        (error,) = of(events, ev.ErrorEvent)
        assert error.rank == 1, error.message
        assert error.message.startswith("rank 1: your code called os._exit(7) at step ")
        done = of(events, ev.DoneEvent)[0]
        assert done.status == "failed" and done.error == error.message
    finally:
        assert_all_gone(pids)
