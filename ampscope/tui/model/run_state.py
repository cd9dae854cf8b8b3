"""What the dashboard knows about one run: a Textual-free model fed with events.

Everything is held in bounded ring buffers, so memory stays flat however long a run is.
The Run view reads it on a timer: the header from here, stat cards and plot series through
``ampscope.tui.model.figures``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

from ampscope.core.presets.fp8_recipes import layers_short
from ampscope.core.presets.workload_spec import config_model, model_label
from ampscope.core.records.labels import named_in
from ampscope.core.text import visible
from ampscope.tui.model.run_events import FINAL_STATES, RECENT, EventState

MAX_POINTS = 4096
"""Steps (and sys samples) kept for the plots; older ones are dropped."""


class RunState(EventState):
    """One run, live or replayed. ``ingest`` is cheap; reading is done at redraw time."""

    def __init__(
        self,
        label: str = "",
        launch: dict[str, Any] | None = None,
        maxlen: int = MAX_POINTS,
        read_only: bool = False,
        read_from: str = "replay",
    ) -> None:
        super().__init__(maxlen)
        self.label = label
        self.launch: dict[str, Any] = dict(launch or {})
        self.read_only = read_only
        self.read_from = read_from  # what the header says a read-only view shows
        self.stop_requested = False
        self.queue_note: str | None = None  # "sweep 2/4" while a queued sweep runs
        self.exit_code: int | None = None

    # ---------------------------------------------------------------- endings the stream omits

    def process_exited(self, code: int, stderr_tail: Sequence[str] = ()) -> None:
        """The engine process ended; fill in what its stream did not say."""
        self.exit_code = code
        self.version += 1
        if self.done is not None:
            return
        if self.stop_requested:
            self.status = "stopped"
            self.log.add("info", None, f"engine stopped (exit code {code})")
            return
        if code == 0:
            self.status = "done"
            return
        self.status = "failed"
        if self.error is None:
            self.error = f"engine exited with code {code} and no error event"
            self.log.add("error", None, self.error)
            for line in stderr_tail:
                self.log.add("stderr", None, line)

    def engine_gone(self) -> None:
        """A followed record's engine went away without writing ``done``."""
        if self.stop_requested:
            self.status = "stopped"
            self.log.add("info", None, "the engine was stopped and wrote no 'done'")
        else:
            self.status = "failed"
            self.error = "crashed: the engine is gone and wrote no 'done' event"
            self.log.add("error", None, self.error)
        self.version += 1

    def record_removed(self, path: str) -> None:
        """A followed record's folder was removed while the run was followed."""
        self.status = "incomplete"
        self.log.add(
            "error",
            None,
            visible(f"the record was removed ({path}): no more of the run can be followed"),
        )
        self.version += 1

    def record_ended(self, unreadable: str | None = None, running: bool = False) -> None:
        """A record read to its end; without ``done`` the run was cut short, unless its events
        could not be read at all (``unreadable`` says why): then nothing is known of its end,
        or its run was still going when it was read (``running``): its end is only so far."""
        if self.finished:
            return
        self.status = "incomplete"
        if unreadable:
            self.log.add("error", None, f"{unreadable}: nothing of the run can be shown")
        elif running:
            self.log.add(
                "info",
                None,
                "the run is still going: this is its record as far as it was written when "
                "read ('ampscope attach' follows it live)",
            )
        else:
            self.log.add("warning", None, "the record has no 'done' event (the run was cut short)")
        self.version += 1

    # ---------------------------------------------------------------- read

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATES

    @property
    def step(self) -> int | None:
        return self.last_step.step if self.last_step else None

    @property
    def total_steps(self) -> int | None:
        steps = self.config.get("steps")
        return steps if isinstance(steps, int) else None

    @property
    def config(self) -> dict[str, Any]:
        if self.hello is not None:
            return self.hello.config
        return self.launch

    def median_step_ms(self) -> float | None:
        """Median of the last RECENT steps' times; a profiled step is slowed by the profiler,
        no figure of training's speed."""
        recent = self.steps.recent("step_ms", RECENT, unless="profiled")
        return statistics.median(recent) if recent else None

    def median_data_ms(self) -> float | None:
        """The host's wait for a batch, median of the recent steps (part of the step time)."""
        recent = self.steps.recent("data_ms", RECENT)
        return statistics.median(recent) if recent else None

    def phase_label(self, now: float | None = None) -> str:
        """What the run is doing: the status, the compile's seconds so far, or 'stalled'."""
        if self.status == "compiling":
            if self.compile_started is not None and not self.read_only:
                elapsed = (now if now is not None else time.monotonic()) - self.compile_started
            else:
                elapsed = self.last_t - (self.compile_started_t or 0.0)
            return f"compiling {elapsed:.0f}s"
        if self.stalled and self.status == "training":
            return "stalled"
        return self.status

    def header(self, now: float | None = None) -> str:
        """The Run view's first line: phase, steps, preset, model, device, precision, compile."""
        cfg, hello = self.config, self.hello
        preset = hello.preset if hello else (self.label or cfg.get("name", "?"))
        device = hello.device if hello else str(cfg.get("device", "?"))
        if hello and hello.device_name and hello.device_name != device:
            device = f"{device} ({hello.device_name})"
        # steps done: a step's own number (log, messages, records) counts from 0
        done = 0 if self.step is None else self.step + 1
        ended = self.done.steps_done if self.done is not None else None
        if isinstance(ended, int) and not isinstance(ended, bool) and ended >= 0:
            done = ended  # the run's own count: its last line's number may not be its last step
        total = self.total_steps
        progress = f"{done} step{'' if done == 1 else 's'}"
        if total and done <= total:
            progress = f"{done}/{total} steps"
        elif total:  # a watched loop that runs past the steps its code said it would take
            progress += f" ({total} planned)"
        if self.epoch > 1:
            progress += f" (epoch {self.epoch})"
        parts = [self.phase_label(now), progress, preset]
        model = model_label(config_model(cfg), hello.workload if hello else None)
        if model:
            parts.append(f"model {model}")
        parts.append(device)
        precision = (
            layers_short(hello.fp8) if hello and hello.fp8 else str(cfg.get("precision", "?"))
        )
        if not named_in(precision, preset):  # amp-fp16-noscale says amp-fp16 already
            parts.append(precision)
        parts.append(f"compile {cfg.get('compile', '?')}")
        if self.read_only:
            parts.append(self.read_from)
        if self.queue_note:
            parts.append(self.queue_note)
        return " · ".join(parts)
