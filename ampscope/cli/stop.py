"""``ampscope stop [RUN]``: stop a run that outlives its terminal (``run --detach``).

Only the process ``live.json`` names is signalled, and only while it proves that it runs the
record (``stopping.verified_pid``: same host, same start time, and it holds the record's
``.owner`` open), so a stale record after pid reuse, or a forged one, never gets a foreign
process killed. SIGTERM first: the engine finishes its step and
writes ``done`` and its summary; SIGKILL only when it has not gone after ``--wait`` seconds
(10, or 15 for a job on several ranks).
"""

from __future__ import annotations

import argparse
import math
import os
import pwd
import signal
import sys
import time
from pathlib import Path
from typing import Any

from ampscope.cli.output import fail, not_a_runs_folder
from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.processes import stopping
from ampscope.core.records.folders import runs_dir_argument
from ampscope.core.text import visible

DEFAULT_WAIT_S = 10.0
POLL_S = 0.1
END_WAIT_S = 2.0
"""How long a run gone without its ``done`` may take to get one: a run stopped before it
started is ended by the ``run --detach`` that waits for it (``launch.record_not_started``)."""


def add_stop_parser(sub: Any) -> None:
    stop = sub.add_parser(
        "stop", help="stop a detached run: it finishes its step and writes its summary"
    )
    stop.add_argument(
        "run", nargs="?", help="a run folder or its name in the runs dir (default: newest live)"
    )
    stop.add_argument(
        "--wait",
        default=None,
        metavar="SECONDS",
        help=f"how long it may take to finish before it is killed (default {DEFAULT_WAIT_S:g}, "
        f"{stopping.RANKS_WAIT_S:g} for a job on several ranks)",
    )
    stop.add_argument(
        "--runs-dir",
        type=runs_dir_argument,
        default=argparse.SUPPRESS,
        help="where run records are (default ./runs or $AMPSCOPE_RUNS_DIR)",
    )


def find_run(arg: str | None, root: Path) -> Path | None:
    if arg is None:
        live = next((r for r in records.list_runs(root) if r.state in ("live", "stalled")), None)
        return live.path if live else None
    for named in (Path(arg), root / arg):
        candidate = ev.named_path(str(named))  # a name printed with its bytes escaped
        if (candidate / records.EVENTS_FILE).is_file():
            return candidate
    return None


def _another_users(pid: int) -> str | None:
    """The name of the user a process belongs to, when that is not this one (its .owner
    proof cannot be read then: /proc hides another user's descriptors); None otherwise."""
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    if uid == os.getuid():
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def cmd_stop(args: argparse.Namespace) -> int:
    if args.wait is not None:  # echoed as typed: 1e400 is no 'inf' the user wrote
        typed = args.wait
        try:
            args.wait = float(typed)
        except ValueError:
            return fail(f"--wait {typed} is not a number. Accepted: 0 or more seconds.")
        if not (math.isfinite(args.wait) and args.wait >= 0):
            return fail(f"--wait {typed} is out of range. Accepted: 0 or more seconds.")
    root = getattr(args, "runs_dir", None) or records.default_runs_dir()
    if (refused := not_a_runs_folder(root)) is not None:
        return refused
    path = find_run(args.run, root)
    if path is None:
        if args.run is None:
            return fail(f"no live run in {root}: nothing to stop. 'ampscope runs' lists them.", 1)
        return fail(f"no run record '{args.run}' (a run folder, or a name in {root}).")
    live = records.read_live(path)
    pid = stopping.verified_pid(live, path) if live else None
    named = records.same_process(live) if live else None
    if pid is None and named is not None and (owner := _another_users(named)) is not None:
        return fail(
            f"{visible(path.name)}: its process (pid {named}) is {visible(owner)}'s, not yours: "
            "ampscope signals only your own runs. Stop it as that user, where it runs.",
            1,
        )
    if pid is None and named is not None:
        return fail(
            f"{visible(path.name)}: the process its live.json names (pid {named}) does not "
            "prove that it runs this record (it does not hold the record's .owner file), so "
            "ampscope does not signal it. Stop it where it runs.",
            1,
        )
    if pid is None:
        state = records.run_state(records.load_run(path, with_events=False))
        return fail(f"{path.name} is not running on this host ({state}): nothing to stop.", 1)
    name = visible(path.name)
    allowed, why = records.stop_rule(live or {})
    if not allowed:
        return fail(
            f"{name} is not ampscope's to stop: {why}. Stop it where it runs (Ctrl+C), or "
            "start it with ampscope.watch(..., allow_stop=True)."
        )
    if args.wait is None:
        hello = records.load_run(path, with_events=False).hello
        args.wait = stopping.stop_wait_s(hello, DEFAULT_WAIT_S)
    print(f"stopping {name} (pid {pid}) ...", file=sys.stderr, flush=True)
    if not stopping.ask_to_stop(path, live or {}, pid):  # a watched process: never killed
        if not _gone(pid, args.wait):
            print(
                f"ampscope: {name} was asked to stop (SIGINT, as Ctrl+C) and is still running "
                f"after {args.wait:g} s; it is your own process, and ampscope does not kill it.",
                file=sys.stderr,
            )
            return 1
    elif not _gone(pid, args.wait):
        stopping.signal_engine(path, pid, signal.SIGKILL)
        _gone(pid, 2.0)
        print(
            f"ampscope: {name} did not finish its step within {args.wait:g} s and was killed; "
            "its record has no summary.",
            file=sys.stderr,
        )
        return 0
    state = records.run_state(records.load_run(path, with_events=False))
    deadline = time.monotonic() + END_WAIT_S
    while state == "crashed" and time.monotonic() < deadline:
        time.sleep(POLL_S)  # stopped before it started: 'run --detach' is writing its end
        state = records.run_state(records.load_run(path, with_events=False))
    print(f"{visible(str(path))}: {state}")
    return 0


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while records.pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True
