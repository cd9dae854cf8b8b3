"""The preset's ``[numerics]`` table, apart from ``core.numerics`` so that reading a preset
never loads numpy and ml_dtypes (the dashboard starts without them)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

DEFAULT_EVERY = 250  # at most 2 % of step time: benchmarks/numerics_cost.py, docs/numerics.md


class NumericsOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[numerics]``: measure every leaf module's outputs and gradients every ``every`` steps
    (0: never)."""

    every: Annotated[int, Meta(ge=0, le=10_000_000)] = DEFAULT_EVERY
