"""What the Run view draws from a RunState: the stat cards and the plot series.

Read at redraw time, never per event. Series are thinned to the plot's width, so the cost of
a redraw does not grow with the length of the run.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from ampscope.core import events as ev
from ampscope.core.machine.mfu import card_share
from ampscope.core.units import fmt_bytes, fmt_ms, fmt_num, fmt_steps, of_measured
from ampscope.tui.model.columns import plot_value
from ampscope.tui.model.run_events import RECENT
from ampscope.tui.model.run_state import RunState

Series = tuple[list, list]


@dataclass(frozen=True)
class Card:
    key: str
    title: str
    value: str
    sub: str = ""
    short: tuple[str, str] | None = None
    """Title and value where the detail line is hidden (80x24), for a card with more to say."""


def plottable(xs: Sequence[float], ys: Sequence[float]) -> Series:
    """The points a plot can draw (``plot_value``): finite, within PLOT_MAX, with tiny values
    drawn as 0. The Run view's columns hold such values already; other series pass here."""
    out_x: list = []
    out_y: list = []
    for x, y in zip(xs, ys, strict=False):
        px, py = plot_value(x), plot_value(y)
        if px is not None and py is not None:
            out_x.append(px)
            out_y.append(py)
    return out_x, out_y


def thin(xs: Sequence[float], ys: Sequence[float], max_points: int) -> Series:
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


# --------------------------------------------------------------------------- stat cards


def cards(state: RunState) -> list[Card]:
    """The ten cards, in the order the grid shows them: speed first, then the numerics."""
    return [
        *_speed_cards(state),
        _memory_card(state),
        _util_card(state),
        *_loss_cards(state),
        _grad_zero_card(state),
        _elapsed_card(state),
    ]


def _speed_cards(state: RunState) -> list[Card]:
    steps = state.steps
    recent = min(len(steps), RECENT)  # the steps the cards are of
    # a zero rate is an unknown one (a watched loop that gave no batch size or FLOP count)
    sps = _median(steps.last("samples_per_s", RECENT)) or None
    tps = _median([v for v in steps.last("tokens_per_s", RECENT) if v is not None])
    tfl = _median(steps.last("tflops", RECENT)) or None
    mfu = _median([v for v in steps.last("mfu", RECENT) if v is not None])
    hello = state.hello
    measured = (
        of_measured(tfl, hello.measured_tflops, hello.world_size) if hello is not None else None
    )
    data = state.median_data_ms()
    step_ms = fmt_ms(state.median_step_ms())
    # A card is 22 columns at 120, 14 at 80: the title says which steps the figure is of, so
    # that it is not read as the run's median (the last line of the log) when the two differ.
    title, short = "Step time", "Step time"
    if recent:
        title, short = f"Step time · last {recent}", f"Step · last {recent}"
    sub = "median" if recent else ""
    if data is not None:  # the wait for the next batch, a part of the step
        sub = f"median · data {fmt_ms(data)}"
    flops = "-" if tfl is None else f"{tfl:.3g}"
    # a CPU: the measured peak is the only one; a share over 100 % is no MFU (core/machine/mfu.py)
    shown = card_share(mfu if mfu is not None else measured)
    if tfl is not None and shown is not None:
        flops += f" · {shown}"
    return [
        Card(
            "step_ms",
            title,
            step_ms,
            sub,
            short=(short, step_ms),  # 80x24: the card is 14 columns
        ),
        Card(
            "throughput",
            "Samples/s",
            "-" if sps is None else fmt_num(sps),
            "" if tps is None else f"{fmt_num(tps)} tokens/s",
        ),
        Card(
            "tflops",
            "TFLOP/s · MFU",
            flops,
            "FLOPs not known"
            if tfl is None and recent
            else "MFU n/a (no peak known)"
            if mfu is None and measured is None
            # the card is 22 columns: the value line has the datasheet's MFU, this line the
            # share of this machine's measured peak (ampscope doctor --bench)
            else (
                f"{measured * 100:.0f}% of measured peak" if measured <= 1 else "beat measured peak"
            )
            if measured is not None
            else (f"MFU {mfu * 100:.1f}%" if mfu <= 1 else "MFU over peak")
            if mfu is not None
            else "",
        ),
    ]


def _loss_cards(state: RunState) -> list[Card]:
    last = state.last_step
    loss = _loss_card(last, state.done)
    if last is None:
        scale = Card("loss_scale", "Loss scale", "-", "")
    elif last.loss_scale is None:
        scale = Card("loss_scale", "Loss scale", "off", "no GradScaler")
    else:
        scale = Card(
            "loss_scale", "Loss scale", fmt_num(last.loss_scale), _log2_label(last.loss_scale)
        )
    total = state.step + 1 if state.step is not None else 0
    skipped = Card("skipped", "Skipped steps", str(state.skipped), f"of {total}" if total else "")
    return [loss, scale, skipped]


def _grad_zero_card(state: RunState) -> Card:
    """The underflow demo's number: output-gradient values that are exactly zero."""
    seen = state.grad_zero
    every = (state.hello.config if state.hello else {}).get("grad_zero_every")
    if seen is None and every == 0:  # never measured, by choice: not "yet"
        return Card("grad_zeros", "Grad zeros", "off", "grad_zero_every=0")
    if seen is None:
        return Card("grad_zeros", "Grad zeros", "-", "not measured yet")
    step, frac = seen
    return Card(
        "grad_zeros",
        "Grad zeros",
        _percent(frac),
        f"at step {step} · max {_percent(state.grad_zero_max)}",
    )


def _percent(frac: float) -> str:
    """45.0%, 0.04% (a small share is not rounded away), 0%."""
    pct = frac * 100
    if pct == 0 or pct >= 1:
        return f"{pct:.1f}%" if pct else "0%"
    return f"{pct:.2g}%"


def _elapsed_card(state: RunState) -> Card:
    seconds = state.last_t if state.hello is not None or state.step_count else None
    value = "-" if seconds is None else fmt_duration(seconds)
    sub, short = "", None
    total, median = state.total_steps, state.median_step_ms()
    if state.stalled and not state.finished:
        sub, short = state.stalled, (f"Elapsed {value}", "stalled")
    elif total and state.step is not None and median is not None and not state.finished:
        if state.step + 1 >= total:  # past the steps planned (a watched loop runs on): no ETA
            return Card("elapsed", "Elapsed", value, "", None)
        eta = fmt_duration((total - state.step - 1) * median / 1000)
        sub, short = f"ETA {eta}", (f"Elapsed {value}", f"ETA {eta}")
    elif state.done is not None:
        sub = f"{fmt_steps(state.done.steps_done)} steps"
    return Card("elapsed", "Elapsed", value, sub, short)


def fmt_duration(seconds: float) -> str:
    """5.2 s, 3m 20s, 1h 05m: a duration read at a glance."""
    if not math.isfinite(seconds) or seconds < 0:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def _loss_card(last: ev.StepEvent | None, done: ev.DoneEvent | None) -> Card:
    """The last loss; once the run is over, the final one as ``done`` names it ("nan", and
    the step), which a step line cannot tell (it writes inf and NaN alike as null)."""
    value = "-" if last is None else _fmt_loss(last.loss)
    notes = []
    if done is not None and done.loss_nonfinite:
        value = done.loss_nonfinite
        notes.append(f"at step {done.loss_final_step}")
    if done is not None and done.loss_first is not None:
        notes.append(f"first {_fmt_loss(done.loss_first)}")
    return Card("loss", "Loss", value, ", ".join(notes))


def _memory_card(state: RunState) -> Card:
    """Peak memory as records, bench and the console define it (``ev.peak_memory``), named:
    the CUDA allocator's peak of allocated bytes, or the process's peak RSS on a CPU run (its
    high-water mark since setup, in the card's title then). A compiled
    run's compile step has its own peak (``done.mem_peak_compile``): the detail line says it,
    in place of the reserved bytes (the memory plot draws those)."""
    last, peak = state.last_step, fmt_bytes(state.mem_peak)
    if last is None or last.mem_peak is None:  # the engine reports no allocator on the CPU
        return Card("memory", "Peak memory", peak, "process RSS" if last else "")
    # named in the title: a card is 14 columns wide at 80, its detail line hidden (the event
    # log's last line says the compile peak there)
    compiled = state.done.mem_peak_compile if state.done is not None else None
    if compiled is not None:
        sub = f"compile {fmt_bytes(compiled)}"
    else:
        sub = "" if last.mem_reserved is None else f"resv {fmt_bytes(last.mem_reserved)}"
    on_cpu = last.mem_reserved is None and state.hello is not None and state.hello.device == "cpu"
    return Card("memory", "Peak RSS" if on_cpu else "Peak allocated", peak, sub)


def _util_card(state: RunState) -> Card:
    s = state.last_sys
    cpu = None if s is None else (s.cpu_util if s.cpu_util is not None else s.proc_cpu)
    if state.gpu_seen and s is not None and s.gpu_util is not None:
        sub = f"CPU {cpu:.0f}%" if cpu is not None else ""
        if s.power_w is not None:
            sub = f"{s.power_w:.0f} W" + (f" · {sub}" if sub else "")
        return Card("util", "Utilization", f"GPU {s.gpu_util:.0f}%", sub)
    proc = None if s is None else s.proc_cpu
    value = "-" if cpu is None else f"CPU {cpu:.0f}%"
    sub = "no NVIDIA GPU" + ("" if proc is None else f" · engine {proc:.0f}%")
    return Card("util", "Utilization", value, sub)


# --------------------------------------------------------------------------- plot series


def _thinned(series: Series, max_points: int) -> Series:
    """A column pair as plots draw it: its values are ``plot_value``s already (kept so as
    events came in, tui/model/columns.py), thinned when there are more than ``max_points``."""
    xs, ys = series
    return (xs, ys) if len(xs) <= max_points else thin(xs, ys, max_points)


def step_time_series(state: RunState, max_points: int) -> Series:
    """Milliseconds against the step."""
    return _thinned(state.steps.series("step", "step_ms"), max_points)


OUTLIER_TIMES_MEDIAN = 4.0
"""A step slower than this many medians is drawn at the ceiling, so one stall (a checkpoint,
a recompile) does not flatten the axis for every other step."""


def clip_outliers(ys: Sequence[float]) -> tuple[list[float], float | None, int]:
    """``ys`` with the outliers drawn at a ceiling, the ceiling (None: nothing clipped), and
    how many were clipped."""
    ceiling, clipped = outlier_ceiling(sorted(ys))
    if ceiling is None:
        return list(ys), None, 0
    return [min(y, ceiling) for y in ys], ceiling, clipped


def outlier_ceiling(ordered: Sequence[float]) -> tuple[float | None, int]:
    """``clip_outliers``'s ceiling and count for one series given in ascending order, without
    a pass over it in Python (the step-time plot draws the points above at the ceiling)."""
    if len(ordered) < 3 or statistics.median(ordered) <= 0:
        return None, 0
    ceiling = OUTLIER_TIMES_MEDIAN * statistics.median(ordered)
    clipped = len(ordered) - bisect_right(ordered, ceiling)
    return (ceiling, clipped) if clipped else (None, 0)


def clip_outliers_across(
    series: Sequence[tuple[str, list[float], list[float]]],
) -> tuple[list[tuple[str, list[float], list[float]]], float | None, int]:
    """Several runs' ``series`` clipped at one ceiling, as ``clip_outliers`` clips one run's:
    four times the slowest run's median, so that a first step that compiled (seconds) does
    not flatten every run's steady steps into the floor. The ceiling (None: nothing clipped)
    and how many points were clipped come back with them."""
    medians = [statistics.median(ys) for _, _, ys in series if len(ys) >= 3]
    if not medians or max(medians) <= 0:
        return list(series), None, 0
    ceiling = OUTLIER_TIMES_MEDIAN * max(medians)
    clipped = sum(1 for _, _, ys in series for y in ys if y > ceiling)
    if not clipped:
        return list(series), None, 0
    return [(name, xs, [min(y, ceiling) for y in ys]) for name, xs, ys in series], ceiling, clipped


def loss_series(state: RunState, max_points: int) -> tuple[Series, Series]:
    """The finite losses, and log2 of the loss scale, against the step."""
    steps = state.steps
    loss = _thinned(steps.series("step", "loss"), max_points)
    return loss, _thinned(steps.series("step", "log2_scale"), max_points)


def grad_zero_series(state: RunState, max_points: int) -> Series:
    """Percent of output-gradient values that are exactly zero, on the steps that measured it."""
    return _thinned(state.steps.series("step", "grad_zero_pct"), max_points)


def memory_series(state: RunState, max_points: int) -> dict[str, Series]:
    """Bytes against seconds since the run started."""
    out: dict[str, Series] = {}
    on_cpu = state.hello is not None and state.hello.device == "cpu"
    allocated = "process RSS" if on_cpu else "allocated"  # the engine reports RSS on CPU
    for name, source, column in (
        (allocated, state.steps, "alloc"),
        ("reserved", state.steps, "resv"),
        ("device used", state.samples, "device_used"),
        ("device total", state.samples, "device_total"),
    ):
        series = source.series("t", column)
        if series[0]:
            out[name] = _thinned(series, max_points)
    return out


def util_series(state: RunState, max_points: int) -> dict[str, Series]:
    """GPU and system CPU in percent, and the engine's CPU in cores, against seconds."""
    out: dict[str, Series] = {}
    samples = state.samples
    for name, column in (("GPU", "gpu"), ("CPU", "cpu"), ("engine CPU", "engine_cores")):
        series = samples.series("t", column)
        if series[0]:
            out[name] = _thinned(series, max_points)
    return out


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
