"""Stands for ampscope's own code in tests/test_watch.py: a call a signal lands inside."""

from __future__ import annotations

import signal

from ampscope.watching import exits


def step_of_ours() -> None:
    exits._on_signal(signal.SIGINT, None)  # as Ctrl+C arriving while this runs
