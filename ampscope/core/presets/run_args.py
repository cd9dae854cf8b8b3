"""The run arguments shared by ``ampscope run`` and ``python -m ampscope.engine``.

argparse only (no torch, no textual): both front-ends build their parsers from here.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from ampscope.core.presets.errors import FlagOverride
from ampscope.core.presets.parallel import Launch, make_launch
from ampscope.core.presets.workload_spec import model_override
from ampscope.core.records.folders import runs_dir_argument
from ampscope.core.text import visible

MODEL_HELP = (
    "train your own model: a factory in FILE.py:FUNCTION or MODULE:FUNCTION, called as "
    "FUNCTION(ctx) (same as --set workload.model=SPEC; see docs/model.md)"
)

REFRESH_RANGE = (0.5, 4.0)
"""Dashboard plot redraws a second that ``--refresh`` accepts: lower for slow SSH links."""
DEFAULT_REFRESH_HZ = 2.0


def check_refresh(hz: float) -> float:
    """``hz`` when it is a redraw rate the dashboard accepts; ValueError naming the range if not."""
    low, high = REFRESH_RANGE
    if not (math.isfinite(hz) and low <= hz <= high):
        raise ValueError(f"{hz:g} is out of range; accepted: {low:g} to {high:g} redraws a second")
    return hz


def refresh_rate(text: str) -> float:
    """argparse ``type=`` for ``--refresh``: a bad value exits 2 with the accepted range."""
    try:
        hz = float(text)
    except ValueError:
        low, high = REFRESH_RANGE
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number; accepted: {low:g} to {high:g} redraws a second"
        ) from None
    try:
        return check_refresh(hz)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_refresh_argument(p: argparse.ArgumentParser) -> None:
    low, high = REFRESH_RANGE
    p.add_argument(
        "--refresh",
        type=refresh_rate,
        default=None,
        metavar="HZ",
        help=f"dashboard plot redraw rate, {low:g} to {high:g} (lower it on slow SSH links)",
    )


class ArgParser(argparse.ArgumentParser):
    """argparse, but bad usage exits 2 with one line and a pointer to --help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse quotes what was typed: an ESC byte in it must not reach the terminal
        self.exit(2, f"ampscope: {visible(message)}. See '{self.prog} --help'.\n")


def add_override_arguments(p: argparse.ArgumentParser, which: str = "the preset") -> None:
    """--model, --steps, --device and --set: the everyday knobs, read back by ``run_overrides``."""
    add_model_argument(p)
    p.add_argument("--steps", type=int, help=f"optimizer steps for {which} (same as --set steps=N)")
    p.add_argument("--device", help="auto, cpu, cuda or cuda:N (same as --set device=D)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a field of {which}, dotted for tables: --set workload.layers=4",
    )


def add_model_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="SPEC", help=MODEL_HELP)


def add_run_arguments(
    p: argparse.ArgumentParser, json_help: str = "print the event stream (one JSON object a line)"
) -> None:
    """The flags of a command that runs a preset; ``json_help`` says what its --json prints."""
    p.add_argument(
        "preset", help="a preset name (see 'ampscope presets') or a path to a .toml file"
    )
    add_override_arguments(p)
    p.add_argument("--json", action="store_true", help=json_help)
    p.add_argument(
        "--runs-dir",
        type=runs_dir_argument,
        help="where run records go (default ./runs or $AMPSCOPE_RUNS_DIR)",
    )
    p.add_argument("--no-record", action="store_true", help="do not write a run record")
    p.add_argument("--exit-with-parent", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)  # set by the launcher


# the flags add_launch_arguments adds, in make_launch's order
LAUNCH_FLAGS = ("nproc_per_node", "nnodes", "node_rank", "rdzv_endpoint", "rdzv_timeout")


def add_launch_arguments(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """torchrun's flags, for ``run``, ``bench`` and the dashboard. ``prefix`` keeps the
    top-level parser's values apart from a subcommand's (``launch_from_args`` merges them)."""
    group = p.add_argument_group("several processes (torchrun: DDP or FSDP2)")
    group.add_argument(
        "--nproc-per-node",
        dest=prefix + "nproc_per_node",
        type=int,
        metavar="N",
        help="processes on this machine, one a GPU (gloo on CPUs); more than 1 starts torchrun",
    )
    group.add_argument(
        "--nnodes", dest=prefix + "nnodes", type=int, metavar="N", help="machines in the job"
    )
    group.add_argument(
        "--node-rank",
        dest=prefix + "node_rank",
        type=int,
        metavar="K",
        help="this machine's place in the job, 0 to nnodes-1 (node 0 writes the record)",
    )
    group.add_argument(
        "--rdzv-endpoint",
        dest=prefix + "rdzv_endpoint",
        metavar="HOST:PORT",
        help="where the machines meet: node 0's address and a free port, the same on every node",
    )
    group.add_argument(
        "--rdzv-timeout",
        dest=prefix + "rdzv_timeout",
        type=int,
        metavar="S",
        help="seconds node 0 waits for the other machines (torchrun's default: 600)",
    )


def launch_from_args(args: argparse.Namespace, prefix: str = "") -> Launch:
    """The launch the flags ask for; a subcommand's flag wins over the top-level one.
    Raises ``LaunchError`` (a user error naming the flag)."""

    def value(name: str) -> object:
        own = getattr(args, name, None)
        return own if own is not None else getattr(args, prefix + name, None)

    return make_launch(*(value(name) for name in LAUNCH_FLAGS))  # type: ignore[arg-type]


def run_overrides(args: argparse.Namespace) -> list[str]:
    overrides = model_overrides(args) + list(args.overrides)
    if args.steps is not None:
        overrides.append(FlagOverride(f"steps={args.steps}", f"--steps {args.steps}"))
    if args.device is not None:
        overrides.append(FlagOverride(f"device='{args.device}'", f"--device {args.device}"))
    return overrides


def model_overrides(args: argparse.Namespace) -> list[str]:
    """``--model SPEC`` as the override it stands for (before any --set, which may refine it)."""
    spec = getattr(args, "model", None)
    return [model_override(spec)] if spec is not None else []
