"""Which rank holds the others up. On several ranks each one says where it is (the step and the
part of it: exchange, data, forward, backward, scaler, optimizer) through torchrun's store,
once a second, from a thread of its own; rank 0 names a rank that has not moved for
``STALL_S`` while the others wait for it, as a ``rank-stalled`` warning, live. Steps 0 and 1
of a compiled model compile (and may recompile), for minutes on a large model: there the time
is ``COMPILE_STALL_S``.

Only this module's thread touches the store: the loop itself sets two attributes a part.
Rank 0 times each rank by when it saw that rank's position change, on its own clock, so the
nodes' clocks never matter.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ampscope.core import events as ev

PARTS = ("exchange", "data", "forward", "backward", "scaler", "optimizer")
STALL_S = 20.0
"""No rank moved for this long: the one behind the others is named (docs/events.md);
``AMPSCOPE_STALL_S`` sets another time."""
COMPILE_STALL_S = 300.0
"""The same for steps 0 and 1 of a compiled model (they compile), unless ``STALL_S`` is longer."""
COMPILING_STEPS = 2  # step 0 compiles, step 1 may recompile
BEACON_S = 1.0
KEY = "ampscope/progress/"


class RankPosition:
    """Where this rank is: set by the loop (cheap), read by the beacon's thread."""

    def __init__(self) -> None:
        self.step = -1
        self.part = "setup"

    def mark(self, step: int, part: str) -> None:
        self.step, self.part = step, part


@dataclass
class Seen:
    step: int
    part: str
    since: float  # rank 0's monotonic clock: when this position was first seen


def stall_verdict(
    seen: dict[int, Seen], now: float, stall_s: float = STALL_S, compiled: bool = False
) -> str | None:
    """What to tell when no rank has moved for ``stall_s`` (``COMPILE_STALL_S`` while a rank
    is in a compiling step of a ``compiled`` model): the ranks furthest behind, and those
    waiting for them; None while any rank moves."""
    if not seen:
        return None
    if compiled and any(s.step < COMPILING_STEPS for s in seen.values()):
        stall_s = max(stall_s, COMPILE_STALL_S)
    still = now - max(s.since for s in seen.values())
    if still < stall_s:
        return None

    def where(s: Seen) -> tuple[int, int]:
        return s.step, PARTS.index(s.part) if s.part in PARTS else len(PARTS)

    behind = min(where(s) for s in seen.values())
    late = sorted(r for r, s in seen.items() if where(s) == behind)
    waiting = sorted(r for r in seen if r not in late)
    first = seen[late[0]]
    if not waiting:
        return (
            f"no rank has moved for {still:.0f} s: every rank is in {first.part} of step "
            f"{first.step} (a collective that waits, or a long compile); s or Ctrl+C stops the job"
        )
    return (
        f"{_ranks(late)} {'has' if len(late) == 1 else 'have'} made no progress for "
        f"{still:.0f} s, in {first.part} of step {first.step}, while {_ranks(waiting)} "
        f"{'waits' if len(waiting) == 1 else 'wait'} for {'it' if len(late) == 1 else 'them'}; "
        "s or Ctrl+C stops the job"
    )


def _ranks(ranks: list[int]) -> str:
    names = ", ".join(str(r) for r in ranks)
    return f"rank {names}" if len(ranks) == 1 else f"ranks {names}"


def stall_seconds() -> float:
    try:
        value = float(os.environ.get("AMPSCOPE_STALL_S", STALL_S))
    except ValueError:
        return STALL_S
    return value if value > 0 else STALL_S


class Beacon:
    """One thread a rank: publishes its position; on rank 0 also reads every rank's, and
    ``report``s a stall once each time the ranks stop moving."""

    def __init__(
        self,
        store: Any,
        rank: int,
        world_size: int,
        progress: RankPosition,
        report: Callable[[ev.WarningEvent], None] | None,
        stall_s: float | None = None,
        every_s: float = BEACON_S,
        compiled: bool = False,
    ) -> None:
        if stall_s is None:
            stall_s = stall_seconds()
        self.store, self.rank, self.world_size = store, rank, world_size
        self.progress, self.report = progress, report
        self.stall_s, self.every_s, self.compiled = stall_s, every_s, compiled
        self.seen: dict[int, Seen] = {}
        self._told: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ampscope-progress", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.store.set(f"{KEY}{self.rank}", f"{self.progress.step} {self.progress.part}")
                if self.report is not None:
                    self._look()
            except Exception:  # noqa: BLE001 - the store went with torchrun: nothing to say
                return

    def _look(self) -> None:
        now = time.monotonic()
        keys = [f"{KEY}{r}" for r in range(self.world_size)]
        if not self.store.check(keys):
            return  # a rank has not said anything yet
        for rank, key in enumerate(keys):
            step_text, part = self.store.get(key).decode().split(" ", 1)
            step = int(step_text)
            old = self.seen.get(rank)
            if old is None or (old.step, old.part) != (step, part):
                self.seen[rank] = Seen(step, part, now)
                self._told = None  # moving again: a later stall is told anew
        message = stall_verdict(self.seen, now, self.stall_s, self.compiled)
        if message is not None and self._told is None and self.report is not None:
            self._told = message
            step = min(s.step for s in self.seen.values())
            self.report(ev.WarningEvent(code=ev.RANK_STALLED, message=message, step=step))
