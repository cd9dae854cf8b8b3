"""Watching a run through its record: read ``events.jsonl`` from the start, then tail it.

Used by ``ampscope attach``, by History (Enter on a live run), by runs the dashboard starts
detached, and by the read-only viewer ``ampscope serve`` runs. Reading a file takes nothing from
the engine, so any number of viewers may attach to one run. Stop signals the record's pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.tui.run_state import RunState

if TYPE_CHECKING:
    from ampscope.tui.app import AmpscopeApp
    from ampscope.tui.screens.run import RunScreen

POLL_S = 0.15
"""How often the file is checked for new lines once caught up."""
CHUNK = 1 << 20
"""Bytes read at a time while catching up, so a long record does not freeze the UI."""
LIVENESS_S = 1.0
STOP_GRACE_S = 10.0
"""SIGTERM lets the engine finish its step and write ``done``; SIGKILL after this long."""


class RecordTail:
    """New complete lines of a growing ``events.jsonl``; a torn last line waits for its end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self._partial = b""

    def read(self, max_bytes: int = CHUNK) -> tuple[list[ev.Event | ev.UnknownEvent], bool]:
        """Events decoded from the new bytes, and whether more bytes are waiting."""
        try:
            with self.path.open("rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < self.offset:  # replaced or truncated: start over
                    self.offset, self._partial = 0, b""
                fh.seek(self.offset)
                chunk = fh.read(max_bytes)
        except FileNotFoundError:
            return [], False
        if not chunk:
            return [], False
        self.offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        return [ev.decode(line) for line in lines if line.strip()], self.offset < size


def _config(run_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((run_dir / records.CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class AttachSource:
    """Feeds a RunState from a record on disk; the Run view's source for an attached run."""

    seekable = False

    def __init__(self, run_dir: Path, allow_stop: bool = True, grace_s: float = STOP_GRACE_S):
        self.run_dir = Path(run_dir)
        self.tail = RecordTail(self.run_dir / records.EVENTS_FILE)
        launch = _config(self.run_dir)
        self.state = RunState(label=launch.get("name", self.run_dir.name), launch=launch)
        self.allow_stop = allow_stop
        self.grace_s = grace_s
        self.ended = False  # done seen, or the engine is gone
        self.crashed = False
        self.stopping = False
        self.caught_up = False

    # ------------------------------------------------------------------ who runs it

    def owner(self) -> tuple[int, str] | None:
        """(pid, host) of the engine writing this record, while it runs."""
        live = records.live_owner(self.run_dir)
        if live is not None:
            try:
                return int(live["pid"]), str(live.get("host", ""))
            except (KeyError, TypeError, ValueError):
                return None
        return None

    @property
    def can_stop(self) -> bool:
        if not self.allow_stop or self.ended or self.stopping:
            return False
        owner = self.owner()
        allowed, _ = records.stop_rule(records.read_live(self.run_dir) or {})
        return allowed and owner is not None and owner[1] == socket.gethostname()

    def label(self) -> str:
        if self.crashed:
            return "crashed"
        if self.stopping and not self.ended:
            return "attached · stopping"
        if self.ended:
            return "attached · ended"
        return "attached" if self.caught_up else "attached · catching up"

    # ------------------------------------------------------------------ following

    def start(self, screen: RunScreen) -> None:
        screen.run_worker(self.follow(screen), group="follow", exit_on_error=False)

    def pump(self) -> bool:
        """Ingest what is new; True while more is waiting (catching up)."""
        items, more = self.tail.read()
        if items:
            self.state.ingest_many(items)
        return more

    async def follow(self, screen: RunScreen | None = None) -> None:
        loop = asyncio.get_running_loop()
        next_check = loop.time() + LIVENESS_S
        while True:
            more = self.pump()
            if self.state.done is not None:
                break
            if more:
                await asyncio.sleep(0)
                continue
            self.caught_up = True
            if loop.time() >= next_check:
                next_check = loop.time() + LIVENESS_S
                if self.owner() is None:
                    while self.pump():  # the last lines, written before it went
                        pass
                    if self.state.done is None:
                        self._mark_crashed()
                    break
            await asyncio.sleep(POLL_S)
        self.ended = True
        self.caught_up = True
        if screen is not None and screen.is_attached:
            screen.refresh_view()
            screen.refresh_bindings()

    def _mark_crashed(self) -> None:
        state = self.state
        self.crashed = True
        if state.stop_requested:
            state.status = "stopped"
            state.add_log("info", None, "the engine was stopped and wrote no 'done'")
        else:
            state.status = "failed"
            state.error = "crashed: the engine is gone and wrote no 'done' event"
            state.add_log("error", None, state.error)
        state.version += 1

    # ------------------------------------------------------------------ stop

    def request_stop(self, screen: RunScreen) -> None:
        screen.run_worker(self.stop(), group="stop", exit_on_error=False)

    async def stop(self) -> None:
        """SIGTERM the engine (it finishes its step and writes ``done``), SIGKILL after grace."""
        owner = self.owner()
        if owner is None or owner[1] != socket.gethostname() or self.ended:
            return
        live = records.read_live(self.run_dir) or {}
        if not records.stop_rule(live)[0]:
            return
        pid = owner[0]
        self.stopping = True
        self.state.stop_requested = True
        if live.get("source") == "watch":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGINT)  # the user's own process: Ctrl+C, never SIGKILL
            return
        _signal(pid, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace_s
        while loop.time() < deadline and records.pid_alive(pid):
            await asyncio.sleep(0.1)
        if records.pid_alive(pid):
            _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    """The engine's group when it leads one (a detached engine does), else the pid alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def attach_record(app: AmpscopeApp, run_dir: Path) -> RunScreen:
    """Show ``run_dir`` in a Run view that follows its record."""
    from ampscope.tui.screens.run import RunScreen

    source = AttachSource(run_dir, allow_stop=not getattr(app, "read_only", False))
    screen = RunScreen(source.state, app.refresh_hz, source=source)
    app.push_screen(screen)
    return screen
