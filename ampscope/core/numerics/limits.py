"""The formats a layer's values are measured against and what each can hold (``LIMITS``), and
``PassTotals``: one module's output or gradient summed over many sampled steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ampscope.core.numerics.event import TensorNumerics

# The formats a layer is measured against: short key -> core.formats key.
FORMATS = {"fp16": "fp16", "bf16": "bf16", "e4m3": "fp8-e4m3fn", "e5m2": "fp8-e5m2"}
FP8_KEYS = ("e4m3", "e5m2")  # also measured after per-tensor amax scaling


@dataclass(frozen=True)
class Limits:
    """Where a format stops holding a magnitude ``a``, as fp32 boundaries ``b`` read "a >= b".

    ``overflow_at``: the smallest magnitude that rounds beyond the largest finite value
    (fp16: 65520, since 65504 + half a step rounds to even, upward). ``zero_below``: the
    smallest magnitude that does *not* round to zero (half the smallest subnormal rounds to
    zero under round-to-nearest-even, anything above it rounds up)."""

    key: str
    largest: float
    smallest: float  # the smallest subnormal
    overflow_at: float
    zero_below: float


# Written out, so that reading a record never loads numpy and ml_dtypes (the dashboard starts
# without them); tests/test_numerics.py derives each from real casts and compares.
LIMITS = {
    "fp16": Limits("fp16", 65504.0, 2.0**-24, 65520.0, 2.980232594040899e-08),
    "bf16": Limits(
        "bf16", 3.3895313892515355e38, 2.0**-133, 3.39617752923046e38, 4.591914937745993e-41
    ),
    "e4m3": Limits("e4m3", 448.0, 2.0**-9, 464.0000305175781, 0.0009765626164153218),
    "e5m2": Limits("e5m2", 57344.0, 2.0**-16, 61440.0, 7.629395440744702e-06),
}


# The largest finite value of each floating format a measured tensor may be computed in, by
# torch's name for it (tests/test_numerics.py checks them against torch.finfo).
DTYPE_LARGEST = {
    "float64": 1.7976931348623157e308,
    "float32": 3.4028234663852886e38,
    "bfloat16": 3.3895313892515355e38,
    "float16": 65504.0,
    "float8_e5m2": 57344.0,
    "float8_e4m3fn": 448.0,
}
DTYPE_LABELS = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def overflows_in(dtype: str | None, key: str) -> bool:
    """Whether an inf or NaN computed in ``dtype`` is an overflow of format ``key``: it is when
    ``key`` holds no larger a value (an fp16 tensor's inf is beyond fp16 and both fp8 formats,
    an fp32 tensor's beyond every one). Whether bf16 would hold an fp16 tensor's inf is not
    known: the value was lost where it was computed."""
    largest = DTYPE_LARGEST.get(dtype or "")
    return largest is not None and LIMITS[key].largest <= largest


def headroom_bits(amax: float | None, key: str) -> float | None:
    """log2(largest finite / amax): negative when the values are beyond the format."""
    if amax is None or amax <= 0:
        return None
    return math.log2(LIMITS[key].largest / amax)


@dataclass
class PassTotals:
    """One module's output (or gradient) over many sampled steps."""

    numel: int = 0
    amax: float | None = None
    min_nonzero: float | None = None
    nonfinite: int = 0
    lost: dict[str, list[float]] = field(default_factory=dict)  # key -> [over, under, scaled]
    steps: int = 0
    overflow_steps: dict[str, int] = field(default_factory=dict)  # steps with any overflow
    # key -> inf/NaN values not counted as key's overflow: computed in a narrower format, or
    # (an older record) in a format not recorded
    hidden: dict[str, int] = field(default_factory=dict)
    dtype: str | None = None  # the widest format its tensors were computed in

    def add(self, t: TensorNumerics) -> None:
        self.steps += 1
        self.numel += t.numel
        self.nonfinite += t.nonfinite
        if t.dtype is not None and DTYPE_LARGEST.get(t.dtype, 0.0) >= DTYPE_LARGEST.get(
            self.dtype or "", 0.0
        ):
            self.dtype = t.dtype
        for key in FORMATS:
            if t.nonfinite and not overflows_in(t.dtype, key):
                self.hidden[key] = self.hidden.get(key, 0) + t.nonfinite
        if t.amax is not None:
            self.amax = t.amax if self.amax is None else max(self.amax, t.amax)
        if t.min_nonzero is not None:
            low = self.min_nonzero
            self.min_nonzero = t.min_nonzero if low is None else min(low, t.min_nonzero)
        for key, share in t.formats.items():
            lost = self.lost.setdefault(key, [0.0, 0.0, 0.0])
            lost[0] += share.overflow * t.numel
            lost[1] += share.underflow * t.numel
            lost[2] += (share.scaled_underflow or 0.0) * t.numel
            self.overflow_steps[key] = self.overflow_steps.get(key, 0) + (share.overflow > 0)

    def share(self, key: str, which: int) -> float:
        return self.lost.get(key, [0.0, 0.0, 0.0])[which] / self.numel if self.numel else 0.0

    def to_json(self) -> dict[str, object]:
        formats: dict[str, object] = {}
        for key in FORMATS:
            entry: dict[str, float] = {
                "overflow": self.share(key, 0),
                "underflow": self.share(key, 1),
            }
            if key in FP8_KEYS:
                entry["scaled_underflow"] = self.share(key, 2)
            formats[key] = entry
        return {
            "amax": self.amax,
            "min_nonzero": self.min_nonzero,
            "nonfinite": self.nonfinite,
            "dtype": self.dtype,
            "formats": formats,
        }
