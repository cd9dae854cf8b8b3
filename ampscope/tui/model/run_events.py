"""What a run's events say, and how each event changes it: ``EventState``, the part of the
dashboard's ``RunState`` that its events feed (``ingest`` looks the event's type up in
``HANDLERS``). Textual-free."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from ampscope.core import events as ev
from ampscope.core import profiles
from ampscope.core.numerics.report import NumericsSummary
from ampscope.core.text import visible
from ampscope.core.units import fmt_done, fmt_num
from ampscope.tui.model.columns import STEP_COLUMNS, SYS_COLUMNS, Columns, plot_value
from ampscope.tui.model.rank_table import RankTable
from ampscope.tui.model.run_log import LOG_LINE_CHARS, EventLog

FINAL_STATES = ("done", "failed", "stopped", "incomplete")
RECENT = 20
"""Steps the stat cards summarise (median of the last RECENT)."""
MAX_UNREADABLE_SHOWN = 5


class EventState:
    """What a run's events say, held in bounded ring buffers (memory stays flat however long
    a run is); ``ingest`` is cheap, reading is done at redraw time. ``RunState`` adds who is
    watching and how the run ended where its stream did not say."""

    def __init__(self, maxlen: int) -> None:
        self.maxlen = maxlen
        self.hello: ev.HelloEvent | None = None
        self.done: ev.DoneEvent | None = None
        self.status = "starting"  # starting, compiling, training, done, failed, stopped
        self.error: str | None = None
        self.compile_s: float | None = None
        self.compile_started: float | None = None  # monotonic, for the ticking label
        self.compile_started_t: float | None = None  # event time, for replays
        self.last_t = 0.0
        self.version = 0
        self.unknown_lines = 0
        self.newer_schema = False  # warned once that the stream is newer than this reader
        self.steps = Columns(STEP_COLUMNS, maxlen)  # the last maxlen step events
        self.samples = Columns(SYS_COLUMNS, maxlen)  # sys events, as many
        self.epoch = 1  # passes over a user's batches begun (``epoch`` notes)
        self.stalled: str | None = None  # a rank-stalled warning, until the next step lands
        self.last_step: ev.StepEvent | None = None
        self.skipped = 0
        self.step_count = 0  # step events ever seen (the columns forget)
        self.sys_count = 0
        self.mem_peak: int | None = None
        self.grad_zero: tuple[int, float] | None = None  # (step, fraction) last measured
        self.grad_zero_max = 0.0
        self.last_sys: ev.SysEvent | None = None
        self.gpu_seen = False
        self.log = EventLog()
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
            self.log.add("warning", None, newer)
        if isinstance(event, ev.UnknownEvent):
            self.unknown_lines += 1
            if newer is None and self.unknown_lines <= MAX_UNREADABLE_SHOWN:
                self.log.add(
                    "warning", None, f"unreadable line: {event.line[:200] or event.reason}"
                )
            return
        self.last_t = max(self.last_t, event.t)
        self.ranks.ingest(event)
        handler = HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)

    def _on_hello(self, e: ev.HelloEvent) -> None:
        self.hello = e
        spec = (e.config.get("workload") or {}).get("model")
        named = f"model {e.workload} from {spec}, " if e.workload else f"model {spec}, "
        model = named if spec else ""  # a watched loop's model is named by its class alone
        self.log.add(
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
        zeros = e.grad_zero_frac
        if zeros is not None:
            self.grad_zero = (e.step, zeros)
            self.grad_zero_max = max(self.grad_zero_max, zeros)
        scale = e.loss_scale
        self.steps.add(  # in STEP_COLUMNS' order
            plot_value(e.step),
            plot_value(e.t),
            plot_value(e.step_ms),
            e.profiled,  # slowed by torch.profiler: no figure of training's speed
            e.data_ms,
            e.samples_per_s,
            e.tokens_per_s,
            e.tflops,
            e.mfu,
            plot_value(e.loss),
            plot_value(math.log2(scale)) if scale is not None and scale > 0 else None,
            plot_value(e.mem_allocated),
            plot_value(e.mem_reserved),
            None if zeros is None else plot_value(zeros * 100),
        )
        peak = ev.peak_memory(e)  # allocated, never reserved: the figure records and bench show
        if peak is not None and (self.mem_peak is None or peak > self.mem_peak):
            self.mem_peak = peak
        if e.skipped:
            self.skipped += 1
            shown = "-" if e.loss_scale is None else fmt_num(e.loss_scale)
            self.log.add("skipped", e.step, f"step skipped (inf/NaN gradients), loss scale {shown}")

    def _on_sys(self, e: ev.SysEvent) -> None:
        """The engine's samples are the one source of host and GPU figures (engine/telemetry)."""
        self.last_sys = e
        self.sys_count += 1
        if e.gpu_util is not None or e.gpu_mem_total is not None:
            self.gpu_seen = True
        cores = None if e.proc_cpu is None else e.proc_cpu / 100
        self.samples.add(  # in SYS_COLUMNS' order
            plot_value(e.t),
            plot_value(e.gpu_util),
            plot_value(e.cpu_util),
            plot_value(cores),
            plot_value(e.gpu_mem_used),
            plot_value(e.gpu_mem_total),
        )

    def _on_phase(self, e: ev.PhaseEvent) -> None:
        if self.status in FINAL_STATES:
            return
        if e.phase == "compile" and e.state == "start":
            self.status = "compiling"
            self.compile_started = time.monotonic()
            self.compile_started_t = e.t
        elif e.phase == "compile" and e.state == "end":
            if e.seconds is not None:
                self.compile_s = e.seconds
            self.log.add("info", e.step, f"compiled in {e.seconds or 0:.1f} s")
        elif e.phase == "train" and e.state == "start":
            self.status = "training"

    def _on_note(self, e: ev.NoteEvent) -> None:
        """A new pass over a user's batches: the header counts it; the log says the first."""
        if e.code == ev.EPOCH_NOTE and e.count is not None:
            self.epoch = max(self.epoch, e.count)
            if e.count > 2:
                return
        self.log.add("info", e.step, e.message)

    def _on_warning(self, e: ev.WarningEvent) -> None:
        if e.code in ev.NOTE_CODES:  # a new pass over the user's batches (counted), ...
            self.epoch += e.code == ev.EPOCH_NOTE
            self.log.add("info", e.step, e.message)
            return
        if e.code == ev.RANK_STALLED:
            # "rank 1 has made no progress for 20 s": a card draws it as it is, so escaped here
            self.stalled = visible(e.message.split(",", 1)[0])
        self.log.add("warning", e.step, f"[{e.code}] {e.message}")

    def _on_error(self, e: ev.ErrorEvent) -> None:
        self.error = visible(f"{e.kind}: {e.message}", LOG_LINE_CHARS, keep_newlines=True)
        text = f"[{e.kind}] {e.message}"
        if e.hint:
            text += f"\n  hint: {e.hint}"
        self.log.add("error", e.step, text)
        if e.traceback:
            tail = e.traceback[-4 * LOG_LINE_CHARS :]
            last = [ln for ln in tail.strip().splitlines() if ln.strip()][-3:]
            for ln in last:
                self.log.add("stderr", e.step, ln)
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
        self.log.add("error" if e.status == "failed" else "info", None, fmt_done(e))

    def _on_numerics(self, e: ev.NumericsEvent) -> None:
        self.numerics.add(e)

    def _on_profile(self, e: ev.ProfileEvent) -> None:
        if not profiles.sound(e):  # a damaged record's: no split to show
            self.log.add("warning", e.step, "a profile whose figures do not hold: not shown")
            return
        self.profile = e
        self.log.add("info", e.step, f"profile of {e.steps} steps: {profiles.headline(e)}")


HANDLERS: dict[type, Callable[[EventState, Any], None]] = {
    ev.HelloEvent: EventState._on_hello,
    ev.StepEvent: EventState._on_step,
    ev.SysEvent: EventState._on_sys,
    ev.PhaseEvent: EventState._on_phase,
    ev.WarningEvent: EventState._on_warning,
    ev.NoteEvent: EventState._on_note,
    ev.ErrorEvent: EventState._on_error,
    ev.CompileEvent: EventState._on_compile,
    ev.DoneEvent: EventState._on_done,
    ev.NumericsEvent: EventState._on_numerics,
    ev.ProfileEvent: EventState._on_profile,
}
"""What each event type changes; a type this table lacks is counted in ``version`` only."""
