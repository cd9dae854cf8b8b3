"""The monitor ``ampscope.watch()`` returns: a user's own loop, recorded like an engine run.

On the training thread, ``Monitor.step`` only reads the step's figures (never waiting on the
device) and queues those that have landed: about 2 us a step on a CPU. The monitor's one thread
wakes ten times a second, mostly while the training thread is inside torch with the GIL
released: it turns landed steps into ``step`` events, puts the lines on disk and refreshes the
heartbeat. Few wake-ups matter: on a machine whose cores torch keeps busy, every thread that
wakes in the process can stall torch's worker threads. Everything that can go wrong on
ampscope's side (folder, disk, NVML, a bug here) is caught, warned about once, and the loop
goes on.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.engine.emitter import EventWriter
from ampscope.watching import exits
from ampscope.watching.describe import RunFacts, describe, hello_event, rss_without_model
from ampscope.watching.gradients import GradNormHook, ZeroGradHook
from ampscope.watching.losses import checked_loss
from ampscope.watching.messages import StepNotes, default_name, error_event, outcome, setup_warnings
from ampscope.watching.options import Options
from ampscope.watching.readout import MemoryReader, Raw, StepValues, make_readout
from ampscope.watching.record import Troubles, WatchRecord
from ampscope.watching.stats import RunFigures
from ampscope.watching.step_event import step_event

TICK_S = 0.1
"""How often landed steps become events and lines go to disk (off the training thread)."""
FLUSH_S = 1.0
"""The event writer's own flush thread: the monitor's tick flushes it well before that."""


class Monitor:
    """Records one training run. Call ``step(loss)`` once per optimizer step, after it."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scaler: Any = None,
        options: Options | None = None,
    ) -> None:
        self.options = options or Options()
        self.troubles = Troubles()
        self.flops_per_step: float | None = self.options.flops_per_step
        self.run_dir: Path | None = None
        self._optimizer = optimizer
        self._record: WatchRecord | None = None
        self._writer: EventWriter | None = None
        self._hello: ev.HelloEvent | None = None
        self._facts: RunFacts | None = None
        self._readout: Any = None
        self._sampler: Any = None
        self._norm_hook: GradNormHook | None = None
        self._zero_hook: ZeroGradHook | None = None
        self._numerics: Any = None  # watch.numerics.WatchNumerics, with numerics_every=N
        self._flop_counter: Any = None
        self._counters: Any = None  # torch._dynamo's, once dynamo is loaded
        self._compile_watch: Any = None
        self._frames_seen = 0
        self._figures = RunFigures(self.options.warmup_steps)
        self._next_step = 0
        self._notes = StepNotes(self.options.precision or "")
        self._signal: int | None = None
        self._closed = False
        self._memory = MemoryReader(None)
        self._started = time.perf_counter()
        self._landed: deque[Raw] = deque()  # steps read back, waiting to be reported
        self._extras = True  # this step needs more than the reading (the first one always does)
        groups = optimizer.param_groups if optimizer is not None else []
        self._lr_group: dict[str, Any] | None = groups[0] if groups else None
        self._reporter: threading.Thread | None = None
        self._stop_reporting = threading.Event()
        try:
            self._start(model, scaler)
        except Exception as exc:  # noqa: BLE001 - watching must never stop the training
            self.troubles.report("could not start watching this run", exc)
            with contextlib.suppress(Exception):  # already warned; nothing more to do
                self._abandon(exc)

    # ------------------------------------------------------------------ start

    def _start(self, model: torch.nn.Module, scaler: Any) -> None:
        o = self.options
        name = o.name or default_name()
        facts = describe(model, self._optimizer, scaler, o, name)
        self._facts = facts
        self._notes.precision = facts.precision
        live = {"source": "watch", "allow_stop": o.allow_stop, "stop_signal": "SIGINT"}
        root = Path(o.runs_dir) if o.runs_dir is not None else records.default_runs_dir()
        self._record = WatchRecord.create(root, name, facts.config, live, self.troubles)
        if self._record is None:
            return
        self.run_dir = self._record.dir
        writer = self._writer = EventWriter(self._record.file, flush_interval=FLUSH_S)
        writer.emit(ev.PhaseEvent(phase="setup", state="start"), urgent=True)
        run_dir = str(self.run_dir.resolve())
        rss_before = None if facts.info.is_cuda else rss_without_model(model)
        self._hello = hello_event(
            facts, self.run_dir.name, run_dir, self.flops_per_step, o.allow_stop, rss_before
        )
        writer.emit(self._hello, urgent=True)
        for warning in setup_warnings(o.count_flops, facts):
            writer.emit(warning, urgent=True)
        self._start_telemetry(facts)
        if o.grad_norm and self._optimizer is not None:
            self._norm_hook = GradNormHook(self._optimizer, self.troubles)
        if o.grad_zero_every > 0:
            self._zero_hook = ZeroGradHook(model, o.grad_zero_every, self.troubles)
        if o.numerics_every > 0 and not facts.compiled:  # hooks would recompile a compiled one
            from ampscope.watching.numerics import WatchNumerics

            self._numerics = WatchNumerics(
                model, facts.info.device, writer.emit, o.numerics_every, scaler
            )
        self._memory = MemoryReader(facts.info.device if facts.info.is_cuda else None)
        writer.emit(ev.PhaseEvent(phase="setup", state="end"), urgent=True)
        phase: ev.Phase = "compile" if facts.compiled else "train"
        writer.emit(ev.PhaseEvent(phase=phase, state="start", step=0), urgent=True)
        exits.register(self)
        self._started = time.perf_counter()
        self._readout = make_readout(facts.info.device, scaler)
        self._landed = self._readout.landed
        self._reporter = threading.Thread(
            target=self._tick_periodically, name="ampscope-watch", daemon=True
        )
        self._reporter.start()
        if o.count_flops and not facts.compiled:
            from ampscope.engine.flops import flop_counter

            self._flop_counter = flop_counter()
            self._flop_counter.__enter__()

    def _start_telemetry(self, facts: RunFacts) -> None:
        from ampscope.engine.telemetry import start_for_run

        try:
            self._sampler = start_for_run(self._writer, facts.info, hz=self.options.telemetry_hz)
        except Exception as exc:  # noqa: BLE001 - no sys figures, the rest goes on
            self.troubles.report("device and host figures are unavailable", exc)

    # ------------------------------------------------------------------ per step

    def step(
        self,
        loss: Any = None,
        *,
        tokens: Any = None,
        samples: int | None = None,
        grad_norm: Any = None,
    ) -> None:
        """Record one optimizer step; call it after ``optimizer.step()`` (or ``scaler.update()``).

        ``loss``: the step's (unscaled) loss, a tensor or a number. ``tokens``: tokens in the
        step, a number or a device tensor (read without a sync). ``samples``: the batch size.
        ``grad_norm``: the norm ``clip_grad_norm_`` returned, if the loop clips.
        """
        readout = self._readout
        if readout is None or self._closed:
            return
        try:  # kept short: right after torch's kernels every line runs on cold caches
            step = self._next_step
            if loss is not None and type(loss) is not float:
                loss, note = checked_loss(step, loss, self._notes)
                if note is not None:  # no loss, or not a scalar: said once a kind
                    self._emit(note, urgent=True)
                    self.troubles.note(note.message)
            zeros = None
            if self._extras:
                grad_norm, zeros = self._extra_work(step, grad_norm)
            group = self._lr_group
            readout.end(step, loss, grad_norm, zeros, tokens, samples, group and group["lr"])
            self._next_step = step + 1
            counters = self._counters
            if counters is None:
                if "torch._dynamo" in sys.modules:
                    self._check_compile(step)
            elif counters["frames"].get("total", 0) != self._frames_seen:
                self._check_compile(step)
        except Exception as exc:  # noqa: BLE001 - never into the user's loop
            self._readout = None
            self.troubles.report("recording a step failed, so steps are no longer recorded", exc)

    def _extra_work(self, step: int, grad_norm: Any) -> tuple[Any, Any]:
        """What only some steps need: the FLOP count's end, the hooks' figures, the first step."""
        if self._flop_counter is not None:
            self._end_flop_count()
        if self._norm_hook is not None:
            hooked = self._norm_hook.take()
            grad_norm = hooked if grad_norm is None else grad_norm
        zeros = self._zero_hook.take(step + 1) if self._zero_hook is not None else None
        if self._numerics is not None:
            self._numerics.after(step)
        if step == 0:
            self._first_step_done()
        hooks = (self._norm_hook, self._zero_hook, self._numerics)
        self._extras = any(h is not None for h in hooks)
        return grad_norm, zeros

    def restart_timer(self) -> None:
        """The next step's time starts now: call after work that is no training step
        (evaluation, a checkpoint), so it does not count as one."""
        if self._readout is not None and not self._closed:
            self._readout.restart()

    def _tick_periodically(self) -> None:
        """Off the training thread, while it is busy in torch: landed steps become events, the
        lines go to disk and the heartbeat is refreshed. One thread, woken ten times a second."""
        while not self._stop_reporting.wait(TICK_S):
            self._report_landed()
            with contextlib.suppress(Exception):  # the record reports its own troubles
                if self._writer is not None and self._record is not None:
                    self._writer.flush()
                    self._record.tick()

    def _report_landed(self) -> None:
        try:
            while self._landed:
                self._report(StepValues.from_raw(self._landed.popleft()))
        except Exception as exc:  # noqa: BLE001 - a fault here must not reach the loop
            self._readout = None
            self._landed.clear()
            self.troubles.report("recording a step failed, so steps are no longer recorded", exc)

    def _report(self, v: StepValues) -> None:
        scaled = not math.isnan(v.scale)
        skipped = scaled and v.scale < v.scale_before
        finite = v.loss is None or math.isfinite(v.loss)
        allocated, reserved, peak_mem = mem = self._memory.read()
        flops = self.flops_per_step
        peak = self._facts.peak if self._facts else None
        step = step_event(v, skipped, finite, mem, flops, peak)
        self._emit(step)
        tokens = v.tokens if step.tokens_per_s is not None else None
        memory = peak_mem if peak_mem is not None else allocated
        counted_zeros = not math.isnan(v.zeros)
        self._figures.add(
            v.step, v.step_ms, v.loss, skipped, v.samples, tokens, memory, counted_zeros
        )
        if finite:
            self._notes.nonfinite = 0
        numerics = self._numerics
        if (skipped or not finite) and numerics is not None:
            numerics.bad_step()  # the next step armed is sampled: it may show the inf again
        if skipped or not finite or not flops:
            for event in self._notes.after(v, skipped, scaled, finite, bool(flops)):
                self._emit(event, urgent=True)

    def _first_step_done(self) -> None:
        if self._facts is None or not self._facts.compiled:
            return
        seconds = round(time.perf_counter() - self._started, 3)
        self._figures.compile_s = seconds
        self._emit(
            ev.PhaseEvent(phase="compile", state="end", seconds=seconds, step=0), urgent=True
        )
        self._emit(ev.PhaseEvent(phase="train", state="start", step=1), urgent=True)

    def _check_compile(self, step: int) -> None:
        """Compile events as the engine emits them; looked at only when dynamo compiled a frame
        since the last step (every compile, recompile and graph break does)."""
        if self._counters is None:
            from torch._dynamo.utils import counters

            self._counters = counters
        frames = self._counters["frames"].get("total", 0)
        if frames == self._frames_seen:
            return
        self._frames_seen = frames
        if self._writer is None:  # closed: nothing to write to
            return
        if self._compile_watch is None:
            from ampscope.engine.compile_stats import CompileWatch

            self._compile_watch = CompileWatch(self._writer)
        self._compile_watch.after_step(step, self._figures.compile_s)

    def _end_flop_count(self) -> None:
        counter, self._flop_counter = self._flop_counter, None
        counter.__exit__(None, None, None)
        counted = float(counter.get_total_flops())
        if counted > 0 and self.flops_per_step is None:
            self.flops_per_step = counted

    # ------------------------------------------------------------------ the end

    def note_signal(self, signum: int) -> None:
        """SIGTERM or SIGINT reached the process: however it ends now, it was stopped."""
        self._signal = signum

    def close(self, error: BaseException | None = None) -> None:
        """End the record with ``done``: ok, failed (``error``'s type and message) or stopped.

        Called by ``with``, by the integrations, and on process exit; more calls do nothing.
        """
        if self._closed:
            return
        self._closed = True
        exits.unregister(self)
        try:
            self._finish(error)
        except Exception as exc:  # noqa: BLE001 - never into the user's code
            self.troubles.report("finishing the run record failed", exc)
        finally:
            self._remove_hooks()

    def _finish(self, error: BaseException | None) -> None:
        if self._flop_counter is not None:
            self._end_flop_count()
        if self._writer is None or self._record is None or self._hello is None:
            return
        self._stop_reporting.set()
        if self._reporter is not None:
            self._reporter.join(TICK_S * 20)
        if self._readout is not None:
            with contextlib.suppress(Exception):  # a broken device: the steps in flight are lost
                self._readout.drain()
        self._report_landed()
        status, message = outcome(error, self._signal)
        if status == "failed" and error is not None:
            self._emit(error_event(error, self._next_step), urgent=True)
        last = self._figures.steps_done - 1 if self._figures.steps_done else None
        self._emit(ev.PhaseEvent(phase="train", state="end", step=last), urgent=True)
        if self._sampler is not None:
            self._sampler.stop()
        peak = self._facts.peak if self._facts else None
        done = self._figures.done(status, self.flops_per_step, peak, message)
        self._emit(done, urgent=True)
        self._writer.close()
        self._record.finish(self._hello, done)

    def _abandon(self, exc: BaseException) -> None:
        """Starting failed half-way: end what was begun, so no record claims to be live."""
        self._readout = None
        self._closed = True
        self._stop_reporting.set()
        exits.unregister(self)
        self._remove_hooks()
        if self._flop_counter is not None:
            self._flop_counter.__exit__(None, None, None)
            self._flop_counter = None
        if self._sampler is not None:
            self._sampler.stop()
        done = ev.empty_done("failed", f"ampscope could not watch this run: {exc}")
        if self._writer is not None:
            self._writer.emit(done, urgent=True)
            self._writer.close()
        if self._record is not None:
            self._record.finish(self._hello, done)

    def forget_after_fork(self) -> None:
        """In a forked child (``exits`` calls it right after the fork): the record is the
        parent's. The child writes nothing to it, waits on none of the parent's threads (they
        are not in the child) or locks, and its steps are not recorded."""
        self._closed = True
        self._readout = None
        self._writer = None
        self._sampler = None
        if self._record is not None:
            self._record.file.forget_after_fork()
        with contextlib.suppress(Exception):  # the child's own copy of the hooks
            self._remove_hooks()
            if self._flop_counter is not None:
                self._flop_counter, counter = None, self._flop_counter
                counter.__exit__(None, None, None)

    def _remove_hooks(self) -> None:
        for hook in (self._norm_hook, self._zero_hook, self._numerics):
            if hook is not None:
                hook.remove()
        self._norm_hook = self._zero_hook = self._numerics = None

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        self.close(error)  # an exception goes on to the caller

    # ------------------------------------------------------------------ helpers

    def _emit(self, event: ev.Event, urgent: bool = False) -> None:
        if self._writer is not None:
            self._writer.emit(event, urgent=urgent)
