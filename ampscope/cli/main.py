"""The ``ampscope`` command. Heavy imports (torch, textual) happen inside the subcommand that needs them."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import shutil
import sys
import textwrap
from collections.abc import Sequence

from ampscope import __version__
from ampscope.cli.output import (
    fail,
    stdout_to_null,
    streams_that_encode_everything,
    streams_when_closed,
    write_failed,
)
from ampscope.core.presets import ConfigError, list_presets, load_preset, user_presets_dir
from ampscope.core.presets.parallel import LaunchError
from ampscope.core.presets.run_args import (
    ArgParser,
    add_launch_arguments,
    add_model_argument,
    add_override_arguments,
    add_refresh_argument,
    add_run_arguments,
    launch_from_args,
    model_overrides,
    run_overrides,
)
from ampscope.core.records.folders import runs_dir_argument
from ampscope.core.text import visible


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    from ampscope.core.comparison import significance  # run records: not the dashboard's start

    p.add_argument("presets", nargs="*", help="presets to compare (default: the lecture's sweep)")
    add_override_arguments(p, "every preset")
    p.add_argument("--baseline", help="the preset others are compared with (default: fp32)")
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        metavar="K",
        help=(
            "runs per preset, interleaved ABAB (default: %(default)s). A speed difference is "
            f"called only when its {significance.LEVEL * 100:.0f}%% confidence interval across the "
            f"repeats excludes 1.0, which needs {significance.MIN_REPEATS} or more"
        ),
    )
    p.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help=(
            "what a step's time is: wall (default) or cpu, the engine process's CPU time (all "
            "threads). On a shared CPU machine other tenants stretch the wall clock, hardly the "
            "CPU time; CPU devices only"
        ),
    )
    p.add_argument("--runs-dir", type=runs_dir_argument, help="where run and sweep records go")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    fmt.add_argument("--csv", action="store_true", help="print the table as CSV")
    fmt.add_argument("--json", action="store_true", help="print the rows as JSON")


DESCRIPTION = (
    "Watch how number formats, mixed precision and torch.compile change a training run. "
    "With no command, opens the dashboard."
)


def add_top_arguments(parser: argparse.ArgumentParser) -> None:
    """The options before any command: the dashboard's own."""
    parser.add_argument("--version", action="version", version=f"ampscope {__version__}")
    parser.add_argument(
        "--runs-dir",
        dest="top_runs_dir",
        type=runs_dir_argument,
        help="where run records go (default ./runs)",
    )
    add_refresh_argument(parser)
    add_model_argument(parser)  # the dashboard: every run it starts trains this model
    add_launch_arguments(parser, prefix="top_")  # the dashboard: every run it starts


def build_parser() -> argparse.ArgumentParser:
    parser = ArgParser(prog="ampscope", description=DESCRIPTION)
    add_top_arguments(parser)
    sub = parser.add_subparsers(dest="command", parser_class=ArgParser)
    run = sub.add_parser("run", help="run a preset headless and print its progress")
    add_run_arguments(run)
    from ampscope.cli.runs import add_detach_arguments, add_runs_parsers

    add_detach_arguments(run)
    add_launch_arguments(run)
    presets = sub.add_parser("presets", help="list the presets found (shipped and user)")
    presets.add_argument(
        "--json",
        action="store_true",
        help="print a JSON list: name, description, path, source (shipped or user), problem",
    )
    bench = sub.add_parser(
        "bench", help="run presets one after another and compare them in one table"
    )
    add_bench_arguments(bench)
    add_launch_arguments(bench)
    # (number-format and memory-planner commands are added here)
    from ampscope.cli.dtypes import add_dtypes_parser
    from ampscope.cli.memory import add_memory_parser

    add_dtypes_parser(sub)
    add_memory_parser(sub)
    from ampscope.cli.numerics import add_numerics_parser

    add_numerics_parser(sub)
    from ampscope.cli.plan import add_plan_parser

    add_plan_parser(sub)
    doctor = sub.add_parser(
        "doctor",
        help="what this machine offers: torch, CUDA, GPUs, bf16/tf32/fp8, NVML; with --bench, "
        "what it delivers",
    )
    doctor.add_argument(
        "--json", action="store_true", help="print the findings as one JSON object (for scripts)"
    )
    doctor.add_argument(
        "--try-compile",
        nargs="?",
        const=True,
        default=False,
        choices=["cpu", "cuda"],
        metavar="DEVICE",
        help="compile a tiny function with torch.compile on each device, or on DEVICE alone "
        "(cpu or cuda; 20-40 s each, cold), instead of only checking that Triton, a C compiler "
        "and Python.h are there",
    )
    from ampscope.cli.doctor_bench import add_bench_options

    add_bench_options(doctor)
    add_runs_parsers(sub)
    from ampscope.cli.stop import add_stop_parser

    add_stop_parser(sub)
    from ampscope.cli.profile import add_profile_parser

    add_profile_parser(sub)
    # `ampscope --model X run ...` and `ampscope run ... --model X` mean the same, as for
    # --runs-dir: a command's own --model, when it is not given, leaves the one before it (its
    # default would replace it, and the command train a built-in workload instead).
    for command in sub.choices.values():
        models = [action for action in command._actions if action.dest == "model"]
        for action in models:
            action.default = argparse.SUPPRESS
        command.set_defaults(takes_model=bool(models))
    return parser


def unused_model(args: argparse.Namespace) -> str | None:
    """``ampscope --model X dtypes``: a command that trains no model was given one before it,
    which it would ignore without a word."""
    if args.command is None or getattr(args, "takes_model", True) or not args.model:
        return None
    return (
        f"--model {args.model}: '{args.command}' trains no model, so it takes none. Accepted: "
        "--model with the dashboard (ampscope --model SPEC) or with run, bench, memory, plan, "
        "numerics and profile."
    )


def main(argv: Sequence[str] | None = None) -> int:
    streams_when_closed()
    streams_that_encode_everything()
    try:
        return dispatch(argv)
    except BrokenPipeError:  # `ampscope presets | head`: the reader left, which is no error
        stdout_to_null()
        return 141
    except KeyboardInterrupt:  # Ctrl+C where a command has no word of its own (torch's import)
        print("ampscope: stopped (Ctrl+C).", file=sys.stderr)
        return 130
    except OSError as exc:
        if exc.filename is not None:  # a path named that cannot be looked at: a folder on the
            # way that is not yours to search (Permission denied), a name too long
            return fail(f"cannot use {exc.filename}: {exc.strerror or exc}.")
        if not write_failed(exc):
            raise
        # `ampscope runs > out.txt` on a full disk: said once
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        stdout_to_null()
        print(f"ampscope: a write failed: {exc.strerror or exc}.", file=sys.stderr)
        return 1


class _NotTheDashboard(Exception):
    pass


class _DashboardParser(ArgParser):
    """The options before any command alone: anything it cannot take is for the whole parser."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _NotTheDashboard(message)


def dashboard_args(argv: Sequence[str] | None) -> argparse.Namespace | None:
    """``argv`` parsed when it opens the dashboard (no command, no --help), without building
    every command's parser: that imports each command's code, a tenth of a second before the
    first screen (benchmarks/first_paint.py). None when ``argv`` names a command, asks for
    help or is at fault: ``build_parser`` then parses it, and says what is wrong."""
    parser = _DashboardParser(prog="ampscope", description=DESCRIPTION, add_help=False)
    parser.add_argument("-h", "--help", action="store_true")  # its abbreviations, as argparse's
    add_top_arguments(parser)
    try:
        args, rest = parser.parse_known_args(argv)
    except _NotTheDashboard:
        return None
    if rest or args.help:
        return None
    del args.help
    args.command = None
    return args


def command_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``argv`` as a command reads it: parsed, the runs folder and the launch settled. Raises
    ``LaunchError`` for a launch that cannot be (argparse's refusals exit, as its own do)."""
    args = dashboard_args(argv) or build_parser().parse_args(argv)
    # `ampscope --runs-dir X run ...` and `ampscope run ... --runs-dir X` mean the same.
    args.runs_dir = getattr(args, "runs_dir", None) or args.top_runs_dir
    args.launch = launch_from_args(args, prefix="top_")
    return args


def set_before_command(argv: Sequence[str]) -> str | None:
    """``ampscope --set steps=150``: a field set for the dashboard, which takes none (argparse
    read the value as a command it does not know)."""
    given = [a for a in argv if a == "--set" or a.startswith("--set=")]
    if not given:
        return None
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for token in argv:
        if token in sub.choices:
            return None
        if token in given:
            return (
                "--set before a command: it sets a field of the command's preset, so it goes "
                "after the command (ampscope run PRESET --set steps=150). The dashboard takes "
                "no --set: change a preset's fields in its form (s saves them as a user preset)."
            )
    return None


def dispatch(argv: Sequence[str] | None = None) -> int:
    if (misplaced := set_before_command(sys.argv[1:] if argv is None else argv)) is not None:
        return fail(misplaced)
    try:
        args = command_args(argv)
    except LaunchError as exc:
        return fail(exc)
    if (unused := unused_model(args)) is not None:
        return fail(unused)
    if args.command == "run":
        return cmd_run(args)
    if args.command == "presets":
        return cmd_presets(args)
    if args.command == "bench":
        from ampscope.cli.bench import cmd_bench

        return cmd_bench(args)
    if args.command == "dtypes":
        from ampscope.cli.dtypes import cmd_dtypes

        return cmd_dtypes(args)
    if args.command == "memory":
        from ampscope.cli.memory import cmd_memory

        return cmd_memory(args)
    if args.command == "numerics":
        from ampscope.cli.numerics import cmd_numerics

        return cmd_numerics(args)
    if args.command == "plan":
        from ampscope.cli.plan import cmd_plan

        return cmd_plan(args)
    if args.command == "profile":
        from ampscope.cli.profile import cmd_profile

        return cmd_profile(args)
    if args.command == "stop":
        from ampscope.cli.stop import cmd_stop

        return cmd_stop(args)
    if args.command in ("runs", "attach", "replay", "serve"):
        from ampscope.cli import runs

        return runs.main(args)
    if args.command == "doctor":
        if args.bench or args.quick or args.bench_device != "auto":
            from ampscope.cli.doctor_bench import cmd_machine_check

            return cmd_machine_check(args)
        from ampscope.cli.doctor import doctor

        return doctor(as_json=args.json, try_compile=args.try_compile)
    return cmd_dashboard(args)


def cmd_run(args: argparse.Namespace) -> int:
    if getattr(args, "detach", False):
        from ampscope.cli.runs import cmd_run_detached

        return cmd_run_detached(args)
    if args.launch.distributed:
        from ampscope.cli.torchrun import cmd_run_distributed

        return cmd_run_distributed(args, args.launch)
    from ampscope.cli.console import ConsoleReporter
    from ampscope.engine.lifecycle.run import run

    reporter = None if args.json else ConsoleReporter()
    return run(
        args.preset,
        run_overrides(args),
        json_out=args.json,
        runs_dir=args.runs_dir,
        record=not args.no_record,
        on_event=reporter,
        exit_with_parent=args.exit_with_parent,
        run_dir=getattr(args, "run_dir", None),
        on_record=reporter.record_at if reporter is not None else None,
    )


def cmd_presets(args: argparse.Namespace) -> int:
    found = list_presets()
    if args.json:
        rows = [
            {
                "name": p.name,
                "description": p.description,
                "path": str(p.path),
                "source": p.source,
                "problem": p.problem,
            }
            for p in found
        ]
        print(json.dumps(rows, indent=2))
        return 0
    width = min(max((len(visible(p.name)) for p in found), default=0), 32)
    columns = shutil.get_terminal_size().columns if sys.stdout.isatty() else 0
    for p in found:
        tag = "" if p.source == "shipped" else f"  [{p.source}: {visible(p.path)}]"
        about = f"BROKEN: {p.problem}" if p.problem else p.description
        line = f"{visible(p.name, 64):<{width}}  {visible(about, 500)}{tag}"
        if columns > width + 20:  # a terminal: wrapped between words, under the description
            line = textwrap.fill(
                line, columns - 1, subsequent_indent=" " * (width + 2), break_on_hyphens=False
            )
        print(line)
    print(f"\nUser presets: {visible(user_presets_dir())}/*.toml")
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    # no garbage collection while the dashboard's code loads and its first screen is built
    # (AmpscopeApp turns it back on once that screen is drawn; here, whatever happens)
    gc.disable()
    try:
        return _dashboard(args)
    finally:
        gc.enable()


def _dashboard(args: argparse.Namespace) -> int:
    try:
        from ampscope.tui.app import run_dashboard
    except ImportError as exc:  # pragma: no cover - a broken install
        print(
            f"ampscope: the dashboard cannot start ({exc}). Reinstall with 'pip install ampscope'.",
            file=sys.stderr,
        )
        return 1
    extra = model_overrides(args)
    if extra:  # refuse a bad spec here, in one line, before the screen is taken over
        try:
            load_preset("fp32", extra)
        except ConfigError as exc:
            print(f"ampscope: {visible(exc.detail)}", file=sys.stderr)
            return 2
    return run_dashboard(
        runs_dir=args.runs_dir,
        refresh_hz=args.refresh,
        extra_overrides=extra,
        processes=args.launch,
    )


if __name__ == "__main__":
    sys.exit(main())
