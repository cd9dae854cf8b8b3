"""``ampscope bench``: the same workload under several presets, one table, honest about noise.

Each preset runs in a fresh engine process (clean memory statistics, its own compile cache
unless the environment shares one). With ``--repeats K`` the presets are interleaved
(ABAB, not AABB) so that a machine getting slower or faster over time hits them all alike;
repeat k of each preset is paired with repeat k of the baseline, and a speed difference is
called only when the 95 % confidence interval of the speed-up excludes 1.0
(``ampscope.core.comparison.significance``; three repeats at least, the default).

A preset whose first run fails is not run again (its row says failed, and why), and bench
exits 1 when a run failed, 130 when stopped, 2 for a usage error, else 0.

Rows are computed from run records, so the dashboard's Compare screen builds the same
table from any runs in the history.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from ampscope.cli.output import fail, output_width
from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.comparison import (
    DEFAULT_BASELINE,
    LECTURE_SWEEP,
    compare,
    interleaved,
    render,
    significance,
    write_sweep,
)
from ampscope.core.comparison.notes import Clock, row_by_clock, spread_notes
from ampscope.core.presets import ConfigError, load_preset
from ampscope.core.presets.parallel import Launch, port_in_use
from ampscope.core.presets.run_args import run_overrides
from ampscope.core.processes.launch import die_with_parent, engine_command, launch_env, stop_grace_s
from ampscope.core.text import visible
from ampscope.core.units import fmt_ms

MAX_REPEATS = 100
"""Runs of each preset a sweep takes at most: more is a sweep that never ends, not a surer verdict."""


def run_one(
    preset: str,
    overrides: Sequence[str],
    runs_dir: Path,
    on_line: Callable[[ev.Event], None] | None = None,
    launch: Launch | None = None,
    command: Callable[..., list[str]] = engine_command,
) -> records.RunRecord:
    """Run one preset in a fresh engine process (torchrun's ranks, with ``launch``) and read
    back its record. ``command`` gives the engine's command line.

    stderr goes to a temporary file, not a pipe: an engine that logs a lot (max-autotune)
    would otherwise fill the pipe and block while this side still reads stdout.
    """
    cmd = command(preset, overrides, runs_dir, launch=launch)
    distributed = launch is not None and launch.distributed
    with tempfile.TemporaryFile() as err_file:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=err_file,
            start_new_session=True,
            env=launch_env(launch),
            preexec_fn=die_with_parent if distributed else None,
        )
        run_dir: Path | None = None
        reason: str | None = None
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                event = ev.decode(line)
                if isinstance(event, ev.HelloEvent) and event.run_dir:
                    run_dir = event.folder()  # a path that is not UTF-8 reads escaped in JSON
                elif isinstance(event, ev.ErrorEvent):
                    reason = event.message
                if on_line is not None and isinstance(event, ev.Event):  # a newer kind: skipped
                    on_line(event)
            proc.wait()
        except BaseException:
            _stop(proc, stop_grace_s(launch, 5.0))
            raise
        stderr = _tail(err_file)
    if run_dir is not None and run_dir.is_dir():
        return records.load_run(run_dir)
    record = records.RunRecord(path=runs_dir / f"(not started: {preset})")
    error = reason or (stderr.strip().splitlines() or ["the engine exited at once"])[-1]
    record.done = ev.empty_done("failed", error)
    return record


def _tail(file: BinaryIO, size: int = 64 * 1024) -> str:
    """The last ``size`` bytes of a file: enough for the line that says why the engine died."""
    end = file.seek(0, os.SEEK_END)
    file.seek(max(0, end - size))
    return file.read().decode(errors="replace")


def _stop(proc: subprocess.Popen, grace_s: float) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)  # torchrun passes it on to every rank
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def cmd_bench(
    args: argparse.Namespace,
    run: Callable[..., records.RunRecord] = run_one,
    cuda_available: Callable[[], bool] | None = None,
    keep_sweep: Callable[..., Path] = write_sweep,
) -> int:
    """``ampscope bench``: each run by ``run`` (an engine process each), the sweep kept by
    ``keep_sweep``; ``cuda_available`` says whether torch sees a GPU (torch's answer unless
    given)."""
    presets = list(args.presets) or list(LECTURE_SWEEP)
    for name in dict.fromkeys(p for p in presets if presets.count(p) > 1):
        print(
            f"ampscope: {visible(name)} given {presets.count(name)} times: it runs once per repeat, one row "
            f"(--repeats N runs every preset N times, interleaved).",
            file=sys.stderr,
        )
    baseline = args.baseline or (DEFAULT_BASELINE if DEFAULT_BASELINE in presets else presets[0])
    presets = [baseline, *(p for p in dict.fromkeys(presets) if p != baseline)]  # baseline first
    overrides = run_overrides(args)
    if not 1 <= args.repeats <= MAX_REPEATS:  # each repeat is a run of every preset
        print(
            f"ampscope: --repeats {args.repeats}: accepted a whole number from 1 to "
            f"{MAX_REPEATS} (a speed verdict needs {significance.MIN_REPEATS} or more).",
            file=sys.stderr,
        )
        return 2
    try:
        loaded = [load_preset(name, overrides) for name in presets]
    except ConfigError as exc:
        return fail(exc)
    clock: Clock = "cpu" if getattr(args, "clock", "wall") == "cpu" else "wall"
    if clock == "cpu":
        on_gpu = next((p for p in loaded if _runs_on_cuda(p.device, cuda_available)), None)
        if on_gpu is not None:
            print(
                f"ampscope: --clock cpu: {on_gpu.name} runs on a GPU (device = "
                f"'{on_gpu.device}'{' finds one here' if on_gpu.device == 'auto' else ''}), "
                "where a step's time is the GPU's, not the process's CPU time. Accepted: "
                "--clock cpu with --device cpu, or the wall clock (the default) on a GPU.",
                file=sys.stderr,
            )
            return 2
    launch: Launch = args.launch
    problem = port_in_use(launch)
    if problem is not None:
        return fail(problem)
    if launch.distributed:
        print(f"every run on {launch.describe()} (torchrun)", file=sys.stderr)
    runs_dir = args.runs_dir or records.default_runs_dir()
    unwritable = _unwritable(Path(runs_dir))
    if unwritable is not None:  # every run and the sweep would fail to keep its record
        return fail(
            f"--runs-dir {runs_dir}: {unwritable}. Accepted: a folder bench can create or "
            "write to (the default is ./runs, or $AMPSCOPE_RUNS_DIR)."
        )
    with _stopped_by_sigterm():  # 'kill', timeout(1), a scheduler: as Ctrl+C, said and kept
        return _sweep(args, presets, baseline, overrides, clock, launch, runs_dir, run, keep_sweep)


@contextlib.contextmanager
def _stopped_by_sigterm() -> Iterator[None]:
    """SIGTERM stops the sweep as Ctrl+C does (the run under way stopped, the table of those
    done printed and kept, exit 130), where it ended bench without a word."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        before = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: signals stay as they are
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _sweep(
    args: argparse.Namespace,
    presets: list[str],
    baseline: str,
    overrides: list[str],
    clock: Clock,
    launch: Launch,
    runs_dir: Path,
    run: Callable[..., records.RunRecord],
    keep_sweep: Callable[..., Path],
) -> int:
    """Every run of the sweep in turn, then its table, printed and kept."""
    order = interleaved(presets, args.repeats)
    results: dict[str, list[records.RunRecord]] = {p: [] for p in presets}
    interrupted = False
    i, total = 0, len(order)  # the runs made and to make: a failed preset's repeats are not
    for name in order:
        if results[name] and failed(results[name][0]):  # it fails again: a repeat says nothing
            continue
        i += 1
        progress = _Progress(f"[{i}/{total}] {visible(name)}")
        try:
            results[name].append(run(name, overrides, runs_dir, progress, launch))
        except KeyboardInterrupt:
            interrupted = True
            finished = progress.finished_record()  # the stop came after its done
            if finished is not None:
                results[name].append(finished)
            break
        finally:
            progress.close()
        refused = progress.refused
        if i == 1 and refused is not None:  # the baseline cannot run: neither will the rest
            trace = f"\n{refused.traceback}" if refused.traceback else ""
            return fail(f"{name} (the baseline) did not run: {refused.message}{trace}")
        if args.repeats > 1 and len(results[name]) == 1 and failed(results[name][0]):
            total -= args.repeats - 1
            print(
                f"{visible(name)} failed on its first run: its other repeats are not run",
                file=sys.stderr,
            )
    if not any(results.values()):  # stopped during the first run: nothing to compare
        return fail("bench stopped before its first run finished: nothing to compare.", 130)
    # A preset as typed (a path to a .toml file) is shown with its control characters escaped.
    shown, baseline = {p: visible(p) for p in results}, visible(baseline)
    rows = compare([row_by_clock(shown[p], rs, clock) for p, rs in results.items() if rs], baseline)
    on_cpu = all(r.hello is None or r.hello.device == "cpu" for rs in results.values() for r in rs)
    fmt = "markdown" if args.markdown else "csv" if args.csv else "json" if args.json else "text"
    print(render(rows, baseline, fmt, width=output_width()))
    notes = spread_notes(rows, baseline, on_cpu)
    if fmt in ("text", "markdown") and notes:  # a spread that blocks a verdict
        print("\n".join(notes))
    try:
        sweep = keep_sweep(runs_dir, rows, baseline, [shown[p] for p in order])
    except OSError as exc:  # a full disk, or the folder removed while the runs ran
        return fail(
            f"the table above is not kept: the sweep record cannot be written in {runs_dir} "
            f"({exc.strerror or exc}).",
            130 if interrupted else 1,
        )
    print(f"\nsweep record: {visible(sweep, 0)}", file=sys.stderr)
    if interrupted:
        return 130
    return 1 if any(failed(r) for rs in results.values() for r in rs) else 0


def failed(run: records.RunRecord) -> bool:
    """The run failed (or its engine died without a ``done``): neither finished nor stopped."""
    return run.status not in ("ok", "stopped")


def _unwritable(runs_dir: Path) -> str | None:
    """Why no record can be kept in ``runs_dir`` (made here if missing), or None."""
    try:
        runs_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        in_the_way = next((p for p in (runs_dir, *runs_dir.parents) if p.exists()), None)
        if in_the_way is not None and not in_the_way.is_dir():
            return f"cannot create the folder: {in_the_way} is a file, not a folder"
        return f"cannot create the folder ({exc.strerror or exc})"
    if not os.access(runs_dir, os.W_OK | os.X_OK):
        return "the folder is not writable"
    return None


def _runs_on_cuda(device: str, cuda_available: Callable[[], bool] | None = None) -> bool:
    """Whether a preset's ``device`` trains on a GPU here (``auto`` asks ``cuda_available``,
    torch unless given, only then)."""
    if device.startswith("cuda"):
        return True
    if device != "auto":
        return False
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available
    return bool(cuda_available())


class _Progress:
    """One status line per engine run on stderr: compile and step progress."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.tty = sys.stderr.isatty()
        self.steps = 0
        self.last = 0.0
        self.refused: ev.ErrorEvent | None = None  # a user error (a bad --model, for one)
        self.run_dir: Path | None = None
        self.done: ev.DoneEvent | None = None
        self._show("starting")

    def __call__(self, event: ev.Event) -> None:
        if isinstance(event, ev.ErrorEvent) and event.kind == "config":
            self.refused = event
        if isinstance(event, ev.HelloEvent):
            self.steps = int(event.config.get("steps", 0))
            self.run_dir = event.folder() if event.run_dir else None
        elif (
            isinstance(event, ev.PhaseEvent) and event.phase == "compile" and event.state == "start"
        ):
            self._show("compiling")
        elif isinstance(event, ev.StepEvent) and time.monotonic() - self.last > 0.2:
            self.last = time.monotonic()
            self._show(f"{event.step + 1}/{self.steps} steps  {fmt_ms(event.step_ms)}/step")
        elif isinstance(event, ev.DoneEvent):
            self.done = event
            self._show(event.status)

    def finished_record(self) -> records.RunRecord | None:
        """The run's record when it had finished (its ``done`` said ok) before a stop ended
        the sweep, else None: a run stopped under way is no figure."""
        if self.done is None or self.done.status != "ok" or self.run_dir is None:
            return None
        try:
            return records.load_run(self.run_dir)
        except OSError:
            return None

    def _show(self, text: str) -> None:
        if self.tty:
            sys.stderr.write(f"\r\x1b[2K{self.label}: {text}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
        else:
            sys.stderr.write(f"{self.label}: done\n")
        sys.stderr.flush()
