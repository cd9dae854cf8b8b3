"""How the engine's process ends, in exit codes, and how a user error before any run is told.

Exit codes: 0 finished, 1 the run failed (NaN, OOM, an exception, a record that cannot be
written), 2 a user error in the preset or for this device, 130 stopped by a signal. Imports no torch: a refusal must be quick.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from ampscope.core import events as ev
from ampscope.core.text import visible

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STOPPED = 0, 1, 2, 130


def refuse(
    message: str,
    json_out: bool,
    on_event: Callable[[ev.Event], None] | None,
    kind: str = "config",
) -> int:
    """A run that cannot start: one message, and an error event for watchers.

    Exit 2 for a user error in the preset (kind ``config``), 1 when the machine is at fault
    (kind ``io``: the runs folder cannot be written).
    """
    event = ev.ErrorEvent(kind=kind, message=message)  # type: ignore[arg-type]
    if json_out:
        sys.stdout.buffer.write(ev.encode(event))
        sys.stdout.flush()
    if on_event:
        on_event(event)
    else:
        print(f"ampscope: {visible(message)}", file=sys.stderr)
    return EXIT_USAGE if kind == "config" else EXIT_FAILED
