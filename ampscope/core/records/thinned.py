"""A long record read in a bounded amount of memory, thinned as the dashboard's plots are.

A run of millions of steps has a record of hundreds of MB: read whole, about 0.5 kB a step in
memory (a 2.6-million-step record took 1.37 GB). The dashboard draws at most a few thousand
points a plot and thins to two a column, each column keeping its extremes (``thin`` in
``tui.model.figures``); TensorBoard keeps 1,000 points a scalar. ``read_thinned`` streams the
file and keeps, whatever its length:

- the steps in at most STEP_BUCKETS runs of consecutive steps, each keeping its fastest and
  slowest step and the one that counted the most gradient zeros, so a stall or a spike of
  zeros still shows; a record of up to 2,048 steps is kept whole;
- every step the GradScaler skipped and the first step whose loss stopped being finite (at
  most MARKED_STEPS of them), and the last RECENT_STEPS steps as they were, so the figures a
  finished run shows last are its own;
- of each other kind of event (a warning's kind is its code), at most OTHERS_KEPT (``sys``:
  SYS_KEPT, ``numerics``: NUMERICS_KEPT, those that found an inf or NaN besides), spread
  evenly over the run with its first and last; ``hello``, ``phase``, ``error`` and ``done``
  always.

Step lines are read for the four figures that choose them (msgspec, no full decode), and the
kept ones are decoded at the end. Torch- and textual-free.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np

from ampscope.core import events as ev
from ampscope.core.records import files

STEP_BUCKETS = 1024
"""Runs of consecutive steps kept, each by up to three steps (3,072 at most)."""
MARKED_STEPS = 512
RECENT_STEPS = 20
"""The dashboard's Step time card reads the last 20 steps (``tui.model.run_events.RECENT``)."""
SYS_KEPT = 4096
NUMERICS_KEPT = 64
OTHERS_KEPT = 1024
ALWAYS_KEPT = (ev.HelloEvent, ev.PhaseEvent, ev.ErrorEvent, ev.DoneEvent)
CHUNK = 1 << 20
MAX_LINE = 16 << 20
"""A longer line is skipped as unreadable rather than held whole."""
STREAMED_BYTES = 1 << 40
"""Any regular file is read: memory does not grow with it, only the time does."""
STEP_PREFIX = b'{"type":"step",'


class _StepFigures(msgspec.Struct):
    """What choosing a step needs of its line."""

    step_ms: float
    loss: float | None = None
    skipped: bool = False
    grad_zero_frac: float | None = None


_step_figures = msgspec.json.Decoder(_StepFigures)
Kept = tuple[int, "bytes | ev.Event"]
"""An event's place in the record, and its line (a step's, still to decode) or the event."""


Run = list
"""A run of consecutive steps as kept: [fastest, slowest, most zeros], each ``(figure,
kept)`` or None (no step of the run counted zeros)."""


class StepThinner:
    """Steps in runs (buckets) of ``width`` consecutive steps: each run keeps its fastest and
    slowest step and its most zeros. Past ``buckets`` runs, neighbours merge (``width``
    doubles), so at most ``3 * buckets`` steps are held whatever the length. Steps come a
    chunk of the file at a time, their runs found with numpy."""

    def __init__(self, buckets: int = STEP_BUCKETS) -> None:
        self.max_buckets = buckets
        self.width = 1
        self.count = 0
        self.runs: list[Run] = []

    def add(self, kept: list[Kept], step_ms: np.ndarray, zeros: np.ndarray) -> None:
        """The next steps: their places and lines, times and zeros (NaN: not counted)."""
        first, n = self.count, len(kept)
        if not n:
            return
        self.count += n
        while (first + n - 1) // self.width + 1 > self.max_buckets:
            self._merge()
        bucket = (first + np.arange(n)) // self.width
        ends = np.flatnonzero(np.diff(bucket)) + 1
        starts = np.concatenate([[0], ends])
        by_time = np.lexsort((step_ms, bucket))  # within each run, fastest first
        counted = np.where(np.isnan(zeros), -np.inf, zeros)
        by_zeros = np.lexsort((counted, bucket))
        stops = np.concatenate([ends, [n]])
        for start, stop in zip(starts.tolist(), stops.tolist(), strict=True):
            fast, slow, most = by_time[start], by_time[stop - 1], by_zeros[stop - 1]
            run: Run = [
                (float(step_ms[fast]), kept[fast]),
                (float(step_ms[slow]), kept[slow]),
                (float(zeros[most]), kept[most]) if counted[most] > -np.inf else None,
            ]
            if start == 0 and first % self.width and self.runs:  # the run goes on
                self.runs[-1] = _combine(self.runs[-1], run)
            else:
                self.runs.append(run)

    def _merge(self) -> None:
        self.width *= 2
        self.runs = [
            _combine(*self.runs[a : a + 2]) if a + 1 < len(self.runs) else self.runs[a]
            for a in range(0, len(self.runs), 2)
        ]

    def kept(self) -> Iterator[Kept]:
        for run in self.runs:
            for item in run:
                if item is not None:
                    yield item[1]


def _combine(a: Run, b: Run) -> Run:
    """One run of two neighbouring ones: the faster fastest, slower slowest, more zeros."""
    zeros = [z for z in (a[2], b[2]) if z is not None]
    return [
        min(a[0], b[0], key=lambda x: x[0]),
        max(a[1], b[1], key=lambda x: x[0]),
        max(zeros, key=lambda x: x[0]) if zeros else None,
    ]


class Spread:
    """At most ``limit`` items of a kind, spread evenly over the record: every ``stride``-th
    item is kept, and the stride doubles when they are too many; the last item too."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.stride = 1
        self.count = 0
        self.items: list[tuple[int, Kept]] = []
        self.last: Kept | None = None

    def add(self, kept: Kept) -> None:
        i, self.count = self.count, self.count + 1
        self.last = kept
        if i % self.stride:
            return
        self.items.append((i, kept))
        if len(self.items) > self.limit:
            self.stride *= 2
            self.items = [(j, k) for j, k in self.items if j % self.stride == 0]

    def kept(self) -> Iterator[Kept]:
        yield from (k for _, k in self.items)
        if self.last is not None:
            yield self.last


@dataclass
class Thinned:
    """A record as ``read_thinned`` keeps it."""

    events: list[ev.Event]
    unreadable: int = 0
    steps: int = 0  # step events in the record
    steps_kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # other events left out, by type

    @property
    def thinned(self) -> bool:
        return self.steps_kept < self.steps or bool(self.dropped)

    def note(self) -> str:
        """What the reader should know: '' for a record read whole and readable."""
        parts = []
        if self.steps_kept < self.steps:
            parts.append(
                f"{self.steps_kept:,} of its {self.steps:,} steps are shown (each run of steps "
                "by its fastest and slowest, every skipped step, the last ones as they were)"
            )
        if self.dropped:
            left = ", ".join(f"{n:,} {tag}" for tag, n in sorted(self.dropped.items()))
            parts.append(f"{left} events are left out, the rest spread over the run")
        said = "a long record, read thinned to span the whole run: " + "; ".join(parts)
        if self.unreadable:  # else a record of unreadable steps showed "0/30 steps", unexplained
            lines = "1 line" if self.unreadable == 1 else f"{self.unreadable:,} lines"
            unread = (
                f"{lines} of the record cannot be read (torn, or not ampscope's events): left out"
            )
            return f"{said}; {unread}" if parts else unread
        return said if parts else ""


class _Reader:
    def __init__(self) -> None:
        self.place = 0
        self.steps = StepThinner()
        self.marked: list[Kept] = []
        self.recent: deque[Kept] = deque(maxlen=RECENT_STEPS)
        self.always: list[Kept] = []
        self.others: dict[tuple[type[ev.Event], str], Spread] = {}  # by type, a warning by code
        self.numerics_marked: list[Kept] = []
        self.unreadable = 0
        self.step_count = 0
        self.loss_was_finite = False

    def lines(self, lines: list[bytes]) -> None:
        """The next lines of the file (whole ones)."""
        kept: list[Kept] = []
        figures: list[_StepFigures] = []
        decode = _step_figures.decode  # the loop runs once a line: millions of times
        for place, line in enumerate(lines, self.place):
            if line.startswith(STEP_PREFIX):
                try:
                    figure = decode(line)
                except (msgspec.MsgspecError, ValueError, RecursionError):
                    pass  # read whole below: an unreadable line is counted there
                else:
                    kept.append((place, line))
                    figures.append(figure)
                    continue
            if line.strip():
                self.read_whole(place, line, kept, figures)
        self.place += len(lines)
        self.add_steps(kept, figures)

    def read_whole(
        self, place: int, line: bytes, kept: list[Kept], figures: list[_StepFigures]
    ) -> None:
        event = ev.decode(line)
        if isinstance(event, ev.UnknownEvent):
            self.unreadable += 1
        elif isinstance(event, ev.StepEvent):  # a step line written in another order
            kept.append((place, event))
            figures.append(
                _StepFigures(event.step_ms, event.loss, event.skipped, event.grad_zero_frac)
            )
        else:
            self.other((place, event), event)

    def add_steps(self, kept: list[Kept], figures: list[_StepFigures]) -> None:
        n = len(kept)
        if not n:
            return
        self.step_count += n
        step_ms = np.fromiter((f.step_ms for f in figures), float, n)
        zeros = np.fromiter(
            (math.nan if f.grad_zero_frac is None else f.grad_zero_frac for f in figures), float, n
        )
        finite = np.fromiter((f.loss is not None for f in figures), bool, n)
        skipped = np.fromiter((f.skipped for f in figures), bool, n)
        before = np.concatenate([[self.loss_was_finite], finite[:-1]])
        self.loss_was_finite = bool(finite[-1])
        marked = np.flatnonzero(skipped | (before & ~finite))  # skipped, or the loss turned
        for i in marked[: MARKED_STEPS - len(self.marked)].tolist():
            self.marked.append(kept[i])
        self.recent.extend(kept[-RECENT_STEPS:])
        self.steps.add(kept, step_ms, zeros)

    def other(self, kept: Kept, event: ev.Event) -> None:
        if isinstance(event, ALWAYS_KEPT):
            self.always.append(kept)
            return
        found = isinstance(event, ev.NumericsEvent) and (event.first_nonfinite or event.replayed)
        if found and len(self.numerics_marked) < NUMERICS_KEPT:  # where an inf or NaN was found
            self.numerics_marked.append(kept)
            return
        kind = (type(event), getattr(event, "code", ""))  # a flood of notes keeps the warnings
        spread = self.others.get(kind)
        if spread is None:
            limit = {ev.SysEvent: SYS_KEPT, ev.NumericsEvent: NUMERICS_KEPT}.get(
                type(event), OTHERS_KEPT
            )
            spread = self.others[kind] = Spread(limit)
        spread.add(kept)

    def result(self) -> Thinned:
        chosen: dict[int, bytes | ev.Event] = {}
        for place, item in (
            *self.steps.kept(),
            *self.marked,
            *self.recent,
            *self.always,
            *self.numerics_marked,
            *(k for spread in self.others.values() for k in spread.kept()),
        ):
            chosen[place] = item
        events: list[ev.Event] = []
        steps_kept = 0
        for place in sorted(chosen):
            item = chosen[place]
            event = ev.decode(item) if isinstance(item, bytes) else item
            if isinstance(event, ev.UnknownEvent):  # a step line whose figures alone read
                self.unreadable += 1  # an unreadable line, not a step left out by thinning
                self.step_count -= 1
                continue
            steps_kept += isinstance(event, ev.StepEvent)
            events.append(event)
        dropped: dict[str, int] = {}
        for (kind, _), spread in self.others.items():
            left_out = spread.count - len({k[0] for k in spread.kept()})
            tag = str(kind.__struct_config__.tag)  # as the stream names it: sys, warning
            dropped[tag] = dropped.get(tag, 0) + left_out
        return Thinned(
            events,
            self.unreadable,
            self.step_count,
            steps_kept,
            {name: n for name, n in dropped.items() if n},
        )


def read_thinned(path: Path) -> Thinned:
    """The events of an ``events.jsonl``, thinned as above; a torn last line (a crash
    mid-write) is skipped. Raises OSError when the file cannot be read at all."""
    reader = _Reader()
    with files.open_file(path, STREAMED_BYTES) as fh:
        partial = b""
        skipping = False  # inside a line over MAX_LINE: drop bytes up to its end
        while chunk := fh.read(CHUNK):
            if skipping:
                end = chunk.find(b"\n")
                if end < 0:
                    continue
                chunk, skipping = chunk[end + 1 :], False
                reader.unreadable += 1
            lines = (partial + chunk).split(b"\n")
            partial = lines.pop()
            if len(partial) > MAX_LINE:
                partial, skipping = b"", True
            reader.lines(lines)
        if partial.strip() and not skipping:
            reader.lines([partial])  # the last line, without its newline: whole, or torn
    return reader.result()
