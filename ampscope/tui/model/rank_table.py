"""Each rank of a run on several processes, as the dashboard sees it (Textual-free).

Fed every event by ``RunState.ingest``: ``hello`` names the ranks and their devices, each
``step`` carries every rank's step time and memory, each ``sys`` every rank's latest GPU (or
process) figures. A one-process run leaves the table empty and the strip hidden.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from ampscope.core import events as ev
from ampscope.core.text import visible

RECENT = 20
"""Steps each rank's step time is the median of, as for the Step time card."""


@dataclass(frozen=True)
class RankRow:
    rank: int
    device: str
    step_ms: float | None  # median of the rank's recent steps
    memory: int | None  # bytes: the GPU's used memory (NVML), else the step's allocator figure
    util: float | None  # %: the GPU's utilisation, else the process's CPU
    util_is_cpu: bool


@dataclass(frozen=True)
class Slowest:
    rank: int
    step_ms: float
    median_ms: float  # the median over ranks of their recent medians

    @property
    def lag_ms(self) -> float:
        return self.step_ms - self.median_ms


class RankTable:
    def __init__(self) -> None:
        self.world_size = 1
        self.strategy: str | None = None
        self.backend: str | None = None
        self.devices: dict[int, str] = {}
        self._ms: dict[int, deque[float]] = {}
        self._step_mem: dict[int, int | None] = {}
        self._sys: dict[int, ev.RankSys] = {}

    @property
    def shown(self) -> bool:
        return self.world_size > 1

    @property
    def on_gpus(self) -> bool:
        """GPU ranks (memory and utilisation are the GPU's); else the process's RSS and CPU."""
        if self.devices:
            return all(d.startswith("cuda") for d in self.devices.values())
        return any(s.gpu_util is not None for s in self._sys.values())

    def ingest(self, event: ev.Event) -> None:
        if isinstance(event, ev.HelloEvent):
            self.world_size = event.world_size
            # the strip's header names them as the record does: escaped, never obeyed
            self.strategy = visible(event.strategy, 40) if event.strategy else None
            self.backend = visible(event.backend, 40) if event.backend else None
            self.devices = {r.rank: r.device for r in event.ranks or []}
        elif isinstance(event, ev.StepEvent) and event.ranks:
            self.world_size = max(self.world_size, len(event.ranks))
            for r in event.ranks:
                self._ms.setdefault(r.rank, deque(maxlen=RECENT)).append(r.step_ms)
                self._step_mem[r.rank] = r.mem_allocated
        elif isinstance(event, ev.SysEvent) and event.ranks:
            for s in event.ranks:
                self._sys[s.rank] = s

    def rows(self) -> list[RankRow]:
        ranks = sorted(set(self._ms) | set(self._sys) | set(self.devices))
        return [self._row(r) for r in ranks]

    def _row(self, rank: int) -> RankRow:
        times = self._ms.get(rank)
        sample = self._sys.get(rank)
        gpu_util = sample.gpu_util if sample else None
        memory = sample.gpu_mem_used if sample and sample.gpu_mem_used is not None else None
        return RankRow(
            rank=rank,
            device=self.devices.get(rank, ""),
            step_ms=statistics.median(times) if times else None,
            memory=memory if memory is not None else self._step_mem.get(rank),
            util=gpu_util if gpu_util is not None else (sample.proc_cpu if sample else None),
            util_is_cpu=gpu_util is None,
        )

    def slowest(self) -> Slowest | None:
        timed = [(r.step_ms, r.rank) for r in self.rows() if r.step_ms is not None]
        if len(timed) < 2:
            return None
        ms, rank = max(timed)
        return Slowest(rank, ms, statistics.median(t for t, _ in timed))
