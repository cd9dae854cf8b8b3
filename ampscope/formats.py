"""Number formats used in training, and exactly what each one does to a value.

Every conversion here is a real cast: numpy for fp64, fp32, fp16 and the integer formats,
ml_dtypes for bf16, the fp8s, fp4 and e8m0 (the same library JAX uses; it rounds from fp64
in one step, to nearest, ties to even). The one format modelled by hand is TF32, which is
not a storage type at all (see :func:`to_tf32`).

Integer formats are shown *quantized*: round half to even, then saturate to [min, max], with
an overflow flag. That is what a quantizer does; a plain C or numpy cast of an out-of-range
value wraps or is undefined, which is never what you want to teach.

This module imports numpy and ml_dtypes but never torch or textual: the dashboard shows it too.
"""

from __future__ import annotations

import ast
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any, Literal

import ml_dtypes
import numpy as np

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
            "fp16 with the mantissa cut to 2 bits: used for gradients",
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
        raise KeyError(f"unknown format '{key}'. Known formats: {', '.join(FORMATS)}.") from None


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


def _round_half_even(x: float) -> int:
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
        return float(min(max(_round_half_even(x), int(f.min)), int(f.max)))
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


# ---------------------------------------------------------------------------------------------
# Safe expressions


class ExpressionError(ValueError):
    """The input is not a number or an allowed arithmetic expression: the message says why."""


ALLOWED = "numbers, + - * / **, unary minus, parentheses, and the names inf and nan"
_MAX_BITS = 1 << 16  # beyond this an exact value is not worth the time: use fp64


def evaluate(text: str) -> Fraction | float:
    """Evaluate ``text`` exactly: a Fraction, or a float for inf/nan (and fractional powers).

    Only numbers, + - * / **, unary minus/plus, parentheses and the names ``inf``/``nan`` are
    accepted; everything else raises :class:`ExpressionError` with a message naming the input.
    Decimal literals are read exactly (``0.1`` is one tenth, not fp64's nearest value).
    """
    source = text.strip()
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError:
        raise ExpressionError(
            f"cannot read '{text}' as a number: it is not valid arithmetic. Accepted: {ALLOWED} "
            "(for example 65504*2 or 1 + 2**-9)."
        ) from None
    try:
        return _eval(tree.body, source)
    except ZeroDivisionError:
        raise ExpressionError(f"cannot evaluate '{text}': division by zero.") from None
    except OverflowError:
        raise ExpressionError(
            f"cannot evaluate '{text}': the result is too large even for an exact number."
        ) from None


def _eval(node: ast.AST, source: str) -> Fraction | float:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _refuse(node, source, "only numbers are allowed")
        if isinstance(value, int):
            return Fraction(value)
        literal = (ast.get_source_segment(source, node) or "").replace("_", "")
        try:
            exact = Fraction(literal)
        except (ValueError, ZeroDivisionError):
            exact = Fraction(value) if math.isfinite(value) else value  # type: ignore[assignment]
        if isinstance(exact, Fraction) and _too_big(exact):
            return value if math.isinf(value) else Fraction(value)
        return exact
    if isinstance(node, ast.Name):
        if node.id in ("inf", "nan"):
            return float(node.id)
        raise _refuse(node, source, f"names such as '{node.id}' are not allowed")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _eval(node.operand, source)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and isinstance(
        node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)
    ):
        a, b = _eval(node.left, source), _eval(node.right, source)
        if isinstance(node.op, ast.Pow):
            return _power(a, b)
        if isinstance(a, float) or isinstance(b, float):
            a, b = float(a), float(b)
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        if b == 0:
            raise ZeroDivisionError
        return a / b
    what = f"'{type(node).__name__}' is not allowed"
    if isinstance(node, ast.BinOp):
        what = f"the operator {type(node.op).__name__} is not allowed"
    elif isinstance(node, ast.UnaryOp):
        what = f"the unary operator {type(node.op).__name__} is not allowed"
    elif isinstance(node, ast.Call):
        what = "function calls are not allowed"
    raise _refuse(node, source, what)


def _power(a: Fraction | float, b: Fraction | float) -> Fraction | float:
    if (
        isinstance(a, Fraction)
        and isinstance(b, Fraction)
        and b.denominator == 1
        and abs(b) <= 4096
        and max(a.numerator.bit_length(), a.denominator.bit_length()) * abs(b) <= _MAX_BITS
    ):
        if a == 0 and b < 0:
            raise ZeroDivisionError
        return a**b.numerator
    try:
        result = float(a) ** float(b)
    except ZeroDivisionError:
        raise
    if isinstance(result, complex):
        raise ExpressionError(
            f"cannot evaluate {float(a):g} ** {float(b):g}: a negative number to a fractional "
            "power is not a real number."
        )
    return Fraction(result) if math.isfinite(result) else result


def _too_big(x: Fraction) -> bool:
    return max(x.numerator.bit_length(), x.denominator.bit_length()) > _MAX_BITS


def _refuse(node: ast.AST, source: str, why: str) -> ExpressionError:
    part = ast.get_source_segment(source, node) or source
    return ExpressionError(
        f"cannot read '{source}' as a number: {why} (at '{part}'). Accepted: {ALLOWED}, "
        "for example 1 + 2**-9 or 65504*2."
    )


def to_fp64(exact: Fraction | float) -> float:
    """The fp64 nearest to an exact value (correctly rounded; +-inf past fp64's range)."""
    if isinstance(exact, float):
        return exact
    try:
        return float(exact)
    except OverflowError:
        return math.inf if exact > 0 else -math.inf


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
    exact: Fraction | float  # the value typed, exactly (a float only for inf/nan)
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
        text = str(x.numerator)
        sign = "-" if text.startswith("-") else ""
        digits = text.lstrip("-")
        if len(digits) <= 60:
            return text
        return f"{sign}{digits[0]}.{digits[1:17]}e+{len(digits) - 1} (exact integer, {len(digits)} digits)"
    d, twos, fives = x.denominator, 0, 0
    while d % 2 == 0:
        d, twos = d // 2, twos + 1
    while d % 5 == 0:
        d, fives = d // 5, fives + 1
    places = max(twos, fives)
    if d != 1 or places > 60:
        return f"{x.numerator}/{x.denominator}" if len(str(x)) <= 60 else f"about {to_fp64(x):.17g}"
    n = abs(x.numerator) * 10**places // x.denominator
    digits = str(n).rjust(places + 1, "0")
    return ("-" if x < 0 else "") + digits[:-places] + "." + digits[-places:]


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
    x = to_fp64(value)
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
        r = _round_half_even(x) if math.isfinite(x) else x
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
    if not math.isfinite(out) and (math.isfinite(x) or (math.isinf(x) and math.isnan(out))):
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


# ---------------------------------------------------------------------------------------------
# Demonstrations a lecturer can read aloud


@dataclass
class DemoResult:
    name: str
    title: str
    lines: list[str]
    data: dict[str, Any]


def _fmt(x: float, key: str = "fp64") -> str:
    return shortest_repr(x, key)


def demo_fp16_overflow() -> DemoResult:
    inputs = [65504.0, 65519.0, 65520.0, 65536.0, 100000.0]
    fp16 = {v: convert(v, "fp16") for v in inputs}
    bf16 = {v: convert(v, "bf16") for v in inputs}
    lines = [
        "fp16 has 5 exponent bits: its largest finite value is (2 - 2^-10) * 2^15 = 65504.",
        "Between 32768 and 65536, fp16 values are 32 apart, so 65504 is followed by 65536 - "
        "which fp16 cannot hold.",
    ]
    for v in inputs:
        lines.append(
            f"  {v:>8g} -> fp16 {_fmt(fp16[v], 'fp16'):>6}    bf16 {_fmt(bf16[v], 'bf16')}"
        )
    lines += [
        "65519 still rounds down to 65504. 65520 sits exactly halfway to 65536; ties go to the",
        "even neighbour, 65536, which is past the top: it becomes inf. So does anything larger.",
        "bf16 keeps fp32's 8 exponent bits: it stores these easily, only less precisely.",
        "In training this is an activation or a loss that grows too big: one inf, then NaN everywhere.",
    ]
    data = {
        "max": FORMATS["fp16"].max,
        "fp16": {repr(k): v for k, v in fp16.items()},
        "bf16": {repr(k): v for k, v in bf16.items()},
        "first_inf": 65520.0,
    }
    return DemoResult("fp16-overflow", "fp16 overflows at 65520", lines, data)


def demo_fp16_underflow() -> DemoResult:
    grads = [1e-8, 1e-7, 1e-6]
    keys = ("fp32", "bf16", "fp16")
    table = {g: {k: convert(g, k) for k in keys} for g in grads}
    f16 = FORMATS["fp16"]
    lines = [
        f"fp16's smallest subnormal is 2^-24 = {f16.smallest_subnormal:.3g}; "
        f"its smallest normal is 2^-14 = {f16.smallest_normal:.3g}.",
        "A gradient of 1e-8 is below half of the smallest subnormal, so fp16 stores 0:",
        "the update it carried is lost, silently.",
    ]
    for g in grads:
        row = table[g]
        rel16 = abs(row["fp16"] - g) / g
        lines.append(
            f"  grad {g:g}:  fp32 {row['fp32']:.4g}   bf16 {row['bf16']:.4g}   "
            f"fp16 {row['fp16']:.4g}  (fp16 error {rel16:.0%})"
        )
    lines += [
        "bf16 has fp32's exponent range (down to about 9e-41) and keeps all three, 3 digits deep.",
        "1e-7 survives in fp16 only as a subnormal, 19% off. This is why fp16 training needs",
        "a loss scale (see --demo loss-scale) and bf16 training does not.",
    ]
    data = {
        "grad": 1e-8,
        "fp16": table[1e-8]["fp16"],
        "bf16": table[1e-8]["bf16"],
        "fp32": table[1e-8]["fp32"],
        "table": {repr(g): row for g, row in table.items()},
    }
    return DemoResult(
        "fp16-underflow", "A 1e-8 gradient vanishes in fp16, not in bf16", lines, data
    )


def demo_bf16_precision() -> DemoResult:
    a = convert(1 + 2**-8, "bf16")
    b = convert(1 + 2**-7, "bf16")
    c = convert(1 + 2**-8, "fp16")
    w = convert(convert(1.0, "bf16") + convert(1e-3, "bf16"), "bf16")
    lines = [
        "bf16 keeps 7 mantissa bits: next to 1.0 the values are 2^-7 = 0.0078125 apart.",
        f"  1 + 2**-8 in bf16 = {_fmt(a, 'bf16')}   (exactly halfway; ties go to the even neighbour, 1)",
        f"  1 + 2**-7 in bf16 = {_fmt(b, 'bf16')}",
        f"  1 + 2**-8 in fp16 = {_fmt(c, 'fp16')}   (fp16 has 10 mantissa bits)",
        f"  a weight of 1.0 plus an update of 0.001, in bf16: {_fmt(w, 'bf16')}",
        "Small updates to large weights vanish. That is why pure-bf16 training keeps",
        "fp32 master weights (AMP) or uses stochastic rounding / Kahan summation.",
    ]
    data = {"1+2**-8": a, "1+2**-7": b, "fp16 1+2**-8": c, "1+0.001": w, "eps": FORMATS["bf16"].eps}
    return DemoResult("bf16-precision", "1 + 2**-8 == 1 in bf16", lines, data)


SUM_FORMATS = ("fp64", "fp32", "fp16", "bf16", "fp8-e4m3fn", "fp8-e5m2")


def demo_sum_tenth(count: int = 10_000) -> DemoResult:
    """Add 0.1 ``count`` times in each float format, rounding after every add (numpy scalars)."""
    exact = count / 10
    results: dict[str, float] = {}
    keys = [k for k in SUM_FORMATS if k in FORMATS]
    if "fp4-e2m1" in FORMATS:
        keys.append("fp4-e2m1")
    for key in keys:
        dt = FORMATS[key].dtype
        step = dt(0.1)
        total = dt(0)
        for _ in range(count):
            total = total + step  # numpy rounds each sum back to the format
        results[key] = float(total)
    errors = {k: abs(v - exact) for k, v in results.items()}
    order = sorted(results, key=lambda k: errors[k])
    lines = [
        f"Adding 0.1 to a running total {count} times; the exact answer is {exact:g}.",
        "Each format rounds after every add, as a sequential loop (or a naive reduction) does.",
    ]
    for key in keys:
        step_val = convert(0.1, key)
        lines.append(
            f"  {FORMATS[key].label:<11} total {results[key]:<20.10g} error {errors[key]:<12.4g}"
            f" (0.1 is stored as {_fmt(step_val, key)})"
        )
    lines += [
        "Once the total is big enough that 0.1 is less than half the gap between neighbours,",
        "adding it changes nothing: fp16 stops at 256, bf16 at 32. This is why accumulators",
        "(matmul sums, loss sums, optimizer state) are kept in fp32.",
    ]
    data = {"exact": exact, "count": count, "results": results, "errors": errors, "order": order}
    return DemoResult("sum-0.1", f"Summing 0.1 {count} times", lines, data)


def demo_loss_scale(scale: float = 2.0**16) -> DemoResult:
    grads = [1e-8, 1e-7, 1e-6, 1e-4]
    rows = []
    for g in grads:
        plain = convert(g, "fp16")
        scaled = convert(g * scale, "fp16")
        back = convert(scaled / scale, "fp32")  # unscale_ works on fp32 master gradients
        rows.append(
            {
                "grad": g,
                "fp16": plain,
                "scaled_fp16": scaled,
                "unscaled_fp32": back,
                "rel_error_plain": abs(plain - g) / g,
                "rel_error_scaled": abs(back - g) / g,
            }
        )
    big = convert(2.0 * scale, "fp16")
    lines = [
        f"Multiply the loss by S = 2^{int(math.log2(scale))} = {scale:g}: every gradient is S times larger,",
        "so it lands in fp16's normal range. Divide by S again in fp32 before the optimizer step.",
        "  gradient     fp16 as is      fp16 of grad*S    unscaled in fp32",
    ]
    for r in rows:
        lines.append(
            f"  {r['grad']:<10g}   {r['fp16']:<13.4g}   {r['scaled_fp16']:<15.4g}   "
            f"{r['unscaled_fp32']:.4g}  (error {r['rel_error_plain']:.0%} -> {r['rel_error_scaled']:.2%})"
        )
    lines += [
        f"The price: a gradient of 2 scaled by S is {2 * scale:g}, past 65504: fp16 makes it {big:g}.",
        "GradScaler then skips that step and halves S; after 2000 good steps it doubles S again.",
    ]
    data = {"scale": scale, "rows": rows, "overflow_example": {"grad": 2.0, "scaled_fp16": big}}
    return DemoResult("loss-scale", "Loss scaling rescues small fp16 gradients", lines, data)


DEMOS: dict[str, tuple[str, Callable[[], DemoResult]]] = {
    "fp16-overflow": ("65504 is fp16's max; 65520 rounds to inf", demo_fp16_overflow),
    "fp16-underflow": ("a 1e-8 gradient vanishes in fp16 but not in bf16", demo_fp16_underflow),
    "bf16-precision": ("1 + 2**-8 == 1 in bf16; small updates vanish", demo_bf16_precision),
    "sum-0.1": ("add 0.1 ten thousand times in each float format", demo_sum_tenth),
    "loss-scale": ("a 2**16 loss scale brings 1e-8 back into fp16's range", demo_loss_scale),
}


def run_demo(name: str) -> DemoResult:
    try:
        return DEMOS[name][1]()
    except KeyError:
        raise KeyError(f"unknown demo '{name}'. Demos: {', '.join(DEMOS)}.") from None


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


__all__: Sequence[str] = (
    "DEMOS",
    "FORMATS",
    "DemoResult",
    "Description",
    "ExpressionError",
    "Format",
    "Stored",
    "convert",
    "crosscheck",
    "describe",
    "evaluate",
    "facts_table",
    "run_demo",
    "store",
    "to_tf32",
)
