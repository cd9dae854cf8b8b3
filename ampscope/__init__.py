"""ampscope: watch how a number format and torch.compile mode change a training run.

The package is layered, bottom to top:

- ``ampscope.core``: presets, events, records and analyses; imports neither torch nor textual;
- ``ampscope.engine`` (trains, torch) and ``ampscope.tui`` (draws, textual), side by side;
- ``ampscope.watch``: records a training loop ampscope did not start, like an engine run;
- ``ampscope.cli`` and ``ampscope.integrations`` (Lightning, Hugging Face): the front-ends.

Importing ``ampscope`` loads none of torch and textual. ``ampscope.Workload`` (what a model
factory for ``--model`` returns) and ``ampscope.ModelContext`` (what it is given) are plain
dataclasses, loaded on first use, so a model file can name them without depending on torch.
``ampscope.watch`` is loaded on first use too, and torch only when ``ampscope.watch(...)`` is
called.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {"Workload": "ampscope.core.workload_spec", "ModelContext": "ampscope.core.workload_spec"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "watch":  # the package, callable: ampscope.watch(model, optimizer, ...)
        return importlib.import_module("ampscope.watch")
    raise AttributeError(f"module 'ampscope' has no attribute {name!r}")
