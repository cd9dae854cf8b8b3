"""The engine process's own lifetime: stopping on signals and when its parent goes away."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from ampscope.core import events as ev
from ampscope.engine.emitter import EventWriter
from ampscope.engine.lifecycle.exits import EXIT_STOPPED

PARENT_GRACE_S = 5.0
STUCK_GRACE_S = 2.0
"""After a signal during setup, or a second one: how long the main thread has to end the run."""
LOOP_GRACE_S = 2.5
"""After one signal in the loop: how long the step has to finish before the run is ended with
the summary so far (under the dashboard's 3 s before SIGKILL)."""
RANKS_LOOP_GRACE_S = 8.0
"""The same on several ranks, where they also agree to stop and compare weights; a rank stuck
in a step or in a collective with a peer that hangs is ended then (the dashboard and
``ampscope run`` wait 15 s before SIGKILL, torchrun 30 s)."""


class SoFar:
    """What a run has to show when another thread, or the user's ``os._exit``, must end it:
    the step running, and once hello is out, hello and a ``done`` over the steps so far."""

    def __init__(self) -> None:
        self.step: Callable[[], int | None] = lambda: None
        self.summary: (
            Callable[[ev.DoneStatus, str | None], tuple[ev.HelloEvent, ev.DoneEvent]] | None
        ) = None

    def now(
        self, status: ev.DoneStatus = "stopped", error: str | None = None
    ) -> tuple[ev.HelloEvent | None, ev.DoneEvent]:
        if self.summary is not None:
            try:
                return self.summary(status, error)
            except Exception:  # noqa: BLE001 - ending the run must not fail on the summary
                pass
        return None, ev.empty_done(status, error=error)

    def step_now(self) -> int | None:
        try:
            return self.step()
        except Exception:  # noqa: BLE001
            return None


def install_signal_handlers(
    stop: threading.Event,
    in_loop: threading.Event,
    end_now: Callable[[], None],
    loop_grace_s: float = LOOP_GRACE_S,
    importing: threading.Event | None = None,
) -> None:
    """SIGTERM/SIGINT/SIGHUP in the loop: finish the current step and write ``done``.

    SIGHUP is a hang-up (an SSH link that dropped under a headless ``ampscope run``): the run
    ends ``stopped`` with its summary, as for SIGTERM, and never as a crash.

    During setup (``in_loop`` not yet set: building the model, a factory loading its data), or
    on a second signal, interrupt at once: setup can take seconds and a stop must not wait for
    it. Never inside torch's import (``importing`` set): an import cut half-way leaves
    numpy's and torch's modules half made (a later import raises, or the process dies by the
    signal at exit); the run ends as soon as the import returns, or from the thread below.

    Python runs a signal handler only between bytecodes, so a main thread blocked inside torch
    (a rank waiting at the rendezvous for a peer that is already gone) would not see it until
    a 30-minute timeout. A thread woken by the same signal through ``set_wakeup_fd`` calls
    ``end_now`` when the main thread has not ended the run ``STUCK_GRACE_S`` later, or, for a
    first signal in the loop, ``loop_grace_s`` later (a step that never ends: a hung peer rank,
    a user's forward that sleeps).
    """

    def handler(signum: int, frame: object) -> None:
        first = not stop.is_set()
        stop.set()
        if importing is not None and importing.is_set():
            return  # the run ends once the import is done (or is ended, if it hangs)
        if not first or not in_loop.is_set():
            raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, handler)
    _watch_for_a_stuck_stop(in_loop, end_now, loop_grace_s)


STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
"""The signals that ask a run to stop: the ones ``install_signal_handlers`` handles."""


def stops_among(arrived: bytes) -> int:
    """How many of the signals ``set_wakeup_fd`` wrote (a byte each, the signal's number) ask
    to stop. Every signal with a Python handler writes one: a DataLoader's workers ending at
    each epoch write SIGCHLD (torch handles it to notice a worker that died), and those must
    never end the run."""
    return sum(1 for number in arrived if number in STOP_SIGNALS)


class _StopWatch:
    """One thread a process, woken by every handled signal through ``set_wakeup_fd``; it acts
    on the stop signals alone, for the run installed last (in-process runs, as the tests make,
    each install theirs)."""

    def __init__(self) -> None:
        self.in_loop = threading.Event()
        self.end_now: Callable[[], None] = lambda: None
        self.loop_grace_s = LOOP_GRACE_S
        self.seen = 0
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        self._read_end = read_end
        threading.Thread(target=self._watch, name="ampscope-stop-watch", daemon=True).start()

    def follow(
        self, in_loop: threading.Event, end_now: Callable[[], None], loop_grace_s: float
    ) -> None:
        self.in_loop, self.end_now, self.seen = in_loop, end_now, 0
        self.loop_grace_s = loop_grace_s

    def _watch(self) -> None:
        while arrived := os.read(self._read_end, 64):
            stops = stops_among(arrived)
            if not stops:
                continue  # another handled signal (SIGCHLD from a loader's worker): no stop
            self.seen += stops
            grace = STUCK_GRACE_S
            if self.in_loop.is_set() and self.seen < 2:
                grace = self.loop_grace_s  # the loop's to finish its step and end the run
            end_now = self.end_now
            threading.Thread(
                target=self._end_after, args=(end_now, grace), name="ampscope-stop-grace",
                daemon=True,
            ).start()  # fmt: skip

    @staticmethod
    def _end_after(end_now: Callable[[], None], grace_s: float) -> None:
        time.sleep(grace_s)
        end_now()  # the process is still here: the main thread is stuck (in torch, or a step)


_stop_watch: _StopWatch | None = None


def _watch_for_a_stuck_stop(
    in_loop: threading.Event, end_now: Callable[[], None], loop_grace_s: float
) -> None:
    global _stop_watch
    if _stop_watch is None:
        _stop_watch = _StopWatch()
    _stop_watch.follow(in_loop, end_now, loop_grace_s)


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
