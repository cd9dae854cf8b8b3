"""The request a viewer leaves in a run folder to have the running engine profile its next steps.

``ampscope profile`` and the Run view leave it (``ask_to_profile``); the engine takes it
between steps (``take_request``), and never lets a request that is not one stop a run.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from ampscope.core.records import files
from ampscope.core.records.folders import write_text

REQUEST_FILE = "profile-request.json"
"""Left in a run folder by a viewer; the engine takes it between steps (at most twice a second)."""
DEFAULT_STEPS = 5
MAX_STEPS = 50
"""The most steps one profile takes: the Chrome trace grows with every step profiled."""


def ask_to_profile(run_dir: Path, steps: int = DEFAULT_STEPS) -> None:
    """Leave the request for the engine of ``run_dir``; it takes it within half a second."""
    # through a fresh file of its own: one of a fixed name may be there already as a FIFO,
    # which an open waits on for ever (the Run view's p froze the dashboard)
    write_text(run_dir / REQUEST_FILE, json.dumps({"steps": steps}))


REQUEST_MAX_BYTES = 4096
"""A request is ``{"steps": K}``: anything longer is not one."""


class BadRequest(ValueError):
    """A request file that is not a request (the message says why); it has been removed."""


def take_request(run_dir: Path) -> int | None:
    """The steps a waiting request asks for (the request is removed), or None when there is
    none. Raises ``BadRequest`` for one that is not ``{"steps": K}`` in a small regular file:
    anyone who can write the folder can leave anything there (a FIFO would block the training
    loop, a link to /dev/zero would fill its memory), and a run is never stopped by it."""
    path = run_dir / REQUEST_FILE
    try:
        raw = files.read_bytes(path, REQUEST_MAX_BYTES, follow_links=False)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a FIFO, a device, a link (to /dev/zero, say), no permission
        raise BadRequest(f"{path} cannot be read as a request: {exc.strerror or exc}") from None
    finally:
        _remove(path)
    return _steps_asked(path, raw)


def _steps_asked(path: Path, raw: bytes) -> int:
    try:
        asked = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadRequest(f"{path} is not JSON text") from None
    if not isinstance(asked, dict):
        raise BadRequest(f'{path} holds {type(asked).__name__}, not {{"steps": K}}')
    steps = asked.get("steps", DEFAULT_STEPS)
    if isinstance(steps, bool) or not isinstance(steps, int):
        raise BadRequest(f'{path} asks for "steps": {steps!r}; a whole number is accepted')
    return min(max(steps, 1), MAX_STEPS)


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
