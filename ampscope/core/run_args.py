"""The run arguments shared by ``ampscope run`` and ``python -m ampscope.engine``.

argparse only (no torch, no textual): both front-ends build their parsers from here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ampscope.core.workload_spec import model_override

MODEL_HELP = (
    "train your own model: a factory in FILE.py:FUNCTION or MODULE:FUNCTION, called as "
    "FUNCTION(ctx) (same as --set workload.model=SPEC; see docs/model.md)"
)


class ArgParser(argparse.ArgumentParser):
    """argparse, but bad usage exits 2 with one line and a pointer to --help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"ampscope: {message}. See '{self.prog} --help'.\n")


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


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "preset", help="a preset name (see 'ampscope presets') or a path to a .toml file"
    )
    add_override_arguments(p)
    p.add_argument(
        "--json", action="store_true", help="print the event stream (one JSON object a line)"
    )
    p.add_argument(
        "--runs-dir", type=Path, help="where run records go (default ./runs or $AMPSCOPE_RUNS_DIR)"
    )
    p.add_argument("--no-record", action="store_true", help="do not write a run record")
    p.add_argument("--exit-with-parent", action="store_true", help=argparse.SUPPRESS)


def run_overrides(args: argparse.Namespace) -> list[str]:
    overrides = model_overrides(args) + list(args.overrides)
    if args.steps is not None:
        overrides.append(f"steps={args.steps}")
    if args.device is not None:
        overrides.append(f"device='{args.device}'")
    return overrides


def model_overrides(args: argparse.Namespace) -> list[str]:
    """``--model SPEC`` as the override it stands for (before any --set, which may refine it)."""
    spec = getattr(args, "model", None)
    return [model_override(spec)] if spec else []
