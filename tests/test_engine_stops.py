"""A stop that lands while torch is still importing: never an import cut half-way."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from ampscope.engine import process


@pytest.mark.unit
def test_a_signal_while_torch_imports_marks_the_stop_and_leaves_the_import_alone() -> None:
    """Raised inside an import, KeyboardInterrupt left numpy and torch half made: the next
    import raised 'cannot load module more than once per process', or the process died by
    the signal at its exit (exit -2 for a run that said stopped). The stop is noted instead,
    the run ends once the import returns, and outside an import setup is cut at once."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    stop, in_loop, importing = threading.Event(), threading.Event(), threading.Event()
    ended = threading.Event()
    try:
        process.install_signal_handlers(stop, in_loop, ended.set, importing=importing)
        importing.set()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs here, between bytecodes, and raises nothing
        assert stop.is_set()
        importing.clear()
        stop.clear()
        with pytest.raises(KeyboardInterrupt):  # in setup, out of an import: cut at once
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
