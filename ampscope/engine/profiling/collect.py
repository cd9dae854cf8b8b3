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

from ampscope.core.profile_rules import PHASE_PREFIX, OpTime, op_class, phase_of, short_dtype

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
    (their union, in µs: kernels on several streams overlap).

    A kernel is classed by the op that launched it where that op says more than the kernel's
    name (``aten::native_layer_norm_backward`` launches ``GammaBetaBackward...``), and takes
    that op's input formats. The engine's own ranges also appear on the GPU's timeline, as
    user annotations spanning the kernels they hold: they are not work, and are left out.
    """
    launchers = _frontend_ops(events)
    rows, spans = [], []
    for e in events:
        if _device(e) != "CUDA" or _is_range(e):
            continue
        start, end = float(e.time_range.start), float(e.time_range.end)
        if end <= start:
            continue
        launcher = launchers.get(getattr(e, "linked_correlation_id", 0))
        phase = _phase(launcher) if launcher is not None else None
        cls = op_class(e.name, phase)
        if launcher is not None and cls not in KERNEL_DECIDES:
            by_op = op_class(launcher.name, phase)
            cls = by_op if by_op != "other" else cls
        dtype = _dtype(launcher, cls, e.name) if launcher is not None else _dtype(e, cls, e.name)
        rows.append(OpTime(e.name, cls, end - start, 1, dtype))
        spans.append((start, end))
    return rows, covered_us(spans)


KERNEL_DECIDES = ("memcpy", "communication")
"""Classes a kernel's own name settles, whatever op launched it (``aten::copy_`` launches
``Memcpy DtoD``)."""


def _frontend_ops(events: Sequence[Any]) -> dict[int, Any]:
    """torch's ops on the CPU, by the id their kernels are linked to. The CUDA runtime's calls
    (``cudaLaunchKernel``) are CPU events too, but their ids are CUPTI's correlation ids, a
    count of its own that takes the same numbers: they are linked to an op themselves
    (``linked_correlation_id`` set), and are left out here, as torch.profiler does."""
    return {
        e.id: e
        for e in events
        if _device(e) == "CPU"
        and not getattr(e, "linked_correlation_id", 0)
        and not getattr(e, "is_async", False)
    }


def _is_range(event: Any) -> bool:
    """A ``record_function`` range as the GPU's timeline shows it (``gpu_user_annotation``)."""
    return bool(getattr(event, "is_user_annotation", False)) or event.name.startswith(PHASE_PREFIX)


def covered_us(spans: Iterable[tuple[float, float]]) -> float:
    """The length of the union of intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total
