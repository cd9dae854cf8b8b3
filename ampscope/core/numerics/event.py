"""The parts of the ``numerics`` event (docs/events.md), apart from ``core.numerics`` so that
reading events imports msgspec alone: the format limits there need numpy and ml_dtypes,
about 0.7 s that the dashboard and every record reader would pay at start."""

from __future__ import annotations

import math

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
    name: str  # as model.named_modules() names it ("" for the model itself)
    kind: str  # the module's class name
    # Its place among the run's modules in model.named_modules() order, the same at every step:
    # a module first run at a later step (an expert given no token before) goes where it
    # stands in the model, not last. Null in older records (read in the order they came).
    order: int | None = None
    activation: TensorNumerics | None = None
    gradient: TensorNumerics | None = None  # scaled by the loss scale under a GradScaler
    # The gradient of each of the module's own trainable parameters, by its name in the module
    # (weight, bias): a module that owns parameters but is not a measured leaf (the model
    # itself, a non-leaf) has these alone. Absent, read as none, in older records.
    parameters: dict[str, TensorNumerics] = msgspec.field(default_factory=dict)


def in_model(order: int | None) -> float:
    """A module's sort key in the model's order; a module of an older record, which has no
    place, keeps the order it came in (sorts are stable)."""
    return math.inf if order is None else order


# What held a step's first inf/NaN (``FirstNonfinite.source``).
OUTPUT = "output"  # the module's output (forward) or the gradient at it (backward)
PARAMETER = "parameter"  # the gradient of the module's parameter ``parameter``
OWN = "own"  # a value the module's own forward computed outside its submodules
INPUTS = "inputs"  # the model's inputs (the batch): no module computed it


class FirstNonfinite(msgspec.Struct, kw_only=True):
    step: int
    module: str  # "" for the model itself
    pass_: str = msgspec.field(name="pass")  # "forward" or "backward"
    source: str = OUTPUT  # one of OUTPUT, PARAMETER, OWN, INPUTS; older records: output
    parameter: str | None = None  # PARAMETER: its name in the module (weight, bias)
    received_by: str | None = None  # OWN, INPUTS: the layer that received it first
    dtype: str | None = None  # the format the tensor holding it was in (torch's name)

    def place(self) -> str:
        """Where it appeared, in words: "head's outputs", "out.bias's gradient", "the model's
        own forward (its code outside any layer, before head)"."""
        if self.source == PARAMETER:
            return f"{'.'.join(n for n in (self.module, self.parameter) if n)}'s gradient"
        if self.source == OWN:
            own = f"{self.module}'s" if self.module else "the model's"
            return f"{own} own forward (its code outside any layer, before {self.received_by})"
        if self.source == INPUTS:
            return f"the model's inputs (the batch itself, before {self.received_by})"
        return f"{self.module}'s {'outputs' if self.pass_ == 'forward' else 'gradients'}"
