"""The engine process's own lifetime: stopping on signals and when its parent goes away."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from ampscope.engine.emitter import EventWriter
from ampscope.engine.exits import EXIT_STOPPED

PARENT_GRACE_S = 5.0


def install_signal_handlers(stop: threading.Event, in_loop: threading.Event) -> None:
    """SIGTERM/SIGINT/SIGHUP in the loop: finish the current step and write ``done``.

    SIGHUP is a hang-up (an SSH link that dropped under a headless ``ampscope run``): the run
    ends ``stopped`` with its summary, as for SIGTERM, and never as a crash.

    During setup (``in_loop`` not yet set: importing torch, building the model), or on a second
    signal, interrupt at once: setup can take seconds and a stop must not wait for it.
    """

    def handler(signum: int, frame: object) -> None:
        first = not stop.is_set()
        stop.set()
        if not first or not in_loop.is_set():
            raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, handler)


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
