"""How the command lines speak: every message goes through ``visible`` on its way out.

Messages carry preset names, paths and engine errors, all of which a user or a record may
have filled with escape sequences.
"""

from __future__ import annotations

import os
import shutil
import sys

from ampscope.core.text import visible


def fail(message: object, code: int = 2) -> int:
    """Print ``ampscope: MESSAGE`` on stderr and return the exit code (2: a user error)."""
    print(f"ampscope: {visible(message, keep_newlines=True)}", file=sys.stderr)
    return code


def output_width(stream: object = None) -> int | None:
    """The columns to fit printed text to: ``$COLUMNS`` when set, else the terminal's width
    when ``stream`` (stdout) is one. None (a pipe, a file): lines are left as they are, one
    record a line, for a script to read."""
    stream = stream or sys.stdout
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    if getattr(stream, "isatty", lambda: False)():
        return shutil.get_terminal_size().columns
    return None
