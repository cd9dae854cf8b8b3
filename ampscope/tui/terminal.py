"""Giving the terminal back as it was found, from a signal handler.

Textual puts the terminal in raw mode with mouse tracking, bracketed paste and the alternate
screen on, and undoes it on a normal exit. A SIGTERM ends the dashboard from a signal
handler that cannot wait for a graceful exit, so the handler
undoes it itself: the sequences Textual's Linux driver writes when it stops, and the termios
settings saved before the app started. After a hang-up (SIGHUP) the terminal is gone and
nothing may be written to it: that handler does not call this.
"""

from __future__ import annotations

import contextlib
import os
import sys
import termios

LEAVE_APPLICATION_MODE = (
    "\x1b[?1000l\x1b[?1003l\x1b[?1015l\x1b[?1006l"  # mouse tracking off
    "\x1b[?2004l"  # bracketed paste off
    "\x1b[?7h"  # line wrap back on
    "\x1b[?2048l"  # in-band resize reports off
    "\x1b[<u"  # the kitty keyboard protocol off (before leaving the alternate screen)
    "\x1b[?1049l"  # back to the main screen
    "\x1b[?25h"  # cursor shown
    "\x1b[?1004l"  # focus reports off
)


class SavedTerminal:
    """The terminal's settings before the dashboard started; ``restore`` puts them back."""

    def __init__(self) -> None:
        self.input_fd = _fileno(sys.__stdin__)
        self.output_fd = _fileno(sys.__stderr__)  # where Textual's driver writes
        self.attrs: list | None = None
        if self.input_fd is not None and os.isatty(self.input_fd):
            with contextlib.suppress(termios.error, OSError):
                self.attrs = termios.tcgetattr(self.input_fd)

    def restore(self) -> None:
        """Write the leaving sequences and reset the modes. Only os calls: signal-safe enough."""
        if self.output_fd is not None and os.isatty(self.output_fd):
            with contextlib.suppress(OSError):
                os.write(self.output_fd, LEAVE_APPLICATION_MODE.encode())
        if self.attrs is not None and self.input_fd is not None:
            with contextlib.suppress(termios.error, OSError):
                termios.tcsetattr(self.input_fd, termios.TCSANOW, self.attrs)


def _fileno(stream: object) -> int | None:
    try:
        return stream.fileno()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return None
