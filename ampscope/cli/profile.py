"""``ampscope profile PRESET --steps K``: where the step goes, from torch.profiler.

The preset runs as ``ampscope run`` would (same flags), for a few warm-up steps and then K
profiled ones; the engine's ``profile`` event is printed as a split into classes, the top ops
and one line on what would help most (or, with ``--json``, as one object). Progress goes to
stderr, the profile to stdout.

``ampscope profile --compare RUN_A RUN_B`` profiles nothing: it reads the last profile of two
recorded runs and prints their splits side by side and what moved.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ampscope.cli.output import fail, stdout_for_json_only
from ampscope.core import events as ev
from ampscope.core import presets, profiles
from ampscope.core.presets.run_args import add_launch_arguments, add_model_argument, model_overrides
from ampscope.core.records.folders import runs_dir_argument
from ampscope.core.text import visible

if TYPE_CHECKING:  # torch's import: only once a run starts
    from ampscope.engine.lifecycle.parts import Parts

WARMUP_STEPS = 3
"""Steps before the profile at least: allocator, cuDNN and autotuning settle. The preset's own
``warmup_steps`` when more (5 by default), and one more to compile."""


def warmup_of(preset: presets.Preset) -> int:
    """The steps run before the profile starts."""
    return max(WARMUP_STEPS, preset.warmup_steps) + (preset.compile != "off")


def add_profile_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="profile a few steps with torch.profiler: where the step goes, what would help",
    )
    p.add_argument(
        "preset", nargs="?", help="a preset name (see 'ampscope presets') or a .toml file"
    )
    p.add_argument(
        "--compare",
        nargs=2,
        metavar=("RUN_A", "RUN_B"),
        help="profile nothing: compare the profiles two runs recorded (each a run folder, or "
        "its name in the runs folder as 'ampscope runs' lists it), A the before",
    )
    add_model_argument(p)
    p.add_argument(
        "--steps",
        type=int,
        default=profiles.DEFAULT_STEPS,
        metavar="K",
        help=f"steps to profile, 1 to {profiles.MAX_STEPS} (default: %(default)s), after the "
        f"preset's warm-up steps (its warmup_steps, 5 by default, at least {WARMUP_STEPS}; one "
        "more when it compiles)",
    )
    p.add_argument("--device", help="auto, cpu, cuda or cuda:N (same as --set device=D)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field of the preset, dotted for tables: --set workload.layers=4",
    )
    p.add_argument("--json", action="store_true", help="print the profile as one JSON object")
    p.add_argument(
        "--runs-dir",
        type=runs_dir_argument,
        help="where run records go (default ./runs or $AMPSCOPE_RUNS_DIR)",
    )
    p.add_argument(
        "--no-record", action="store_true", help="do not write a run record (nor the trace)"
    )
    add_launch_arguments(p)


def cmd_profile(
    args: argparse.Namespace, load: LoadWatch | None = None, parts: Parts | None = None
) -> int:
    """``ampscope profile``; ``load`` measures other processes' use of the CPUs while the
    profile runs (this machine's, unless given); ``parts``: what the run is made of
    (``engine.lifecycle.parts``), the engine's own unless given."""
    if args.compare is not None:
        if args.preset is not None:
            return fail(
                f"give either a preset to profile or --compare RUN_A RUN_B, not both "
                f"(got the preset '{args.preset}' as well)."
            )
        return compare_runs(args.compare, args.runs_dir, args.json)
    if args.preset is None:
        return fail(
            "say what to profile: a preset name (see 'ampscope presets') or a .toml file, or "
            "--compare RUN_A RUN_B to compare the profiles of two recorded runs."
        )
    k = args.steps
    if not 1 <= k <= profiles.MAX_STEPS:
        return fail(
            f"--steps {k}: accepted a whole number of steps to profile from 1 to "
            f"{profiles.MAX_STEPS} (the Chrome trace grows with every step)."
        )
    if args.launch.distributed:
        return fail(
            "ampscope profile runs on one process; drop --nproc-per-node/--nnodes (a run on "
            "several processes is profiled from the Run view, on rank 0)."
        )
    overrides = model_overrides(args) + list(args.overrides)
    if args.device is not None:
        overrides.append(f"device='{args.device}'")
    try:
        preset = presets.load_preset(args.preset, overrides)
    except presets.ConfigError as exc:
        return fail(exc)
    start = warmup_of(preset)
    overrides.append(f"steps={start + k}")

    from ampscope.cli.console import ConsoleReporter
    from ampscope.engine.lifecycle.run import run

    found: list[ev.ProfileEvent] = []
    errors: list[ev.ErrorEvent] = []
    hellos: list[ev.HelloEvent] = []
    progress = None if args.json else ConsoleReporter(result=sys.stderr)
    load = load or LoadWatch()

    def on_event(event: ev.Event) -> None:
        if isinstance(event, ev.ProfileEvent):
            load.end()
            found.append(event)
        elif isinstance(event, ev.ErrorEvent):
            errors.append(event)
        elif isinstance(event, ev.HelloEvent):
            hellos.append(event)
        elif isinstance(event, ev.StepEvent) and event.step == start - 1:
            load.begin()  # the last warm-up step is done: the profile starts now
        if progress is not None:
            progress(event)
        elif isinstance(event, ev.WarningEvent):
            print(f"ampscope: warning: {visible(event.message)}", file=sys.stderr)

    with stdout_for_json_only(args.json):
        code = run(
            args.preset,
            overrides,
            runs_dir=args.runs_dir,
            record=not args.no_record,
            on_event=on_event,
            profile=(start, k),
            parts=parts,
        )
    if not found:
        if errors and progress is None:
            print(f"ampscope: {visible(errors[0].message)}", file=sys.stderr)
        return code or 1
    profile = found[-1]
    facts = run_facts(preset, hellos[0] if hellos else None)
    busy = load.note()
    if args.json:
        print(json.dumps(profiles.to_json(profile, preset.name, facts, busy)))
    else:
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else 80
        warm = f"after {start} warm-up step{'s' if start != 1 else ''}"
        title = f"{preset.name} ({warm})"
        text = profiles.render(profile, title, width, facts, busy)
        print(visible(text, keep_newlines=True))
    return code


def run_facts(preset: presets.Preset, hello: ev.HelloEvent | None) -> profiles.RunFacts:
    """What the profiled run was and what its device runs: the advice's facts. The run is one
    process, so ``auto`` AdamW is the fused kernel exactly on CUDA."""
    from ampscope.core.presets.optimizer import implementation

    on_cuda = hello is not None and hello.device.startswith("cuda")
    capability = tuple(hello.compute_capability or ()) if hello is not None else ()
    if on_cuda:
        fast_bf16: bool | None = capability >= (8, 0) if capability else None
    else:
        from ampscope.engine.device import cpu_has_fast_bf16

        fast_bf16 = cpu_has_fast_bf16()
    return profiles.RunFacts(
        precision=preset.precision,
        compile=preset.compile,
        optimizer=implementation(preset.optimizer, on_cuda, auto_fused=on_cuda),
        fp8=on_cuda and capability >= (8, 9),
        fast_bf16=fast_bf16,
    )


class LoadWatch:
    """The CPU time other processes took while the profile ran: the machine's busy time less
    this process's and its children's (a DataLoader's workers are the run's own work).
    ``cpu_seconds``, ``cores`` and ``threads`` read this machine unless given."""

    def __init__(
        self,
        cpu_seconds: Callable[[], tuple[float, float, float]] | None = None,
        cores: Callable[[], int | None] | None = None,
        threads: Callable[[], int] | None = None,
    ) -> None:
        self._start: tuple[float, float, float] | None = None
        self._end: tuple[float, float, float] | None = None
        self._cpu_seconds = cpu_seconds or _cpu_seconds
        self._cores, self._threads = cores, threads

    def begin(self) -> None:
        self._start = self._cpu_seconds()

    def end(self) -> None:
        self._end = self._cpu_seconds()

    def note(self) -> str | None:
        """``profiles.load_note`` for the profiled steps; None when not measured."""
        if self._start is None or self._end is None:
            return None
        import psutil
        import torch

        wall = self._end[0] - self._start[0]
        if wall <= 0:
            return None
        others = (self._end[1] - self._start[1]) - (self._end[2] - self._start[2])
        cores = (self._cores or psutil.cpu_count)() or 1
        threads = (self._threads or torch.get_num_threads)()
        return profiles.load_note(max(0.0, others) / wall, cores, threads)


def _cpu_seconds() -> tuple[float, float, float]:
    """(now, the machine's busy CPU seconds, this process tree's CPU seconds)."""
    import time

    import psutil

    machine = psutil.cpu_times()
    waiting = ("idle", "iowait", "guest", "guest_nice")  # a guest's time is in user already
    busy = sum(machine) - sum(getattr(machine, name, 0.0) for name in waiting)
    me = psutil.Process()
    own = sum(me.cpu_times()[:4])
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            own += sum(child.cpu_times()[:2])
    return time.monotonic(), busy, own


def compare_runs(names: list[str], runs_dir: Path | None, as_json: bool) -> int:
    """Both runs' last profiles side by side, or a message naming the run that has none."""
    from ampscope.cli.runs import resolve_run
    from ampscope.core import records
    from ampscope.core.profiles import compare

    root = runs_dir or records.default_runs_dir()
    found = []
    for name in names:
        path = resolve_run(name, root)
        if path is None:
            return fail(
                f"--compare: no run record '{name}'. Accepted: a run folder (one that holds "
                f"{records.EVENTS_FILE}), or a run's name in {root}, as 'ampscope runs' lists it."
            )
        record = records.load_run(path)
        profile = compare.last_profile(record.events)
        if profile is None:
            why = f" ({record.problem})" if record.problem else ""
            return fail(
                f"--compare: the run '{name}' holds no profile{why}. Record one with "
                f"'ampscope profile {record.preset}' (a new run of the preset, kept in "
                f"{root}), or with p in the Run view while a run is live; then compare that run."
            )
        found.append((record, profile))
    (rec_a, pa), (rec_b, pb) = found
    differs = compare.setup_differs(rec_a, rec_b)
    if as_json:
        out = compare.to_json(
            (rec_a.name, rec_a.preset, pa), (rec_b.name, rec_b.preset, pb), differs
        )
        print(json.dumps(out))
        return 0
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else 80
    text = compare.side_by_side(
        (f"{rec_a.preset} ({rec_a.name})", pa), (f"{rec_b.preset} ({rec_b.name})", pb), width
    )
    note = compare.differs_line(differs)
    if note:
        text += "\n" + note
    print(visible(text, keep_newlines=True))
    return 0
