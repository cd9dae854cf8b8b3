"""What ``ampscope run`` prints on a terminal: a live progress line and a summary table."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import TextIO

from ampscope.cli.output import output_width
from ampscope.core import events as ev
from ampscope.core.comparison.notes import run_spread_note
from ampscope.core.presets.fp8_recipes import layers_line
from ampscope.core.records import summary
from ampscope.core.text import visible, wrap
from ampscope.core.units import fmt_bytes, fmt_final_loss, fmt_loss, fmt_mfu, fmt_ms, fmt_num

REDRAW_S = 0.1


class ConsoleReporter:
    """An ``on_event`` callback. Redraws the progress line at most 10 times a second.

    Progress, warnings and errors go to ``out`` (stderr); what the run gave, the summary table
    and the record's folder, to ``result`` (stdout), where a script captures it.
    """

    def __init__(self, out: TextIO | None = None, result: TextIO | None = None) -> None:
        self.out = out or sys.stderr
        self.result = result or sys.stdout
        self.tty = self.out.isatty()
        self.steps = 0
        self.last_draw = 0.0
        self.last_step: ev.StepEvent | None = None
        self.drawn: ev.StepEvent | None = None  # the step the progress line last showed
        self.errors_said: list[str] = []  # error messages printed, not repeated by the summary
        self.phase = "starting"
        self.hello: ev.HelloEvent | None = None
        self.run_dir: str | None = None  # the record's folder, known before hello

    def record_at(self, run_dir: Path) -> None:
        self.run_dir = str(run_dir.resolve())

    def say(self, text: str) -> None:
        """A line of the command's own on ``out``, clear of the progress line."""
        self._line(text)

    def __call__(self, event: ev.Event) -> None:
        if isinstance(event, ev.StepEvent):
            self.last_step = event
            now = time.monotonic()
            if now - self.last_draw >= (REDRAW_S if self.tty else 5.0):
                self.last_draw = now
                self._progress()
            return
        if isinstance(event, ev.HelloEvent):
            self.hello = event
            self.steps = int(event.config.get("steps", 0))
            peak = (
                f"{event.peak_tflops:g} TFLOP/s {event.compute_dtype} peak"
                if event.peak_tflops
                else "no MFU peak"
            )
            if event.measured_tflops:  # this machine's own, from ampscope doctor --bench
                measured = f"{event.measured_tflops:.3g} TFLOP/s {event.compute_dtype} measured"
                peak = f"{peak}, {measured}" if event.peak_tflops else f"{measured} peak"
            header = (
                f"{event.preset}: {event.config['precision']} on {where_it_runs(event)}, "
                f"{fmt_num(event.param_count)} params, {workload_label(event)}, {peak}"
            )
            self._line(visible(header))  # one line, whatever the model's name holds
            if (event.config.get("workload") or {}).get("model") and event.flops_note:
                self._line(
                    f"model FLOPs per step: {event.flops_per_step:.4g} ({event.flops_note})"
                    if event.flops_per_step
                    else "model FLOPs per step: not counted, so TFLOP/s and MFU show '-' (a "
                    "Workload's flops_per_step gives them)"
                )
            if event.fp8 is not None:
                self._line(layers_line(event.fp8))
        elif isinstance(event, ev.PhaseEvent):
            if event.phase == "compile" and event.state == "start":
                self._line("compiling (torch.compile) ...")
            elif event.phase == "compile" and event.state == "end":
                self._line(f"compiled in {event.seconds:.1f} s")
        elif isinstance(event, ev.WarningEvent):
            where = f" (step {event.step})" if event.step is not None else ""
            said = "note" if event.code in ev.NOTE_CODES else "warning"
            self._line(f"{said}{where}: {event.message}")
        elif isinstance(event, ev.NoteEvent) and (event.count or 0) <= 2:  # then only counted
            where = f" (step {event.step})" if event.step is not None else ""
            self._line(f"note{where}: {event.message}")
        elif isinstance(event, ev.ErrorEvent):
            self._catch_up()  # the progress the error ended, before it and never after
            self.errors_said.append(event.message)
            where = f" at step {event.step}" if event.step is not None else ""
            if event.kind == "config":  # a user error: one message, as for any bad input
                self._line(f"ampscope: {event.message}")
            else:
                self._line(f"error ({event.kind}){where}: {event.message}")
            if event.hint:
                self._line(f"hint: {event.hint}")
            if event.traceback:
                self._line(event.traceback.rstrip())
        elif isinstance(event, ev.DoneEvent):
            self._catch_up()
            self._clear()
            self.out.flush()
            if not (event.steps_done == 0 and event.status == "failed"):  # else the error said it
                error = event.error or ""
                repeated = bool(error) and any(error in m for m in self.errors_said)
                self.result.write(summary_table(event, error_said=repeated) + "\n")
                spread = run_spread_note(event)
                if spread:
                    width = output_width(self.result)
                    self.result.write("\n".join(wrap(spread, width)) + "\n")
            run_dir = self.hello.run_dir if self.hello is not None else None
            if run_dir or self.run_dir:  # every ending, also a stop or fault before hello
                self.result.write(visible(f"run record: {run_dir or self.run_dir}") + "\n")
            self.result.flush()

    def _catch_up(self) -> None:
        """Off a terminal, the last steps' line when it was not printed yet (on a terminal the
        line is redrawn in place and cleared at the end)."""
        if not self.tty and self.last_step is not self.drawn:
            self._progress()

    def _progress(self) -> None:
        s = self.drawn = self.last_step
        if s is None:
            return
        total = max(self.steps, 1)
        width = 24
        filled = int(width * min(1.0, (s.step + 1) / total))
        bar = "#" * filled + "-" * (width - filled)
        scale = f"  scale {s.loss_scale:g}" if s.loss_scale is not None else ""
        text = (
            f"[{bar}] {s.step + 1}/{total}  {fmt_ms(s.step_ms)}/step  loss {fmt_loss(s.loss)}"
            f"  {fmt_num(s.samples_per_s)} samples/s{scale}"
        )
        if self.tty:
            self.out.write("\r\x1b[2K" + text)
        else:
            self.out.write(text + "\n")
        self.out.flush()

    def _clear(self) -> None:
        if self.tty:
            self.out.write("\r\x1b[2K")

    def _line(self, text: str) -> None:
        self._clear()
        self.out.write(visible(text, keep_newlines=True) + "\n")
        self.out.flush()


def workload_label(hello: ev.HelloEvent) -> str:
    """'gpt workload', or for a user's model its name and the spec it came from."""
    spec = (hello.config.get("workload") or {}).get("model")
    if spec:
        return f"model {hello.workload or '?'} from {spec}"
    return f"{(hello.config.get('workload') or {}).get('kind', '?')} workload"


def summary_table(done: ev.DoneEvent, error_said: bool = False) -> str:
    """The run's figures; ``error_said``: its error was printed already, so the status row
    points to it rather than repeat it."""
    final = fmt_final_loss(done.loss_final, done.loss_nonfinite, done.loss_final_step)
    error = "the error above" if error_said else done.error
    rows = [
        ("status", done.status + (f" ({error})" if done.error else "")),
        ("steps", str(done.steps_done)),
        ("step time (median)", fmt_ms(done.step_ms_median)),
        ("step time p10-p90", f"{fmt_ms(done.step_ms_p10)} - {fmt_ms(done.step_ms_p90)}"),
        *throughput(done),
        ("TFLOP/s", f"{done.tflops:.3g}" if done.tflops is not None else "-"),
        ("MFU", fmt_mfu(done.mfu, done.mfu_measured)),
        ("peak memory", fmt_bytes(done.mem_peak)),
        *(
            [("compile peak", f"{fmt_bytes(done.mem_peak_compile)} (the compile step's own)")]
            if done.mem_peak_compile is not None
            else []
        ),
        ("loss first -> final", f"{fmt_loss(done.loss_first)} -> {final}"),
        ("skipped steps", str(done.skipped_steps)),
        ("compile", f"{done.compile_s:.1f} s" if done.compile_s is not None else "-"),
        ("wall time", f"{done.wall_s:.1f} s"),
        *rank_rows(done),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


def throughput(done: ev.DoneEvent) -> list[tuple[str, str]]:
    """The median step's rates, and under them what the run delivered where that differs
    (``core.records.summary.delivered_samples_per_s``)."""
    rates = f"{fmt_num(done.samples_per_s)} samples/s" + (
        f", {fmt_num(done.tokens_per_s)} tokens/s" if done.tokens_per_s else ""
    )
    delivered = summary.delivered_samples_per_s(done)
    if delivered is None:
        return [("throughput", rates)]
    why = ": slower steps held the run back" if delivered < (done.samples_per_s or 0) else ""
    return [
        ("throughput", f"{rates} at the median step"),
        (
            "delivered",
            f"{fmt_num(delivered)} samples/s (mean step {fmt_ms(done.step_ms_mean)}{why})",
        ),
    ]


def where_it_runs(hello: ev.HelloEvent) -> str:
    """'cpu (AMD EPYC)', or for several ranks '2 ranks (ddp over gloo): 2 x cpu on 1 host'."""
    if hello.world_size <= 1 or not hello.ranks:
        return f"{hello.device} ({hello.device_name})"
    names = sorted({f"{r.device.split(':')[0]} ({r.device_name})" for r in hello.ranks})
    hosts = len({r.host for r in hello.ranks})
    return (
        f"{hello.world_size} ranks ({hello.strategy} over {hello.backend}): "
        f"{hello.world_size} x {', '.join(names)} on {hosts} host{'s' if hosts > 1 else ''}"
    )


def rank_rows(done: ev.DoneEvent) -> list[tuple[str, str]]:
    """On several processes: the slowest rank against the median one, and whether the
    replicas ended with the same weights."""
    ranks = done.ranks or []
    timed = [r for r in ranks if r.step_ms_median is not None]
    if not timed:
        return []
    slowest = max(timed, key=lambda r: r.step_ms_median or 0.0)
    median = statistics.median(r.step_ms_median or 0.0 for r in timed)
    rows = [
        ("ranks", str(done.world_size)),
        (
            "slowest rank",
            f"rank {slowest.rank}: {fmt_ms(slowest.step_ms_median)} "
            f"(+{fmt_ms((slowest.step_ms_median or 0.0) - median)} over the median rank)",
        ),
    ]
    sums = {r.param_checksum for r in ranks}
    if None not in sums:
        rows.append(
            ("weights", f"identical on every rank ({sums.pop()})" if len(sums) == 1 else "differ")
        )
    return rows
