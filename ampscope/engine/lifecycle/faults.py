"""Every fault of a run turned into one error event a watcher can show, and its exit code."""

from __future__ import annotations

import errno
import resource
import traceback

import torch

from ampscope.core import events as ev
from ampscope.core import presets
from ampscope.core.numerics.event import INPUTS, OWN
from ampscope.core.numerics.nonfinite import range_advice
from ampscope.core.records.tally import StepTally
from ampscope.core.records.writer import RecordLost
from ampscope.core.text import cut, exit_call
from ampscope.engine.device import DeviceInfo
from ampscope.engine.lifecycle.exits import EXIT_FAILED, EXIT_USAGE
from ampscope.engine.lifecycle.record import IO_HINT
from ampscope.engine.step.metrics import EveryStepSkipped, NonFiniteLoss, ReplicasDiverged
from ampscope.engine.workloads.user_code import (
    exception_text,
    raised_by_ampscope,
    user_traceback,
)

OOM_HINT = (
    "Lower batch_size or the workload size, use amp-bf16 or bf16 (smaller activations and "
    "weights), or recompute activations (activation checkpointing)."
)


def left_early(exc: SystemExit, tally: StepTally) -> ev.ErrorEvent:
    """The user's code called ``sys.exit()`` inside the run (at import, in the factory, in
    ``forward``): the process would end silently with a torn record, so it is a failure."""
    step = tally.step_running
    where = (
        f"at step {step}"
        if step is not None
        else "before the first step (importing your code, in make, or in the forward that "
        "counts the FLOPs)"
    )
    call = exit_call(exc.code)
    return ev.ErrorEvent(
        kind="exception",
        message=(
            f"your code called {call} {where}, which ends the process: the run stopped there "
            "and is recorded failed. Raise an exception instead to say why, or return."
        ),
        step=step,
        traceback=user_traceback(exc),  # none of its frames theirs (--model sys:exit): none
    )


def first_words(first: ev.FirstNonfinite | None) -> str:
    """Where the inf/NaN first appeared, as a sentence to add (nothing when not found)."""
    if first is None:
        return ""
    said = "" if first.source in (OWN, INPUTS) else f" ({first.pass_} pass)"  # in the words
    return f" inf/NaN first appears in {first.place()}{said} at step {first.step}."


def every_step_skipped(exc: EveryStepSkipped, preset: str) -> ev.ErrorEvent:
    """A run that finished without one update: the GradScaler skipped every step."""
    message = (
        f"Every step skipped ({exc.steps} of {exc.steps}): the GradScaler found inf/NaN in "
        "the gradients at every step, so the weights were never updated; the loss scale fell "
        f"from {exc.scale_first:g} to {exc.scale_last:g} without finding a finite step."
    )
    if exc.first is not None:
        message += first_words(exc.first)
        if exc.first.pass_ == "forward":
            message += (
                " An overflow in the forward pass is no loss scale's to fix: amp-bf16 has "
                "fp32's range."
            )
    else:
        message += (
            f" 'ampscope numerics {preset}', with this run's flags, names the layer where the "
            "inf/NaN appears."
        )
    return ev.ErrorEvent(kind="nan", message=message, step=exc.steps - 1)


def failure(
    exc: BaseException, preset: presets.Preset, info: DeviceInfo | None, tally: StepTally
) -> tuple[ev.ErrorEvent, int]:
    """The error event for a fault and the exit code it gives."""
    if isinstance(exc, presets.ConfigError):
        # a fault of a user's model code carries its traceback, filtered to their frames
        trace = getattr(exc, "traceback", None)
        return ev.ErrorEvent(kind="config", message=str(exc), traceback=trace), EXIT_USAGE
    if isinstance(exc, NonFiniteLoss):
        where = f" (the loss on rank(s) {', '.join(map(str, exc.ranks))})" if exc.ranks else ""
        if exc.step == 0 and preset.precision in ("fp32", "tf32", "fp64"):
            cause = (  # before any update, in a wide format: the model or its data
                "before any update, in a format with fp32's range or more: the model or its "
                "data gives it (a log or a division by zero, a NaN in a batch), not the format."
            )
        else:
            cause = "the numbers left the format's range. " + (
                "Pure fp16 has no master weights or loss scaling; use amp-fp16 or amp-bf16."
                if preset.precision == "fp16"
                else range_advice(preset.precision, preset.grad_clip)
            )
        message = (
            f"Loss became {exc.loss} at step {exc.step}{where}: {cause}{first_words(exc.first)}"
        )
        return ev.ErrorEvent(kind="nan", message=message, step=exc.step), EXIT_FAILED
    if isinstance(exc, EveryStepSkipped):
        return every_step_skipped(exc, preset.name), EXIT_FAILED
    if isinstance(exc, ReplicasDiverged):
        return ev.ErrorEvent(kind="diverged", message=str(exc), step=exc.step), EXIT_FAILED
    if isinstance(exc, RecordLost):
        event = ev.ErrorEvent(
            kind="io", message=exc.message, step=tally.steps_done or None, hint=IO_HINT
        )
        return event, EXIT_FAILED
    reason = out_of_memory(exc)
    if reason is not None:
        step = tally.step_running if tally.step_running is not None else tally.steps_done
        gpu = info.device if info is not None and info.is_cuda else None  # a CPU run has no pool
        event = ev.ErrorEvent(
            kind="oom",
            message=f"Out of memory at step {step}: {reason}",
            step=step,
            hint=OOM_HINT,
            mem_allocated=torch.cuda.memory_allocated(gpu) if gpu else None,
            mem_reserved=torch.cuda.memory_reserved(gpu) if gpu else None,
        )
        return event, EXIT_FAILED
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    message = f"{type(exc).__name__}: {exception_text(exc)}"
    if raised_by_ampscope(exc):  # its own hooks: every frame, and whose fault it is
        message = f"ampscope's own instrumentation failed (a fault of ampscope, not of the model): {message}"
    elif preset.workload.model is not None:  # the user's model failed: their frames, as theirs
        trace = user_traceback(exc) or trace
    event = ev.ErrorEvent(
        kind="exception",
        message=message,
        step=tally.steps_done or None,
        traceback=cut(trace),
        hint=descriptors_hint(exc),
    )
    return event, EXIT_FAILED


def descriptors_hint(exc: BaseException) -> str | None:
    """What to do when the process ran out of file descriptors (EMFILE, ENFILE anywhere in the
    chain; DataLoader workers pass tensors through them): None for any other fault."""
    link: BaseException | None = exc
    for _ in range(8):
        if link is None:
            return None
        errno_ = getattr(link, "errno", None)
        if errno_ in (errno.EMFILE, errno.ENFILE) or "Too many open files" in exception_text(link):
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            return (
                f"The process ran out of file descriptors (ulimit -n is {limit}): raise the "
                "limit (ulimit -n 4096 in the shell that starts the run), or lower the "
                "DataLoader's num_workers in your factory."
            )
        link = link.__cause__ or link.__context__
    return None


CPU_ALLOC_FAILED = "DefaultCPUAllocator: can't allocate memory"


def out_of_memory(exc: BaseException) -> str | None:
    """The first line of an allocation failure anywhere in the cause chain; None if none.

    torch.compile wraps an OOM of compiling or autotuning (BackendCompilerFailed, ...): the
    allocation failure is its cause, or the cause's cause.
    """
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        reason = _allocation_failure(link)
        if reason is not None:
            return reason
        inner = getattr(link, "inner_exception", None)  # torch._dynamo's wrappers keep it too
        link = (
            link.__cause__
            or (inner if isinstance(inner, BaseException) else None)
            or (None if link.__suppress_context__ else link.__context__)
        )
    return None


def _allocation_failure(exc: BaseException) -> str | None:
    """torch raises OutOfMemoryError for CUDA only; a failed host allocation is a RuntimeError
    from the CPU allocator (or Python's MemoryError)."""
    text = exception_text(exc)
    if isinstance(exc, torch.OutOfMemoryError):
        return text.splitlines()[0] if text else "CUDA out of memory"
    if isinstance(exc, MemoryError):
        return "the host could not allocate memory (MemoryError)"
    if isinstance(exc, RuntimeError) and CPU_ALLOC_FAILED in text:
        return text[text.index(CPU_ALLOC_FAILED) :].splitlines()[0]
    return None
