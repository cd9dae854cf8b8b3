from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent

# Bytecode is cached as Python does by default, also where PYTHONDONTWRITEBYTECODE is set: every
# worker imports some 250 test modules through pytest's assertion rewriting, and the processes
# the suite starts import ampscope; uncached, each worker re-parses and rewrites them all (about
# 10 s of CPU a worker on 2 cores, a sixth of the quick tier). The caches are __pycache__
# folders, which git ignores.
sys.dont_write_bytecode = False

# Under pytest-xdist each worker gets its share of the cores, so that workers (and the
# engines they start) do not each spin a thread per core.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _workers)))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: none without it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: half again as many workers as cores. About a fifth of the suite's time is
    spent waiting on the processes it starts (engines, ranks, viewers); a third worker fills
    it (measured on 2 cores: 379 s with 2 workers, 281 s with 3, 278 s with 4)."""
    return max(2, (os.cpu_count() or 1) * 3 // 2)


SESSION_MARK = "AMPSCOPE_TEST_SESSION"
"""Every process this test session starts inherits this variable, with this session's own
value: an orphan (a forked child, a torchrun rank in a session of its own, whose parent has
gone) still carries it in ``/proc/PID/environ``."""
os.environ[SESSION_MARK] = f"{os.getpid()}-{time.time_ns()}"

TIERS = ("unit", "ui", "subprocess", "slow")
IN_PROCESS = ("unit", "ui")


def tiers_of(item: pytest.Item) -> set[str]:
    return {mark.name for mark in item.iter_markers() if mark.name in TIERS}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test names its tier, so that `-m unit` is the quick tier of pure logic and `-m ui`
    the dashboard's headless tests: unit alone, ui alone, or subprocess, slow or both (a
    torchrun test starts processes and takes tens of seconds)."""
    wrong = []
    for item in items:
        tiers = tiers_of(item)
        alone = any(t in tiers for t in IN_PROCESS)
        if not tiers or (alone and len(tiers) > 1):
            wrong.append(f"{item.nodeid} ({', '.join(sorted(tiers)) or 'no tier'})")
    if wrong:
        raise pytest.UsageError(
            "every test needs the mark unit or ui alone, or subprocess and/or slow:\n  "
            + "\n  ".join(wrong)
        )


@pytest.fixture(autouse=True)
def _in_process_tiers_stay_in_their_lane(request: pytest.FixtureRequest, monkeypatch) -> None:
    """A test marked unit or ui runs in this process: one that starts a child is in the wrong
    tier. A unit test drives no dashboard either: an app under Pilot is the ui tier's."""
    tiers = tiers_of(request.node)
    if not tiers or tiers - set(IN_PROCESS):
        return

    def refuse(self, *args, **kwargs):
        raise AssertionError("a test marked unit or ui started a child process: mark it subprocess")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    if tiers == {"unit"}:
        import textual.app as textual_app  # loaded here, so that a test importing it late is caught

        def no_app(self, *args, **kwargs):
            raise AssertionError("a test marked unit ran the dashboard under Pilot: mark it ui")

        monkeypatch.setattr(textual_app.App, "run_test", no_app)


PILOT_SETTLE_S = 120.0
"""How long a test's Pilot waits for a screen to settle after a key: what a user would wait."""


@pytest.fixture(autouse=True)
def _no_animations(request: pytest.FixtureRequest, monkeypatch) -> None:
    """A dashboard under Pilot draws each change at once: a Tabs underline or a scroll caught
    mid-animation would make a snapshot depend on how busy the machine is. (A subprocess-tier
    test may drive a dashboard too, beside the processes it starts.)"""
    if {"ui", "subprocess"} & tiers_of(request.node):
        from textual import constants  # what App() reads its animation level from
        from textual.pilot import Pilot

        monkeypatch.setattr(constants, "TEXTUAL_ANIMATIONS", "none")
        # Pilot gives a screen's widgets 30 s to settle after each key; on a shared machine at
        # load 19 a screen took longer, and the test failed on the wait, not on what it checks
        settle = Pilot._wait_for_screen

        async def patient(self: Pilot, timeout: float = PILOT_SETTLE_S) -> bool:
            return await settle(self, timeout)

        monkeypatch.setattr(Pilot, "_wait_for_screen", patient)


@pytest.fixture(autouse=True)
def _isolated_user_config(tmp_path_factory, monkeypatch):
    """User presets and run records never leak between tests or into the developer's home."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg")))
    monkeypatch.setenv("AMPSCOPE_RUNS_DIR", str(tmp_path_factory.mktemp("runs")))
    # Printed text is fitted to $COLUMNS: a developer's terminal, or a dashboard test before
    # this one, must not change what a command prints here.
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


RECORDED_STEPS = (4, 8)


@pytest.fixture(scope="session")
def _recorded_runs_once(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two finished mlp-demo records on the CPU (4 and 8 steps), made by real engine processes
    once for the whole session: every xdist worker shares them (each start costs seconds)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the folder above every worker's own
    folder = shared / "recorded-runs"
    with open(shared / "recorded-runs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first worker records, the others wait for it
        if not (folder / ".complete").exists():
            from ampscope.cli.bench import run_one

            shutil.rmtree(folder, ignore_errors=True)
            for steps in RECORDED_STEPS:
                overrides = ["device='cpu'", f"steps={steps}", "warmup_steps=2"]
                run_one("mlp-demo", overrides, folder)
            (folder / ".complete").touch()
    return folder


@pytest.fixture
def recorded_runs(_recorded_runs_once: Path, tmp_path: Path) -> Path:
    """A runs folder of this test's own, holding copies of the session's two real records."""
    runs = tmp_path / "recorded-runs"
    shutil.copytree(_recorded_runs_once, runs, ignore=shutil.ignore_patterns(".complete"))
    return runs


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_in_ps(tmp_path_factory):
    """No test leaves a process behind: none of this session's children, no process (a
    detached engine, a viewer) that works in this session's temporary folders, and no
    process started from this session, even orphaned (it carries SESSION_MARK)."""
    yield
    ours = str(tmp_path_factory.getbasetemp()) + os.sep
    # what was just stopped may take a moment to go (the check's own test waits less)
    deadline = time.monotonic() + float(os.environ.get("AMPSCOPE_TEST_LEFTOVER_WAIT_S", "10"))
    while True:
        left = _left_behind(ours)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    for proc in left:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    assert not left, "processes left behind: " + "; ".join(
        f"{p.pid} {' '.join(p.info['cmdline'] or [])[:200]}" for p in left
    )


def _left_behind(ours: str) -> list[psutil.Process]:
    me = psutil.Process()
    mine = {p.pid for p in me.children(recursive=True)}
    left = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.info["pid"] == me.pid or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["pid"] in mine or ours in cmdline or _started_here(proc.info["pid"]):
            left.append(proc)
    return left


def _started_here(pid: int) -> bool:
    """The process was started from this session (it inherited SESSION_MARK's value)."""
    mark = f"{SESSION_MARK}={os.environ[SESSION_MARK]}".encode()
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return mark in fh.read().split(b"\0")
    except OSError:  # another user's, gone, or no /proc
        return False


@pytest.fixture
def fake_cuda():
    """Two fake H200s, handed to the CUDA-facing paths in place of torch.cuda."""
    from tests.fakes import FakeCuda

    return FakeCuda()
