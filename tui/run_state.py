"""What the dashboard knows about one run: a Textual-free model fed with events.

Everything is held in bounded ring buffers, so memory stays flat however long a run is.
The Run view reads stat-card values and thinned plot series from here on a timer.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ampscope.core import events as ev
from ampscope.core.units import fmt_bytes, fmt_ms, fmt_num
from ampscope.tui.rank_table import RankTable

MAX_POINTS = 4096
"""Steps (and sys samples) kept for the plots; older ones are dropped."""
RECENT = 20
"""Steps the stat cards summarise (median of the last RECENT)."""
MAX_LOG = 1000

FINAL_STATES = ("done", "failed", "stopped", "incomplete")


@dataclass(frozen=True)
class Card:
    key: str
    title: str
    value: str
    sub: str = ""


@dataclass(frozen=True)
class LogEntry:
    seq: int
    level: str  # info, warning, error, skipped, stderr
    step: int | None
    text: str


def thin(xs: Sequence[float], ys: Sequence[float], max_points: int) -> tuple[list, list]:
    """At most ``max_points`` points: each bucket of consecutive points keeps its min and max.

    Spikes survive (a one-step stall still shows), and the cost of a redraw no longer
    depends on how long the run has been going.
    """
    n = len(xs)
    if n <= max_points or max_points < 2:
        return list(xs), list(ys)
    buckets = max_points // 2
    out_x: list = []
    out_y: list = []
    for b in range(buckets):
        lo = b * n // buckets
        hi = (b + 1) * n // buckets
        if hi <= lo:
            continue
        i_min = i_max = lo
        for i in range(lo + 1, hi):
            if ys[i] < ys[i_min]:
                i_min = i
            if ys[i] > ys[i_max]:
                i_max = i
        for i in sorted({i_min, i_max}):
            out_x.append(xs[i])
            out_y.append(ys[i])
    return out_x, out_y


def points_for_width(columns: int) -> int:
    """About two points per character column of a plot."""
    return max(4, 2 * columns)


class RunState:
    """One run, live or replayed. ``ingest`` is cheap; reading is done at redraw time."""

    def __init__(
        self,
        label: str = "",
        launch: dict[str, Any] | None = None,
        maxlen: int = MAX_POINTS,
        read_only: bool = False,
    ) -> None:
        self.label = label
        self.launch: dict[str, Any] = dict(launch or {})
        self.read_only = read_only
        self.maxlen = maxlen
        self.hello: ev.HelloEvent | None = None
        self.done: ev.DoneEvent | None = None
        self.status = "starting"  # starting, compiling, training, done, failed, stopped
        self.error: str | None = None
        self.compile_s: float | None = None
        self.compile_info: ev.CompileEvent | None = None
        self._compile_started: float | None = None  # monotonic, for the ticking label
        self._compile_started_t: float | None = None  # event time, for replays
        self.last_t = 0.0
        self.version = 0
        self.events_seen = 0
        self.unknown_lines = 0
        self.stop_requested = False
        self.queue_note: str | None = None  # "sweep 2/4" while a queued sweep runs
        self.exit_code: int | None = None
        # (step, t, step_ms, loss, loss_scale, samples/s, tokens/s, tflops, mfu, alloc, reserved)
        self.steps: deque[tuple] = deque(maxlen=maxlen)
        # (t, gpu_util, cpu_util, proc_cpu, gpu_mem_used, gpu_mem_total)
        self.sys: deque[tuple] = deque(maxlen=maxlen)
        self.recent_ms: deque[float] = deque(maxlen=RECENT)
        self.last_step: ev.StepEvent | None = None
        self.skipped = 0
        self.step_count = 0  # step events ever seen (the deque forgets)
        self.sys_count = 0
        self.mem_peak: int | None = None
        self.last_sys: ev.SysEvent | None = None
        self.sys_from_engine = False
        self.gpu_seen = False
        self.log: deque[LogEntry] = deque(maxlen=MAX_LOG)
        self.log_seq = 0
        self.ranks = RankTable()  # each rank of a run on several processes

    # ---------------------------------------------------------------- ingest

    def ingest_many(self, items: Iterable[ev.Event | ev.UnknownEvent]) -> None:
        for item in items:
            self.ingest(item)

    def ingest(self, event: ev.Event | ev.UnknownEvent) -> None:
        self.version += 1
        self.events_seen += 1
        if isinstance(event, ev.UnknownEvent):
            self.unknown_lines += 1
            if self.unknown_lines <= 5:
                self.add_log("warning", None, f"unreadable line: {event.line[:200]}")
            return
        self.last_t = max(self.last_t, event.t)
        self.ranks.ingest(event)
        if isinstance(event, ev.StepEvent):
            self._on_step(event)
        elif isinstance(event, ev.SysEvent):
            self._on_sys(event, from_engine=True)
        elif isinstance(event, ev.PhaseEvent):
            self._on_phase(event)
        elif isinstance(event, ev.HelloEvent):
            self.hello = event
            self.add_log(
                "info",
                None,
                f"{event.preset} on {event.device} ({event.device_name}), "
                f"{fmt_num(event.param_count)} params, "
                f"torch {event.torch_version}",
            )
        elif isinstance(event, ev.WarningEvent):
            self.add_log("warning", event.step, f"[{event.code}] {event.message}")
        elif isinstance(event, ev.ErrorEvent):
            self.error = f"{event.kind}: {event.message}"
            text = f"[{event.kind}] {event.message}"
            if event.hint:
                text += f"\n  hint: {event.hint}"
            self.add_log("error", event.step, text)
            if event.traceback:
                last = [ln for ln in event.traceback.strip().splitlines() if ln.strip()][-3:]
                for ln in last:
                    self.add_log("stderr", event.step, ln)
            if event.kind == "config" and self.status == "starting":
                self.status = "failed"
        elif isinstance(event, ev.CompileEvent):
            self.compile_info = event
            if event.compile_s is not None:
                self.compile_s = event.compile_s
        elif isinstance(event, ev.DoneEvent):
            self._on_done(event)

    def _on_step(self, e: ev.StepEvent) -> None:
        if self.status in ("starting", "compiling"):
            self.status = "training"
        self.last_step = e
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
            )
        )
        self.recent_ms.append(e.step_ms)
        for mem in (e.mem_peak, e.mem_allocated, e.mem_reserved):
            if mem is not None and (self.mem_peak is None or mem > self.mem_peak):
                self.mem_peak = mem
        if e.skipped:
            self.skipped += 1
            scale = "-" if e.loss_scale is None else fmt_num(e.loss_scale)
            self.add_log("skipped", e.step, f"step skipped (inf/NaN gradients), loss scale {scale}")

    def _on_sys(self, e: ev.SysEvent, from_engine: bool) -> None:
        if from_engine:
            self.sys_from_engine = True
        self.last_sys = e
        self.sys_count += 1
        if e.gpu_util is not None or e.gpu_mem_total is not None:
            self.gpu_seen = True
        self.sys.append((e.t, e.gpu_util, e.cpu_util, e.proc_cpu, e.gpu_mem_used, e.gpu_mem_total))

    def ingest_local_sys(self, event: ev.SysEvent) -> None:
        """A sample the dashboard took itself (psutil) because the engine sends none."""
        if self.sys_from_engine:
            return
        self.version += 1
        self._on_sys(event, from_engine=False)

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

    def _on_done(self, e: ev.DoneEvent) -> None:
        self.done = e
        self.status = {"ok": "done"}.get(e.status, e.status)
        if e.compile_s is not None:
            self.compile_s = e.compile_s
        if e.mem_peak is not None and (self.mem_peak is None or e.mem_peak > self.mem_peak):
            self.mem_peak = e.mem_peak
        if e.error and not self.error:
            self.error = e.error
        text = (
            f"run {e.status}: {e.steps_done} steps in {e.wall_s:.1f} s, median step "
            f"{fmt_ms(e.step_ms_median)}, final loss {fmt_num(e.loss_final)}"
        )
        self.add_log("error" if e.status == "failed" else "info", None, text)

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

    def add_log(self, level: str, step: int | None, text: str) -> None:
        self.log_seq += 1
        self.log.append(LogEntry(self.log_seq, level, step, text))

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

    def phase_label(self, now: float | None = None) -> str:
        if self.status == "compiling":
            if self._compile_started is not None and not self.read_only:
                elapsed = (now if now is not None else time.monotonic()) - self._compile_started
            else:
                elapsed = self.last_t - (self._compile_started_t or 0.0)
            return f"compiling {elapsed:.0f}s"
        return self.status

    def header(self, now: float | None = None) -> str:
        cfg = self.config
        preset = self.hello.preset if self.hello else (self.label or cfg.get("name", "?"))
        device = self.hello.device if self.hello else str(cfg.get("device", "?"))
        if self.hello and self.hello.device_name and self.hello.device_name != device:
            device = f"{device} ({self.hello.device_name})"
        step = "-" if self.step is None else str(self.step + 1)
        total = self.total_steps
        progress = f"step {step}/{total}" if total else f"step {step}"
        parts = [
            self.phase_label(now),
            progress,
            preset,
            device,
            str(cfg.get("precision", "?")),
            f"compile {cfg.get('compile', '?')}",
        ]
        if self.read_only:
            parts.append("replay")
        if self.queue_note:
            parts.append(self.queue_note)
        return " · ".join(parts)

    def cards(self) -> list[Card]:
        recent = [s for s in list(self.steps)[-RECENT:]]
        med = self.median_step_ms()
        sps = _median([s[5] for s in recent])
        tps = _median([s[6] for s in recent if s[6] is not None])
        tfl = _median([s[7] for s in recent])
        mfu = _median([s[8] for s in recent if s[8] is not None])
        last = self.last_step
        cards = [
            Card(
                "step_ms",
                "Step time",
                fmt_ms(med),
                f"median of last {len(recent)}" if recent else "",
            ),
            Card(
                "throughput",
                "Throughput",
                "-" if sps is None else f"{fmt_num(sps)} samples/s",
                "" if tps is None else f"{fmt_num(tps)} tokens/s",
            ),
            Card(
                "tflops",
                "TFLOP/s · MFU",
                "-" if tfl is None else f"{tfl:.3g}",
                "MFU n/a" if mfu is None else f"MFU {mfu * 100:.1f}%",
            ),
            Card(
                "loss",
                "Loss",
                "-" if last is None else _fmt_loss(last.loss),
                ""
                if self.done is None or self.done.loss_first is None
                else f"first {_fmt_loss(self.done.loss_first)}",
            ),
        ]
        if last is None or last.loss_scale is None:
            cards.append(
                Card(
                    "loss_scale",
                    "Loss scale",
                    "-" if last is None else "off",
                    "no GradScaler" if last is not None else "",
                )
            )
        else:
            cards.append(
                Card(
                    "loss_scale",
                    "Loss scale",
                    fmt_num(last.loss_scale),
                    _log2_label(last.loss_scale),
                )
            )
        total = self.step + 1 if self.step is not None else 0
        cards.append(
            Card("skipped", "Skipped steps", str(self.skipped), f"of {total}" if total else "")
        )
        alloc = last.mem_allocated if last else None
        resv = last.mem_reserved if last else None
        sub = " · ".join(
            x
            for x in (
                f"alloc {fmt_bytes(alloc)}" if alloc is not None else "",
                f"resv {fmt_bytes(resv)}" if resv is not None else "",
            )
            if x
        )
        cards.append(Card("memory", "Peak memory", fmt_bytes(self.mem_peak), sub))
        s = self.last_sys
        cpu = None if s is None else (s.cpu_util if s.cpu_util is not None else s.proc_cpu)
        if self.gpu_seen and s is not None and s.gpu_util is not None:
            sub = f"CPU {cpu:.0f}%" if cpu is not None else ""
            if s.power_w is not None:
                sub = f"{s.power_w:.0f} W" + (f" · {sub}" if sub else "")
            cards.append(Card("util", "GPU util", f"{s.gpu_util:.0f}%", sub))
        else:
            proc = None if s is None else s.proc_cpu
            value = "-" if cpu is None else f"CPU {cpu:.0f}%"
            sub = "no NVIDIA GPU" + ("" if proc is None else f" · engine {proc:.0f}%")
            cards.append(Card("util", "GPU util", value, sub))
        return cards

    # series: each returns (xs, [(name, ys), ...]) already thinned to max_points
    def step_time_series(self, max_points: int) -> tuple[list, list]:
        xs = [s[0] for s in self.steps]
        ys = [s[2] for s in self.steps]
        return thin(xs, ys, max_points)

    def loss_series(self, max_points: int) -> tuple[tuple[list, list], tuple[list, list]]:
        pts = [(s[0], s[3]) for s in self.steps if s[3] is not None and math.isfinite(s[3])]
        loss = thin([p[0] for p in pts], [p[1] for p in pts], max_points)
        sc = [(s[0], math.log2(s[4])) for s in self.steps if s[4] is not None and s[4] > 0]
        scale = thin([p[0] for p in sc], [p[1] for p in sc], max_points)
        return loss, scale

    def memory_series(self, max_points: int) -> dict[str, tuple[list, list]]:
        """MiB against seconds since the run started."""
        out: dict[str, tuple[list, list]] = {}
        on_cpu = self.hello is not None and self.hello.device == "cpu"
        allocated = "process RSS" if on_cpu else "allocated"  # the engine reports RSS on CPU
        for name, idx in ((allocated, 9), ("reserved", 10)):
            pts = [(s[1], s[idx] / 2**20) for s in self.steps if s[idx] is not None]
            if pts:
                out[name] = thin([p[0] for p in pts], [p[1] for p in pts], max_points)
        for name, idx in (("device used", 4), ("device total", 5)):
            pts = [(s[0], s[idx] / 2**20) for s in self.sys if s[idx] is not None]
            if pts:
                out[name] = thin([p[0] for p in pts], [p[1] for p in pts], max_points)
        return out

    def util_series(self, max_points: int) -> dict[str, tuple[list, list]]:
        """Percent against seconds since the run started."""
        out: dict[str, tuple[list, list]] = {}
        for name, idx in (("GPU", 1), ("CPU", 2), ("engine CPU", 3)):
            pts = [(s[0], s[idx]) for s in self.sys if s[idx] is not None]
            if pts:
                out[name] = thin([p[0] for p in pts], [p[1] for p in pts], max_points)
        return out


def replay(events: Iterable[ev.Event], label: str = "") -> RunState:
    """A finished run's state, from its record's events, all at once."""
    state = RunState(label=label, read_only=True)
    state.ingest_many(events)
    if not state.finished:
        state.status = "incomplete"
        state.add_log("warning", None, "the record has no 'done' event (the run was cut short)")
    return state


def _median(values: list) -> float | None:
    return statistics.median(values) if values else None


def _fmt_loss(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "inf/NaN"  # the stream writes a non-finite loss as null
    return f"{x:.4g}"


def _log2_label(scale: float) -> str:
    if scale <= 0:
        return ""
    return f"2^{math.log2(scale):.0f}"
