"""Run comparison: bench rows, verdicts and sweep records, built from run records.

Shared by ``ampscope bench`` and the dashboard's Compare screen, so both show one table.
Torch- and textual-free.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

import msgspec

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.units import fmt_bytes, fmt_ms, fmt_num

LECTURE_SWEEP = ["fp32", "tf32", "amp-bf16", "amp-fp16", "amp-fp16-noscale", "bf16"]
DEFAULT_BASELINE = "fp32"
SWEEP_FILE = "sweep.json"


class Row(msgspec.Struct, kw_only=True):
    """One preset's line in the comparison (several runs of it when repeated)."""

    preset: str
    status: str  # ok | failed | stopped | mixed
    runs: int
    reason: str | None = None
    step_ms: float | None = None
    spread_lo: float | None = None  # p10 of one run, or the lowest repeat's median
    spread_hi: float | None = None
    speedup: float | None = None
    significant: bool | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    tflops: float | None = None
    mfu: float | None = None
    mem_peak: int | None = None
    mem_change: float | None = None  # fraction vs the baseline: -0.38 is 38 % less
    loss_final: float | None = None
    loss_change: float | None = None  # relative difference from the baseline's final loss
    skipped_steps: int = 0
    grad_zero_frac: float | None = None  # the largest measured in the run(s)
    compile_s: float | None = None
    run_dirs: list[str] = msgspec.field(default_factory=list)


def interleaved(presets: Sequence[str], repeats: int) -> list[str]:
    """ABAB order: every preset once, then every preset again."""
    return [p for _ in range(repeats) for p in presets]


def row_from_runs(preset: str, runs: Sequence[records.RunRecord]) -> Row:
    """One row from a preset's runs. A stopped run's figures count: they measure the steps it
    ran (its status says it stopped); a failed run's do not."""
    dones = [r.done for r in runs if r.done is not None]
    measured = [d for d in dones if d.status in ("ok", "stopped") and d.steps_done > 0]
    statuses = {r.status for r in runs}
    status = statuses.pop() if len(statuses) == 1 else "mixed"
    row = Row(preset=preset, status=status, runs=len(runs), run_dirs=[str(r.path) for r in runs])
    failures = [_reason(r) for r in runs if r.status != "ok"]
    row.reason = next((f for f in failures if f), None)
    zeros = [
        e.grad_zero_frac
        for r in runs
        for e in r.events
        if isinstance(e, ev.StepEvent) and e.grad_zero_frac is not None
    ]
    row.grad_zero_frac = max(zeros) if zeros else None
    row.skipped_steps = sum(d.skipped_steps for d in dones)
    if not measured:
        return row
    ok = measured
    medians = [d.step_ms_median for d in ok if d.step_ms_median is not None]
    if medians:
        row.step_ms = statistics.median(medians)
        if len(medians) > 1:
            row.spread_lo, row.spread_hi = min(medians), max(medians)
        else:
            row.spread_lo, row.spread_hi = ok[0].step_ms_p10, ok[0].step_ms_p90
    row.samples_per_s = _median([d.samples_per_s for d in ok])
    row.tokens_per_s = _median([d.tokens_per_s for d in ok])
    row.tflops = _median([d.tflops for d in ok])
    row.mfu = _median([d.mfu for d in ok])
    peaks = [d.mem_peak for d in ok if d.mem_peak is not None]
    row.mem_peak = max(peaks) if peaks else None
    row.loss_final = _median([d.loss_final for d in ok])
    compiles = [d.compile_s for d in ok if d.compile_s is not None]
    row.compile_s = statistics.median(compiles) if compiles else None
    return row


def compare(rows: list[Row], baseline: str) -> list[Row]:
    """Fill speedup, memory and loss changes relative to the baseline row."""
    base = next((r for r in rows if r.preset == baseline), None)
    for row in rows:
        if base is None or row.step_ms is None or base.step_ms is None:
            continue
        row.speedup = base.step_ms / row.step_ms
        row.significant = abs(row.step_ms - base.step_ms) > max(_spread(row), _spread(base))
        if row.mem_peak and base.mem_peak:
            row.mem_change = row.mem_peak / base.mem_peak - 1
        if row.loss_final is not None and base.loss_final:
            row.loss_change = row.loss_final / base.loss_final - 1
    return rows


def verdicts(rows: list[Row], baseline: str) -> list[str]:
    """Sentences a lecturer can read aloud, derived from the numbers only."""
    lines = []
    for row in rows:
        if row.preset == baseline:
            continue
        if row.status == "stopped" and not row.reason:
            lines.append(
                f"{row.preset} was stopped before its last step: its figures cover the steps "
                "it ran."
            )
        elif row.status != "ok":
            lines.append(
                f"{row.preset} {row.status}: {(row.reason or 'see its run record').rstrip('.')}."
            )
        if row.status != "ok" and row.step_ms is None:
            continue
        parts = []
        if row.speedup is not None:
            if not row.significant:
                parts.append(f"no significant speed difference from {baseline} (within noise)")
            elif row.speedup >= 1:
                parts.append(f"{row.speedup:.2g}x faster than {baseline}")
            else:
                parts.append(f"{1 / row.speedup:.2g}x slower than {baseline}")
        if row.mem_change is not None and abs(row.mem_change) >= 0.01:
            more_less = "less" if row.mem_change < 0 else "more"
            parts.append(f"{abs(row.mem_change):.0%} {more_less} peak memory")
        if row.loss_change is not None:
            if abs(row.loss_change) < 0.005:
                parts.append(f"final loss within {max(abs(row.loss_change), 0.001):.1%}")
            else:
                worse = "higher" if row.loss_change > 0 else "lower"
                parts.append(f"final loss {abs(row.loss_change):.1%} {worse}")
        sentence = f"{row.preset}: " + ", ".join(parts) if parts else f"{row.preset}: no baseline"
        lines.append(sentence + ".")
        if row.grad_zero_frac is not None and row.grad_zero_frac >= 0.01:
            lines.append(
                f"{row.preset} lost {row.grad_zero_frac:.0%} of its output-gradient values to "
                "underflow (exact zeros)."
            )
        if row.skipped_steps:
            lines.append(f"{row.preset}: the loss scaler skipped {row.skipped_steps} step(s).")
    return lines


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


def cells(row: Row) -> dict[str, str]:
    spread = ""
    if row.spread_lo is not None and row.spread_hi is not None:
        spread = f" ({fmt_ms(row.spread_lo)}-{fmt_ms(row.spread_hi)})"
    speedup = "-"
    if row.speedup is not None:
        speedup = f"{row.speedup:.2f}x" + ("" if row.significant or row.speedup == 1 else " ~")
    return {
        "preset": row.preset,
        "step": (fmt_ms(row.step_ms) + spread) if row.step_ms is not None else "-",
        "speedup": speedup,
        "samples": fmt_num(row.samples_per_s),
        "tokens": fmt_num(row.tokens_per_s),
        "tflops": f"{row.tflops:.3g}" if row.tflops is not None else "-",
        "mfu": f"{row.mfu:.1%}" if row.mfu is not None else "-",
        "mem": fmt_bytes(row.mem_peak),
        "mem_change": f"{row.mem_change:+.0%}" if row.mem_change is not None else "-",
        "loss": f"{row.loss_final:.4f}" if row.loss_final is not None else "-",
        "loss_change": f"{row.loss_change:+.1%}" if row.loss_change is not None else "-",
        "skipped": str(row.skipped_steps),
        "zeros": f"{row.grad_zero_frac:.1%}" if row.grad_zero_frac is not None else "-",
        "compile": f"{row.compile_s:.1f} s" if row.compile_s is not None else "-",
        "status": row.status if row.status == "ok" else f"{row.status}: {row.reason or '?'}",
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
        fields = [f for f in Row.__struct_fields__ if f != "run_dirs"]
        writer.writerow(fields)
        for row in rows:
            writer.writerow(["" if getattr(row, f) is None else getattr(row, f) for f in fields])
        return out.getvalue()
    heads = [h for h, _ in COLUMNS]
    body = [[c[k] for _, k in COLUMNS] for c in table]
    if fmt == "markdown":
        lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        lines += ["| " + " | ".join(r) + " |" for r in body]
    else:
        lines = text_table(heads, body, width)
    notes = verdicts(rows, baseline)
    if any(r.significant is False and r.preset != baseline for r in rows):
        notes.append(
            "~ marks a speed difference smaller than the step-time spread: not significant."
        )
    return "\n".join(lines) + ("\n\n" + "\n".join(notes) if notes else "")


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


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _spread(row: Row) -> float:
    if row.spread_lo is None or row.spread_hi is None:
        return 0.0
    return (row.spread_hi - row.spread_lo) / 2 if row.runs == 1 else row.spread_hi - row.spread_lo


def _reason(run: records.RunRecord) -> str | None:
    errors = [e for e in run.events if isinstance(e, ev.ErrorEvent)]
    if errors:
        return errors[-1].message
    return run.done.error if run.done else "no done event (the engine died)"
