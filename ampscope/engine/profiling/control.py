"""Profiling a running loop on request: nothing until asked, then torch.profiler over K steps.

The loop calls ``before_step`` and ``after_step`` around every step and takes ``phase`` for
the ranges of the step. Unasked, ``before_step`` reads the clock and, at most twice a second,
looks for the request file a viewer leaves in the run folder (one ``stat``); ``phase`` hands
back one shared do-nothing context. Asked, the profiler runs over the next K steps, the
engine's ranges mark data, forward, backward, scaler and optimizer, and at the end one
``profile`` event holds the split and the trace's path.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from ampscope.core import events as ev
from ampscope.core import profiles
from ampscope.engine.emitter import EventWriter
from ampscope.engine.profiling.collect import cpu_op_times, device_op_times
from ampscope.engine.profiling.trace import save_trace

CHECK_EVERY_S = 0.5
_NOTHING = contextlib.nullcontext()
KINETO_QUIET = "6"
"""torch's profiler library (kineto) writes ``USDT: ... profiler_start`` (and _stop) to the
process's stderr at every profile, between the progress lines. Its level USDT is its highest
(5): a threshold above it keeps the terminal ours. It is read once, at the first profile."""


def quiet_kineto() -> None:
    """Silence kineto's own log lines, unless the user set ``KINETO_LOG_LEVEL`` themselves."""
    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET)


def no_phase(name: str) -> AbstractContextManager[object]:
    return _NOTHING


class ProfileControl:
    """One run's profiles. ``first`` is ``(step, K)``: profile K steps from that step on
    (``ampscope profile``); otherwise only when a viewer asks through ``run_dir``."""

    def __init__(
        self,
        writer: EventWriter,
        device: torch.device,
        run_dir: Path | None = None,
        first: tuple[int, int] | None = None,
    ) -> None:
        self.writer = writer
        self.device = device
        self.run_dir = run_dir
        self.planned = first
        self._request = run_dir / profiles.REQUEST_FILE if run_dir else None
        self._next_check = 0.0
        self._profiler: profile | None = None
        self._first = 0
        self._last = -1
        self._done = -1
        self._t0 = 0.0
        self.phase: Callable[[str], AbstractContextManager[object]] = no_phase
        self.profiled: set[int] = set()  # the steps that ran under the profiler (slower)

    @property
    def active(self) -> bool:
        return self._profiler is not None

    def before_step(self, step: int) -> bool:
        """Starts a profile asked for at this step; True when one started just now."""
        if self._profiler is not None:
            return False
        steps = self._asked(step)
        if steps is None:
            return False
        self._start(step, steps)
        return True

    def _asked(self, step: int) -> int | None:
        if self.planned is not None and step >= self.planned[0]:
            steps, self.planned = self.planned[1], None
            return steps
        if self._request is None:
            return None
        now = time.monotonic()
        if now < self._next_check:
            return None
        self._next_check = now + CHECK_EVERY_S
        if not os.path.lexists(self._request):
            return None
        try:
            return profiles.take_request(self._request.parent)
        except profiles.BadRequest as exc:  # left by anyone: refused, and training goes on
            self._warn(step, f"the request was refused: {exc}")
            return None

    def _start(self, step: int, steps: int) -> None:
        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        quiet_kineto()
        try:
            prof = profile(activities=activities, record_shapes=True)
            prof.__enter__()
        except Exception as exc:  # noqa: BLE001 - a profile that cannot start is a warning
            self._warn(step, f"the profiler could not start ({exc})")
            return
        self._profiler, self._first, self._last = prof, step, step + steps - 1
        self.phase = _mark
        self._sync()
        self._t0 = time.perf_counter()

    def after_step(self, step: int) -> None:
        """Ends the profile after its last step."""
        self._done = step
        if self._profiler is not None:
            self.profiled.add(step)
            if step >= self._last:
                self._finish(step)

    def end_run(self) -> None:
        """The run ended (a stop, its last step) inside a profile: the steps it got."""
        if self._profiler is not None and self._done >= self._first:
            self._finish(self._done)
        self.close()

    def _finish(self, step: int) -> None:
        assert self._profiler is not None
        self._sync()
        measured_us = (time.perf_counter() - self._t0) * 1e6
        prof, self._profiler, self.phase = self._profiler, None, no_phase
        steps = step - self._first + 1
        try:
            prof.__exit__(None, None, None)
            event = self._summarize(prof, measured_us, steps)
        except Exception as exc:  # noqa: BLE001
            self._warn(step, f"the profile could not be read ({exc})")
            return
        self.writer.emit(event, urgent=True)

    def _summarize(self, prof: profile, measured_us: float, steps: int) -> ev.ProfileEvent:
        events = prof.events()
        if self.device.type == "cuda":
            ops, busy_us = device_op_times(events)
            timing, idle_us = "device", max(0.0, measured_us - busy_us)
        else:
            ops, timing, idle_us = cpu_op_times(events), "cpu", 0.0
        event = profiles.summarize(
            ops, measured_us, step=self._first, steps=steps, timing=timing, idle_us=idle_us
        )
        if self.run_dir is not None:
            event.trace, event.trace_bytes, event.note = save_trace(prof, self.run_dir, self._first)
        else:
            event.note = "no Chrome trace: this run keeps no record"
        return event

    def _sync(self) -> None:
        if self.device.type == "cuda":  # profiled steps only: the split needs the kernels done
            torch.cuda.synchronize(self.device)

    def _warn(self, step: int, message: str) -> None:
        self.writer.emit(
            ev.WarningEvent(code="profile-failed", message=f"no profile: {message}", step=step),
            urgent=True,
        )

    def close(self) -> None:
        """A run that failed mid-profile leaves no profiler running."""
        if self._profiler is not None:
            with contextlib.suppress(Exception):
                self._profiler.__exit__(None, None, None)
            self._profiler, self.phase = None, no_phase


def _mark(name: str) -> AbstractContextManager[object]:
    return record_function(f"ampscope.{name}")
