"""The profile's Chrome trace in the run folder, gzipped and bounded.

Perfetto (https://ui.perfetto.dev) and chrome://tracing open ``.json.gz`` as it is. torch
writes the trace uncompressed, and its size is not known before: it goes to the system's
temporary folder, never the run folder, and only its gzipped copy comes in. A trace grows with
the steps profiled (at most ``profiles.MAX_STEPS``); one that is still over ``TRACE_LIMIT``
bytes compressed is not kept, and a run keeps the traces of its last ``KEEP_TRACES`` profiles
(each ``p`` in the dashboard takes one). A trace that cannot be written costs the trace only:
the profile's note says why.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

TRACE_LIMIT = 32 * 1024 * 1024
KEEP_TRACES = 3
TRACE_NAME = re.compile(r"profile-step(\d+)\.trace\.json\.gz")


def save_trace(
    prof: Any, run_dir: Path, step: int, limit: int = TRACE_LIMIT
) -> tuple[str | None, int | None, str | None]:
    """The trace's path and size, and a note when it was left out (over ``limit`` bytes)."""
    target = run_dir / f"profile-step{step}.trace.json.gz"
    raw = ""
    try:
        fd, raw = tempfile.mkstemp(prefix="ampscope-trace-", suffix=".json")
        os.close(fd)
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(target, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        size = target.stat().st_size
    except Exception as exc:  # noqa: BLE001 - the trace is lost, not the profile
        with contextlib.suppress(OSError):
            target.unlink()
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        return None, None, f"no Chrome trace: it could not be written ({why})"
    finally:
        if raw:
            with contextlib.suppress(OSError):
                os.unlink(raw)
    if size > limit:
        with contextlib.suppress(OSError):
            target.unlink()
        over, kept = size / 2**20, limit / 2**20
        return (
            None,
            None,
            f"no Chrome trace: {over:.0f} MiB is over the {kept:.0f} MiB kept; profile fewer steps",
        )
    drop_old_traces(run_dir)
    return str(target), size, None


def drop_old_traces(run_dir: Path) -> None:
    """Only the last ``KEEP_TRACES`` traces (by the step they start at) stay in the folder."""
    try:
        names = [(TRACE_NAME.fullmatch(p.name), p) for p in run_dir.iterdir()]
    except OSError:
        return
    found = [(int(match.group(1)), path) for match, path in names if match]
    for _, path in sorted(found)[:-KEEP_TRACES]:
        with contextlib.suppress(OSError):
            path.unlink()
