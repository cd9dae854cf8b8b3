"""Fakes for the seams where ampscope meets the machine: tests hand these in as arguments
instead of patching torch.cuda (or ampscope's own modules) by name."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any


@dataclass
class FakeCuda:
    """A machine with ``count`` GPUs of one kind, as ``ampscope.engine.device.Cuda`` and
    ``CudaMemory`` ask about it: what torch.cuda would answer, with no GPU here."""

    name: str = "NVIDIA H200"
    sms: int = 132
    count: int = 2
    capability: tuple[int, int] = (9, 0)
    total_memory: int = 141 << 30
    available: bool = True
    chosen: list[int] = field(default_factory=list)  # each index set_device was given
    peak: int = 0  # the allocator's peak so far
    held: int = 0  # what the allocator holds now: a restarted peak starts here
    stats: dict[str, Any] = field(default_factory=dict)  # memory_stats_as_nested_dict's

    def is_available(self) -> bool:
        return self.available

    def device_count(self) -> int:
        return self.count

    def current_device(self) -> int:
        return 0

    def set_device(self, device: Any) -> None:
        self.chosen.append(device)

    def get_device_properties(self, device: Any) -> Any:
        major, minor = self.capability
        return SimpleNamespace(
            name=self.name,
            major=major,
            minor=minor,
            total_memory=self.total_memory,
            uuid="u",
            multi_processor_count=self.sms,
        )

    def memory_stats_as_nested_dict(self, device: Any = None) -> dict[str, Any]:
        return self.stats

    def max_memory_allocated(self, device: Any = None) -> int:
        return self.peak

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self.peak = self.held


@dataclass
class FakeThreads:
    """A CPU's matmul threads, as ``ampscope.engine.machine.bench.Threads``: two unless told,
    whatever OMP_NUM_THREADS the suite runs under."""

    n: int = 2

    def get(self) -> int:
        return self.n

    def set(self, n: int) -> None:
        self.n = n
