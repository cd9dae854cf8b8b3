"""How the command lines speak: every message goes through ``visible`` on its way out.

Messages carry preset names, paths and engine errors, all of which a user or a record may
have filled with escape sequences.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
from collections.abc import Iterator

from ampscope.core.text import visible


def fail(message: object, code: int = 2) -> int:
    """Print ``ampscope: MESSAGE`` on stderr and return the exit code (2: a user error)."""
    print(f"ampscope: {visible(message, keep_newlines=True)}", file=sys.stderr)
    return code


def streams_when_closed() -> None:
    """A command started with stdout or stderr closed (``ampscope presets >&-``, a service
    with no output) writes that stream to /dev/null. Python leaves ``sys.stdout`` None then,
    which every command's first print failed on, and the next file opened would take the
    free descriptor and receive what is printed, a child's output too."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if getattr(sys, name) is not None:
            continue
        with contextlib.suppress(OSError):
            try:
                os.fstat(fd)
            except OSError:  # closed: /dev/null takes its place (the lowest free descriptor)
                null = os.open(os.devnull, os.O_WRONLY)
                if null != fd:
                    os.dup2(null, fd)
                    os.close(null)
            setattr(sys, name, open(fd, "w", closefd=False))  # noqa: SIM115 - for the process


def streams_that_encode_everything() -> None:
    """Output whose encoding lacks a character ampscope prints (``PYTHONIOENCODING=ascii``, a
    pipe under ``LANG=C``: the "…" of a cut value, "×", a bar's blocks) shows it escaped
    (``\u2026``), as Python's own stderr does, instead of ending the command on a
    UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]


def stdout_to_null() -> None:
    """What stdout still holds, and all it is sent from now on, goes nowhere: its reader has
    left, or its disk is full, and a second error at exit would say it again."""
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, sys.stdout.fileno())
    os.close(null)


WRITE_FAILED = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)
"""A write refused for want of room or by the device: stdout on a full disk."""


def write_failed(exc: OSError) -> bool:
    """Whether ``exc`` is a write that failed for want of room or by the device, on no named
    file (stdout's text, ``ampscope runs > out.txt`` on a full disk)."""
    return exc.filename is None and exc.errno in WRITE_FAILED


def not_a_runs_folder(root: object) -> int | None:
    """Exit 2 with a message when the runs folder is a file (listing it as empty, or as
    holding no live run, blamed the runs); None when it is a folder or absent."""
    from pathlib import Path

    path = Path(str(root))
    if path.exists() and not path.is_dir():
        return fail(
            f"the runs folder {path} is a file, not a folder of run records. Accepted: "
            "--runs-dir (or $AMPSCOPE_RUNS_DIR) naming a folder."
        )
    return None


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


@contextlib.contextmanager
def stdout_for_json_only(json_out: bool) -> Iterator[None]:
    """While the user's code trains in this process (``numerics``, ``profile``): with
    ``json_out``, what it prints (``print``, ``os.write(1, ...)``, a C library) goes to
    stderr, so that stdout carries the command's JSON alone (``| jq`` works)."""
    if not json_out:
        yield
        return
    sys.stdout.flush()
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no stdout or stderr to speak of: only Python's print is moved
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)
