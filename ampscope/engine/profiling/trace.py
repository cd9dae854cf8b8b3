"""The profile's Chrome trace in the run folder, gzipped and bounded.

Perfetto (https://ui.perfetto.dev) and chrome://tracing open ``.json.gz`` as it is. A trace
grows with the steps profiled (at most ``profiles.MAX_STEPS``); one that is still over
``TRACE_LIMIT`` bytes compressed is not kept, and the profile's note says so.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

TRACE_LIMIT = 32 * 1024 * 1024


def save_trace(prof: Any, run_dir: Path, step: int) -> tuple[str | None, int | None, str | None]:
    """The trace's path and size, and a note when it was left out."""
    target = run_dir / f"profile-step{step}.trace.json.gz"
    fd, raw = tempfile.mkstemp(suffix=".json", dir=run_dir)
    os.close(fd)
    try:
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(target, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
    except OSError as exc:
        return None, None, f"no Chrome trace: it could not be written ({exc.strerror or exc})"
    finally:
        with contextlib.suppress(OSError):
            os.unlink(raw)
    size = target.stat().st_size
    if size > TRACE_LIMIT:
        target.unlink()
        mib = size / 2**20
        return (
            None,
            None,
            f"no Chrome trace: {mib:.0f} MiB is over the 32 MiB kept; profile fewer steps",
        )
    return str(target), size, None
