"""Text from users and records, made safe to show.

Preset names and descriptions, run names, error messages and paths come from files anyone may
have written. Shown raw, an escape sequence can rewrite the terminal (its title, its colours,
the cursor); the dashboard additionally must never read them as markup. ``visible`` turns
every control character into a printable escape (``\\x1b``), and caps the length.
"""

from __future__ import annotations

import math
import textwrap
import unicodedata

MAX_SHOWN = 4000
"""Characters shown of one user- or record-supplied string; the rest is summarised."""
MAX_RECORDED = 16_000
"""Characters of an exception's text a record keeps: a message of megabytes (a user's exception
that holds a whole dataset's repr) made a ``done`` line and ``summary.json`` too large to read
back, and the run listed as crashed."""


def value_text(value: object, width: int) -> str:
    """``repr(value)`` for a message, at most ``width`` characters: an int of over 64 bits as
    about 10**N (repr refuses past 4,300 digits), and a repr that raises said so."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"about {'-' if value < 0 else ''}10**{int(value.bit_length() * math.log10(2))}"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a user's __repr__ raised
        return "<repr() failed>"
    return text if len(text) <= width else text[: width - 3] + "..."


def exit_call(code: object) -> str:
    """The ``sys.exit`` call a message names, from the exit's ``code``: its argument shown by
    ``value_text``, since a user's code may exit with anything (a 10**5000, an object whose
    ``__repr__`` raises)."""
    return "sys.exit()" if code is None else f"sys.exit({value_text(code, 200)})"


def exception_text(exc: BaseException, limit: int = MAX_RECORDED) -> str:
    """``str(exc)``, or what Python's own traceback prints when that fails: a user's
    exception whose ``__str__`` raises (or returns no str) must not end the run unrecorded.
    Past ``limit`` characters it is cut and says how much was left out."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - whatever the user's __str__ raises
        return "<exception str() failed>"
    return cut(text, limit)


def cut(text: str, limit: int = MAX_RECORDED) -> str:
    """``text``, or its first ``limit`` characters and how many more there were."""
    if len(text) <= limit:
        return text
    return text[:limit] + _more(len(text) - limit)


def _more(left_out: int) -> str:
    """What a cut text ends with: how many characters it left out."""
    return f"… ({left_out:,} more characters)"


def is_utf8(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8: a file name's bytes that are not (Python holds
    them as lone surrogates) cannot go into a TOML or Python file."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def surrogate_text(ch: str) -> str:
    """A lone surrogate as text: ``\\xff`` for the byte that is not UTF-8 it stands for (0xDC80
    to 0xDCFF, Python's ``surrogateescape``: a file name's), else ``\\ud800``. The commands,
    the screens and the event stream all write such a byte so."""
    code = ord(ch)
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch == "\n":
        return "\\n"
    if ch == "\t":
        return "\\t"
    if ch == "\r":
        return "\\r"
    if 0xD800 <= code <= 0xDFFF:
        return surrogate_text(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: object, limit: int = MAX_SHOWN, *, keep_newlines: bool = False) -> str:
    """``text`` with control characters (C0, DEL, C1, bidi overrides) shown as escapes, and
    lone surrogates (a file name's bytes that are not UTF-8), which no terminal can be sent.

    ``keep_newlines`` keeps line breaks and tabs as they are (multi-line messages, tracebacks).
    Past ``limit`` characters the text is cut and says how much was left out.
    """
    s = str(text)
    left_out = len(s) - limit if limit and len(s) > limit else 0
    if left_out:
        s = s[:limit]
    out = []
    for ch in s:
        kept_break = keep_newlines and ch in "\n\t"
        if kept_break or ch == " " or unicodedata.category(ch) not in ("Cc", "Cf", "Cs"):
            out.append(ch)
        else:
            out.append(_escape(ch))
    shown = "".join(out)
    return shown + _more(left_out) if left_out else shown


def wrap(text: str, width: int | None, indent: str = "", hang: str | None = None) -> list[str]:
    """``text`` as lines of at most ``width`` columns, broken between words only: a terminal
    that wraps a long line itself cuts words in two ("interle / aved"). The first line starts
    with ``indent``, the rest with ``hang`` (``indent`` when not given). A word longer than a
    line (a path) keeps a line of its own, whole. ``width`` None: one line, as it is."""
    hang = indent if hang is None else hang
    if width is None:
        return [indent + text]
    lines = textwrap.wrap(
        text,
        width=max(width, len(indent) + 1, len(hang) + 1),
        initial_indent=indent,
        subsequent_indent=hang,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return lines or [indent.rstrip()]
