"""Per-layer numerics: which layer's values a format cannot hold, shared by engine, CLI and views.

The engine measures each leaf module's output (forward) and the gradient at that output
(backward) against fp16, bf16 and the two fp8 formats; this package holds the format limits
it measures against (taken from ``core.formats``, checked by real casts with ml_dtypes), the
summary of many sampled steps, and the sentences a lecturer can read out. No torch here.

Its modules:

    limits.py   the formats measured against and what each holds; a module's totals over steps
    groups.py   repeated blocks as one row, and which layers are measured past the cap
    event.py    the parts of the ``numerics`` event
    options.py  the preset's ``[numerics]`` table
    report.py   sampled steps summed per module, and the verdicts
    grid.py     the Numerics view's heatmap as numbers
    nonfinite.py  what to do about an inf or NaN, in the format the run computes in
"""

from __future__ import annotations

from ampscope.core.numerics.event import FirstNonfinite, FormatShare, ModuleNumerics, TensorNumerics
from ampscope.core.numerics.groups import (
    MODULE_CAP,
    choose_modules,
    group_label,
    group_names,
    pattern,
)
from ampscope.core.numerics.limits import (
    DTYPE_LABELS,
    DTYPE_LARGEST,
    FORMATS,
    FP8_KEYS,
    LIMITS,
    Limits,
    PassTotals,
    headroom_bits,
    overflows_in,
)

__all__ = [
    "DTYPE_LABELS",
    "DTYPE_LARGEST",
    "FORMATS",
    "FP8_KEYS",
    "FirstNonfinite",
    "FormatShare",
    "LIMITS",
    "Limits",
    "MODULE_CAP",
    "ModuleNumerics",
    "PassTotals",
    "TensorNumerics",
    "choose_modules",
    "group_label",
    "group_names",
    "headroom_bits",
    "overflows_in",
    "pattern",
]
