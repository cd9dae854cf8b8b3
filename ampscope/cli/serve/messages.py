"""What a browser tab may send ``ampscope serve``: every websocket message is checked here
before a viewer sees it, and the viewer's driver checks a resize again.

Apart from cli/serve/serve.py so that the viewers' side (cli/serve/viewers.py, cli/serve/viewer_driver.py)
reads the same rules without importing the server.
"""

from __future__ import annotations

import json
from typing import Any

from ampscope.core.text import visible

SIZE_RANGE = (10, 1000)
"""Columns and rows a browser may ask the viewer's terminal for (``?width=&height=``)."""

STDIN_CHARS = 1 << 16
"""The most characters one ``stdin`` message may carry (a paste); xterm.js sends keys one by one."""
PING_CHARS = 64
"""A ``ping`` carries the browser's clock, echoed back: a few digits."""


class BadMessage(ValueError):
    """A browser's websocket message that is not one textual-serve's page sends: its tab is
    closed (the message says why)."""


def browser_message(text: str) -> tuple[str, Any]:
    """A browser's websocket message as ``(kind, data)``, checked before anything reaches the
    viewer; BadMessage when it is not one the page sends.

    A ``resize`` must give whole numbers; they are brought into SIZE_RANGE, as the query's are
    checked against it: a browser window dragged narrower than 10 columns is no reason to close
    the tab, and a viewer asked for 100000 columns would take gigabytes drawing them.
    """
    try:
        envelope = json.loads(text)
    except (ValueError, RecursionError):
        raise BadMessage("a message that is not JSON") from None
    if not isinstance(envelope, list) or not envelope or not isinstance(envelope[0], str):
        raise BadMessage("a message that is not a [kind, data] list")
    kind, data = envelope[0], envelope[1] if len(envelope) > 1 else None
    if kind == "stdin":
        if not isinstance(data, str) or len(data) > STDIN_CHARS:
            raise BadMessage(f"stdin that is not text of at most {STDIN_CHARS} characters")
        return kind, data
    if kind == "resize":
        return kind, terminal_size(data)
    if kind == "ping":
        if not isinstance(data, str) or len(data) > PING_CHARS:
            raise BadMessage(f"a ping that is not text of at most {PING_CHARS} characters")
        return kind, data
    if kind in ("focus", "blur"):
        return kind, None
    raise BadMessage(f"a message of unknown kind {visible(kind, 40)}")


def terminal_size(data: Any) -> tuple[int, int]:
    """``{"width": W, "height": H}`` as whole numbers brought into SIZE_RANGE; BadMessage for
    anything else (text, fractions, booleans, 1e308)."""
    low, high = SIZE_RANGE
    if not isinstance(data, dict):
        raise BadMessage("a resize without width and height")
    size = []
    for key in ("width", "height"):
        value = data.get(key)
        if type(value) is not int:  # bool is an int too, and no size
            shown = visible(json.dumps(value), 40)
            raise BadMessage(f"a resize to {key}={shown}, which is not a whole number")
        size.append(min(max(value, low), high))
    return size[0], size[1]
