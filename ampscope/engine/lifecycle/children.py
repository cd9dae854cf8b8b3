"""Processes the user's code started and left running when the run ends.

A child the training code started (a data server, ``subprocess.Popen`` of a tool, a
``multiprocessing`` worker never joined) would outlive the run and hold its memory or GPU. At
the end of a run the engine ends what is left of its descendants, SIGTERM then SIGKILL, and
says which in a ``children-ended`` warning. torch.compile's own compile workers are left to
end with the engine, as they do, and so are the workers of the DataLoader whose iterator
ampscope holds (docs/model.md's factory, ``num_workers`` > 0): they serve ampscope, not
the user's leftovers.

A child that left the engine's process tree (it called ``setsid`` and its parent exited: a
daemon) cannot be told from any other process by its parent. Every process started during the
run inherits the engine's mark (MARK_ENV), so such a one is still found, and named in the
warning as left running: it was made to outlive its parent, and ampscope does not end it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable

import psutil

from ampscope.core import events as ev
from ampscope.core.text import visible
from ampscope.engine.emitter import EventWriter

TERM_GRACE_S = 2.0
TORCH_OWN = ("torch/_inductor", "torch._inductor")  # inductor's compile worker pool
MARK_ENV = "AMPSCOPE_ENGINE_MARK"


def mark_descendants() -> Callable[[], None]:
    """Give every process started from now on this run's mark; returns what takes it back."""
    before = os.environ.get(MARK_ENV)
    os.environ[MARK_ENV] = f"{os.getpid()}-{time.time_ns()}"

    def restore() -> None:
        if before is None:
            os.environ.pop(MARK_ENV, None)
        else:
            os.environ[MARK_ENV] = before

    return restore


def unreachable() -> list[psutil.Process]:
    """Live processes that carry this run's mark but are no longer the engine's descendants."""
    mark = os.environ.get(MARK_ENV)
    if not mark:
        return []
    token = f"{MARK_ENV}={mark}".encode()
    try:
        tree = {p.pid for p in psutil.Process().children(recursive=True)} | {os.getpid()}
    except psutil.Error:
        return []
    found = []
    for proc in psutil.process_iter(["pid", "status", "cmdline"]):
        if proc.info["pid"] in tree or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(t in " ".join(proc.info["cmdline"] or []) for t in TORCH_OWN):
            continue
        try:
            with open(f"/proc/{proc.info['pid']}/environ", "rb") as fh:
                if token in fh.read().split(b"\0"):
                    found.append(proc)
        except OSError:  # another user's, gone, or no /proc
            continue
    return found


def compiler_marks() -> tuple[str, ...]:
    """What names inductor's own compiler processes on their command line: its cache folder
    (``TORCHINDUCTOR_CACHE_DIR``, by default ``/tmp/torchinductor_USER``), which the g++ it
    starts compiles in."""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return ("torchinductor_", cache) if cache else ("torchinductor_",)


def _descendants() -> tuple[list[psutil.Process], list[psutil.Process]]:
    """The engine's live descendants as the user's and inductor's own compilers (a g++ on a
    file in inductor's cache, its cc1plus): a stop during torch.compile ends those too,
    without blaming the user for them. Torch's compile workers are in neither list, nor are
    the workers of the DataLoader ampscope iterates (``release_iterators`` lets go of its
    iterator first: they end with it, or, persistent, with the loader)."""
    serving = _release_iterators()
    me = os.getpid()
    try:
        found = psutil.Process(me).children(recursive=True)
    except psutil.Error:
        return [], []
    kinds: dict[int, str] = {}
    parents: dict[int, int] = {}
    for child in found:
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                kinds[child.pid] = "gone"
                continue
            cmdline = " ".join(child.cmdline())
            parents[child.pid] = child.ppid()
        except psutil.Error:
            kinds[child.pid] = "gone"
            continue
        if any(t in cmdline for t in TORCH_OWN) or child.pid in serving:
            kinds[child.pid] = "torch"
        elif any(mark in cmdline for mark in compiler_marks()):
            kinds[child.pid] = "compiler"

    def kind(pid: int) -> str:
        seen = pid
        while seen != me and seen in parents:  # what an ancestor is, its children are
            if kinds.get(seen, "user") != "user":
                return kinds[seen]
            seen = parents[seen]
        return kinds.get(pid, "user")

    users = [c for c in found if kind(c.pid) == "user"]
    compilers = [c for c in found if kind(c.pid) == "compiler"]
    return users, compilers


def _release_iterators() -> set[int]:
    """``engine.workloads.user.release_iterators``, where a user's workload was built: a run
    refused before that never imports it (nor torch, which it needs)."""
    user = sys.modules.get("ampscope.engine.workloads.user")
    return user.release_iterators() if user is not None else set()


def describe_process(child: psutil.Process) -> str:
    try:
        name = " ".join(child.cmdline()[:3]) or child.name()
    except psutil.Error:
        name = "?"
    return f"{child.pid} ({visible(name)[:60]})"


def _names(procs: list[psutil.Process]) -> str:
    return ", ".join(describe_process(c) for c in procs[:5]) + (" ..." if len(procs) > 5 else "")


def _count(procs: list[psutil.Process]) -> str:
    return f"{len(procs)} process{'es' if len(procs) > 1 else ''}"


def end_users_children(writer: EventWriter) -> list[int]:
    """End the processes the user's code left behind, and name those it cannot reach;
    returns the pids of those ended. Inductor's compilers (a stop during torch.compile) are
    killed at once, and not named: they are torch's, not the user's."""
    left, compilers = _descendants()
    away = unreachable()
    for compiler in compilers:  # torch's, with nothing to finish: no grace to wait out, which
        # after the loop's 2.5 s left a stop during torch.compile past the dashboard's 3 s
        with contextlib.suppress(psutil.Error):
            compiler.kill()
    _until_dead(compilers, KILL_LANDS_S)
    if not left and not away:
        return []
    parts = []
    if left:
        parts.append(
            f"your code left {_count(left)} running at the end of the run: {_names(left)}. "
            f"ampscope ended them (SIGTERM, then SIGKILL after {TERM_GRACE_S:g} s)"
        )
    if away:
        parts.append(
            f"{'it also left' if left else 'your code left'} {_count(away)} that left the "
            f"engine's process tree (setsid, a daemon) and still run: {_names(away)}. ampscope "
            "does not end those; kill them by pid if they should not outlive the run"
        )
    message = "; ".join(parts) + "; join or terminate the processes your code starts."
    writer.emit(ev.WarningEvent(code="children-ended", message=message), urgent=True)
    _end(left)
    return [c.pid for c in left]


KILL_LANDS_S = 1.0
"""The most a SIGKILL is given to land (it takes milliseconds; longer on a loaded machine)."""


def _until_dead(procs: list[psutil.Process], timeout: float) -> None:
    """Wait until each of ``procs`` is dead (a zombie, or gone), at most ``timeout`` in all,
    without reaping any: the one that started it (inductor's pool) reaps its own children.
    A SIGKILL sent is not yet a process ended, and a stop must leave none behind."""
    deadline = time.monotonic() + timeout
    for proc in procs:
        while time.monotonic() < deadline:
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.Error:  # gone
                break
            time.sleep(0.01)


def _end(procs: list[psutil.Process]) -> None:
    """SIGTERM, then SIGKILL to what is left after TERM_GRACE_S."""
    for child in procs:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(procs, timeout=TERM_GRACE_S)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(alive, timeout=1.0)
