"""Reading a run record's files, which need not be files: anyone who can write the runs folder
can leave a FIFO, a device or a link to one under a record's names.

A plain ``open`` of a FIFO waits for a writer for ever (``ampscope runs``, ``stop``,
``attach`` and History hung on a ``live.json`` FIFO), and a link to ``/dev/zero`` reads until
memory runs out. Every read of a record goes through here: the file is opened without
waiting (``O_NONBLOCK``), without following a last-component link where ampscope's own
processes write the file (``live.json``, ``.owner``), and is read only if ``fstat`` of that
very descriptor says it is a regular file no larger than the bound given. Anything else is an
``OSError`` (``NotAFile``), which every reader already turns into "unreadable".

Torch- and textual-free.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import IO, Any

SMALL_BYTES = 1 << 20
"""live.json, .owner, config.json, summary.json: a few kB each; a MiB is far past any."""
EVENTS_BYTES = 1 << 30
"""events.jsonl: a million steps is about 300 MB."""


class NotAFile(OSError):
    """A record's file that is not a regular file, or larger than a record's file can be."""


def open_file(path: Path, max_bytes: int, *, follow_links: bool = True) -> IO[bytes]:
    """``path`` opened for reading, once it is known to be a regular file of at most
    ``max_bytes``; raises OSError (``NotAFile`` for what is not one), never waits."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_links:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise NotAFile(errno.ELOOP, "a link, not a file", str(path)) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotAFile(errno.EINVAL, "not a regular file", str(path))
        if info.st_size > max_bytes:
            raise NotAFile(errno.EFBIG, f"larger than {max_bytes:,} bytes", str(path))
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: Path, max_bytes: int = SMALL_BYTES, *, follow_links: bool = True) -> bytes:
    """The whole of a small record file (see ``open_file``); one that grew past
    ``max_bytes`` while read is refused too."""
    with open_file(path, max_bytes, follow_links=follow_links) as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise NotAFile(errno.EFBIG, f"larger than {max_bytes:,} bytes", str(path))
    return data


def read_json(path: Path, max_bytes: int = SMALL_BYTES, *, follow_links: bool = True) -> Any:
    """A small record file's JSON. OSError when it cannot be read as a file, ValueError when
    it is not JSON (invalid UTF-8 and nesting too deep for the parser included)."""
    data = read_bytes(path, max_bytes, follow_links=follow_links)
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError(f"{path} nests too deep") from None
