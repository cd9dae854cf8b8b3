"""The Machine view's lines: one bar per format, measured beside the datasheet, then verdicts.

Textual-free and torch-free: the dashboard only reads what ``ampscope doctor --bench`` kept.
A bar's full length is the datasheet figure and its filled part the measured one; a CPU has
no datasheet, so its bars are scaled to its fastest format.
"""

from __future__ import annotations

import math

from ampscope.core.machine import steady, verdicts
from ampscope.core.machine.check import RUN_COMMAND, MachineCheck, staleness
from ampscope.core.text import visible, wrap

FULL, EMPTY = "\u2588", "\u2591"
NO_CHECK = (
    "No machine check kept for this host yet. Run\n\n    ampscope doctor --bench\n\nin a "
    "terminal (under a minute and a half): it measures what each number format delivers here, "
    "beside the datasheet, and says why a figure is low. Runs then show their MFU against the "
    "measured peak too."
)


def bar(value: float, full: float, width: int) -> str:
    """``value`` of ``full`` in ``width`` cells; a figure that is no number draws empty."""
    drawn = math.isfinite(value) and math.isfinite(full) and full > 0
    filled = max(0, min(width, round(width * value / full))) if drawn else 0
    return FULL * filled + EMPTY * (width - filled)


def rate(tflops: float, kind: str) -> str:
    """TFLOP/s on a GPU; GFLOP/s on a CPU, where a TFLOP/s figure would read 0.0."""
    return f"{tflops:,.0f}" if kind == "cuda" else f"{tflops * 1e3:,.1f}"


def check_lines(
    check: MachineCheck, width: int, torch: str | None, driver: str | None
) -> list[str]:
    """The view of one kept check, ``width`` columns wide at most."""
    unit = "TFLOP/s" if check.kind == "cuda" else "GFLOP/s"
    when = check.when.replace("T", " ")[:16] + " UTC" if check.when else "at an unknown time"
    threads = f", {check.threads} thread{'s' if check.threads > 1 else ''}" if check.threads else ""
    lines = [
        visible(f"{check.device}{threads}", 200),
        visible(
            f"measured {when} on torch {check.torch}"
            + (f", driver {check.driver}" if check.driver else ""),
            200,
        ),
    ]
    stale = staleness(check, torch, driver)
    if stale:
        lines.extend(wrap(visible(stale, 400), width, "! ", "  "))
    if check.contended:
        contended = (
            f"measured while other processes kept {check.other_cpus:.1f} of its {check.cpus or '?'} "
            "CPUs busy: no figure here is kept as this machine's peak"
        )
        lines.extend(wrap(contended, width, "! ", "  "))
    if check.ignored:
        ignored = (
            f"the kept file holds figures that are no measurement, ignored: "
            f"{', '.join(check.ignored)}; run {RUN_COMMAND} to measure again"
        )
        lines.extend(wrap(visible(ignored, 400), width, "! ", "  "))
    lines.append("")
    has_sheet = any(f.datasheet_tflops for f in check.matmul.values())
    lines.append(
        f"matmul {unit}: {FULL} measured, to the bar's end the datasheet"
        if has_sheet
        else f"matmul {unit}: {FULL} measured (no datasheet for a CPU: bars against the fastest)"
    )
    rounds = max((len(f.rounds) for f in check.matmul.values()), default=0)
    if rounds:
        lines.extend(
            wrap(
                f"the best of {rounds} rounds; 'busy': the median round fell more than "
                f"{steady.pct(steady.STEADY_SPREAD)} below it, so runs are not read against it",
                width,
            )
        )
    scale = max((f.tflops for f in check.matmul.values()), default=0.0)
    figures = [(fmt, rate(f.tflops, check.kind), f) for fmt, f in check.matmul.items()]
    num_w = max((len(r) for _, r, _ in figures), default=1)
    busy = {fmt: busy_tag(f.rounds) for fmt, f in check.matmul.items()}
    tail_w = (22 if has_sheet else 0) + max((len(b) for b in busy.values()), default=0)
    bar_w = max(8, min(40, width - 6 - num_w - 1 - tail_w - 2))
    for fmt, value, fig in figures:
        if fig.datasheet_tflops:
            sheet = rate(fig.datasheet_tflops, check.kind)
            tail = f" of {sheet} ({verdicts.pct(fig.ratio or 0.0)})"
            drawn = bar(fig.tflops, fig.datasheet_tflops, bar_w)
        else:
            tail = "" if not has_sheet else "  (no datasheet)"
            drawn = bar(fig.tflops, scale, bar_w)
        lines.append(f"{visible(fmt, 8):<5} {drawn} {value:>{num_w}}{tail}{busy[fmt]}")
    if check.memory_gbps is not None:
        what = "copy" if check.kind == "cuda" else "RAM copy"
        if check.memory_datasheet_gbps:
            ratio = check.memory_gbps / check.memory_datasheet_gbps
            lines.append(
                f"{what}: {bar(check.memory_gbps, check.memory_datasheet_gbps, bar_w)} "
                f"{check.memory_gbps:,.0f} of {check.memory_datasheet_gbps:,.0f} GB/s "
                f"({verdicts.pct(ratio)}){busy_tag(check.memory_rounds)}"
            )
        else:
            lines.append(f"{what}: {check.memory_gbps:,.1f} GB/s{busy_tag(check.memory_rounds)}")
    if check.h2d_gbps is not None:
        lines.append(f"host to GPU (pinned): {check.h2d_gbps:,.1f} GB/s")
    if check.allreduce_busbw_gbps is not None:
        lines.append(
            f"all-reduce across the GPUs: {check.allreduce_busbw_gbps:,.0f} GB/s bus bandwidth"
        )
    elif check.allreduce_note:
        lines.extend(wrap(visible(check.allreduce_note, 400), width))
    if check.verdicts:
        lines.append("")
        for verdict in check.verdicts:
            lines.extend(wrap(visible(verdict, 400), width, "- ", "  "))
    return lines


def busy_tag(rounds: list[float]) -> str:
    """'  busy 58 %' beside a figure whose rounds disagreed; '' for a steady one."""
    gap = steady.spread(rounds)
    return "" if steady.trusted(rounds) or gap is None else f"  busy {steady.pct(gap)}"


def view_lines(
    checks: dict[str, MachineCheck],
    problem: str | None,
    width: int,
    torch: str | None,
    driver: str | None,
) -> list[str]:
    """Every kept check of this host, GPUs first; or how to get one."""
    if problem:
        return wrap(visible(problem, 400), width)
    if not checks:
        return [line for part in NO_CHECK.split("\n") for line in wrap(part, width)]
    lines: list[str] = []
    for check in sorted(checks.values(), key=lambda c: (str(c.kind) != "cuda", str(c.device))):
        if lines:
            lines.append("")
        try:
            lines.extend(check_lines(check, width, torch, driver))
        except (TypeError, ValueError, OverflowError, AttributeError) as exc:  # never a crash
            said = (
                f"the kept check of {check.device!s} cannot be shown ({type(exc).__name__}: "
                f"{exc}); run {RUN_COMMAND} to measure again"
            )
            lines.extend(wrap(visible(said, 400), width))
    return lines
