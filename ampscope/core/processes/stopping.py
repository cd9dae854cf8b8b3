"""Signalling a run's process: only one that proves it runs the record, only as allowed.

``ampscope stop``, the dashboard's stop and ``attach`` + ``s`` all come here. Public facts
(pid, host, start time: ``records.same_process``) say a run is live; only the held ``.owner``
file (``core.processes.ownership``) says a process is the run's, and only then is it signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ampscope.core import events as ev
from ampscope.core.processes import ownership
from ampscope.core.processes.tree import job_tree, kill_tree
from ampscope.core.records import same_process

RANKS_WAIT_S = 15.0
"""How long a stop waits before SIGKILL for a job on several ranks (its ranks agree to stop
and compare their weights; one stuck in a step is cut short after 8 s), as the dashboard."""


def stop_wait_s(hello: ev.HelloEvent | None, single: float) -> float:
    """The wait before SIGKILL: ``single``, or RANKS_WAIT_S for a job on several ranks."""
    if hello is not None and hello.world_size > 1:
        return max(single, RANKS_WAIT_S)
    return single


def signal_engine(run_dir: Path, pid: int, sig: int) -> bool:
    """Signal the engine of ``run_dir`` only if ``pid`` proves it runs it (``verified_pid``);
    its whole group only when ampscope created that group for it. False when not signalled.

    A detached torchrun job's group is led by its launcher (``ampscope run``), which holds the
    record too: that group is signalled (the launcher passes a stop to torchrun, which passes
    it to every rank), and a SIGKILL reaches every process of the job (``core.processes.tree``).
    """
    if not ownership.holds_owner(pid, run_dir):
        return False  # checked again before every signal: it may have gone meanwhile
    leader = _launcher(run_dir, pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if leader is None:
            os.kill(pid, sig)
        elif sig == signal.SIGKILL:
            kill_tree(job_tree(leader) or job_tree(pid))
        else:
            os.killpg(leader, sig)
    return True


def _launcher(run_dir: Path, pid: int) -> int | None:
    """The leader of the group ampscope made for the run: ``pid`` itself, or a launcher that
    proves it runs the record too; None when there is none (signal ``pid`` alone)."""
    leader = ownership.group_leader(run_dir)
    if leader is None or (leader != pid and not ownership.holds_owner(leader, run_dir)):
        return None
    try:
        return leader if os.getpgid(leader) == leader else None
    except OSError:
        return None


def ask_to_stop(
    run_dir: Path,
    live: dict[str, Any],
    pid: int,
    send: Callable[[int, int], None] = os.kill,
    holds: Callable[[int, Path], bool] = ownership.holds_owner,
) -> bool:
    """Stop a verified run as ``stop_rule`` allows. An engine gets SIGTERM (and SIGCONT, if
    paused) and may be killed after its grace: True. A watched process is the user's own:
    SIGINT to it alone, as Ctrl+C, and never a kill: False. (A process that ignores SIGINT,
    as one started in the background of a shell does, asked for SIGTERM in its record.)
    ``send`` signals a watched process and ``holds`` says it still holds the run's record:
    ``os.kill`` and ``ownership.holds_owner`` unless given."""
    if live.get("source") == "watch":
        asked = signal.SIGTERM if live.get("stop_signal") == "SIGTERM" else signal.SIGINT
        if holds(pid, run_dir):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                send(pid, asked)
        return False
    signal_engine(run_dir, pid, signal.SIGTERM)
    signal_engine(run_dir, pid, signal.SIGCONT)
    return True


def verified_pid(live: dict[str, Any], run_dir: Path) -> int | None:
    """The pid ``live.json`` names, only while that very process runs this record here: same
    host and start time, and it holds the record's ``.owner`` open (``core.processes.ownership``), so a
    stale record after pid reuse, or a forged one, never gets a foreign process signalled."""
    pid = same_process(live)
    return pid if pid is not None and ownership.holds_owner(pid, run_dir) else None
