"""Watching a run through its record: read ``events.jsonl`` from the start, then tail it.

Used by ``ampscope attach``, by History (Enter on a live run), by runs the dashboard starts
detached, and by the read-only viewer ``ampscope serve`` runs. Reading a file takes nothing from
the engine, so any number of viewers may attach to one run. Stop signals the record's engine,
once its pid is verified to be that engine (``stopping.verified_pid``).
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.processes import stopping
from ampscope.core.records import files
from ampscope.tui.model.run_state import RunState
from ampscope.tui.model.source import RESTART, STOP

POLL_S = 0.15
"""How often the file is checked for new lines once caught up."""
CHUNK = 1 << 20
"""Bytes read at a time while catching up, so a long record does not freeze the UI."""
MAX_LINE = 16 << 20
"""A line longer than this is skipped (as unreadable) rather than held in memory whole."""
LIVENESS_S = 1.0
STOP_GRACE_S = 10.0
"""SIGTERM lets the engine finish its step and write ``done``; SIGKILL after this long."""


class RecordTail:
    """New complete lines of a growing ``events.jsonl``; a torn last line waits for its end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self._partial = b""
        self._skipping = False  # inside a line over MAX_LINE: drop bytes up to its end

    def read(self, max_bytes: int = CHUNK) -> tuple[list[ev.Event | ev.UnknownEvent], bool]:
        """Events decoded from the new bytes, and whether more bytes are waiting."""
        try:
            with files.open_file(self.path, files.EVENTS_BYTES) as fh:
                size = os.fstat(fh.fileno()).st_size
                if size < self.offset:  # replaced or truncated: start over
                    self.offset, self._partial, self._skipping = 0, b"", False
                fh.seek(self.offset)
                chunk = fh.read(max_bytes)
        except OSError:  # gone, or no regular file (a FIFO, a link to a device): nothing to follow
            return [], False
        if not chunk:
            return [], False
        self.offset += len(chunk)
        items: list[ev.Event | ev.UnknownEvent] = []
        if self._skipping:
            end = chunk.find(b"\n")
            if end < 0:
                return [], self.offset < size
            chunk, self._skipping = chunk[end + 1 :], False
            items.append(ev.UnknownEvent(line="", reason=f"a line over {MAX_LINE:,} bytes"))
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE:
            self._partial, self._skipping = b"", True
        items += [ev.decode(line) for line in lines if line.strip()]
        return items, self.offset < size


def _config(run_dir: Path) -> dict[str, Any]:
    try:
        data = files.read_json(run_dir / records.CONFIG_FILE)
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


class AttachSource:
    """The Run view's source for a record on disk, followed as the engine writes it.

    ``allow_stop`` False (a served viewer) offers no engine keys at all.
    """

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
        self.stalled = False  # heartbeat stale, engine process still there
        self.caught_up = False

    # ------------------------------------------------------------------ who runs it

    def engine_pid(self) -> int | None:
        """The engine's pid, only while that very process runs on this host (never a pid
        ``live.json`` merely names: it may be stale after pid reuse, or crafted)."""
        live = records.read_live(self.run_dir)
        return stopping.verified_pid(live, self.run_dir) if live is not None else None

    def engine_state(self) -> str:
        """``live``, ``stalled`` (the heartbeat stopped, the process is still there) or ``gone``."""
        if records.live_owner(self.run_dir) is not None:
            return "live"
        return "stalled" if records.is_stalled(self.run_dir) else "gone"

    @property
    def watched(self) -> bool:
        """Someone's own training process, seen through ``ampscope.watch``: not an engine."""
        hello = self.state.hello
        live = records.read_live(self.run_dir) or {}
        return live.get("source") == "watch" or (hello is not None and hello.source == "watch")

    @property
    def can_stop(self) -> bool:
        if not self.allow_stop or self.ended or self.stopping:
            return False
        allowed, _ = records.stop_rule(records.read_live(self.run_dir) or {})
        return allowed and self.engine_pid() is not None

    def allows(self, control: str) -> bool | None:
        """Stop while its engine runs here; restart never (this dashboard did not start it)."""
        if control != STOP or not self.allow_stop:
            return False
        return True if self.can_stop else None

    def why_not(self, control: str) -> str:
        if control == RESTART:
            return "this dashboard did not start the run (start it again from the presets)"
        if not self.allow_stop:
            return "this view is read-only"
        allowed, why = records.stop_rule(records.read_live(self.run_dir) or {})
        if not allowed:
            return why
        if self.ended:
            return "the run has ended"
        if self.stopping:
            return "it is stopping"
        return "its engine runs on another host"

    def label(self) -> str:
        if self.crashed:
            return "crashed"
        if self.stopping and not self.ended:
            return "attached · stopping"
        if self.ended:
            return "attached · ended"
        if self.stalled:
            return "attached · stalled (no heartbeat: paused or busy)"
        return "attached" if self.caught_up else "attached · catching up"

    # ------------------------------------------------------------------ following

    async def pump(self) -> bool:
        """Ingest what is new, read on a thread (never the UI's: a disk may stall); True
        while more is waiting (catching up)."""
        items, more = await asyncio.to_thread(self.tail.read)
        if items:
            self.state.ingest_many(items)
        return more

    async def feed(self) -> None:
        """Catch up in chunks (the UI stays live), then tail until ``done`` or the engine goes.

        An engine whose heartbeat stops while its process stays (SIGSTOP, a swapping host, a
        long call) is ``stalled``, not crashed: following goes on, and resumes showing steps
        when it does.
        """
        loop = asyncio.get_running_loop()
        next_check = loop.time() + LIVENESS_S
        while True:
            more = await self.pump()
            if self.state.done is not None:
                break
            if more:
                await asyncio.sleep(0)
                continue
            self.caught_up = True
            if loop.time() >= next_check:
                next_check = loop.time() + LIVENESS_S
                engine = await asyncio.to_thread(self.engine_state)  # reads live.json
                self.stalled = engine == "stalled"
                if engine == "gone":
                    while await self.pump():  # the last lines, written before it went
                        pass
                    if self.state.done is not None:
                        pass
                    elif not await asyncio.to_thread(self.run_dir.is_dir):
                        # its record was removed, live.json with it: whether its engine still
                        # runs is not known from here, so it is not said to have crashed
                        self.state.record_removed(str(self.run_dir))
                    else:
                        self.crashed = not self.state.stop_requested
                        self.state.engine_gone()
                    break
            await asyncio.sleep(POLL_S)
        self.ended = True
        self.stalled = False
        self.caught_up = True

    # ------------------------------------------------------------------ stop

    async def stop(self) -> None:
        """SIGTERM the engine (it finishes its step and writes ``done``), SIGKILL after grace.

        Only a verified engine is signalled (``stopping.verified_pid``); a stalled (stopped)
        one gets SIGCONT too, so that it can act on the SIGTERM.
        """
        pid = self.engine_pid()
        if not self.allow_stop or pid is None or self.ended:
            return
        live = records.read_live(self.run_dir) or {}
        if not records.stop_rule(live)[0]:
            return
        self.stopping = True
        self.state.stop_requested = True
        if not stopping.ask_to_stop(self.run_dir, live, pid):
            return  # the user's own process: Ctrl+C, never SIGKILL
        loop = asyncio.get_running_loop()
        deadline = loop.time() + stopping.stop_wait_s(self.state.hello, self.grace_s)
        while loop.time() < deadline and records.pid_alive(pid):
            await asyncio.sleep(0.1)
        if records.pid_alive(pid) and self.engine_pid() == pid:
            stopping.signal_engine(self.run_dir, pid, signal.SIGKILL)

    async def restart(self) -> None:
        """Not offered: the engine is not this dashboard's child."""
