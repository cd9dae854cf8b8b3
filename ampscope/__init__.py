"""ampscope: watch how a number format and torch.compile mode change a training run.

The package is layered, bottom to top:

- ``ampscope.core``: presets, events, records and analyses; imports neither torch nor textual;
- ``ampscope.engine`` (trains, torch) and ``ampscope.tui`` (draws, textual), side by side;
- ``ampscope.watching``: records a training loop ampscope did not start, like an engine run;
- ``ampscope.cli`` and ``ampscope.integrations`` (Lightning, Hugging Face): the front-ends.

What a user's code names is here: ``ampscope.Workload`` (what a model factory for
``--model`` returns) and ``ampscope.ModelContext`` (what it is given), plain dataclasses; and
``ampscope.watch(model, optimizer, ...)`` with its ``Monitor``, ``count_flops`` and
``WatchWarning``. Importing ``ampscope`` loads none of them (nor torch, nor textual): each is
loaded on first use, and torch only when ``ampscope.watch(...)`` is called.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and editors see; at run time, loaded on first use
    from ampscope.core.workload import ModelContext, Workload
    from ampscope.watching import Monitor, WatchWarning, count_flops, watch

__version__ = "0.1.0"
__all__ = ["ModelContext", "Monitor", "WatchWarning", "Workload", "count_flops", "watch"]

_LAZY = {
    "Workload": "ampscope.core.workload",
    "ModelContext": "ampscope.core.workload",
    "watch": "ampscope.watching",
    "count_flops": "ampscope.watching",
    "Monitor": "ampscope.watching",
    "WatchWarning": "ampscope.watching",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ampscope' has no attribute {name!r}")
