"""How a served viewer leaves once ``ampscope serve`` is gone: asked to quit, and ended
outright if the quit takes too long. Shared by the viewer's parent watch (cli/serve/viewer.py) and
its driver's end of input (cli/serve/viewer_driver.py)."""

from __future__ import annotations

import os
import signal
import threading
import time

EXIT_GRACE_S = 3.0
"""How long the app has to quit once its parent is gone, before the process just ends."""


def leave_soon() -> None:
    """Quit: SIGTERM to this process (the app's driver turns it into a quit; before the app
    runs it ends the process), and ``os._exit`` should the quit take over EXIT_GRACE_S (its
    last frames may block on a pipe nobody reads any more)."""

    def last_resort() -> None:
        time.sleep(EXIT_GRACE_S)
        os._exit(0)

    threading.Thread(target=last_resort, name="ampscope-leave", daemon=True).start()
    os.kill(os.getpid(), signal.SIGTERM)
