"""Strings from users and records, made safe to show: control characters become visible.

A preset name, a description or an error message read from a record could carry terminal
escapes (``\\x1b[2J`` clears a screen) or carriage returns that overwrite what is shown.
``visible`` spells them out the way Python writes them, so they are seen, never obeyed.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_OR_NEWLINE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _spelled(match: re.Match[str]) -> str:
    return ascii(match.group())[1:-1]  # '\x1b' -> \x1b, '\r' -> \r


def visible(text: str, *, lines: bool = True) -> str:
    """``text`` with control characters written out; newlines and tabs kept when ``lines``."""
    pattern = _CONTROL if lines else _CONTROL_OR_NEWLINE
    return pattern.sub(_spelled, text)
