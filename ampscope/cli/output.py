"""How the command lines speak: every message goes through ``visible`` on its way out.

Messages carry preset names, paths and engine errors, all of which a user or a record may
have filled with escape sequences.
"""

from __future__ import annotations

import sys

from ampscope.core.text import visible


def fail(message: object, code: int = 2) -> int:
    """Print ``ampscope: MESSAGE`` on stderr and return the exit code (2: a user error)."""
    print(f"ampscope: {visible(message, keep_newlines=True)}", file=sys.stderr)
    return code
