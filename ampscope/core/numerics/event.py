"""The parts of the ``numerics`` event (docs/events.md), apart from ``core.numerics`` so that
reading events imports msgspec alone: the format limits there need numpy and ml_dtypes,
about 0.7 s that the dashboard and every record reader would pay at start."""

from __future__ import annotations

import msgspec


class FormatShare(msgspec.Struct, kw_only=True):
    """Shares (0-1) of a tensor's values that a format would lose."""

    # values beyond the format's largest finite value: finite ones, and the inf/NaN of a
    # tensor computed in a format no wider (older records: finite ones only)
    overflow: float
    underflow: float  # non-zero values that round to zero
    scaled_underflow: float | None = None  # fp8 only: after scaling the tensor by its amax


class TensorNumerics(msgspec.Struct, kw_only=True):
    """One module's output or output gradient in one step (all tensors of a tuple or dict,
    and every call of the module in the step, together)."""

    numel: int
    amax: float | None  # the largest finite magnitude; null when none is finite
    min_nonzero: float | None  # the smallest non-zero finite magnitude
    nonfinite: int  # inf and NaN values
    formats: dict[str, FormatShare]
    # The format the tensor was computed in (torch's name: float16, float32; the widest of a
    # module's several tensors); null in older records. Its inf and NaN values count as the
    # overflow of every format that holds no larger a value (``core.numerics.overflows_in``).
    dtype: str | None = None


class ModuleNumerics(msgspec.Struct, kw_only=True):
    name: str  # as model.named_modules() names it
    kind: str  # the module's class name
    activation: TensorNumerics | None = None
    gradient: TensorNumerics | None = None  # scaled by the loss scale under a GradScaler


class FirstNonfinite(msgspec.Struct, kw_only=True):
    step: int
    module: str
    pass_: str = msgspec.field(name="pass")  # "forward" or "backward"
