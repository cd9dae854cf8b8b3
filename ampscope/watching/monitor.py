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
import threading
from collections import deque
from pathlib import Path
from typing import Any

import torch

from ampscope.core import events as ev
from ampscope.core.records.tally import StepTally
from ampscope.core.records.writer import RecordWriter
from ampscope.engine.emitter import EventWriter
from ampscope.engine.step.metrics import MemoryReader
from ampscope.watching import exits
from ampscope.watching.compiled import CompileTracker
from ampscope.watching.describe import RunFacts
from ampscope.watching.losses import checked_figure, checked_loss
from ampscope.watching.messages import StepNotes, error_event, outcome, partial_count_warning
from ampscope.watching.opening import Surroundings, open_record, start_telemetry
from ampscope.watching.options import Options
from ampscope.watching.readout import RSS_EVERY_S, Raw, make_readout
from ampscope.watching.reporting import StepReport, Ticker
from ampscope.watching.step_hooks import StepHooks
from ampscope.watching.troubles import Troubles

REPORT_BATCH = 4096
"""Steps turned into events before their lines go to disk: about 2 MB, well inside what the
record queues (``MAX_QUEUED_BYTES``)."""


class Monitor:
    """Records one training run. Call ``step(loss)`` once per optimizer step, after it."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scaler: Any = None,
        options: Options | None = None,
        world: Surroundings | None = None,
    ) -> None:
        self.options = options or Options()
        self._world = world or Surroundings()
        self.troubles = Troubles()
        self.flops_per_step: float | None = self.options.flops_per_step
        self.run_dir: Path | None = None
        self._optimizer = optimizer
        self._record: RecordWriter | None = None
        self._writer: EventWriter | None = None
        self._hello: ev.HelloEvent | None = None
        self._facts: RunFacts | None = None
        self._readout: Any = None
        self._sampler: Any = None
        self._hooks: StepHooks | None = None  # what the options ask of a step beyond reading
        self._compile = CompileTracker(False, self._emit)
        self._next_step = 0
        self._step_lock = threading.Lock()
        # the monitor's thread and the close both report landed steps: one at a time, in order
        self._report_lock = threading.RLock()
        self._steps = StepReport(
            StepTally(self.options.warmup_steps),
            StepNotes(self.options.precision or ""),
            self._emit,
            lambda: self._hooks.bad_step() if self._hooks is not None else None,
        )
        self._tally, self._notes = self._steps.tally, self._steps.notes
        self._signal: int | None = None
        self._exit: tuple[object, int] | None = None  # sys.exit's code, and the step it came at
        self._closed = False
        self._landed: deque[Raw] = deque()  # steps read back, waiting to be reported
        self._extras = True  # this step needs more than the reading (the first one always does)
        groups = optimizer.param_groups if optimizer is not None else []
        self._lr_group: dict[str, Any] | None = groups[0] if groups else None
        self._ticker: Ticker | None = None  # landed steps to events, lines to disk
        try:
            self._start(model, scaler)
        except Exception as exc:  # noqa: BLE001 - watching must never stop the training
            self.troubles.report("could not start watching this run", exc)
            with contextlib.suppress(Exception):  # already warned; nothing more to do
                self._abandon(exc)

    # ------------------------------------------------------------------ start

    def _start(self, model: torch.nn.Module, scaler: Any) -> None:
        o = self.options
        opened = open_record(model, self._optimizer, scaler, o, self.troubles, self._world)
        if opened is None:
            return
        facts, self._record, writer, self._hello = opened
        self._facts, self._writer, self.run_dir = facts, writer, self._record.run_dir
        self._notes.precision = facts.precision
        self._sampler = start_telemetry(
            writer, facts, o.telemetry_hz, self.troubles, self._world.start_for_run
        )
        numerics = None
        if o.numerics_every > 0 and not facts.compiled:  # hooks would recompile a compiled one
            from ampscope.watching.numerics import WatchNumerics

            numerics = WatchNumerics(
                model, facts.info.device, writer.emit, o.numerics_every, scaler
            )
        self._hooks = StepHooks(model, self._optimizer, o, self.troubles, numerics)
        self._steps.memory = MemoryReader(facts.info.device, host_every_s=RSS_EVERY_S)
        self._steps.peak = facts.peak
        writer.emit(ev.PhaseEvent(phase="setup", state="end"), urgent=True)
        phase: ev.Phase = "compile" if facts.compiled else "train"
        writer.emit(ev.PhaseEvent(phase=phase, state="start", step=0), urgent=True)
        exits.register(self)
        self._compile = CompileTracker(facts.compiled, self._emit)
        self._readout = make_readout(facts.info.device, scaler)
        self._landed = self._readout.landed
        writer.flush()  # hello on disk now, not at the first tick: a process may end before it
        self._record.write_queued()
        self._ticker = Ticker(self._world.tick_s, self._tick, "ampscope-watch")
        if o.count_flops and not facts.compiled:
            self._hooks.count_flops()
            self._notes.counting = True

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
        with self._step_lock:  # loops that call it from several threads number steps once
            self._step(loss, tokens, samples, grad_norm)

    def _step(self, loss: Any, tokens: Any, samples: Any, grad_norm: Any) -> None:
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
            if tokens is not None or samples is not None or grad_norm is not None:
                tokens, samples, grad_norm = self._checked(step, tokens, samples, grad_norm)
            zeros = None
            if self._extras:
                grad_norm, zeros = self._extra_work(step, grad_norm)
            group = self._lr_group
            readout.end(step, loss, grad_norm, zeros, tokens, samples, group and group["lr"])
            self._next_step = step + 1
            self._compile.after_step(step, self._writer)
        except Exception as exc:  # noqa: BLE001 - never into the user's loop
            self._readout = None
            self.troubles.report("recording a step failed, so steps are no longer recorded", exc)

    def _checked(self, step: int, *figures: Any) -> list[Any]:
        """``tokens``, ``samples`` and ``grad_norm`` as recorded: one that is no number is
        left out of its step and warned about, once a kind, as a loss is."""
        kept = []
        for name, value in zip(("tokens", "samples", "grad_norm"), figures, strict=True):
            value, note = checked_figure(step, name, value, self._notes)
            if note is not None:
                self._emit(note, urgent=True)
                self.troubles.note(note.message)
            kept.append(value)
        return kept

    def _extra_work(self, step: int, grad_norm: Any) -> tuple[Any, Any]:
        """What only some steps need: the FLOP count's end, the hooks' figures, the first step."""
        self._end_flop_count()
        zeros = None
        if self._hooks is not None:
            grad_norm, zeros = self._hooks.take(step, grad_norm)
        if step == 0:
            self._compile.first_step_done()
            self._tally.compile_s = self._compile.compile_s
        self._extras = self._hooks is not None and self._hooks.any
        return grad_norm, zeros

    def restart_timer(self) -> None:
        """The next step's time starts now: call after work that is no training step
        (evaluation, a checkpoint), so it does not count as one."""
        if self._readout is not None and not self._closed:
            self._readout.restart()

    def _tick(self) -> None:
        """Off the training thread, while it is busy in torch: landed steps become events, the
        lines go to disk and the heartbeat is refreshed. One thread, woken ten times a second."""
        self._report_landed()
        with contextlib.suppress(Exception):  # the record reports its own troubles
            if self._writer is not None and self._record is not None:
                self._writer.flush()
                self._record.tick()

    def _report_landed(self) -> None:
        """The landed steps as events, their lines on disk a batch at a time: all at once, a
        backlog (a thread starved of the GIL, the steps of a close) would be more than the
        record queues for a slow disk, and its later steps dropped from a record that is fine."""
        try:
            with self._report_lock:
                self._report_batches()
        except Exception as exc:  # noqa: BLE001 - a fault here must not reach the loop
            self._readout = None
            self.troubles.report("recording a step failed, so steps are no longer recorded", exc)

    def _report_batches(self) -> None:
        while True:
            self._steps.report_all(self._landed, self.flops_per_step, REPORT_BATCH)
            if not self._landed:
                return
            self._to_disk()

    def _to_disk(self) -> None:
        """A batch's lines on disk, and the heartbeat where it is due: a backlog that takes
        seconds to report must not read as a stalled run."""
        with contextlib.suppress(Exception):  # the record reports its own troubles
            if self._writer is not None and self._record is not None:
                self._writer.flush()
                self._record.tick()

    def _end_flop_count(self) -> None:
        counted = self._hooks.end_flop_count() if self._hooks is not None else None
        if counted is not None and self.flops_per_step is None:
            self.flops_per_step = counted.flops
            self._steps.counted = True  # the first step's: later ones in proportion
            if counted.partial:
                self._emit(partial_count_warning(counted.flops, counted.missing), urgent=True)

    # ------------------------------------------------------------------ the end

    def note_exit(self, code: object) -> None:
        """``sys.exit(code)`` was called on the main thread: unless a step follows (the loop
        caught the SystemExit), the run ends with that code."""
        self._exit = (code, self._next_step)

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
        if self._writer is None or self._record is None or self._hello is None:
            self._end_flop_count()
            return
        noted = self._exit
        if error is None and noted is not None and noted[1] == self._next_step:
            error = SystemExit(noted[0])  # the atexit hook's way out: sys.exit said how
        status, message = outcome(error, self._signal)
        try:  # the last steps read, the error, the phase's end: a signal may have cut any of it
            self._wind_down(error, status)
            peak = self._facts.peak if self._facts else None
            flops = None if self._steps.counted else self.flops_per_step  # None: the steps'
            done = self._tally.done(status, flops, peak, message)
        except Exception as exc:  # noqa: BLE001 - a signal mid-step: the record still ends
            self.troubles.report("summing up the run failed, so its done has no figures", exc)
            done = ev.empty_done(status, message)
        self._emit(done, urgent=True)
        self._writer.close()
        self._record.close(self._hello, done)

    def _wind_down(self, error: BaseException | None, status: str) -> None:
        self._end_flop_count()
        if self._ticker is not None:
            self._ticker.stop(self._world.tick_s * 20)
        if self._readout is not None:
            with contextlib.suppress(Exception):  # a broken device: the steps in flight are lost
                self._readout.drain()
        self._report_landed()
        if status == "failed" and error is not None:
            self._emit(error_event(error, self._next_step), urgent=True)
        last = self._tally.steps_done - 1 if self._tally.steps_done else None
        self._emit(ev.PhaseEvent(phase="train", state="end", step=last), urgent=True)
        if self._sampler is not None:
            self._sampler.stop()

    def _abandon(self, exc: BaseException) -> None:
        """Starting failed half-way: end what was begun, so no record claims to be live."""
        self._readout = None
        self._closed = True
        if self._ticker is not None:
            self._ticker.stop()
        exits.unregister(self)
        self._remove_hooks()
        if self._sampler is not None:
            self._sampler.stop()
        done = ev.empty_done("failed", f"ampscope could not watch this run: {exc}")
        if self._writer is not None:
            self._writer.emit(done, urgent=True)
            self._writer.close()
        if self._record is not None:
            self._record.close(self._hello, done)

    def forget_after_fork(self) -> None:
        """In a forked child (``exits`` calls it right after the fork): the record is the
        parent's. The child writes nothing to it, waits on none of the parent's threads (they
        are not in the child) or locks, and its steps are not recorded."""
        self._closed = True
        self._readout = None
        self._writer = None
        self._sampler = None
        if self._record is not None:
            self._record.forget_after_fork()
        with contextlib.suppress(Exception):  # the child's own copy of the hooks
            self._remove_hooks()

    def _remove_hooks(self) -> None:
        hooks, self._hooks = self._hooks, None
        if hooks is not None:
            hooks.remove()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        self.close(error)  # an exception goes on to the caller

    def _emit(self, event: ev.Event, urgent: bool = False) -> None:
        if self._writer is not None:
            self._writer.emit(event, urgent=urgent)
