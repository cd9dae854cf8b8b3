"""Run folders on disk: making one (``new_run_dir``), reading one (``RunRecord``, ``load_run``),
listing them, and who runs one now (``live.json``, the heartbeat a running process refreshes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ampscope.core import events as ev
from ampscope.core.processes import ownership
from ampscope.core.records import files

CONFIG_FILE = "config.json"
EVENTS_FILE = "events.jsonl"
SUMMARY_FILE = "summary.json"


def default_runs_dir() -> Path:
    """``$AMPSCOPE_RUNS_DIR``, or ./runs when it is unset, empty or only spaces."""
    named = os.environ.get("AMPSCOPE_RUNS_DIR", "")
    return Path(named if named.strip() else "runs")


def runs_dir_argument(text: str) -> Path:
    """``--runs-dir``'s value as a path; a blank one (``--runs-dir "$DIR"`` with DIR unset)
    is refused rather than read as the current folder."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} names no folder. Accepted: a folder's path, such as ./runs (the default)"
        )
    return Path(text)


def safe_file_name(name: str) -> str:
    """``name`` as a file name: letters, digits, '-', '_' and '.' kept, the rest '_'."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in name)
    return safe.lstrip(".")[:100] or "run"


def new_run_dir(root: Path, preset_name: str) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    safe = safe_file_name(preset_name)
    root.mkdir(parents=True, exist_ok=True)
    for n in range(1000):
        path = root / (f"{stamp}-{safe}" if n == 0 else f"{stamp}-{safe}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot create a run folder under {root}")


def write_json(path: Path, data: Any) -> None:
    """Write whole or not at all (a temporary file, then a rename); OSError when it cannot."""
    write_text(path, json.dumps(data, indent=2) + "\n")


def write_text(path: Path, text: str) -> None:
    """``text`` written whole in place of ``path``, whatever stood there: a FIFO or a device
    under that name is replaced, not opened (opening a FIFO waits for a reader for ever).
    OSError when it cannot (``path`` a folder, a full disk)."""
    # The temporary file is a fresh one of its own (several processes may write one file, as
    # engine and launcher do live.json): one of a fixed name may be there as a FIFO, which an
    # open waits on for ever.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)  # as a file written plainly is: others may read the record
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # a full disk leaves no half-written file behind
        raise


@dataclass
class RunRecord:
    """A run read back from disk."""

    path: Path
    hello: ev.HelloEvent | None = None
    done: ev.DoneEvent | None = None
    events: list[ev.Event] = field(default_factory=list)
    unreadable_lines: int = 0
    problem: str | None = None
    """Why (part of) the record could not be read: shown beside it, never raised."""
    note: str = ""
    """How its events were read, where not whole (a long record, thinned: ``load_run``)."""

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def preset(self) -> str:
        return self.hello.preset if self.hello else self.path.name.split("-", 1)[-1]

    @property
    def status(self) -> str:
        """ok, failed or stopped from the record's own ``done``; 'incomplete' without one."""
        return self.done.status if self.done else "incomplete"

    @property
    def state(self) -> str:
        """live, crashed, or the done status: see ``run_state``."""
        return run_state(self)


def read_events(path: Path) -> tuple[list[ev.Event], int]:
    """All events of an ``events.jsonl``; a torn last line (a crash mid-write) is skipped.

    Raises OSError when the file cannot be read at all, or is no regular file of a record's size.
    """
    events: list[ev.Event] = []
    bad = 0
    with files.open_file(path, files.EVENTS_BYTES) as fh:
        for line in fh:
            if not line.strip():
                continue
            item = ev.decode(line)
            if isinstance(item, ev.UnknownEvent):
                bad += 1
            else:
                events.append(item)
    return events, bad


def load_run(path: Path, with_events: bool = True, thinned: bool = False) -> RunRecord:
    """A record as far as it can be read: whatever is unreadable is named in ``problem``.
    ``thinned``: its events in bounded memory, however long the run (``thinned.read_thinned``;
    what was left out is said in ``note``)."""
    record = RunRecord(path)
    events_path = path / EVENTS_FILE
    try:
        if with_events and events_path.is_file():
            if thinned:
                from ampscope.core.records.thinned import read_thinned  # numpy: not at start-up

                kept = read_thinned(events_path)
                record.events, record.unreadable_lines = kept.events, kept.unreadable
                record.note = kept.note()
            else:
                record.events, record.unreadable_lines = read_events(events_path)
            for item in record.events:
                if isinstance(item, ev.HelloEvent):
                    record.hello = item
                elif isinstance(item, ev.DoneEvent):
                    record.done = item
            if record.done is None and (path / SUMMARY_FILE).is_file():
                _done_from_summary(record)  # the events file filled up before done
            return record
        if (path / SUMMARY_FILE).is_file():
            _read_summary(record)
        elif events_path.is_file():
            with files.open_file(events_path, files.EVENTS_BYTES) as fh:
                first = ev.decode(fh.readline(1 << 20))
            if isinstance(first, ev.HelloEvent):
                record.hello = first
    except OSError as exc:
        record.problem = f"cannot be read ({exc.strerror or exc})"
    return record


def _read_summary(record: RunRecord) -> None:
    try:
        data = files.read_json(record.path / SUMMARY_FILE)
    except (ValueError, RecursionError):
        record.problem = f"{SUMMARY_FILE} is not valid JSON"
        return
    if not isinstance(data, dict):
        record.problem = f"{SUMMARY_FILE} is not a JSON object"
        return
    hello = ev.decode(json.dumps(data.get("hello")))
    done = ev.decode(json.dumps(data.get("done")))
    record.hello = hello if isinstance(hello, ev.HelloEvent) else None
    record.done = done if isinstance(done, ev.DoneEvent) else None
    if record.hello is None or (data.get("done") is not None and record.done is None):
        record.problem = f"{SUMMARY_FILE} does not hold a readable hello and done"


def _done_from_summary(record: RunRecord) -> None:
    events, hello = record.events, record.hello
    _read_summary(record)
    record.events, record.hello = events, hello or record.hello
    if record.done is not None:
        record.events.append(record.done)


def list_runs(root: Path | None = None) -> list[RunRecord]:
    """Runs under ``root``, newest first, read from their summaries (cheap). Never raises: an
    unreadable record comes back with ``problem`` set, an unreadable folder as no runs."""
    root = root or default_runs_dir()
    try:
        candidates = [p for p in root.iterdir() if (p / EVENTS_FILE).is_file()]
    except OSError:
        return []
    runs = [load_run(p, with_events=False) for p in candidates]
    return sorted(runs, key=lambda r: r.name, reverse=True)


# --------------------------------------------------------------------------- liveness

LIVE_FILE = "live.json"
LIVE_STALE_S = 10.0
"""A heartbeat older than this means the engine is not making progress (stalled or gone)."""
PROC_START_SLACK_S = 2.0


def process_start(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch), or None if it does not run."""
    import psutil  # here: the dashboard's first screen reads no liveness (benchmarks/first_paint.py)

    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, OSError, ValueError, OverflowError):
        return None


def write_live(
    run_dir: Path,
    pid: int,
    started_at: float | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """``live.json``: who runs this record, refreshed by the engine about once a second.

    ``proc_start`` (the writer's process start time) lets a viewer make sure a pid still
    belongs to this run before it signals it: pids are reused.
    ``extra`` adds fields: a watched process says how (and whether) a viewer may stop it.
    Written about itself, the process also holds the folder's ``.owner`` (``core.processes.ownership``).
    """
    if pid == os.getpid():
        ownership.claim(run_dir)
    now = time.time()
    data = {
        "pid": pid,
        "host": socket.gethostname(),
        "heartbeat": now,
        "started_at": now if started_at is None else started_at,
        "proc_start": process_start(pid),
        **(extra or {}),
    }
    write_text(run_dir / LIVE_FILE, json.dumps(data) + "\n")


def read_live(run_dir: Path) -> dict[str, Any] | None:
    """``live.json``, or None: absent, unreadable, not a regular file (a FIFO would block its
    reader for ever), a link (only ampscope's own processes write it, never as a link)."""
    try:
        data = files.read_json(run_dir / LIVE_FILE, follow_links=False)
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def stop_rule(live: dict[str, Any]) -> tuple[bool, str]:
    """Whether a viewer may stop the process ``live.json`` names, and if not, why.

    An engine always may be stopped. A process watched with ``ampscope.watch`` is the user's
    own training: only when it was started with ``allow_stop=True``, and then with SIGINT
    (as Ctrl+C would), to that process alone.
    """
    if live.get("source") != "watch":
        return True, ""
    if live.get("allow_stop") is True:
        return True, ""
    return False, "this training loop was watched without allow_stop=True"


def clear_live(run_dir: Path) -> None:
    with contextlib.suppress(OSError):
        (run_dir / LIVE_FILE).unlink()
    ownership.release(run_dir)


MAX_PID = (1 << 31) - 1
"""No process has a larger pid (a pid_t is 32 bits; Linux's own limit is 2**22)."""


def live_pid(live: dict[str, Any]) -> int | None:
    """The pid ``live.json`` names, when it is one a process can have: a file that names
    10**30 or "1" names none."""
    pid = live.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid <= MAX_PID:
        return None
    return pid


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs on this host (a zombie counts as gone)."""
    if not 0 < pid <= MAX_PID:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OSError, OverflowError):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no /proc (macOS): kill(0) said it exists


def _heartbeat_age(live: dict[str, Any], now: float) -> float | None:
    """Seconds since the last heartbeat; None when it is unreadable or from the future."""
    try:
        age = now - float(live.get("heartbeat", 0))
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(age) or age < -LIVE_STALE_S:  # a clock or a file that lies
        return None
    return max(age, 0.0)


def same_process(live: dict[str, Any]) -> int | None:
    """The pid ``live.json`` names while a process started at that time runs on this host.

    Public facts only (anyone can read them for any process): enough to list a run as live,
    never enough to signal it (``stopping.verified_pid``).
    """
    pid = live_pid(live)
    try:
        recorded = float(live["proc_start"])
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    if pid is None or not math.isfinite(recorded):  # NaN is within no slack of anything
        return None
    if live.get("host") != socket.gethostname() or not pid_alive(pid):
        return None
    started = process_start(pid)
    if started is None or not abs(started - recorded) <= PROC_START_SLACK_S:
        return None
    return pid


def live_owner(run_dir: Path, now: float | None = None) -> dict[str, Any] | None:
    """``live.json`` when its engine still runs: fresh heartbeat, and pid alive if on this host."""
    live = read_live(run_dir)
    if live is None:
        return None
    age = _heartbeat_age(live, time.time() if now is None else now)
    if age is None or age >= LIVE_STALE_S:
        return None
    if live.get("host") == socket.gethostname() and same_process(live) is None:
        return None  # gone, or a reused pid: ``ampscope stop`` says the same
    return live


def is_stalled(run_dir: Path, now: float | None = None) -> bool:
    """The heartbeat is stale but the engine process still runs here (paused, swapping)."""
    live = read_live(run_dir)
    if live is None:
        return False
    age = _heartbeat_age(live, time.time() if now is None else now)
    return age is not None and age >= LIVE_STALE_S and same_process(live) is not None


def tail_events(path: Path, max_bytes: int = 1 << 16) -> list[ev.Event]:
    """The complete events in the last ``max_bytes`` of ``events.jsonl`` (cheap on big records)."""
    try:
        with files.open_file(path, files.EVENTS_BYTES) as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return []
    lines = data.split(b"\n")
    if size > max_bytes:
        lines = lines[1:]  # the first one is cut
    out = []
    for line in lines:
        if line.strip():
            item = ev.decode(line)
            if not isinstance(item, ev.UnknownEvent):
                out.append(item)
    return out


def run_state(record: RunRecord, now: float | None = None) -> str:
    """``live``, ``stalled``, ``crashed``, or the ``done`` status (ok, failed, stopped).

    Live: no ``done`` yet, and ``live.json`` names a process that still runs on this host (or,
    from another host, a heartbeat under ``LIVE_STALE_S`` old). Stalled: the heartbeat is
    stale but that very process still runs here (paused, swapping, a long call): it may go
    on. Crashed: no ``done`` and the engine is gone (or, from another host, its heartbeat is
    stale, or it left no ``live.json``).
    """
    if record.done is not None:
        return record.done.status
    if live_owner(record.path, now) is not None:
        return "live"
    if is_stalled(record.path, now):
        return "stalled"
    # The summary may not be written yet (the engine is finishing): the stream says.
    done = next(
        (
            e
            for e in reversed(tail_events(record.path / EVENTS_FILE))
            if isinstance(e, ev.DoneEvent)
        ),
        None,
    )
    if done is not None:
        record.done = done
        return done.status
    return "crashed"
