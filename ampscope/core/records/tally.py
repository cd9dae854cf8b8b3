"""What a run has seen so far: enough to write ``done`` at any moment, also after a fault.

One tally for engine runs and watched loops alike (``engine.step.metrics.StepReporter`` and
``watching.reporting.StepReport`` add each step to it), so that Compare sets them side by side
on the same statistics. Its memory does not grow with the run: each figure of a step goes into
a ``Distribution`` (``core.records.distribution``) of the steps of its kind, a kind being what
the summary's rule (``core.records.summary.timed_steps``) tells apart: the first step, a
warm-up step or a later one, and whether torch.profiler slowed it or it also counted gradient
zeros. ``done`` takes the kinds the rule keeps once the run's length is known. Up to 65,536
steps of a kind the figures are exact; beyond, within 0.05 % (``distribution.ACCURACY``).

Torch-free.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from ampscope.core import events as ev
from ampscope.core.records import summary
from ampscope.core.records.distribution import Distribution, Figures, merged

FIRST, WARMUP, LATER = 0, 1, 2
"""The first step, a warm-up step after it, a step after the warm-up."""
SETTLE_EVERY = 4096
"""Steps between two folds of the figures into buckets (each fold: a few ms)."""


class StepKind:
    """The figures of the steps of one kind (``StepTally``)."""

    __slots__ = (
        "cpu_ms",
        "flops",
        "instrumented",
        "profiled",
        "ranks",
        "samples",
        "step_ms",
        "tokens",
    )

    def __init__(self, profiled: bool, instrumented: bool) -> None:
        self.profiled = profiled  # torch.profiler slowed these steps
        self.instrumented = instrumented  # these steps also counted gradient zeros
        self.step_ms = Distribution()
        self.cpu_ms = Distribution()  # where the step had one (not a GPU's step)
        self.samples = Distribution()  # where the step gave them (engine runs, watched loops)
        self.tokens = Distribution()
        self.flops = Distribution()  # an engine run's, as its batches change
        self.ranks: list[Distribution] = []  # several processes: each rank's step time

    def settle(self) -> None:
        figures = (self.step_ms, self.cpu_ms, self.samples, self.tokens, self.flops)
        for figure in (*figures, *self.ranks):
            figure.settle()


class StepTally:
    """A run's books: its steps' figures by kind, its losses, skipped steps and peaks.

    ``compiled``: the first step compiles the model, so it is never a timed step (a watched
    loop learns it after that step: ``compile_s`` set says the same).
    """

    def __init__(self, warmup_steps: int, compiled: bool = False) -> None:
        self.warmup_steps = warmup_steps
        self.compiled = compiled
        self.steps_done = 0
        self.loss_first: float | None = None
        self.loss_final: float | None = None  # the last step's, finite or not
        self.loss_final_step: int | None = None
        self.skipped = 0
        self.nonfinite_run = 0  # consecutive non-finite losses, the current streak
        self.compile_s: float | None = None
        self.mem_peak: int | None = None  # training's: the peak restarts after compile
        self.mem_peak_compile: int | None = None  # CUDA: the compile step's peak
        self.step_running: int | None = None  # the step the loop is in (a fault's step)
        self.started = time.monotonic()
        self.rank_mem_peak: list[int | None] = []  # several processes: by rank
        self.kinds: dict[tuple[int, bool, bool], StepKind] = {}
        self._by_code: list[StepKind | None] = [None] * 12  # the same, found fast (``_kind``)
        self.added = 0  # steps added: the next one's place in the run

    def add(
        self,
        step: int,
        step_ms: float,
        loss: float | None,
        skipped: bool,
        *,
        memory: int | None = None,
        cpu_ms: float | None = None,
        samples: float | None = None,
        tokens: float | None = None,
        flops: float | None = None,
        instrumented: bool = False,
        profiled: bool = False,
        ranks: Sequence[tuple[float, int | None]] | None = None,
    ) -> None:
        """One step. ``loss`` None: the loop gave none. ``memory``: the step's peak bytes.
        ``samples``, ``tokens`` and ``flops``: the step's own, where they change from step
        to step.
        ``ranks``: each rank's (step time, peak bytes), on several processes."""
        place = self.added
        self.added = place + 1
        phase = FIRST if place == 0 else WARMUP if place < self.warmup_steps else LATER
        kind = self._by_code[4 * phase + 2 * profiled + instrumented] or self._kind(
            phase, profiled, instrumented
        )
        kind.step_ms.add(step_ms)
        if cpu_ms is not None:
            kind.cpu_ms.add(cpu_ms)
        if samples is not None:
            kind.samples.add(samples)
        if tokens is not None:
            kind.tokens.add(tokens)
        if flops is not None:
            kind.flops.add(flops)
        if ranks:
            self._add_ranks(kind, ranks)
        if not place % SETTLE_EVERY:
            for each in self.kinds.values():
                each.settle()
        self.steps_done = step + 1
        self.skipped += skipped
        if loss is not None:
            self.loss_final, self.loss_final_step = loss, step  # what happened, finite or not
            if math.isfinite(loss):
                self.nonfinite_run = 0
                if self.loss_first is None:
                    self.loss_first = loss
            else:
                self.nonfinite_run += 1
        if memory is not None and (self.mem_peak is None or memory > self.mem_peak):
            self.mem_peak = memory

    def _kind(self, phase: int, profiled: bool, instrumented: bool) -> StepKind:
        kind = self.kinds[phase, profiled, instrumented] = StepKind(profiled, instrumented)
        self._by_code[4 * phase + 2 * profiled + instrumented] = kind
        return kind

    def _add_ranks(self, kind: StepKind, ranks: Sequence[tuple[float, int | None]]) -> None:
        if not self.rank_mem_peak:
            self.rank_mem_peak = [None for _ in ranks]
        while len(kind.ranks) < len(ranks):
            kind.ranks.append(Distribution())
        for rank, (ms, mem) in enumerate(ranks):
            kind.ranks[rank].add(ms)
            if mem is not None:
                self.rank_mem_peak[rank] = max(self.rank_mem_peak[rank] or 0, mem)

    # ------------------------------------------------------------------ the summary

    def timed_kinds(self) -> list[StepKind]:
        """The kinds of step that say how fast training runs, by the summary's rule
        (``core.records.summary.timed_steps``) over the steps added so far."""
        compiled = self.compiled or self.compile_s is not None
        first = max(self.warmup_steps, int(compiled))
        if self.added > first:
            phases = {LATER, FIRST} if first == 0 else {LATER}
        elif self.added > 1:  # shorter than its warm-up: every step but the first
            phases = {WARMUP}
        else:
            phases = {FIRST} if self.added and not compiled else set()
        kinds = list(self.kinds.items())  # at once: a stop may sum up while the loop adds
        kept = [k for (phase, _, _), k in kinds if phase in phases]
        unprofiled = [k for k in kept if not k.profiled] or kept
        return [k for k in unprofiled if not k.instrumented] or unprofiled

    def timed(self, figure: str = "step_ms") -> Figures:
        """One figure (``step_ms``, ``cpu_ms``, ``samples``, ``tokens``) of the timed steps."""
        return merged(getattr(k, figure) for k in self.timed_kinds())

    def cpu_ms_median(self) -> float | None:
        """The timed steps' median CPU time, as ``step_ms_median`` is of their wall time;
        None unless every timed step has one (``bench --clock cpu``)."""
        kinds = self.timed_kinds()
        if not kinds or any(len(k.cpu_ms) < len(k.step_ms) for k in kinds):
            return None
        return merged(k.cpu_ms for k in kinds).median()

    def rank_done(self, checksums: Sequence[str | None] | None = None) -> list[ev.RankDone] | None:
        """Each rank's median step (over the job's timed steps) and memory peak."""
        if not self.rank_mem_peak:
            return None
        kinds = self.timed_kinds()
        out = []
        for rank, mem_peak in enumerate(self.rank_mem_peak):
            times = merged(k.ranks[rank] for k in kinds if rank < len(k.ranks))
            out.append(
                ev.RankDone(
                    rank=rank,
                    step_ms_median=times.median(),
                    mem_peak=mem_peak,
                    skipped_steps=self.skipped,  # the same on every rank, or the run failed
                    param_checksum=checksums[rank] if checksums else None,
                )
            )
        return out

    def done(
        self,
        status: ev.DoneStatus,
        flops: float | None,
        peak: float | None,
        error: str | None = None,
        *,
        samples: float | None = None,
        tokens: float | None = None,
        world_size: int = 1,
        ranks: list[ev.RankDone] | None = None,
    ) -> ev.DoneEvent:
        """``flops``, ``samples`` and ``tokens`` where every step has the same, are one
        rank's per step (None: the median of what the timed steps gave); ``peak`` is one
        device's TFLOP/s. The rates are the job's (times ``world_size``), MFU against
        ``world_size`` times the peak."""
        kinds = self.timed_kinds()
        if samples is None:
            samples = merged(k.samples for k in kinds).median()
        if tokens is None:
            tokens = merged(k.tokens for k in kinds).median()
        if flops is None:
            flops = merged(k.flops for k in kinds).median()
        speed = summary.rates(
            merged(k.step_ms for k in kinds),
            samples * world_size if samples is not None else None,
            tokens * world_size if tokens else None,
            flops * world_size if flops else None,
            peak * world_size if peak else None,
        )
        return summary.done_event(
            status,
            self,
            speed,
            error,
            mem_peak_compile=self.mem_peak_compile,
            cpu_ms_median=self.cpu_ms_median(),
            world_size=world_size,
            ranks=ranks,
        )
