"""``python -m ampscope.cli.viewer --runs-dir DIR``: the served viewer's entry.

textual-serve starts one per browser tab. It opens the dashboard read-only, following the
newest live run in DIR.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from ampscope.core.run_args import ArgParser, add_refresh_argument


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgParser(prog="python -m ampscope.cli.viewer", description=__doc__)
    parser.add_argument("--runs-dir", type=Path, help="where run records are")
    add_refresh_argument(parser)
    args = parser.parse_args(argv)
    from ampscope.tui.app import AmpscopeApp

    app = AmpscopeApp(
        runs_dir=args.runs_dir, refresh_hz=args.refresh, read_only=True, follow_live=True
    )
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
