"""A profile of the step: its split into classes, the line that says what would help most,
the difference between two profiles, and the request a viewer leaves for a running engine.

Torch-free: ``ampscope profile``, the Run view's profile screen and Compare read the same
``ProfileEvent`` with these functions. The engine turns torch.profiler's events into
``OpTime`` rows and calls ``summarize``.

Its modules:

    split.py    the step's split into classes, its rows and headline, two profiles' difference
    request.py  the request a viewer leaves for a running engine to profile its next steps
    rules.py    which class of work an op or a kernel is, and the words shown for it
    advice.py   the line that says what would help, for this run on this device
    compare.py  two runs' profiles side by side
"""

from __future__ import annotations

from ampscope.core.profiles.advice import RunFacts, advice, load_note
from ampscope.core.profiles.request import (
    DEFAULT_STEPS,
    MAX_STEPS,
    REQUEST_FILE,
    REQUEST_MAX_BYTES,
    BadRequest,
    ask_to_profile,
    take_request,
)
from ampscope.core.profiles.rules import label
from ampscope.core.profiles.split import (
    CASTS_ROW,
    TOP_OPS,
    ClassChange,
    casts_share,
    change_text,
    diff,
    headline,
    narrow_formats,
    profiles_in,
    render,
    shown_classes,
    sound,
    split_rows,
    summarize,
    to_json,
)

__all__ = [
    "BadRequest",
    "CASTS_ROW",
    "ClassChange",
    "DEFAULT_STEPS",
    "MAX_STEPS",
    "REQUEST_FILE",
    "REQUEST_MAX_BYTES",
    "RunFacts",
    "TOP_OPS",
    "advice",
    "ask_to_profile",
    "casts_share",
    "change_text",
    "diff",
    "headline",
    "label",
    "load_note",
    "narrow_formats",
    "profiles_in",
    "sound",
    "render",
    "shown_classes",
    "split_rows",
    "summarize",
    "take_request",
    "to_json",
]
