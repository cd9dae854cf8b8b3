"""The comparison table: a row per preset from its runs' records (``Row``, ``row_from_runs``),
the speed-ups against the baseline and the verdicts read from them, and the table as text,
CSV or JSON and as a sweep record (``write_sweep``).
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.comparison import significance
from ampscope.core.machine import check
from ampscope.core.text import visible, wrap
from ampscope.core.units import fmt_bytes, fmt_final_loss, fmt_mfu, fmt_ms, fmt_num

LECTURE_SWEEP = ["fp32", "tf32", "amp-bf16", "amp-fp16", "amp-fp16-noscale", "bf16"]
DEFAULT_BASELINE = "fp32"
SWEEP_FILE = "sweep.json"
# What must match the baseline for a difference to be a precision effect, in the user's words.
SETUP_FIELDS = ("workload", "sizes", "batch", "steps", "device", "processes")


class Row(msgspec.Struct, kw_only=True):
    """One preset's line in the comparison (several runs of it when repeated)."""

    preset: str
    status: str  # ok | failed | stopped | mixed
    runs: int
    reason: str | None = None
    step_ms: float | None = None  # geometric mean of the runs' median step times (by clock)
    spread_lo: float | None = None  # p10 of one run, or the lowest repeat's median
    spread_hi: float | None = None
    run_medians: list[float | None] = msgspec.field(default_factory=list)  # per run, in order
    setup: dict[str, str] = msgspec.field(default_factory=dict)  # SETUP_FIELDS, from hello
    differs: list[str] = msgspec.field(default_factory=list)  # SETUP_FIELDS unlike the baseline
    speedup: float | None = None  # baseline step time / this step time
    speedup_low: float | None = None  # 95 % confidence interval (3 or more repeats)
    speedup_high: float | None = None
    significant: bool | None = None  # None: not tested (fewer than 3 repeats, or no baseline)
    is_baseline: bool = False
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    tflops: float | None = None
    mfu: float | None = None
    mfu_measured: float | None = None  # against this machine's measured peak (doctor --bench)
    mem_peak: int | None = None
    mem_change: float | None = None  # fraction vs the baseline: -0.38 is 38 % less
    # What mem_peak measures: "rss" (a CPU run: the process's peak resident memory, runtime
    # and all) or "allocated" (CUDA: the allocator's peak of tensor bytes); None: not known
    mem_measure: str | None = None
    loss_final: float | None = None
    loss_nonfinite: str | None = None  # "nan" or "inf" when a run ended on a non-finite loss
    loss_nonfinite_step: int | None = None
    loss_change: float | None = None  # relative difference from the baseline's final loss
    skipped_steps: int = 0
    grad_zero_frac: float | None = None  # the largest measured in the run(s)
    compile_s: float | None = None
    run_dirs: list[str] = msgspec.field(default_factory=list)
    clock: str = "wall"  # step times by the wall clock, or the CPU's (bench --clock cpu)
    # --clock cpu: the same aggregate of the same runs by the wall clock, to check the CPU's
    wall_ms: float | None = None
    wall_run_medians: list[float | None] = msgspec.field(default_factory=list)
    wall_speedup: float | None = None  # the baseline's wall time / this row's
    clocks_disagree: bool = False  # the wall clock rules out the CPU clock's speed-up


def interleaved(presets: Sequence[str], repeats: int) -> list[str]:
    """ABAB order: every preset once, then every preset again."""
    return [p for _ in range(repeats) for p in presets]


def row_from_runs(preset: str, runs: Sequence[records.RunRecord]) -> Row:
    """One row from a preset's runs. A stopped run's figures count: they measure the steps it
    ran (its status says it stopped); a failed run's do not. Beside a repeat that finished, a
    stopped one's fewer steps (its loss not yet a final loss) are left out."""
    dones = [r.done for r in runs if r.done is not None]
    measured = [d for d in dones if d.status in ("ok", "stopped") and d.steps_done > 0]
    finished = [d for d in measured if d.status == "ok"]
    stopped = len(measured) - len(finished)
    measured = finished or measured
    statuses = {r.status for r in runs}
    status = statuses.pop() if len(statuses) == 1 else "mixed"
    row = Row(preset=preset, status=status, runs=len(runs), run_dirs=[str(r.path) for r in runs])
    failures = [_reason(r) for r in runs if r.status != "ok"]
    row.reason = next((f for f in failures if f), None)
    if row.reason is None and finished and stopped:
        row.reason = (
            f"{stopped} of {len(runs)} runs stopped before the last step: the figures are the "
            "finished runs'"
        )
    zeros = [
        e.grad_zero_frac
        for r in runs
        for e in r.events
        if isinstance(e, ev.StepEvent) and e.grad_zero_frac is not None
    ]
    row.grad_zero_frac = max(zeros) if zeros else None
    row.skipped_steps = sum(d.skipped_steps for d in dones)
    went_nonfinite = next((d for d in dones if d.loss_nonfinite), None)
    if went_nonfinite is not None:  # shown as it happened, never an earlier finite loss
        row.loss_nonfinite = went_nonfinite.loss_nonfinite
        row.loss_nonfinite_step = went_nonfinite.loss_final_step
    row.setup = setup_of(runs[0]) if runs else {}
    row.mem_measure = memory_measure(runs)
    row.run_medians = [
        r.done.step_ms_median if r.done is not None and r.done in measured else None for r in runs
    ]
    if not measured:
        return row
    ok = measured
    medians = [d.step_ms_median for d in ok if d.step_ms_median is not None]
    if medians:
        # The geometric mean, as the speed-up averages the logs of paired ratios: with every
        # repeat paired, speedup = baseline step time / this step time, as printed.
        row.step_ms = statistics.geometric_mean(medians) if len(medians) > 1 else medians[0]
        if len(medians) > 1:
            row.spread_lo, row.spread_hi = min(medians), max(medians)
        else:
            row.spread_lo, row.spread_hi = ok[0].step_ms_p10, ok[0].step_ms_p90
    set_rates(row, [r for r in runs if r.done in ok], row.step_ms)
    peaks = [d.mem_peak for d in ok if d.mem_peak is not None]
    row.mem_peak = max(peaks) if peaks else None
    row.loss_final = _median([d.loss_final for d in ok])
    compiles = [d.compile_s for d in ok if d.compile_s is not None]
    row.compile_s = statistics.median(compiles) if compiles else None
    return row


def set_rates(row: Row, runs: Sequence[records.RunRecord], step_ms: float | None) -> None:
    """The row's samples/s, tokens/s, TFLOP/s and MFU at the row's own step time ``step_ms``.

    Each run's rate times its median step time is the work of its typical step (samples,
    tokens, FLOPs, a share of the peak); the median of that over the runs, divided by
    ``step_ms``, is the rate beside that step time. So a row's rates and its step time are
    one figure seen two ways, by one aggregate and one clock: 1.09k samples/s never stands
    beside a step time that implies half of it.
    """

    def at_step_time(rate: Callable[[records.RunRecord], float | None]) -> float | None:
        work = []
        for run in runs:
            value, ms = rate(run), run.done.step_ms_median if run.done is not None else None
            if value is not None and ms:
                work.append(value * ms)
        return statistics.median(work) / step_ms if work and step_ms else None

    row.samples_per_s = at_step_time(lambda r: r.done.samples_per_s if r.done else None)
    row.tokens_per_s = at_step_time(lambda r: r.done.tokens_per_s if r.done else None)
    row.tflops = at_step_time(lambda r: r.done.tflops if r.done else None)
    row.mfu = at_step_time(lambda r: r.done.mfu if r.done else None)
    row.mfu_measured = at_step_time(check.mfu_measured)


RSS, ALLOCATED = "rss", "allocated"
MEMORY_WORDS = {RSS: "peak process memory (RSS)", ALLOCATED: "peak allocated memory"}
"""What a verdict calls a row's peak memory, by what it measures."""
MEMORY_HEADS = {
    RSS: {"mem": "peak RSS", "mem_change": "RSS vs base"},
    ALLOCATED: {"mem": "peak alloc", "mem_change": "alloc vs base"},
}
MEMORY_LEGEND = {
    RSS: "peak RSS: the engine process's peak resident memory (RSS), the Python and torch "
    "runtime and its caches as well as the tensors: not the training tensors that ampscope "
    "memory plans, so the two can differ, even in which preset needs more.",
    ALLOCATED: "peak alloc: the peak of torch's CUDA allocator (max_memory_allocated), the "
    "bytes it gave to tensors, not the cache it holds.",
}


def memory_measure(runs: Sequence[records.RunRecord]) -> str | None:
    """What the runs' peak memory is: the process RSS on a CPU, the allocator's peak on
    CUDA (``ev.peak_memory``); None without a hello to say where they ran."""
    devices = {r.hello.device for r in runs if r.hello is not None}
    if not devices:
        return None
    on_cuda = {d.startswith("cuda") for d in devices}
    return None if len(on_cuda) > 1 else ALLOCATED if on_cuda.pop() else RSS


def setup_of(run: records.RunRecord) -> dict[str, str]:
    """The run's workload, sizes, batch, steps, device and processes (torchrun's ranks, each
    training the batch: a step of N does N times the work) as text, from its hello event."""
    if run.hello is None:
        return {}
    conf = run.hello.config or {}
    workload = conf.get("workload") or {}
    sizes = {k: v for k, v in workload.items() if k not in ("kind", "size") and v is not None}
    return {
        "workload": str(workload.get("kind", "?")),
        "sizes": ", ".join(f"{k}={v}" for k, v in sorted(sizes.items())),
        "batch": str(conf.get("batch_size", "?")),
        "steps": str(conf.get("steps", "?")),
        "device": run.hello.device_name or run.hello.device,
        "processes": str(run.hello.world_size or 1),
    }


def compare(rows: list[Row], baseline: str) -> list[Row]:
    """Fill speed-up, memory and loss changes relative to the baseline row.

    A row whose setup differs from the baseline's gets ``differs`` and no relative figures.
    """
    base = next((r for r in rows if r.preset == baseline), None)
    for row in rows:
        row.differs = []
        row.speedup = row.speedup_low = row.speedup_high = row.significant = None
        row.mem_change = row.loss_change = row.wall_speedup = None
        row.clocks_disagree = False
        row.is_baseline = row is base
        if base is None:
            continue
        if row.setup and base.setup:
            row.differs = [f for f in SETUP_FIELDS if row.setup.get(f) != base.setup.get(f)]
        if row.differs:
            continue
        if row is base:
            row.speedup = 1.0 if row.step_ms is not None else None
        elif row.step_ms is not None and base.step_ms is not None:
            tested = significance.speed_up(base.run_medians, row.run_medians)
            if tested is None:
                row.speedup = base.step_ms / row.step_ms
            else:
                row.speedup, row.speedup_low, row.speedup_high = (
                    tested.ratio,
                    tested.low,
                    tested.high,
                )
                row.significant = tested.significant
            if row.wall_ms and base.wall_ms:  # --clock cpu: what the wall clock says of it
                wall = significance.speed_up(base.wall_run_medians, row.wall_run_medians)
                row.wall_speedup = wall.ratio if wall is not None else base.wall_ms / row.wall_ms
                row.clocks_disagree = _clocks_disagree(row.speedup, row.wall_speedup, wall)
        if row.mem_peak and base.mem_peak:
            row.mem_change = row.mem_peak / base.mem_peak - 1
        if row.loss_final is not None and base.loss_final:
            row.loss_change = row.loss_final / base.loss_final - 1
    return rows


def verdicts(rows: list[Row], baseline: str) -> list[str]:
    """Sentences a lecturer can read aloud, derived from the numbers only."""
    base = next((r for r in rows if r.preset == baseline), None)
    lines = [_off_cpu_note(base)] if base is not None and off_cpu(base) else []
    for row in rows:
        stopped = row.status == "stopped" and not row.reason
        if stopped:  # the baseline's too: every other row is read against its figures
            lines.append(
                f"{row.preset} was stopped before its last step: its figures cover the steps "
                "it ran."
            )
        if row.preset == baseline:
            continue
        if not stopped and row.status != "ok":
            lines.append(
                f"{row.preset} {row.status}: {(row.reason or 'see its run record').rstrip('.')}."
            )
        if row.status != "ok" and row.step_ms is None:
            continue
        if row.differs and base is not None:
            lines.append(_not_comparable(row, base))
            continue
        parts = []
        if row.speedup is not None:
            parts.append(_speed_words(row, baseline))
        if row.mem_change is not None and abs(row.mem_change) >= 0.01:
            more_less = "less" if row.mem_change < 0 else "more"
            memory = MEMORY_WORDS.get(row.mem_measure or "", "peak memory")
            parts.append(f"{abs(row.mem_change):.0%} {more_less} {memory}")
        if row.loss_change is not None:
            if abs(row.loss_change) < 0.005:
                parts.append(f"final loss within {max(abs(row.loss_change), 0.001):.1%}")
            else:
                worse = "higher" if row.loss_change > 0 else "lower"
                parts.append(f"final loss {abs(row.loss_change):.1%} {worse}")
        sentence = f"{row.preset}: " + ", ".join(parts) if parts else f"{row.preset}: no baseline"
        lines.append(sentence + ".")
        if off_cpu(row):
            lines.append(_off_cpu_note(row))
        elif clocks_disagree(row) and not (base is not None and off_cpu(base)):
            lines.append(_clocks_note(row, base))
        underflow = _underflow_words(row, base)
        if underflow:
            lines.append(underflow)
        if row.skipped_steps:
            lines.append(f"{row.preset}: the loss scaler skipped {row.skipped_steps} step(s).")
    return lines


def _underflow_words(row: Row, base: Row | None) -> str | None:
    """The output-gradient zeros a preset adds to the baseline's: a zero the baseline has
    too (a Hugging Face causal LM's last position, which no label follows) is the model's,
    not an underflow."""
    zeros = row.grad_zero_frac
    if zeros is None:
        return None
    base_zeros = base.grad_zero_frac if base is not None else None
    if not base_zeros or base is None:
        if zeros < 0.01:
            return None
        return f"{row.preset} lost {zeros:.0%} of its output-gradient values to underflow (exact zeros)."
    if zeros - base_zeros < 0.01:
        return None
    return (
        f"{row.preset} lost {zeros:.0%} of its output-gradient values to underflow "
        f"(exact zeros; {base.preset} {base_zeros:.1%})."
    )


CLOCKS_DISAGREE = 1.2
"""A CPU-clock speed-up and the wall clock's this many times apart (either way) disagree
widely: the verdict gives both and calls neither a speed-up."""
OFF_CPU = 0.5
"""CPU time under this share of a step's wall time: most of the step is off the CPU clock
(sleep, I/O, a device, other processes), which ``--clock cpu`` does not see."""


def _clocks_disagree(cpu: float | None, wall: float, tested: significance.SpeedUp | None) -> bool:
    """``--clock cpu``: the wall clock rules out the CPU clock's speed-up ``cpu``. With
    repeats, when ``cpu`` lies outside the wall clock's own confidence interval (a wall clock
    swinging with other tenants rules nothing out: that is what the CPU clock is for); and
    either way only when the two are :data:`CLOCKS_DISAGREE` times apart or more."""
    if cpu is None or cpu <= 0 or wall <= 0 or max(cpu / wall, wall / cpu) < CLOCKS_DISAGREE:
        return False
    return tested is None or not tested.low <= cpu <= tested.high


def clocks_disagree(row: Row) -> bool:
    """``--clock cpu``: the row's CPU-clock speed-up and the wall clock's disagree widely."""
    return row.clocks_disagree and row.wall_speedup is not None and row.speedup is not None


def off_cpu(row: Row) -> bool:
    """``--clock cpu``: most of the row's step time is not this process's CPU time."""
    return (
        row.wall_ms is not None and row.step_ms is not None and row.step_ms < OFF_CPU * row.wall_ms
    )


def _off_cpu_note(row: Row) -> str:
    assert row.step_ms is not None and row.wall_ms is not None
    return (
        f"{row.preset}: its CPU time is {row.step_ms / row.wall_ms:.0%} of its wall time "
        f"({fmt_ms(row.step_ms)} of {fmt_ms(row.wall_ms)} a step): most of a step is off the "
        "CPU clock (sleep, I/O, a device, or other processes: DataLoader workers, other "
        "tenants), so CPU times compare this process's own work only."
    )


def _clocks_note(row: Row, base: Row | None) -> str:
    shares = [
        f"{r.preset} {fmt_ms(r.step_ms)} of CPU time in {fmt_ms(r.wall_ms)}"
        for r in (base, row)
        if r is not None and r.step_ms is not None and r.wall_ms is not None
    ]
    return (
        f"{row.preset}: the CPU clock and the wall clock disagree ({'; '.join(shares)} a step): "
        "threads working at once each add CPU time, waits add none."
    )


def _speed_words(row: Row, baseline: str) -> str:
    assert row.speedup is not None
    n = significance.MIN_REPEATS
    if clocks_disagree(row):
        assert row.wall_speedup is not None
        if (row.speedup - 1) * (row.wall_speedup - 1) <= 0:
            return (
                f"no speed verdict: the clocks contradict each other (by CPU time a step "
                f"{row.speedup:.2g}x the speed of {baseline}, by the wall clock "
                f"{row.wall_speedup:.2g}x)"
            )
        less_more = "less" if row.speedup > 1 else "more"
        factor = row.speedup if row.speedup > 1 else 1 / row.speedup
        return (
            f"{factor:.2g}x {less_more} CPU time a step than {baseline}"
            f"{'' if row.significant is not None else ' (untested)'}, but "
            f"{row.wall_speedup:.2g}x its speed by the wall clock: no speed verdict"
        )
    if row.significant is None:
        return (
            f"no speed verdict without {n} or more interleaved runs of each (--repeats {n}); "
            f"an untested {row.speedup:.2g}x the speed of {baseline}"
        )
    interval = f"{significance.LEVEL:.0%} CI {row.speedup_low:.3g}-{row.speedup_high:.3g}x"
    if not row.significant:
        return f"no significant speed difference from {baseline} ({interval})"
    if row.speedup >= 1:
        return f"{row.speedup:.2g}x faster than {baseline} ({interval})"
    return f"{1 / row.speedup:.2g}x slower than {baseline} ({interval})"


def _not_comparable(row: Row, base: Row) -> str:
    fields = row.differs
    named = fields[0] if len(fields) == 1 else ", ".join(fields[:-1]) + " and " + fields[-1]
    details = "; ".join(f"{f} {row.setup.get(f)} vs {base.setup.get(f)}" for f in fields)
    return f"{row.preset}: different {named} from {base.preset}: not comparable ({details})."


COLUMNS = [
    ("preset", "preset"),
    ("step time", "step"),
    ("speedup", "speedup"),
    ("samples/s", "samples"),
    ("tokens/s", "tokens"),
    ("TFLOP/s", "tflops"),
    ("MFU", "mfu"),
    ("peak mem", "mem"),
    ("mem vs base", "mem_change"),
    ("final loss", "loss"),
    ("loss vs base", "loss_change"),
    ("skipped", "skipped"),
    ("grad zeros", "zeros"),
    ("compile", "compile"),
    ("status", "status"),
]


def cells(row: Row, with_spread: bool = True) -> dict[str, str]:
    """Each figure of a row as shown; ``with_spread``: the step time's p10-p90 beside it."""
    spread = ""
    if with_spread and row.spread_lo is not None and row.spread_hi is not None:
        spread = f" ({fmt_ms(row.spread_lo)}-{fmt_ms(row.spread_hi)})"
    speedup = _speed_cell(row)
    return {
        "preset": row.preset,
        "step": (fmt_ms(row.step_ms) + spread) if row.step_ms is not None else "-",
        "speedup": speedup,
        "samples": fmt_num(row.samples_per_s),
        "tokens": fmt_num(row.tokens_per_s),
        "tflops": f"{row.tflops:.3g}" if row.tflops is not None else "-",
        "mfu": fmt_mfu(row.mfu, row.mfu_measured),
        "mem": fmt_bytes(row.mem_peak),
        "mem_change": f"{row.mem_change:+.0%}" if row.mem_change is not None else "-",
        "loss": f"{row.loss_final:.4f}"
        if row.loss_final is not None
        else fmt_final_loss(None, row.loss_nonfinite, row.loss_nonfinite_step),
        "loss_change": f"{row.loss_change:+.1%}" if row.loss_change is not None else "-",
        "skipped": str(row.skipped_steps),
        "zeros": f"{row.grad_zero_frac:.1%}" if row.grad_zero_frac is not None else "-",
        "compile": f"{row.compile_s:.1f} s" if row.compile_s is not None else "-",
        "status": f"{row.status}: {row.reason}" if row.reason else row.status,
    }


def text_table(heads: list[str], body: list[list[str]], width: int | None = None) -> list[str]:
    """Columns padded to their widest cell. Wider than ``width``: cut into blocks of whole
    columns, one under the other, each starting with the first column (the preset)."""
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(heads)]
    blocks: list[list[int]] = [[0]]
    used = widths[0]
    for i in range(1, len(heads)):
        if width is not None and used + 2 + widths[i] > width and len(blocks[-1]) > 1:
            blocks.append([0])
            used = widths[0]
        blocks[-1].append(i)
        used += 2 + widths[i]
    lines: list[str] = []
    for block in blocks:
        if lines:
            lines.append("")
        lines.append("  ".join(heads[i].ljust(widths[i]) for i in block).rstrip())
        lines += ["  ".join(r[i].ljust(widths[i]) for i in block).rstrip() for r in body]
    return lines


def _speed_cell(row: Row) -> str:
    """'1.31x (1.22-1.41)' tested and significant, '~' not significant, '?' untested."""
    if row.differs:
        return "not comparable: " + ", ".join(row.differs)
    if row.speedup is None:
        return "-"
    if row.is_baseline:
        return f"{row.speedup:.2f}x"
    clocks = " !" if clocks_disagree(row) else ""
    if row.significant is None:
        return f"{row.speedup:.2f}x ?{clocks}"
    interval = f"{row.speedup:.2f}x ({row.speedup_low:.2f}-{row.speedup_high:.2f})"
    return interval + ("" if row.significant else " ~") + clocks


def render(rows: list[Row], baseline: str, fmt: str = "text", width: int | None = None) -> str:
    """The comparison as text (fitted to ``width`` columns when given), markdown, CSV or JSON."""
    if fmt == "json":
        return json.dumps(
            {
                "baseline": baseline,
                "rows": msgspec.to_builtins(rows),
                "verdict": verdicts(rows, baseline),
            },
            indent=2,
        )
    table = [cells(r) for r in rows]
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        lists = ("run_dirs", "run_medians", "wall_run_medians", "setup")
        fields = [f for f in Row.__struct_fields__ if f not in lists]
        writer.writerow(fields)
        for row in rows:
            writer.writerow([_csv_value(getattr(row, f)) for f in fields])
        return out.getvalue()
    by_cpu = bool(rows) and rows[0].clock == "cpu"
    memory = MEMORY_HEADS.get(_memory_measure(rows) or "", {})
    heads = [memory.get(k) or (CPU_HEADS.get(k, h) if by_cpu else h) for h, k in COLUMNS]
    body = [[c[k] for _, k in COLUMNS] for c in table]
    if fmt == "markdown":
        lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        lines += ["| " + " | ".join(r) + " |" for r in body]
    else:
        lines = text_table(heads, body, width)
    notes = [
        line
        for note in verdicts(rows, baseline) + legend(rows)
        for line in wrap(note, width, hang="  ")
    ]
    return "\n".join(lines) + ("\n\n" + "\n".join(notes) if notes else "")


CLOCK_WORDS = {
    "wall": "wall clock (each step's elapsed time)",
    "cpu": "CPU clock (each step's process CPU time, all threads: --clock cpu)",
}
CPU_HEADS = {
    "step": "CPU time/step",
    "samples": "samples/CPU s",
    "tokens": "tokens/CPU s",
    "tflops": "TFLOP/CPU s",
}
"""bench --clock cpu: the columns timed by the CPU clock, named so."""


def _measured(row: Row) -> int:
    """How many of a row's runs measured a step time."""
    return sum(m is not None for m in row.run_medians)


def legend(rows: list[Row]) -> list[str]:
    """Which clock and which aggregate the row's figures are, and what the marks in the
    speed-up column mean, for the marks that appear."""
    notes = []
    clock = rows[0].clock if rows else "wall"
    repeated = any(r.runs > 1 for r in rows)
    # a row whose other repeats failed or were not run shows one run's spread
    alone = [r.preset for r in rows if r.spread_lo is not None and _measured(r) == 1]
    aggregate = (
        "; across repeats their geometric mean (the fastest and slowest repeat's in brackets"
        + (f"; {', '.join(alone)}: one repeat measured, its steps' p10-p90" if alone else "")
        + "); speedup: the geometric mean of the paired repeats' ratios, the baseline's step "
        "time / the row's when every repeat ran"
        if repeated
        else " (its steps' p10-p90 in brackets); speedup: the baseline's step time / the row's"
    )
    rates = (
        "samples, tokens and TFLOP per CPU second: a step's work over that CPU time (MFU is a "
        "wall-clock figure: -)"
        if clock == "cpu"
        else "samples/s, tokens/s, TFLOP/s and MFU: a step's work over that step time"
    )
    if any(r.step_ms is not None for r in rows):
        notes.append(
            f"step time: {CLOCK_WORDS.get(clock, clock)}, each run's median over its timed "
            f"steps{aggregate}; {rates}."
        )
    measures = {r.mem_measure for r in rows if r.mem_peak is not None}
    notes += [MEMORY_LEGEND[m] for m in (RSS, ALLOCATED) if m in measures]
    if any(clocks_disagree(r) for r in rows):
        notes.append(
            f"! marks a CPU-clock speed-up the wall clock rules out (the two {CLOCKS_DISAGREE}x "
            "apart or more): the verdict gives both."
        )
    if any(r.significant is not None for r in rows):
        notes.append(
            f"speedup interval: {significance.LEVEL:.0%} confidence; "
            "~ marks an interval that contains 1.0: not significant."
        )
    base = next((r for r in rows if r.is_baseline), None)
    for row in rows:
        if base is None or row is base or row.speedup is None or row.differs:
            continue
        pairs = len(significance.paired_medians(base.run_medians, row.run_medians))
        measured = max(_count_measured(base), _count_measured(row))
        if row.significant is not None and pairs < measured:
            notes.append(
                f"{row.preset}: speedup from the {pairs} repeats that ran in both it and "
                f"{base.preset}; step times from every repeat that ran, so the two differ."
            )
    if any(r.significant is None and r.speedup is not None and not r.is_baseline for r in rows):
        notes.append(
            f"? marks an untested speed-up: one run's step-time spread is not run-to-run "
            f"variation, so a verdict needs {significance.MIN_REPEATS} or more interleaved runs "
            f"of each preset (ampscope bench --repeats {significance.MIN_REPEATS})."
        )
    return notes


def write_sweep(runs_dir: Path, rows: list[Row], baseline: str, order: list[str]) -> Path:
    path = records.new_run_dir(runs_dir, "sweep")
    records.write_json(
        path / SWEEP_FILE,
        {
            "baseline": baseline,
            "order": order,
            "rows": msgspec.to_builtins(rows),
            "verdict": verdicts(rows, baseline),
        },
    )
    return path


def _csv_value(value: object) -> object:
    if value is None:
        return ""
    return "; ".join(map(str, value)) if isinstance(value, list) else value


def _memory_measure(rows: list[Row]) -> str | None:
    """What the table's peak memory column measures, when every row with a figure says the
    same."""
    measures = {r.mem_measure for r in rows if r.mem_peak is not None}
    return measures.pop() if len(measures) == 1 else None


def _count_measured(row: Row) -> int:
    return sum(1 for m in row.run_medians if m is not None and m > 0)


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _reason(run: records.RunRecord) -> str | None:
    errors = [e for e in run.events if isinstance(e, ev.ErrorEvent)]
    if errors:  # the record's text, shown with its control characters escaped
        return visible(errors[-1].message)
    if run.done is None:
        return "no done event (the engine died)"
    return visible(run.done.error) if run.done.error else run.done.error
