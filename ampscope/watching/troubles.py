"""What ampscope could not do for a watched run, said once a kind as a Python warning, so
that its troubles never become the user's: an unwritable runs folder, a full disk (the record
writer, ``core.records.writer``, tells them here), NVML, a bug in ampscope. Training goes on.

Torch-free.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from types import FrameType

from ampscope.core.text import exception_text, visible


class WatchWarning(RuntimeWarning):
    """ampscope could not record part of a watched run; the training itself is unaffected."""


class Troubles:
    """One Python warning per kind of trouble and run, then silence."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def report(self, what: str, exc: BaseException | None = None) -> None:
        if what in self.seen:
            return
        self.seen.add(what)
        cause = f" ({type(exc).__name__}: {exception_text(exc)})" if exc is not None else ""
        said = f"{what}{cause}. Your training goes on; ampscope records no more of it."
        _warn(said)

    def note(self, message: str) -> None:
        """A note on what the loop gave ampscope (the record goes on): each one said once."""
        if message in self.seen:
            return
        self.seen.add(message)
        _warn(message)


def _warn(message: str) -> None:
    """Warn on the user's line, with the control characters of what the message names (a
    runs folder, a run's name) spelled out: a warning goes to the user's terminal as it is."""
    text = visible(f"ampscope.watch: {message}", 0, keep_newlines=True)
    warnings.warn(text, WatchWarning, stacklevel=_users_level())


_PACKAGE = Path(__file__).parent.parent
_OURS = tuple(
    str(p) + os.sep for p in {_PACKAGE, _PACKAGE.resolve(), (_PACKAGE / "engine").resolve()}
)  # the package as imported, and where its engine/ link points


def _users_level() -> int:
    """The ``stacklevel`` of the first caller outside ampscope: the warning names the user's
    line (their ``watch()`` or ``mon.step()`` call), not ours."""
    level = 2
    frame: FrameType | None = sys._getframe(2)  # 1 is _warn(), which calls warnings.warn
    while frame is not None and frame.f_code.co_filename.startswith(_OURS):
        frame, level = frame.f_back, level + 1
    return level
