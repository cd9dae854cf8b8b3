"""The engine process's own lifetime: stopping on signals and when its parent goes away."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from ampscope.engine.emitter import EventWriter
from ampscope.engine.exits import EXIT_STOPPED

PARENT_GRACE_S = 5.0
STUCK_GRACE_S = 2.0


def install_signal_handlers(
    stop: threading.Event, in_loop: threading.Event, end_now: Callable[[], None]
) -> None:
    """SIGTERM/SIGINT/SIGHUP in the loop: finish the current step and write ``done``.

    SIGHUP is a hang-up (an SSH link that dropped under a headless ``ampscope run``): the run
    ends ``stopped`` with its summary, as for SIGTERM, and never as a crash.

    During setup (``in_loop`` not yet set: importing torch, building the model), or on a second
    signal, interrupt at once: setup can take seconds and a stop must not wait for it.

    Python runs a signal handler only between bytecodes, so a main thread blocked inside torch
    (a rank waiting at the rendezvous for a peer that is already gone) would not see it until
    a 30-minute timeout. A thread woken by the same signal through ``set_wakeup_fd`` calls
    ``end_now`` when the main thread has not ended the run ``STUCK_GRACE_S`` later.
    """

    def handler(signum: int, frame: object) -> None:
        first = not stop.is_set()
        stop.set()
        if not first or not in_loop.is_set():
            raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, handler)
    _watch_for_a_stuck_stop(in_loop, end_now)


class _StopWatch:
    """One thread a process, woken by every handled signal through ``set_wakeup_fd``; it acts
    for the run installed last (in-process runs, as the tests make, each install theirs)."""

    def __init__(self) -> None:
        self.in_loop = threading.Event()
        self.end_now: Callable[[], None] = lambda: None
        self.seen = 0
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        self._read_end = read_end
        threading.Thread(target=self._watch, name="ampscope-stop-watch", daemon=True).start()

    def follow(self, in_loop: threading.Event, end_now: Callable[[], None]) -> None:
        self.in_loop, self.end_now, self.seen = in_loop, end_now, 0

    def _watch(self) -> None:
        while arrived := os.read(self._read_end, 64):
            self.seen += len(arrived)
            if self.in_loop.is_set() and self.seen < 2:
                continue  # the loop finishes its step: that is the main thread's to do
            end_now = self.end_now
            time.sleep(STUCK_GRACE_S)
            end_now()  # the process is still here: the main thread is stuck in torch


_stop_watch: _StopWatch | None = None


def _watch_for_a_stuck_stop(in_loop: threading.Event, end_now: Callable[[], None]) -> None:
    global _stop_watch
    if _stop_watch is None:
        _stop_watch = _StopWatch()
    _stop_watch.follow(in_loop, end_now)


def watch_parent(stop: threading.Event, writer: EventWriter) -> None:
    """Stop when the process that started us is gone (its pipe broke or it was killed)."""
    parent = os.getppid()
    _set_parent_death_signal()

    def watch() -> None:
        while not stop.wait(0.5):
            if os.getppid() != parent or writer.broken:
                stop.set()
        deadline = time.monotonic() + PARENT_GRACE_S
        while time.monotonic() < deadline:
            time.sleep(0.2)
        if os.getppid() != parent or writer.broken:
            writer.flush()  # the loop did not come back (a long compile): leave anyway
            os._exit(EXIT_STOPPED)

    threading.Thread(target=watch, name="ampscope-parent-watch", daemon=True).start()


def _set_parent_death_signal() -> None:
    """Linux: the kernel sends SIGTERM when the parent dies, even if it was SIGKILLed."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
