"""``python -m ampscope.cli.viewer --runs-dir DIR``: the served viewer's entry.

textual-serve starts one per browser tab. It opens the dashboard read-only, following the
newest live run in DIR. SIGUSR1 repaints its whole screen: ``ampscope serve`` sends it when
frames were dropped for a tab that could not keep up (cli/serve_viewers.py).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from ampscope.core.run_args import ArgParser, add_refresh_argument

if TYPE_CHECKING:
    from textual.app import App

REPAINT_SIGNAL = signal.SIGUSR1


def repaint(app: App[object]) -> None:
    """Draw the whole screen again, as if to a blank terminal."""
    screen = app.screen
    screen.refresh(screen.region)


def repaint_on_signal(app: App[object]) -> None:
    """Have REPAINT_SIGNAL repaint ``app``'s screen (the handler runs on the app's thread,
    between two steps of its loop: it only schedules the repaint)."""

    def handler(_signum: int, _frame: FrameType | None) -> None:
        with suppress(RuntimeError):  # before the app's loop runs, or after it ended
            asyncio.get_running_loop().call_soon_threadsafe(repaint, app)

    signal.signal(REPAINT_SIGNAL, handler)


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgParser(prog="python -m ampscope.cli.viewer", description=__doc__)
    parser.add_argument("--runs-dir", type=Path, help="where run records are")
    add_refresh_argument(parser)
    args = parser.parse_args(argv)
    from ampscope.tui.app import AmpscopeApp

    app = AmpscopeApp(
        runs_dir=args.runs_dir, refresh_hz=args.refresh, read_only=True, follow_live=True
    )
    repaint_on_signal(app)
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
