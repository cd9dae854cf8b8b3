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

from ampscope.core.profiles.rules import (
    PHASE_CLASS,
    PHASE_PREFIX,
    OpTime,
    decides_itself,
    is_cast,
    op_class,
    phase_of,
    short_dtype,
)

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


def event_class(event: Any, phase: str | None) -> str:
    """What an op does: its own class, or where that is generic (an elementwise kernel, a
    view), its caller's: ``aten::clamp_min`` under ``aten::relu`` is the activation's,
    ``aten::threshold_backward`` under autograd's ``ReluBackward0`` too, and the bias copy
    ``aten::addmm`` makes is the matmul's. The walk stops at the engine's ranges."""
    cls = op_class(event.name, phase)
    if decides_itself(event.name, cls) or phase in PHASE_CLASS:
        return cls
    parent = event.cpu_parent
    if parent is None or phase_of(parent.name) is not None:
        return cls
    caller = event_class(parent, phase)
    return caller if caller != "other" else cls


WRAPPERS = ("aten::linear", "aten::matmul")
"""Dense ops that call the one that does the work: under autocast their inputs are the
model's fp32, the kernel's are bf16."""


def _dtype(event: Any, cls: str, kernel: str = "") -> str | None:
    """The format a dense op's time ran in: its own inputs' where it does the work itself;
    for time spent on a dense op's behalf (addmm's bias copy, the bias sum of its backward,
    autograd's node, a wrapper's dispatch), the format of the op that did the work for the
    same caller, so that a class's formats cover all of its time; else its kernel's name."""
    if cls not in DENSE:
        return None
    if _works(event, cls):
        own = short_dtype(_inputs(event))
        if own:
            return own
    return _callers_format(event, cls) or short_dtype((), kernel)


def _works(event: Any, cls: str) -> bool:
    return event.name not in WRAPPERS and op_class(event.name) == cls


def _inputs(event: Any) -> Sequence[str]:
    return getattr(event, "input_dtypes", None) or ()


def _callers_format(event: Any, cls: str) -> str | None:
    """The format of the op doing the dense work nearest to ``event``: under each caller of
    the class in turn (itself first), up to the engine's range."""
    node = event
    while node is not None and phase_of(node.name) is None:
        if op_class(node.name) == cls:
            found = _working_format(node, cls)
            if found:
                return found
        node = node.cpu_parent
    return None


def _working_format(node: Any, cls: str, depth: int = 0) -> str | None:
    """The format of the first op under ``node`` (itself included) that does the work."""
    if _works(node, cls):
        own = short_dtype(_inputs(node))
        if own:
            return own
    if depth >= 8:
        return None
    for child in getattr(node, "cpu_children", None) or ():
        found = _working_format(child, cls, depth + 1)
        if found:
            return found
    return None


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
        cls = event_class(e, _phase(e))
        rows.append(OpTime(e.name, cls, float(e.self_cpu_time_total), 1, _dtype(e, cls), _casts(e)))
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
            by_op = event_class(launcher, phase)
            cls = by_op if by_op != "other" else cls
        dtype = _dtype(launcher, cls, e.name) if launcher is not None else _dtype(e, cls, e.name)
        cast = _casts(launcher) if launcher is not None else False
        rows.append(OpTime(e.name, cls, end - start, 1, dtype, cast))
        spans.append((start, end))
    return rows, covered_us(spans)


def _casts(event: Any) -> bool:
    """Whether an op converts between number formats: a copy whose destination and source
    dtypes differ (torch.profiler records them with ``record_shapes``), or a conversion
    (``aten::to``, ``aten::_to_copy``) whose copy does. ``addmm`` copying its bias into its
    output is a copy, not a cast."""
    if not is_cast(event.name):
        return False
    if event.name == "aten::copy_":
        dtypes = [d for d in (getattr(event, "input_dtypes", None) or [])[:2] if d]
        return len(dtypes) == 2 and dtypes[0] != dtypes[1]
    return any(_casts(child) for child in getattr(event, "cpu_children", None) or [])


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
