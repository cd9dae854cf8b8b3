"""How the ranks of one run talk: every step's figures gathered, one decision to stop, and the
first rank's failure named.

``SoloLink`` is the only rank of a one-process run and costs nothing. ``RankLink`` joins the
process group torchrun set up (NCCL on GPUs, gloo on CPUs) and keeps a gloo group for the
host-side exchange: once a loop iteration, every rank hands over the steps whose figures have
landed on its host (step time, metrics, memory), whether it was asked to stop, and its latest
telemetry sample (``all_gather_object``, a few hundred bytes a rank). Every rank receives
everything, so every rank reaches the same verdicts (stop, non-finite loss, skips that
disagree) at the same step, and no rank is left waiting in a collective the others skipped.

A rank that fails on its own (an exception, OOM) says so in torchrun's key-value store before
it exits; the others see their collectives break, and rank 0 reports the first failure with its
rank instead of the broken connection it saw.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from ampscope.core import events as ev
from ampscope.engine.ranks import RankEnv
from ampscope.engine.ranks.stall_watch import Beacon, RankPosition

PhaseMarker = Callable[[str], AbstractContextManager[object]]

FAILURE_KEY = "ampscope/failure"
FAILURES_KEY = "ampscope/failures"
BLAME_WAIT_S = 3.0  # how long a rank that lost its peers waits for the failed one's report
COMM_ERROR_WORDS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "NCCL",
    "Timed out",
    "timed out",
)


class RankFigures(NamedTuple):
    """One rank's figures for one step, as they landed on its host."""

    rank: int
    step: int
    step_ms: float
    values: list[float]  # StepMetrics order
    mem_allocated: int | None
    mem_reserved: int | None
    mem_peak: int | None
    cpu_ms: float | None = None  # CPU devices: the process's CPU time over the step


class SoloLink:
    """The one rank of a one-process run."""

    rank = 0
    world_size = 1
    local_rank = 0
    backend: str | None = None
    lead = True
    grouped = False

    def exchange(
        self, landed: list[RankFigures], stop: bool, sample: ev.RankSys | None = None
    ) -> tuple[list[list[RankFigures]], bool]:
        return [[f] for f in landed], stop

    def gather(self, value: Any) -> list[Any]:
        return [value]

    def blame(
        self, event: ev.ErrorEvent, exc: BaseException | None = None, shared: bool = False
    ) -> ev.ErrorEvent:
        return event

    def reported_failure(self) -> ev.ErrorEvent | None:
        return None

    def put_sample(self, sample: ev.RankSys) -> None:
        pass

    def latest_samples(self) -> list[ev.RankSys] | None:
        return None

    def hold(self, *objects: Any) -> None:
        pass

    def marking(self, step: int, phase: PhaseMarker) -> PhaseMarker:
        return phase

    def watch_progress(
        self, report: Callable[[ev.WarningEvent], None] | None, compiled: bool = False
    ) -> None:
        pass

    def stop_watching(self) -> None:
        pass


class RankLink:
    """One rank of several, joined to the process group torchrun prepared (``env://``)."""

    def __init__(self, ranks: RankEnv, device: torch.device) -> None:
        self.grouped = True
        self.rank = ranks.rank
        self.world_size = ranks.world_size
        self.local_rank = ranks.local_rank
        self.lead = ranks.lead
        self.backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
            dist.init_process_group(self.backend, device_id=device)
            self.host_group: Any = dist.new_group(backend="gloo")
        else:
            dist.init_process_group(self.backend)
            self.host_group = None  # the default group is gloo already
        self.store = _default_store()
        self._pending: dict[int, dict[int, RankFigures]] = {}
        self._samples: dict[int, ev.RankSys] = {}
        self._samples_lock = threading.Lock()
        self._held: list[Any] = []
        self.progress = RankPosition()
        self.beacon: Beacon | None = None
        _OPEN.append(self)

    def marking(self, step: int, phase: PhaseMarker) -> PhaseMarker:
        """``phase`` that also tells this rank's position (``engine.ranks.stall_watch``)."""
        progress = self.progress

        @contextmanager
        def marked(part: str) -> Iterator[object]:
            progress.mark(step, part)
            with phase(part) as inner:
                yield inner

        return marked

    def watch_progress(
        self, report: Callable[[ev.WarningEvent], None] | None, compiled: bool = False
    ) -> None:
        """Start telling this rank's position; rank 0 ``report``s a rank that stalls (given
        longer in the first steps of a ``compiled`` model)."""
        if self.store is not None and self.beacon is None:
            lead_report = report if self.lead else None
            self.beacon = Beacon(
                self.store, self.rank, self.world_size, self.progress, lead_report,
                compiled=compiled,
            )  # fmt: skip

    def stop_watching(self) -> None:
        if self.beacon is not None:
            self.beacon.close()

    def exchange(
        self, landed: list[RankFigures], stop: bool, sample: ev.RankSys | None = None
    ) -> tuple[list[list[RankFigures]], bool]:
        """Every rank's landed steps and stop flags, once an iteration, on every rank alike.

        Returns the steps every rank has now reported (oldest first, each a list by rank) and
        whether any rank asked to stop.
        """
        self.progress.mark(self.progress.step + 1, "exchange")
        received: list[Any] = [None] * self.world_size
        dist.all_gather_object(received, (stop, landed, sample), group=self.host_group)
        for rank_sample in (r[2] for r in received if r[2] is not None):
            self.put_sample(rank_sample)
        return collect(received, self._pending, self.world_size)

    def gather(self, value: Any) -> list[Any]:
        """One value from every rank, by rank (a collective: every rank must call it)."""
        received: list[Any] = [None] * self.world_size
        dist.all_gather_object(received, value, group=self.host_group)
        return received

    # ------------------------------------------------------------------ telemetry

    def put_sample(self, sample: ev.RankSys) -> None:
        with self._samples_lock:
            self._samples[sample.rank] = sample

    def latest_samples(self) -> list[ev.RankSys] | None:
        with self._samples_lock:
            return [self._samples[r] for r in sorted(self._samples)]

    # ------------------------------------------------------------------ failures

    def blame(
        self, event: ev.ErrorEvent, exc: BaseException | None = None, shared: bool = False
    ) -> ev.ErrorEvent:
        """The failure to report: the first rank's own, told to the others through the store.

        A ``shared`` failure is one every rank reached together from the exchanged figures (a
        non-finite loss, skips that disagree, a refused preset): no rank is to blame. A rank
        whose collective broke because a peer went away does not count as first: it waits
        briefly for the peer's report, and reports the broken connection only when none comes
        (the peer was killed, or crashed in native code).
        """
        if shared:
            return event
        event.rank = self.rank
        event.message = f"rank {self.rank}: {event.message}"
        lost_peer = exc is not None and is_comm_error(exc)
        if lost_peer:
            event.message += (
                " Another rank stopped answering; if no rank reported a failure, it was killed "
                "(out of host memory?) or crashed in native code: torchrun's log names it."
            )
        if self.store is None:
            return event
        try:
            if not lost_peer and self.store.add(FAILURES_KEY, 1) == 1:
                self.store.set(FAILURE_KEY, ev.encode(event))
                return event
            self.store.wait([FAILURE_KEY], timedelta(seconds=BLAME_WAIT_S))
            first = ev.decode(self.store.get(FAILURE_KEY))
        except Exception:  # noqa: BLE001 - the store went with torchrun: say what this rank saw
            return event
        return first if isinstance(first, ev.ErrorEvent) else event

    def reported_failure(self) -> ev.ErrorEvent | None:
        """A failure another rank has reported, without waiting (a stop that came from
        torchrun because a rank failed is that failure, not a stop)."""
        if self.store is None:
            return None
        try:
            if not self.store.check([FAILURE_KEY]):
                return None
            first = ev.decode(self.store.get(FAILURE_KEY))
        except Exception:  # noqa: BLE001 - no store, no report
            return None
        return first if isinstance(first, ev.ErrorEvent) else None

    def hold(self, *objects: Any) -> None:
        """Keep the model (and so DDP's reducer) alive until the process ends.

        Nothing is torn down: the rank's process ends with ``os._exit`` (``engine.lifecycle.run``).
        Freeing a DDP model frees its gloo process group, whose destructor joins a worker
        thread that needs the GIL the destructor holds: a deadlock at the end of every run.
        After a failure, a teardown could also wait on a rank that is gone.
        """
        self._held.extend(objects)


def collect(
    received: list[tuple[bool, list[RankFigures], Any]],
    pending: dict[int, dict[int, RankFigures]],
    world_size: int,
) -> tuple[list[list[RankFigures]], bool]:
    """Add one exchange's (stop, landed steps, sample) by rank to ``pending``; take out the
    steps every rank has now reported, oldest first, each as a list by rank.

    A rank's steps land in order, so a step all ranks have reported has no older step
    missing: the steps come out in order and each exactly once.
    """
    stop_all = False
    for rank, (rank_stop, figures, _sample) in enumerate(received):
        stop_all = stop_all or rank_stop
        for f in figures:
            pending.setdefault(f.step, {})[rank] = f
    ready = sorted(step for step, by_rank in pending.items() if len(by_rank) == world_size)
    steps = []
    for step in ready:
        by_rank = pending.pop(step)
        steps.append([by_rank[r] for r in range(world_size)])
    return steps, stop_all


_OPEN: list[RankLink] = []
"""Links live as long as the process (see ``RankLink.close``)."""


def blame_here(event: ev.ErrorEvent) -> ev.ErrorEvent:
    """``event`` as this rank's own failure, told to the others through the store, when this
    process is one rank of several (``RankLink.blame``); as it is otherwise. For a rank that
    leaves at once (the user's ``os._exit``): the others then name it, and how it left,
    instead of the connection they saw close."""
    for link in _OPEN:
        try:
            return link.blame(event)
        except Exception:  # noqa: BLE001 - leaving must not fail on the report
            return event
    return event


def is_comm_error(exc: BaseException) -> bool:
    """A collective or the store failed: a symptom of another rank's end, not a cause."""
    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(w in text for w in COMM_ERROR_WORDS)


def _default_store() -> Any:
    """torchrun's key-value store, which outlives the ranks (the agent hosts it)."""
    try:
        return dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        return None


Link = SoloLink | RankLink


def connect(ranks: RankEnv, device: torch.device) -> Link:
    return RankLink(ranks, device) if ranks.distributed else SoloLink()
