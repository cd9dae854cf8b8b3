"""A launched job's whole tree of processes, for the kill that ends it.

torchrun starts each rank in a session of its own, so SIGKILL to torchrun's process group
never reaches the ranks: they are found as torchrun's descendants, and each is killed with
the group it leads (a rank's compile workers, its user's children).
"""

from __future__ import annotations

import contextlib
import os
import signal

import psutil


def job_tree(pid: int) -> list[psutil.Process]:
    """``pid`` and its descendants as they are now; empty once it has gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def kill_tree(procs: list[psutil.Process]) -> None:
    """SIGKILL every process of ``procs`` still running, with the group it leads.

    Each is the very process that was found (psutil compares its start time), never another
    that has since been given its pid.
    """
    for proc in procs:
        with contextlib.suppress(psutil.Error, OSError):
            if not proc.is_running():
                continue
            if os.getpgid(proc.pid) == proc.pid:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
