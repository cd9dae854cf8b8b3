"""What the dashboard knows about one run: a Textual-free model fed with events.

Everything is held in bounded ring buffers, so memory stays flat however long a run is.
The Run view reads it on a timer: the header from here, stat cards and plot series through
``ampscope.tui.model.figures``.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ampscope.core import events as ev
from ampscope.core import profiles
from ampscope.core.fp8_recipes import layers_short
from ampscope.core.numerics_report import NumericsSummary
from ampscope.core.run_labels import named_in
from ampscope.core.text import visible
from ampscope.core.units import fmt_done, fmt_num
from ampscope.core.workload_spec import config_model, model_label
from ampscope.tui.model.columns import STEP_COLUMNS, SYS_COLUMNS, Columns
from ampscope.tui.model.rank_table import RankTable

MAX_POINTS = 4096
"""Steps (and sys samples) kept for the plots; older ones are dropped."""
RECENT = 20
"""Steps the stat cards summarise (median of the last RECENT)."""
MAX_LOG = 1000
LOG_LINE_CHARS = 2000
"""Characters an event-log entry keeps: a 10 MB warning is cut, so the log holds at most
MAX_LOG x LOG_LINE_CHARS characters however a record is made."""
MAX_UNREADABLE_SHOWN = 5

FINAL_STATES = ("done", "failed", "stopped", "incomplete")


@dataclass(frozen=True)
class LogEntry:
    seq: int
    level: str  # info, warning, error, skipped, stderr
    step: int | None
    text: str


class RunState:
    """One run, live or replayed. ``ingest`` is cheap; reading is done at redraw time."""

    def __init__(
        self,
        label: str = "",
        launch: dict[str, Any] | None = None,
        maxlen: int = MAX_POINTS,
        read_only: bool = False,
        read_from: str = "replay",
    ) -> None:
        self.label = label
        self.launch: dict[str, Any] = dict(launch or {})
        self.read_only = read_only
        self.read_from = read_from  # what the header says a read-only view shows
        self.maxlen = maxlen
        self.hello: ev.HelloEvent | None = None
        self.done: ev.DoneEvent | None = None
        self.status = "starting"  # starting, compiling, training, done, failed, stopped
        self.error: str | None = None
        self.compile_s: float | None = None
        self._compile_started: float | None = None  # monotonic, for the ticking label
        self._compile_started_t: float | None = None  # event time, for replays
        self.last_t = 0.0
        self.version = 0
        self.unknown_lines = 0
        self.newer_schema = False  # warned once that the stream is newer than this reader
        self.stop_requested = False
        self.queue_note: str | None = None  # "sweep 2/4" while a queued sweep runs
        self.exit_code: int | None = None
        # (step, t, step_ms, loss, loss_scale, samples/s, tokens/s, tflops, mfu, alloc, reserved,
        #  grad_zero_frac)
        self.steps: deque[tuple] = deque(maxlen=maxlen)
        # (t, gpu_util, cpu_util, proc_cpu, gpu_mem_used, gpu_mem_total)
        self.sys: deque[tuple] = deque(maxlen=maxlen)
        self.step_columns = Columns(STEP_COLUMNS, maxlen)
        self.sys_columns = Columns(SYS_COLUMNS, maxlen)
        self.recent_ms: deque[float] = deque(maxlen=RECENT)
        self.recent_data_ms: deque[float] = deque(maxlen=RECENT)  # waits for the next batch
        self.epoch = 1  # passes over a user's batches begun (``epoch`` notes)
        self.stalled: str | None = None  # a rank-stalled warning, until the next step lands
        self.last_step: ev.StepEvent | None = None
        self.skipped = 0
        self.step_count = 0  # step events ever seen (the deque forgets)
        self.sys_count = 0
        self.mem_peak: int | None = None
        self.grad_zero: tuple[int, float] | None = None  # (step, fraction) last measured
        self.grad_zero_max = 0.0
        self.last_sys: ev.SysEvent | None = None
        self.gpu_seen = False
        self.log: deque[LogEntry] = deque(maxlen=MAX_LOG)
        self.log_seq = 0
        self.ranks = RankTable()  # each rank of a run on several processes
        self.numerics = NumericsSummary()  # per-layer numerics of the sampled steps
        self.profile: ev.ProfileEvent | None = None  # the latest, asked for with the Run view's p

    # ---------------------------------------------------------------- ingest

    def ingest_many(self, items: Iterable[ev.Event | ev.UnknownEvent]) -> None:
        for item in items:
            self.ingest(item)

    def ingest(self, event: ev.Event | ev.UnknownEvent) -> None:
        self.version += 1
        newer = ev.newer_schema_warning(event)
        if newer is not None and not self.newer_schema:
            self.newer_schema = True
            self.add_log("warning", None, newer)
        if isinstance(event, ev.UnknownEvent):
            self.unknown_lines += 1
            if newer is None and self.unknown_lines <= MAX_UNREADABLE_SHOWN:
                self.add_log(
                    "warning", None, f"unreadable line: {event.line[:200] or event.reason}"
                )
            return
        self.last_t = max(self.last_t, event.t)
        self.ranks.ingest(event)
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)

    def _on_hello(self, e: ev.HelloEvent) -> None:
        self.hello = e
        spec = (e.config.get("workload") or {}).get("model")
        model = f"model {e.workload or '?'} from {spec}, " if spec else ""
        self.add_log(
            "info",
            None,
            f"{e.preset} on {e.device} ({e.device_name}), {model}{fmt_num(e.param_count)} "
            f"params, torch {e.torch_version}",
        )

    def _on_step(self, e: ev.StepEvent) -> None:
        if self.status in ("starting", "compiling"):
            self.status = "training"
        self.last_step = e
        self.stalled = None  # steps land again: the ranks moved
        self.step_count += 1
        self.steps.append(
            (
                e.step,
                e.t,
                e.step_ms,
                e.loss,
                e.loss_scale,
                e.samples_per_s,
                e.tokens_per_s,
                e.tflops,
                e.mfu,
                e.mem_allocated,
                e.mem_reserved,
                e.grad_zero_frac,
            )
        )
        zeros = e.grad_zero_frac
        if zeros is not None:
            self.grad_zero = (e.step, zeros)
            self.grad_zero_max = max(self.grad_zero_max, zeros)
        loss, scale = e.loss, e.loss_scale
        self.step_columns.add(
            e.step,
            e.t,
            e.step_ms,
            loss if loss is not None and math.isfinite(loss) else None,
            math.log2(scale) if scale is not None and scale > 0 else None,
            e.mem_allocated,
            e.mem_reserved,
            None if zeros is None else zeros * 100,
        )
        if not e.profiled:  # slowed by torch.profiler: no figure of training's speed
            self.recent_ms.append(e.step_ms)
        if e.data_ms is not None:
            self.recent_data_ms.append(e.data_ms)
        peak = ev.peak_memory(e)  # allocated, never reserved: the figure records and bench show
        if peak is not None and (self.mem_peak is None or peak > self.mem_peak):
            self.mem_peak = peak
        if e.skipped:
            self.skipped += 1
            shown = "-" if e.loss_scale is None else fmt_num(e.loss_scale)
            self.add_log("skipped", e.step, f"step skipped (inf/NaN gradients), loss scale {shown}")

    def _on_sys(self, e: ev.SysEvent) -> None:
        """The engine's samples are the one source of host and GPU figures (engine/telemetry)."""
        self.last_sys = e
        self.sys_count += 1
        if e.gpu_util is not None or e.gpu_mem_total is not None:
            self.gpu_seen = True
        self.sys.append((e.t, e.gpu_util, e.cpu_util, e.proc_cpu, e.gpu_mem_used, e.gpu_mem_total))
        cores = None if e.proc_cpu is None else e.proc_cpu / 100
        self.sys_columns.add(e.t, e.gpu_util, e.cpu_util, cores, e.gpu_mem_used, e.gpu_mem_total)

    def _on_phase(self, e: ev.PhaseEvent) -> None:
        if self.status in FINAL_STATES:
            return
        if e.phase == "compile" and e.state == "start":
            self.status = "compiling"
            self._compile_started = time.monotonic()
            self._compile_started_t = e.t
        elif e.phase == "compile" and e.state == "end":
            if e.seconds is not None:
                self.compile_s = e.seconds
            self.add_log("info", e.step, f"compiled in {e.seconds or 0:.1f} s")
        elif e.phase == "train" and e.state == "start":
            self.status = "training"

    def _on_warning(self, e: ev.WarningEvent) -> None:
        if e.code in ev.NOTE_CODES:  # a new pass over the user's batches (counted), ...
            self.epoch += e.code == ev.EPOCH_NOTE
            self.add_log("info", e.step, e.message)
            return
        if e.code == ev.RANK_STALLED:
            self.stalled = e.message.split(",", 1)[0]  # "rank 1 has made no progress for 20 s"
        self.add_log("warning", e.step, f"[{e.code}] {e.message}")

    def _on_error(self, e: ev.ErrorEvent) -> None:
        self.error = visible(f"{e.kind}: {e.message}", LOG_LINE_CHARS, keep_newlines=True)
        text = f"[{e.kind}] {e.message}"
        if e.hint:
            text += f"\n  hint: {e.hint}"
        self.add_log("error", e.step, text)
        if e.traceback:
            tail = e.traceback[-4 * LOG_LINE_CHARS :]
            last = [ln for ln in tail.strip().splitlines() if ln.strip()][-3:]
            for ln in last:
                self.add_log("stderr", e.step, ln)
        if e.kind == "config" and self.status == "starting":
            self.status = "failed"

    def _on_compile(self, e: ev.CompileEvent) -> None:
        if e.compile_s is not None:
            self.compile_s = e.compile_s

    def _on_done(self, e: ev.DoneEvent) -> None:
        self.done = e
        self.status = {"ok": "done"}.get(e.status, e.status)
        if e.compile_s is not None:
            self.compile_s = e.compile_s
        if e.mem_peak is not None and (self.mem_peak is None or e.mem_peak > self.mem_peak):
            self.mem_peak = e.mem_peak
        if e.error and not self.error:
            self.error = visible(e.error, LOG_LINE_CHARS, keep_newlines=True)
        self.add_log("error" if e.status == "failed" else "info", None, fmt_done(e))

    def _on_profile(self, e: ev.ProfileEvent) -> None:
        self.profile = e
        self.add_log("info", e.step, f"profile of {e.steps} steps: {profiles.headline(e)}")

    # ---------------------------------------------------------------- endings the stream omits

    def process_exited(self, code: int, stderr_tail: Sequence[str] = ()) -> None:
        """The engine process ended; fill in what its stream did not say."""
        self.exit_code = code
        self.version += 1
        if self.done is not None:
            return
        if self.stop_requested:
            self.status = "stopped"
            self.add_log("info", None, f"engine stopped (exit code {code})")
            return
        if code == 0:
            self.status = "done"
            return
        self.status = "failed"
        if self.error is None:
            self.error = f"engine exited with code {code} and no error event"
            self.add_log("error", None, self.error)
            for line in stderr_tail:
                self.add_log("stderr", None, line)

    def engine_gone(self) -> None:
        """A followed record's engine went away without writing ``done``."""
        if self.stop_requested:
            self.status = "stopped"
            self.add_log("info", None, "the engine was stopped and wrote no 'done'")
        else:
            self.status = "failed"
            self.error = "crashed: the engine is gone and wrote no 'done' event"
            self.add_log("error", None, self.error)
        self.version += 1

    def record_ended(self) -> None:
        """A record read to its end; without ``done`` the run was cut short."""
        if self.finished:
            return
        self.status = "incomplete"
        self.add_log("warning", None, "the record has no 'done' event (the run was cut short)")
        self.version += 1

    # ---------------------------------------------------------------- the event log

    def add_log(self, level: str, step: int | None, text: str) -> None:
        self.log_seq += 1
        shown = visible(text, LOG_LINE_CHARS, keep_newlines=True)
        self.log.append(LogEntry(self.log_seq, level, step, shown))

    def log_since(self, seq: int) -> list[LogEntry]:
        """Entries newer than ``seq`` (those already dropped from the ring are lost)."""
        if not self.log or self.log[-1].seq <= seq:
            return []
        return [e for e in self.log if e.seq > seq]

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
        return statistics.median(self.recent_ms) if self.recent_ms else None

    def median_data_ms(self) -> float | None:
        """The host's wait for a batch, median of the recent steps (part of the step time)."""
        return statistics.median(self.recent_data_ms) if self.recent_data_ms else None

    def phase_label(self, now: float | None = None) -> str:
        if self.status == "compiling":
            if self._compile_started is not None and not self.read_only:
                elapsed = (now if now is not None else time.monotonic()) - self._compile_started
            else:
                elapsed = self.last_t - (self._compile_started_t or 0.0)
            return f"compiling {elapsed:.0f}s"
        if self.stalled and self.status == "training":
            return "stalled"
        return self.status

    def header(self, now: float | None = None) -> str:
        cfg = self.config
        preset = self.hello.preset if self.hello else (self.label or cfg.get("name", "?"))
        device = self.hello.device if self.hello else str(cfg.get("device", "?"))
        if self.hello and self.hello.device_name and self.hello.device_name != device:
            device = f"{device} ({self.hello.device_name})"
        # steps done: a step's own number (log, messages, records) counts from 0
        done = 0 if self.step is None else self.step + 1
        total = self.total_steps
        progress = f"{done}/{total} steps" if total else f"{done} step{'' if done == 1 else 's'}"
        if self.epoch > 1:
            progress += f" (epoch {self.epoch})"
        parts = [self.phase_label(now), progress, preset]
        model = model_label(config_model(cfg), self.hello.workload if self.hello else None)
        if model:
            parts.append(f"model {model}")
        parts.append(device)
        precision = (
            layers_short(self.hello.fp8)
            if self.hello and self.hello.fp8
            else str(cfg.get("precision", "?"))
        )
        if not named_in(precision, preset):  # amp-fp16-noscale says amp-fp16 already
            parts.append(precision)
        parts.append(f"compile {cfg.get('compile', '?')}")
        if self.read_only:
            parts.append(self.read_from)
        if self.queue_note:
            parts.append(self.queue_note)
        return " · ".join(parts)


_HANDLERS: dict[type, Callable[[RunState, Any], None]] = {
    ev.HelloEvent: RunState._on_hello,
    ev.StepEvent: RunState._on_step,
    ev.SysEvent: RunState._on_sys,
    ev.PhaseEvent: RunState._on_phase,
    ev.WarningEvent: RunState._on_warning,
    ev.ErrorEvent: RunState._on_error,
    ev.CompileEvent: RunState._on_compile,
    ev.DoneEvent: RunState._on_done,
    ev.NumericsEvent: lambda state, e: state.numerics.add(e),
    ev.ProfileEvent: RunState._on_profile,
}
"""What each event type changes; a type this table lacks is counted in ``version`` only."""
