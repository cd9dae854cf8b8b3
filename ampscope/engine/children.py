"""Processes the user's code started and left running when the run ends.

A child the training code started (a data server, ``subprocess.Popen`` of a tool, a
``multiprocessing`` worker never joined) would outlive the run and hold its memory or GPU. At
the end of a run the engine ends what is left of its descendants, SIGTERM then SIGKILL, and
says which in a ``children-ended`` warning. torch.compile's own compile workers are left to
end with the engine, as they do.
"""

from __future__ import annotations

import contextlib
import os

import psutil

from ampscope.core import events as ev
from ampscope.core.text import visible
from ampscope.engine.emitter import EventWriter

TERM_GRACE_S = 2.0
TORCH_OWN = ("torch/_inductor", "torch._inductor")  # inductor's compile worker pool


def users_children() -> list[psutil.Process]:
    """The engine's live descendants, less torch's own compile workers."""
    try:
        found = psutil.Process(os.getpid()).children(recursive=True)
    except psutil.Error:
        return []
    left = []
    for child in found:
        try:
            cmdline = " ".join(child.cmdline())
            if child.status() == psutil.STATUS_ZOMBIE or any(t in cmdline for t in TORCH_OWN):
                continue
        except psutil.Error:
            continue
        left.append(child)
    return left


def describe(child: psutil.Process) -> str:
    try:
        name = " ".join(child.cmdline()[:3]) or child.name()
    except psutil.Error:
        name = "?"
    return f"{child.pid} ({visible(name)[:60]})"


def end_users_children(writer: EventWriter) -> list[int]:
    """End the processes the user's code left behind; returns their pids."""
    left = users_children()
    if not left:
        return []
    names = ", ".join(describe(c) for c in left[:5]) + (" ..." if len(left) > 5 else "")
    message = (
        f"your code left {len(left)} process{'es' if len(left) > 1 else ''} running at the end "
        f"of the run: {names}. ampscope ended them (SIGTERM, then SIGKILL after "
        f"{TERM_GRACE_S:g} s); join or terminate the processes your code starts."
    )
    writer.emit(ev.WarningEvent(code="children-ended", message=message), urgent=True)
    for child in left:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(left, timeout=TERM_GRACE_S)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(alive, timeout=1.0)
    return [c.pid for c in left]
