"""torch.profiler's events as self time per op, each with its class.

On a CPU the time is the ops' own CPU time; on a GPU it is the kernels' device time, each
kernel classed with the op that launched it (for its phase and its number format), and the
time with no kernel running is the idle gap. The events are read by their attributes alone
(``FunctionEvent``: name, device_type, self_cpu_time_total, cpu_parent, time_range, ...), so
the tests can hand in fakes for the GPU's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ampscope.core.profile_rules import OpTime, op_class, phase_of, short_dtype

DENSE = ("matmul", "conv", "attention")


def _device(event: Any) -> str:
    return str(getattr(event.device_type, "name", event.device_type)).upper()


def _phase(event: Any) -> str | None:
    """The engine's range an event ran under, found up its parents."""
    node = event
    while node is not None:
        phase = phase_of(node.name)
        if phase is not None:
            return phase
        node = node.cpu_parent
    return None


def _dtype(event: Any, cls: str, kernel: str = "") -> str | None:
    if cls not in DENSE:
        return None
    return short_dtype(getattr(event, "input_dtypes", None) or (), kernel)


def cpu_op_times(events: Sequence[Any]) -> list[OpTime]:
    """Every CPU op's self time, on the thread that ran the step (the one with the engine's
    ranges): another thread's ops overlap the step and would be counted twice."""
    marked = [e for e in events if _device(e) == "CPU" and phase_of(e.name)]
    thread = marked[0].thread if marked else None
    rows = []
    for e in events:
        if _device(e) != "CPU" or (thread is not None and e.thread != thread):
            continue
        if e.self_cpu_time_total <= 0:
            continue
        cls = op_class(e.name, _phase(e))
        rows.append(OpTime(e.name, cls, float(e.self_cpu_time_total), 1, _dtype(e, cls)))
    return rows


def device_op_times(events: Sequence[Any]) -> tuple[list[OpTime], float]:
    """Every kernel, memcpy and memset on the GPU with its class, and the time they cover
    (their union, in µs: kernels on several streams overlap)."""
    launchers = {e.id: e for e in events if _device(e) == "CPU"}
    rows, spans = [], []
    for e in events:
        if _device(e) != "CUDA":
            continue
        start, end = float(e.time_range.start), float(e.time_range.end)
        if end <= start:
            continue
        launcher = launchers.get(getattr(e, "linked_correlation_id", None))
        phase = _phase(launcher) if launcher is not None else None
        cls = op_class(e.name, phase)
        dtype = _dtype(launcher, cls, e.name) if launcher is not None else _dtype(e, cls, e.name)
        rows.append(OpTime(e.name, cls, end - start, 1, dtype))
        spans.append((start, end))
    return rows, covered_us(spans)


def covered_us(spans: Iterable[tuple[float, float]]) -> float:
    """The length of the union of intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total
