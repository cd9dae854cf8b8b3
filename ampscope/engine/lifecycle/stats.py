"""What a run has seen so far: enough to write ``done`` at any moment, also after a fault."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

from ampscope.core import events as ev
from ampscope.core.records import summary


@dataclass
class RunStats:
    warmup_steps: int
    compiled: bool = False  # the first step compiled the model: it is never a timed step
    step_ms: list[float] = field(default_factory=list)  # by step, from step 0
    cpu_ms: list[float | None] = field(default_factory=list)  # by step: CPU devices' CPU time
    instrumented: set[int] = field(default_factory=set)  # steps that also counted grad zeros
    profiled: set[int] = field(default_factory=set)  # steps torch.profiler slowed
    steps_done: int = 0
    loss_first: float | None = None
    loss_final: float | None = None  # the last step's, finite or not
    loss_final_step: int | None = None
    skipped: int = 0
    nonfinite_run: int = 0  # consecutive non-finite losses, the current streak
    compile_s: float | None = None
    mem_peak: int | None = None  # the training peak: the statistics are reset after compile
    mem_peak_compile: int | None = None  # CUDA: the compile step's peak (autotuning included)
    step_running: int | None = (
        None  # the step the loop is in (a fault's step), not the last reported
    )
    started: float = field(default_factory=time.monotonic)
    rank_ms: list[list[float]] = field(default_factory=list)  # several processes: by rank
    rank_mem_peak: list[int | None] = field(default_factory=list)

    def add_rank_steps(self, figures: list[tuple[float, int | None]]) -> None:
        """Each rank's (step time, memory) for one step, by rank."""
        if not self.rank_ms:
            self.rank_ms = [[] for _ in figures]
            self.rank_mem_peak = [None for _ in figures]
        for rank, (ms, mem) in enumerate(figures):
            self.rank_ms[rank].append(ms)
            if mem is not None:
                self.rank_mem_peak[rank] = max(self.rank_mem_peak[rank] or 0, mem)

    def rank_done(self, checksums: list[str | None] | None = None) -> list[ev.RankDone] | None:
        """Each rank's median step (after warm-up, as for the job's) and memory peak."""
        if not self.rank_ms:
            return None
        out = []
        kept = self.timed_steps()
        for rank, times in enumerate(self.rank_ms):
            timed = [times[i] for i in kept if i < len(times)]
            out.append(
                ev.RankDone(
                    rank=rank,
                    step_ms_median=statistics.median(timed) if timed else None,
                    mem_peak=self.rank_mem_peak[rank],
                    skipped_steps=self.skipped,  # the same on every rank, or the run failed
                    param_checksum=checksums[rank] if checksums else None,
                )
            )
        return out

    def cpu_ms_median(self) -> float | None:
        """The timed steps' median CPU time, as ``step_ms_median`` is of their wall time;
        None unless every timed step has one (``bench --clock cpu``)."""
        times = [self.cpu_ms[i] for i in self.timed_steps() if i < len(self.cpu_ms)]
        if not times or any(t is None for t in times):
            return None
        return statistics.median(t for t in times if t is not None)

    def timed(self) -> list[float]:
        """The step times that say how fast training runs (``timed_steps``)."""
        return [self.step_ms[i] for i in self.timed_steps()]

    def timed_steps(self) -> list[int]:
        """The steps that say how fast training runs (``core.records.summary.timed_steps``)."""
        return summary.timed_steps(
            len(self.step_ms), self.warmup_steps, self.compiled, self.instrumented, self.profiled
        )

    def done(
        self,
        status: ev.DoneStatus,
        samples: int,
        tokens: int | None,
        flops: float,
        peak: float | None,
        error: str | None = None,
        world_size: int = 1,
        ranks: list[ev.RankDone] | None = None,
    ) -> ev.DoneEvent:
        """``samples``, ``tokens`` and ``flops`` are one rank's per step; the rates are the
        job's (times ``world_size``), MFU against ``world_size`` times the peak."""
        tokens = tokens * world_size if tokens else tokens
        peak = peak * world_size if peak else peak
        speed = summary.rates(
            self.step_ms, self.timed_steps(), samples * world_size, tokens, flops * world_size, peak
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
