"""``python -m engine PRESET ...``: the engine alone, printing its event stream (always --json)."""

import sys

from ampscope.cli import _Parser, add_run_arguments, run_overrides
from engine.run import run

parser = _Parser(prog="python -m engine", description="Run one preset and print its event stream.")
add_run_arguments(parser)
args = parser.parse_args()
sys.exit(
    run(
        args.preset,
        run_overrides(args),
        json_out=True,
        runs_dir=args.runs_dir,
        record=not args.no_record,
        exit_with_parent=args.exit_with_parent,
    )
)
