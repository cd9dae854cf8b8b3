"""``python -m ampscope.cli.serve.viewer --runs-dir DIR``: the served viewer's entry.

textual-serve starts one per browser tab. It opens the dashboard read-only, following the
newest live run in DIR. SIGUSR1 repaints its whole screen: ``ampscope serve`` sends it when
frames were dropped for a tab that could not keep up (cli/serve/viewers.py).

A viewer never outlives the ``ampscope serve`` that started it, however serve ends (SIGKILL,
the OOM killer, a hang-up it could not act on): on Linux the kernel sends it SIGTERM when serve
goes (PR_SET_PDEATHSIG); everywhere, a thread sees its parent change, and its input reaching
its end (serve's side of the pipe closed) ends it too (cli/serve/viewer_driver.py). Each of these
asks the app to quit, and ends the process outright if it has not within EXIT_GRACE_S.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from contextlib import suppress
from types import FrameType
from typing import TYPE_CHECKING

from ampscope.cli.serve.viewer_exit import leave_soon
from ampscope.core.presets.run_args import ArgParser, add_refresh_argument
from ampscope.core.records.folders import runs_dir_argument

if TYPE_CHECKING:
    from textual.app import App

REPAINT_SIGNAL = signal.SIGUSR1
PARENT_ENV = "AMPSCOPE_VIEWER_PARENT"
"""The pid of the ``ampscope serve`` that started this viewer: the viewer ends with it."""
PARENT_POLL_S = 0.5
PR_SET_PDEATHSIG = 1


def end_with_parent(parent: int | None = None) -> None:
    """End this process when ``parent`` (PARENT_ENV, else the process that started this one)
    ends: the kernel's parent-death signal on Linux, and a thread that polls the parent's pid
    (which becomes another's once the parent is gone) everywhere."""
    if parent is None:
        parent = int(os.environ.get(PARENT_ENV) or 0) or os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        except (OSError, AttributeError):
            pass  # the poll below still ends it
    if os.getppid() != parent:  # serve was gone before the line above
        sys.exit(0)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        leave_soon()

    threading.Thread(target=watch, name="ampscope-parent", daemon=True).start()


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
    parser = ArgParser(prog="python -m ampscope.cli.serve.viewer", description=__doc__)
    parser.add_argument("--runs-dir", type=runs_dir_argument, help="where run records are")
    add_refresh_argument(parser)
    args = parser.parse_args(argv)
    end_with_parent()
    from textual.drivers.web_driver import WebDriver

    from ampscope.cli.serve.viewer_driver import ViewerDriver
    from ampscope.tui.app import AmpscopeApp

    app = AmpscopeApp(
        runs_dir=args.runs_dir, refresh_hz=args.refresh, read_only=True, follow_live=True
    )
    if app.driver_class is WebDriver:  # served (textual-serve names the web driver)
        app.driver_class = ViewerDriver
    repaint_on_signal(app)
    app.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
