"""What a value becomes in each format: stored value, bits, rounding error, flags."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import MAX_EMAX, MIN_EMIN, Decimal, localcontext
from fractions import Fraction
from typing import Any

from ampscope.core.formats.catalog import (
    DEFAULT_KEYS,
    FORMATS,
    Format,
    bit_code,
    bit_fields,
    convert,
    get_format,
    round_half_even,
    shortest_repr,
)
from ampscope.core.formats.expression import evaluate, to_fp64

# ---------------------------------------------------------------------------------------------
# One value in every format


@dataclass
class Stored:
    """What one format does to one value."""

    format: str
    value: float  # the stored value (may be inf or nan)
    text: str  # the shortest decimal that reads back to it
    exact: str  # the stored value's exact decimal expansion
    code: int | None  # the encoding as an unsigned integer
    fields: tuple[str, ...]  # (sign, exponent, mantissa) bit strings
    abs_error: float | None  # stored - input, None when not finite
    rel_error: float | None  # |stored - input| / |input|
    overflow: bool = False  # became inf/NaN, or saturated, because |input| was past max
    saturated: bool = False  # clamped to the largest (or smallest) value
    underflow: bool = False  # a nonzero input stored as zero
    subnormal: bool = False  # stored as a subnormal: fewer significant bits than normal
    invalid: bool = False  # no encoding for this input (NaN into an integer, a negative e8m0)
    notes: list[str] = field(default_factory=list)

    @property
    def bits(self) -> str:
        return "|".join(self.fields) if self.fields else "-"

    @property
    def flags(self) -> list[str]:
        names = ("overflow", "saturated", "underflow", "subnormal", "invalid")
        return [n for n in names if getattr(self, n)]

    def to_dict(self) -> dict[str, Any]:
        finite = math.isfinite(self.value)
        return {
            "format": self.format,
            "stored": self.value if finite else None,
            "stored_str": self.text,
            "exact": self.exact,
            "bits": self.bits,
            "code": self.code,
            "abs_error": self.abs_error,
            "rel_error": self.rel_error,
            "flags": self.flags,
            "overflow": self.overflow,
            "saturated": self.saturated,
            "underflow": self.underflow,
            "subnormal": self.subnormal,
            "invalid": self.invalid,
            "notes": list(self.notes),
        }


@dataclass
class Description:
    """One input value and what every chosen format stores for it."""

    input: str
    exact: Fraction | float  # the value typed, exactly (a float only for inf, nan and -0)
    fp64: float  # what a program holds: the formats are cast from this
    rows: list[Stored]

    @property
    def exact_text(self) -> str:
        return _exact_text(self.exact)

    def row(self, key: str) -> Stored:
        return next(r for r in self.rows if r.format == key)

    def to_dict(self) -> dict[str, Any]:
        return {
            "input": self.input,
            "exact": self.exact_text,
            "fp64": self.fp64 if math.isfinite(self.fp64) else None,
            "fp64_str": shortest_repr(self.fp64, "fp64"),
            "formats": {r.format: r.to_dict() for r in self.rows},
        }


def _exact_text(x: Fraction | float) -> str:
    """A Fraction as an exact decimal when it terminates (and is short), else n/d."""
    if isinstance(x, float):
        return shortest_repr(x, "fp64")
    if x.denominator == 1:
        sign = "-" if x < 0 else ""
        # the digits through Decimal: str() of an integer past 4,300 digits raises ValueError
        digits = "".join(map(str, Decimal(abs(x.numerator)).as_tuple().digits))
        if len(digits) <= 60:
            return sign + digits
        return f"{sign}{digits[0]}.{digits[1:17]}e+{len(digits) - 1} (exact integer, {len(digits)} digits)"
    d, twos, fives = x.denominator, 0, 0
    while d % 2 == 0:
        d, twos = d // 2, twos + 1
    while d % 5 == 0:
        d, fives = d // 5, fives + 1
    places = max(twos, fives)
    if d != 1 or places > 60:
        if x.numerator.bit_length() + x.denominator.bit_length() <= 200 and len(str(x)) <= 60:
            return f"{x.numerator}/{x.denominator}"
        return f"about {_scientific(x)}"
    n = abs(x.numerator) * 10**places // x.denominator
    digits = str(n).rjust(places + 1, "0")
    return ("-" if x < 0 else "") + digits[:-places] + "." + digits[-places:]


def _scientific(x: Fraction) -> str:
    """17 significant digits of ``x``: fp64's when it holds x as a normal number, else worked
    out in decimal (fp64 would say 0 for 1e-5000, inf for a 400-digit quotient)."""
    near = to_fp64(x)
    if math.isfinite(near) and abs(near) >= sys.float_info.min:
        return f"{near:.17g}"
    with localcontext() as ctx:
        ctx.prec, ctx.Emax, ctx.Emin = 17, MAX_EMAX, MIN_EMIN
        return f"{Decimal(x.numerator) / Decimal(x.denominator):.16e}"


def exact_decimal(value: float) -> str:
    """The exact decimal expansion of a float (every binary float has one)."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    d = Decimal(value)
    return format(d, "f") if -30 < d.adjusted() < 30 else str(d)


def store(value: Fraction | float, fmt: str | Format, *, saturate_fp8: bool = False) -> Stored:
    """Cast an exact value (via its fp64, as a program would) into ``fmt`` and report it."""
    f = get_format(fmt)
    x = to_fp64(value)  # -0.0 keeps its sign here: a format's sign bit shows it
    if isinstance(value, float) and value == 0:
        value = Fraction(0)  # exactly zero, for the flags and the error
    saturate = saturate_fp8 and f.key == "fp8-e4m3fn"
    out = convert(x, f, saturate=saturate)
    row = Stored(
        format=f.key,
        value=out,
        text=shortest_repr(out, f),
        exact=exact_decimal(out),
        code=bit_code(out, f),
        fields=(),
        abs_error=None,
        rel_error=None,
    )
    row.fields = bit_fields(row.code, f)
    _flag(row, f, value, x, out, saturate)
    if isinstance(value, Fraction) and math.isfinite(out) and not row.invalid:
        err = Fraction(out) - value
        row.abs_error = _finite(to_fp64(err))
        row.rel_error = _finite(to_fp64(abs(err) / abs(value))) if value else 0.0
    return row


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _flag(row: Stored, f: Format, exact: Fraction | float, x: float, out: float, sat: bool) -> None:
    finite_in = isinstance(exact, Fraction)
    if math.isnan(x):
        if f.encoding == "int":
            row.invalid = True
            row.notes.append("NaN has no integer encoding (a plain cast is undefined)")
        elif f.encoding == "fn-nonan":
            row.invalid = True
            row.notes.append(
                f"{f.label} has no NaN: ml_dtypes stores {row.text} (converters differ)"
            )
        return
    if f.encoding == "int":
        r = round_half_even(x) if math.isfinite(x) else x
        if r > f.max or r < f.min:
            row.overflow = row.saturated = True
            row.notes.append(
                f"quantized: rounded half to even, then saturated to [{f.min:g}, {f.max:g}]"
            )
        elif finite_in and exact != 0 and out == 0:
            row.underflow = True
        return
    if f.encoding == "e8m0" and (x <= 0 or (finite_in and exact <= 0)):
        row.invalid = True
        row.notes.append("e8m0 has no sign and no zero: only positive powers of two")
        return
    # a finite value past fp64's range (10**400) reaches the format as fp64's inf: still past max
    if not math.isfinite(out) and (
        math.isfinite(x) or finite_in or (math.isinf(x) and math.isnan(out))
    ):
        row.overflow = True
        row.notes.append(f"past {f.label}'s largest finite value {f.max:.6g}: {f.overflow}")
    elif (
        sat
        and math.isfinite(out)
        and abs(out) == f.max
        and not math.isfinite(convert(x, f, saturate=False))
    ):
        row.overflow = row.saturated = True
        row.notes.append(f"saturated to +-{shortest_repr(f.max, f)} (as torch's cast does)")
    elif f.encoding == "fn-nonan" and abs(out) == f.max:
        half = f.max + math.ldexp(1.0, f.max_exponent - f.mantissa_bits - 1)
        if abs(x) >= half:  # the largest value's mantissa is odd: a tie rounds up, past max
            row.overflow = row.saturated = True
            row.notes.append(f"saturated to +-{shortest_repr(f.max, f)}: {f.label} has no inf")
    if finite_in and exact != 0 and out == 0:
        row.underflow = True
        row.notes.append(
            f"below half of {f.label}'s smallest subnormal {f.smallest_subnormal:.3g}: rounded to zero"
        )
    elif f.has_subnormals and math.isfinite(out) and 0 < abs(out) < f.smallest_normal:
        row.subnormal = True
        row.notes.append(
            f"subnormal: below the smallest normal {f.smallest_normal:.3g}, so fewer significant bits"
        )
    if f.encoding == "e8m0" and finite_in and 0 < exact < Fraction(f.smallest_normal) and out:
        row.saturated = True
        row.notes.append("e8m0 has no zero: rounded up to its smallest value 2^-127")


def describe(
    value: str | float | Fraction,
    formats: Iterable[str] | None = None,
    *,
    saturate_fp8: bool = False,
) -> Description:
    """Store one value (a number or an expression such as ``'1 + 2**-9'``) in each format."""
    if isinstance(value, str):
        text, exact = value.strip(), evaluate(value)
    elif isinstance(value, Fraction):
        text, exact = str(value), value
    else:
        v = float(value)
        text, exact = repr(v), (Fraction(v) if math.isfinite(v) else v)
    keys = list(formats) if formats is not None else list(DEFAULT_KEYS)
    for k in keys:
        get_format(k)
    rows = [store(exact, k, saturate_fp8=saturate_fp8) for k in keys]
    return Description(text, exact, to_fp64(exact), rows)


def facts_table(formats: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Every format's facts, one dict a format (the explorer's summary table)."""
    return [get_format(k).facts() for k in (formats or FORMATS)]
