"""A watched step's figures, once they have landed on the host, as the engine reports its
own: a ``step`` event (``core.records.step_event``), the run's tally (``core.records.tally``),
and the notes a skipped or non-finite step (or a run without FLOPs) calls for. Runs on the
monitor's thread, never the training thread's."""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable

import torch

from ampscope.core import events as ev
from ampscope.core.records.step_event import step_event
from ampscope.core.records.tally import StepTally
from ampscope.engine.step.metrics import MemoryReader
from ampscope.watching.messages import StepNotes
from ampscope.watching.readout import RSS_EVERY_S, Raw, StepValues


class StepReport:
    def __init__(
        self,
        tally: StepTally,
        notes: StepNotes,
        emit: Callable[..., None],
        bad_step: Callable[[], None],
    ) -> None:
        """``bad_step`` is told of a step that was skipped or not finite."""
        self.tally, self.notes, self.emit, self.bad_step = tally, notes, emit, bad_step
        # the device's, once the run knows it is on a GPU
        self.memory = MemoryReader(torch.device("cpu"), host_every_s=RSS_EVERY_S)
        self.peak: float | None = None  # the device's peak TFLOP/s, for MFU
        # FLOPs counted on the first step (count_flops) are the first step's: a later step's
        # are in proportion to its tokens (or samples) over the first step's.
        self.counted = False
        self.first_size: tuple[bool, float] | None = None  # (by tokens?, the first step's)

    def report(self, v: StepValues, flops: float | None) -> None:
        """One landed step; ``flops``: per step, when known."""
        flops = self._flops(v, flops)
        scaled = not math.isnan(v.scale)
        skipped = scaled and v.scale < v.scale_before
        finite = v.loss is None or math.isfinite(v.loss)
        step = step_event(
            v.step,
            v.step_ms,
            v.loss,
            skipped,
            loss_scale=v.scale,
            grad_norm=v.grad_norm,
            samples=v.samples,
            tokens=v.tokens,
            flops=flops,
            peak_tflops=self.peak,
            memory=self.memory.read(),
            zeros=v.zeros,
            lr=v.lr,
        )
        self.emit(step)
        self.tally.add(
            v.step,
            v.step_ms,
            v.loss,
            skipped,
            memory=ev.peak_memory(step),
            samples=v.samples,
            tokens=v.tokens if step.tokens_per_s is not None else None,
            flops=flops if self.counted else None,
            instrumented=step.grad_zero_frac is not None,
        )
        if finite:
            self.notes.nonfinite = 0
        if skipped or not finite:
            self.bad_step()  # numerics sample the next step: it may show the inf again
        if skipped or not finite or not flops:
            for event in self.notes.after(v, skipped, scaled, finite, bool(flops)):
                self.emit(event, urgent=True)

    def _flops(self, v: StepValues, flops: float | None) -> float | None:
        if self.first_size is None:
            by_tokens = bool(v.tokens)
            self.first_size = (by_tokens, float((v.tokens if by_tokens else v.samples) or 0))
        by_tokens, first = self.first_size
        size = v.tokens if by_tokens else v.samples
        if not (flops and self.counted and first and size and math.isfinite(size)):
            return flops
        return flops * size / first

    def report_all(self, landed: deque[Raw], flops: float | None, most: int = 0) -> None:
        """Every landed step (``most``: at most that many), oldest first; a fault empties
        ``landed`` and propagates."""
        left = most or len(landed)
        try:
            while landed and left > 0:
                left -= 1
                self.report(StepValues.from_raw(landed.popleft()), flops)
        except Exception:
            landed.clear()
            raise


class Ticker:
    """Calls ``work`` every ``period`` seconds on a daemon thread of its own, until stopped."""

    def __init__(self, period: float, work: Callable[[], None], name: str) -> None:
        self.period, self.work = period, work
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.work()

    def stop(self, wait_s: float = 0.0) -> None:
        """No more calls; wait up to ``wait_s`` for one under way to end."""
        self._stop.set()
        if wait_s > 0 and self._thread is not threading.current_thread():
            self._thread.join(wait_s)
