"""``python -m ampscope.engine PRESET ...``: the engine alone, printing its event stream (always --json)."""

import sys

from ampscope.core.presets.run_args import ArgParser, add_run_arguments, run_overrides
from ampscope.engine.lifecycle.run import run

parser = ArgParser(
    prog="python -m ampscope.engine", description="Run one preset and print its event stream."
)
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
        run_dir=args.run_dir,
    )
)
