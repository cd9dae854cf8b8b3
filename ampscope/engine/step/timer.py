"""Step timing and metric read-back without stalling the GPU.

Per step, the loop hands over a small tensor of metrics (loss, grad norm, loss scale, ...).
On the CPU they are read at once. On CUDA the step is timed with CUDA events and the metrics
are copied to pinned host memory without blocking; a step is reported once its copy has
landed (``Event.query()``, no sync), normally one step later. Only ``drain()`` at the end of
the run synchronises.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch

RING = 64  # steps the CPU may run ahead before the oldest read blocks


@dataclass
class FinishedStep:
    step: int
    step_ms: float
    values: list[float]
    cpu_ms: float | None = None  # the process's CPU time over the step (CPU devices)


class CpuStepTimer:
    """The host's wall clock, and beside it the process's CPU time (``time.process_time``, all
    threads): on a shared machine other tenants stretch the first, hardly the second."""

    def __init__(self) -> None:
        self._t0 = 0.0
        self._cpu0 = 0.0
        self._ready: list[FinishedStep] = []

    def begin(self) -> None:
        self._t0 = time.perf_counter()
        self._cpu0 = time.process_time()

    def leave_out(self, ms: float) -> None:
        """The step running now is timed without these ``ms`` (a rerun inside it)."""
        self._t0 += ms / 1000.0

    def end(self, step: int, metrics: torch.Tensor) -> None:
        ms = (time.perf_counter() - self._t0) * 1000.0
        cpu_ms = (time.process_time() - self._cpu0) * 1000.0
        self._ready.append(FinishedStep(step, ms, metrics.tolist(), cpu_ms))

    def poll(self) -> list[FinishedStep]:
        ready, self._ready = self._ready, []
        return ready

    def drain(self) -> list[FinishedStep]:
        return self.poll()


@dataclass
class _InFlight:
    step: int
    start: torch.cuda.Event
    end: torch.cuda.Event
    host: torch.Tensor


class CudaStepTimer:
    def __init__(self, width: int) -> None:
        self._pinned = [
            torch.empty(width, dtype=torch.float32, pin_memory=True) for _ in range(RING)
        ]
        self._next = 0
        self._start: torch.cuda.Event | None = None
        self._inflight: deque[_InFlight] = deque()
        self._landed: list[FinishedStep] = []

    def begin(self) -> None:
        self._start = torch.cuda.Event(enable_timing=True)
        self._start.record()

    def end(self, step: int, metrics: torch.Tensor) -> None:
        host = self._pinned[self._next]
        self._next = (self._next + 1) % RING
        if len(self._inflight) == RING:  # far ahead: wait for the oldest, the GPU stays busy
            self._inflight[0].end.synchronize()
            self._landed.append(self._read(self._inflight.popleft()))
        host.copy_(metrics.float(), non_blocking=True)
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        assert self._start is not None
        self._inflight.append(_InFlight(step, self._start, end, host))

    def poll(self) -> list[FinishedStep]:
        ready, self._landed = self._landed, []
        while self._inflight and self._inflight[0].end.query():
            ready.append(self._read(self._inflight.popleft()))
        return ready

    @staticmethod
    def _read(item: _InFlight) -> FinishedStep:
        return FinishedStep(item.step, item.start.elapsed_time(item.end), item.host.tolist())

    def drain(self) -> list[FinishedStep]:
        torch.cuda.synchronize()
        return self.poll()


def make_step_timer(device: torch.device, width: int) -> CpuStepTimer | CudaStepTimer:
    return CudaStepTimer(width) if device.type == "cuda" else CpuStepTimer()
