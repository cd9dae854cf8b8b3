"""The formats: bit layouts, ranges, and casts (numpy and ml_dtypes; TF32 by hand)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import ml_dtypes
import numpy as np

from ampscope.core.presets.suggest import did_you_mean
from ampscope.core.text import visible

Encoding = Literal["ieee", "fn", "fn-nonan", "e8m0", "int"]


@dataclass(frozen=True)
class Format:
    """A number format's layout and the facts that follow from it."""

    key: str
    label: str
    bits: int
    sign_bits: int
    exponent_bits: int
    mantissa_bits: int
    bias: int | None
    encoding: Encoding
    dtype: Any  # the numpy / ml_dtypes scalar type; None for tf32
    overflow: str  # what happens past the largest finite value
    note: str = ""

    @property
    def is_float(self) -> bool:
        return self.encoding != "int"

    @property
    def has_inf(self) -> bool:
        return self.encoding == "ieee"

    @property
    def has_nan(self) -> bool:
        return self.encoding in ("ieee", "fn", "e8m0")

    @property
    def has_subnormals(self) -> bool:
        return self.is_float and self.encoding != "e8m0"

    @property
    def saturates(self) -> bool:
        """Formats that cannot encode overflow at all clamp to their largest value."""
        return self.encoding in ("fn-nonan", "int")

    # -- numerical facts, from the layout (cross-checked against finfo by crosscheck()) --

    @property
    def max_exponent(self) -> int:
        assert self.bias is not None
        top = 2**self.exponent_bits - 1
        if self.encoding == "ieee" or self.encoding == "e8m0":
            top -= 1  # all-ones exponent: inf/NaN (ieee) or NaN (e8m0)
        return top - self.bias

    @property
    def max(self) -> float:
        if self.encoding == "int":
            return float(2 ** (self.bits - self.sign_bits) - 1)
        m = self.mantissa_bits
        # fn: the all-ones exponent holds normal numbers except mantissa all ones (NaN).
        significand = 2 - 2.0 ** (1 - m) if self.encoding == "fn" else 2 - 2.0**-m
        return math.ldexp(significand, self.max_exponent)

    @property
    def min(self) -> float:
        if self.encoding == "int":
            return float(-(2 ** (self.bits - 1))) if self.sign_bits else 0.0
        return -self.max if self.sign_bits else self.smallest_normal

    @property
    def smallest_normal(self) -> float:
        if self.encoding == "int":
            return 1.0
        assert self.bias is not None
        first = 0 if self.encoding == "e8m0" else 1  # e8m0 has no subnormals, no zero
        return math.ldexp(1.0, first - self.bias)

    @property
    def smallest_subnormal(self) -> float:
        if not self.has_subnormals:
            return self.smallest_normal
        return math.ldexp(self.smallest_normal, -self.mantissa_bits)

    @property
    def eps(self) -> float:
        """Gap between 1 and the next value; 1 for integers."""
        return 1.0 if self.encoding == "int" else math.ldexp(1.0, -self.mantissa_bits)

    @property
    def decimal_digits(self) -> float:
        """About how many decimal digits the stored fraction bits carry (mantissa bits x log10 2)."""
        if self.encoding == "int":
            return math.log10(self.max)
        return self.mantissa_bits * math.log10(2)

    @property
    def range_decades(self) -> float:
        """log10(largest finite / smallest positive) (smallest subnormal for floats, 1 for ints)."""
        return math.log10(self.max) - math.log10(self.smallest_subnormal)

    def facts(self) -> dict[str, Any]:
        """Every fact as plain data (for JSON and for a dashboard table)."""
        return {
            "key": self.key,
            "label": self.label,
            "kind": "float" if self.is_float else "int",
            "bits": self.bits,
            "sign_bits": self.sign_bits,
            "exponent_bits": self.exponent_bits,
            "mantissa_bits": self.mantissa_bits,
            "exponent_bias": self.bias,
            "max": self.max,
            "min": self.min,
            "smallest_normal": self.smallest_normal if self.is_float else None,
            "smallest_subnormal": self.smallest_subnormal if self.has_subnormals else None,
            "eps": self.eps,
            "decimal_digits": round(self.decimal_digits, 2),
            "range_decades": round(self.range_decades, 2),
            "has_inf": self.has_inf,
            "has_nan": self.has_nan,
            "has_subnormals": self.has_subnormals,
            "overflow": self.overflow,
            "note": self.note,
        }


_F = Format
FORMATS: dict[str, Format] = {
    f.key: f
    for f in (
        _F("fp64", "fp64", 64, 1, 11, 52, 1023, "ieee", np.float64, "becomes inf"),
        _F("fp32", "fp32", 32, 1, 8, 23, 127, "ieee", np.float32, "becomes inf"),
        _F(
            "tf32",
            "tf32",
            19,
            1,
            8,
            10,
            127,
            "ieee",
            None,
            "becomes inf",
            "not a storage type: fp32 inputs rounded to 10 mantissa bits by Tensor Cores",
        ),
        _F("bf16", "bf16", 16, 1, 8, 7, 127, "ieee", ml_dtypes.bfloat16, "becomes inf"),
        _F("fp16", "fp16", 16, 1, 5, 10, 15, "ieee", np.float16, "becomes inf"),
        _F(
            "fp8-e4m3fn",
            "fp8 e4m3fn",
            8,
            1,
            4,
            3,
            7,
            "fn",
            ml_dtypes.float8_e4m3fn,
            "no inf: becomes NaN (torch's cast and FP8 recipes saturate to +-448 instead)",
            "'fn' = finite: the top exponent holds numbers; only S.1111.111 is NaN",
        ),
        _F(
            "fp8-e5m2",
            "fp8 e5m2",
            8,
            1,
            5,
            2,
            15,
            "ieee",
            ml_dtypes.float8_e5m2,
            "becomes inf",
            "fp16 with the mantissa cut to 2 bits: gradients in fp8 tensorwise training (rowwise: e4m3)",
        ),
        _F("int8", "int8", 8, 1, 0, 7, None, "int", np.int8, "saturates to -128 / 127 (flagged)"),
        _F("uint8", "uint8", 8, 0, 0, 8, None, "int", np.uint8, "saturates to 0 / 255 (flagged)"),
        _F(
            "int4", "int4", 4, 1, 0, 3, None, "int", ml_dtypes.int4, "saturates to -8 / 7 (flagged)"
        ),
    )
}
if hasattr(ml_dtypes, "float4_e2m1fn"):
    FORMATS["fp4-e2m1"] = _F(
        "fp4-e2m1",
        "fp4 e2m1",
        4,
        1,
        2,
        1,
        1,
        "fn-nonan",
        ml_dtypes.float4_e2m1fn,
        "no inf, no NaN: saturates to +-6",
        "MXFP4/NVFP4 element type: 16 values, +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}",
    )
if hasattr(ml_dtypes, "float8_e8m0fnu"):
    FORMATS["e8m0"] = _F(
        "e8m0",
        "e8m0 scale",
        8,
        0,
        8,
        0,
        127,
        "e8m0",
        ml_dtypes.float8_e8m0fnu,
        "becomes NaN",
        "powers of two only: no sign, no zero, no mantissa; 0xFF is NaN",
    )

FLOAT_KEYS = tuple(k for k, f in FORMATS.items() if f.is_float)
# The formats values are usually stored in (the explorer's default columns).
DEFAULT_KEYS = tuple(FORMATS)


def get_format(key: str | Format) -> Format:
    if isinstance(key, Format):
        return key
    try:
        return FORMATS[key]
    except KeyError:
        hint = did_you_mean(key, FORMATS)
        raise KeyError(
            f"unknown format '{visible(key, 60)}'.{hint} Known formats: {', '.join(FORMATS)}."
        ) from None


def crosscheck() -> list[str]:
    """Compare the layout-derived facts with numpy's / ml_dtypes' finfo and iinfo.

    Returns the mismatches (empty when everything agrees). TF32 has no finfo: it is checked
    against fp32 for the fields they share.
    """
    problems: list[str] = []
    for f in FORMATS.values():
        if f.key == "tf32":
            ref = FORMATS["fp32"]
            pairs = [
                ("smallest_normal", f.smallest_normal, ref.smallest_normal),
                ("bias", f.bias, ref.bias),
                ("max", f.max, to_tf32(f.max)),
                ("max+ulp/2 -> inf", to_tf32(f.max + math.ldexp(1.0, 127 - 11)), math.inf),
            ]
        elif f.is_float:
            fi = ml_dtypes.finfo(f.dtype)
            pairs = [
                ("max", f.max, float(fi.max)),
                ("smallest_normal", f.smallest_normal, float(fi.smallest_normal)),
                ("smallest_subnormal", f.smallest_subnormal, float(fi.smallest_subnormal)),
                ("eps", f.eps, float(fi.eps)),
                ("mantissa_bits", f.mantissa_bits, int(fi.nmant)),
                ("exponent_bits", f.exponent_bits, int(fi.nexp)),
                ("bits", f.bits, int(fi.bits)),
            ]
        else:
            ii = ml_dtypes.iinfo(f.dtype)
            pairs = [("max", f.max, float(ii.max)), ("min", f.min, float(ii.min))]
        for name, mine, ref_value in pairs:
            if mine != ref_value:
                problems.append(f"{f.key}.{name}: layout says {mine}, finfo says {ref_value}")
    return problems


# ---------------------------------------------------------------------------------------------
# Conversions


def to_tf32(x: float) -> float:
    """Round to TF32: what Tensor Cores do to fp32 matmul inputs when TF32 is on.

    TF32 keeps fp32's 8 exponent bits (same range, same subnormals) and 10 of its 23
    mantissa bits. The value is first an fp32 (that is what the tensor holds), then its low
    13 mantissa bits are rounded away, to nearest with ties to even; a carry may step into
    the exponent, and past fp32's largest TF32 value the result becomes inf. NaN and inf pass
    through. Hardware paths differ in this last detail (PTX ``cvt.rna.tf32.f32`` rounds ties
    away from zero, some kernels simply truncate): round-to-nearest-even is the model here.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        f32 = np.float32(x)
    if not np.isfinite(f32):
        return float(f32)
    bits = int(np.array(f32).view(np.uint32))
    drop = 13
    lsb = (bits >> drop) & 1
    bits = (bits + (1 << (drop - 1)) - 1 + lsb) & ~((1 << drop) - 1) & 0xFFFFFFFF
    return float(np.array(bits, dtype=np.uint32).view(np.float32))


def round_half_even(x: float) -> int:
    return round(Fraction(x))  # Fraction rounds exactly, ties to even


def convert(x: float, fmt: str | Format, *, saturate: bool = False) -> float:
    """The value a format stores for the fp64 number ``x``, as a Python float.

    ``saturate``: clamp overflow to +-max instead of inf/NaN (what torch's fp8 e4m3fn cast and
    FP8 training recipes do). Formats without inf or NaN (integers, fp4) always saturate.
    """
    f = get_format(fmt)
    x = float(x)
    if f.encoding == "int":
        if math.isnan(x):
            return math.nan
        if math.isinf(x):
            return f.max if x > 0 else f.min
        return float(min(max(round_half_even(x), int(f.min)), int(f.max)))
    if f.key == "fp64":
        return x
    if f.key == "tf32":
        out = to_tf32(x)
    else:
        with np.errstate(over="ignore", invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out = float(np.array(x, dtype=np.float64).astype(f.dtype).astype(np.float64))
    if saturate and not math.isnan(x) and not math.isfinite(out) and f.sign_bits:
        return math.copysign(f.max, x)
    return out


def bit_code(stored: float, fmt: str | Format) -> int | None:
    """The stored value's encoding as an unsigned integer of ``fmt.bits`` bits."""
    f = get_format(fmt)
    if f.encoding == "int":
        if math.isnan(stored):
            return None
        return int(stored) & ((1 << f.bits) - 1)
    if f.key == "tf32":
        return int(np.array(np.float32(stored)).view(np.uint32)) >> 13
    view = {64: np.uint64, 32: np.uint32, 16: np.uint16}.get(f.bits, np.uint8)
    with np.errstate(over="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        code = int(np.array(stored, dtype=np.float64).astype(f.dtype).view(view))
    return code & ((1 << f.bits) - 1)


def bit_fields(code: int | None, fmt: str | Format) -> tuple[str, ...]:
    """The encoding split into (sign, exponent, mantissa) bit strings; integers: one field."""
    f = get_format(fmt)
    if code is None:
        return ()
    text = format(code, f"0{f.bits}b")
    if f.encoding == "int":
        return (text,)
    s, e = f.sign_bits, f.exponent_bits
    parts = (text[:s], text[s : s + e], text[s + e :])
    return tuple(p for p in parts if p)


def shortest_repr(stored: float, fmt: str | Format) -> str:
    """The stored value for display: exact when short, else the format's digits plus one.

    At least 3 significant digits, so that coarse formats show their rounding (bf16 stores 1e-8
    as 1.001e-08, not as "1e-08").
    """
    f = get_format(fmt)
    if math.isnan(stored):
        return "nan"
    if math.isinf(stored):
        return "inf" if stored > 0 else "-inf"
    if stored == 0:
        return "-0" if math.copysign(1.0, stored) < 0 else "0"
    if f.encoding == "int" or (stored == int(stored) and abs(stored) < 1e16):
        return str(int(stored))
    if f.key == "fp64":
        return repr(stored)
    digits = max(3, math.ceil(f.decimal_digits) + 1)
    for short in range(1, digits):
        text = f"{stored:.{short}g}"
        if float(text) == stored:  # an exact short decimal, such as 0.5 or 1.75
            return text
    return f"{stored:.{digits}g}"


def keys_from(text: str | None) -> list[str]:
    """Parse a comma-separated format list ('fp16,bf16'); raises KeyError naming a bad one."""
    if not text:
        return list(DEFAULT_KEYS)
    aliases = {"e4m3": "fp8-e4m3fn", "e4m3fn": "fp8-e4m3fn", "e5m2": "fp8-e5m2", "fp4": "fp4-e2m1"}
    keys = []
    for part in text.split(","):
        k = part.strip().lower().replace("_", "-").replace(" ", "-")
        k = aliases.get(k, k)
        get_format(k)
        keys.append(k)
    return keys
