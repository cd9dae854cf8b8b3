"""Safe evaluation of a typed value such as `1 + 2**-9`, kept exact as a Fraction."""

from __future__ import annotations

import ast
import math
import re
from fractions import Fraction

from ampscope.core.text import visible

# ---------------------------------------------------------------------------------------------
# Safe expressions


class ExpressionError(ValueError):
    """The input is not a number or an allowed arithmetic expression: the message says why."""


ALLOWED = "numbers, + - * / **, unary minus, parentheses, and the names inf and nan"
_MAX_BITS = 1 << 16  # beyond this an exact value is not worth the time: use fp64
_MAX_DIGITS = int(_MAX_BITS * math.log10(2))  # the decimal digits of _MAX_BITS: 19,728
MAX_CHARS = 1000
"""The longest value read: a number that size is written as a power (10**5000, 1e5000)."""
MAX_DEPTH = 100
"""Parentheses, signs and powers nested deeper than this are refused (Python's parser stops
at 200 parentheses, and deeper signs exhaust its stack); a long sum is no nesting."""
ECHO_CHARS = 60
"""Characters of a refused value said back in its message."""


def echo(text: str) -> str:
    """A value as a message says it back: control characters escaped (an ESC typed or pasted
    would drive the terminal), and a long one shortened."""
    return visible(text, ECHO_CHARS)


def evaluate(text: str) -> Fraction | float:
    """Evaluate ``text`` exactly: a Fraction, or a float for inf/nan, -0 (and fractional powers).

    Only numbers, + - * / **, unary minus/plus, parentheses and the names ``inf``/``nan`` are
    accepted; everything else raises :class:`ExpressionError` with a message naming the input.
    Decimal literals are read exactly (``0.1`` is one tenth, not fp64's nearest value). A zero
    keeps the sign IEEE arithmetic gives it (``-0``, ``0 * -1``), as a format's sign bit does.
    """
    source = text.strip()
    if len(source) > MAX_CHARS:
        raise ExpressionError(
            f"cannot read '{echo(source)}' as a number: it is too long ({len(source):,} "
            f"characters; up to {MAX_CHARS:,} are read). Write a large number as a power, for "
            "example 10**5000 or 1e5000."
        )
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        if "nested parentheses" in str(exc):
            raise _too_deep(source) from None
        raise ExpressionError(
            f"cannot read '{echo(text)}' as a number: it is not valid arithmetic. Accepted: "
            f"{ALLOWED} (for example 65504*2 or 1 + 2**-9)."
        ) from None
    except (RecursionError, MemoryError):  # signs nested past the parser's stack
        raise _too_deep(source) from None
    try:
        return _eval(tree.body, source)
    except ZeroDivisionError:
        raise ExpressionError(f"cannot evaluate '{echo(text)}': division by zero.") from None
    except OverflowError:
        raise ExpressionError(
            f"cannot evaluate '{echo(text)}': the result is too large or too small even for an "
            f"exact number (one of up to about {_MAX_DIGITS:,} digits, such as 10**5000 or "
            "1e-5000)."
        ) from None


def _too_deep(source: str) -> ExpressionError:
    return ExpressionError(
        f"cannot read '{echo(source)}' as a number: it nests too deep (parentheses, signs or "
        f"powers more than {MAX_DEPTH} levels inside each other)."
    )


def _eval(node: ast.AST, source: str, depth: int = 0) -> Fraction | float:
    if depth > MAX_DEPTH:
        raise _too_deep(source)
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _refuse(node, source, "only numbers are allowed")
        if isinstance(value, int):
            return Fraction(value)
        literal = (ast.get_source_segment(source, node) or "").replace("_", "")
        try:
            exact = _read_decimal(literal)
        except (ValueError, ZeroDivisionError):
            exact = Fraction(value) if math.isfinite(value) else value  # type: ignore[assignment]
        if isinstance(exact, Fraction) and _too_big(exact):
            raise OverflowError  # fp64's inf or 0 would be shown as the exact value
        return exact
    if isinstance(node, ast.Name):
        if node.id in ("inf", "nan"):
            return float(node.id)
        raise _refuse(node, source, f"names such as '{echo(node.id)}' are not allowed")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _eval(node.operand, source, depth + 1)
        if isinstance(node.op, ast.UAdd):
            return operand
        return -0.0 if operand == 0 and not _negative(operand) else -operand
    if isinstance(node, ast.BinOp) and isinstance(
        node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)
    ):
        # a sum or product of many terms is a chain down its left side, not nesting
        left_depth = depth + isinstance(node.op, ast.Pow)
        a, b = _eval(node.left, source, left_depth), _eval(node.right, source, depth + 1)
        if isinstance(node.op, ast.Pow):
            return _power(a, b)
        result = _arithmetic(node.op, a, b)
        if isinstance(result, Fraction) and _too_big(result):
            # every step stays within the exact limit: a product of 110 numbers of 19,000
            # digits took minutes to multiply and then to write out
            raise OverflowError
        return _signed_zero(result, node.op, a, b)
    what = f"'{type(node).__name__}' is not allowed"
    if isinstance(node, ast.BinOp):
        what = f"the operator {type(node.op).__name__} is not allowed"
    elif isinstance(node, ast.UnaryOp):
        what = f"the unary operator {type(node.op).__name__} is not allowed"
    elif isinstance(node, ast.Call):
        what = "function calls are not allowed"
    raise _refuse(node, source, what)


def _arithmetic(op: ast.operator, a: Fraction | float, b: Fraction | float) -> Fraction | float:
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
    if isinstance(op, ast.Add):
        return a + b
    if isinstance(op, ast.Sub):
        return a - b
    if isinstance(op, ast.Mult):
        return a * b
    if b == 0:
        raise ZeroDivisionError
    return a / b


def _negative(x: Fraction | float) -> bool:
    """Below zero, or IEEE's -0.0 (a Fraction has no negative zero: -0 is kept as -0.0)."""
    return x < 0 or (isinstance(x, float) and x == 0 and math.copysign(1.0, x) < 0)


def _signed_zero(
    result: Fraction | float, op: ast.operator, a: Fraction | float, b: Fraction | float
) -> Fraction | float:
    """A zero result with the sign IEEE arithmetic gives it: a product or quotient of unlike
    signs is -0 (``0 * -1``), and so is a sum of two negative zeros (``-0 + -0``, ``-0 - 0``);
    every other exact zero is +0."""
    if result != 0:  # NaN included
        return result
    if isinstance(op, (ast.Mult, ast.Div)):
        negative = _negative(a) != _negative(b)
    else:
        negative = _negative(a) and (_negative(b) if isinstance(op, ast.Add) else not _negative(b))
        negative = negative and a == 0 and b == 0
    return -0.0 if negative else Fraction(0)


def _power(a: Fraction | float, b: Fraction | float) -> Fraction | float:
    if (
        isinstance(a, Fraction)
        and isinstance(b, Fraction)
        and b.denominator == 1
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
    if result == 0 and a != 0 and isinstance(a, Fraction) and isinstance(b, Fraction):
        raise OverflowError  # too small to keep exactly: fp64's 0 is not its exact value
    return Fraction(result) if math.isfinite(result) else result


def _read_decimal(literal: str) -> Fraction:
    """A decimal literal's exact value. Raises OverflowError for one with far more digits than
    kept (1e999999999), which Fraction would build as a billion-digit integer first; a zero
    (0e999999999) is zero whatever its exponent."""
    found = re.fullmatch(r"([0-9.]*)[eE]([+-]?[0-9]+)", literal)
    if found and not found.group(1).strip(".0"):
        return Fraction(0)
    if found and abs(int(found.group(2))) > _MAX_DIGITS + MAX_CHARS:
        raise OverflowError
    return Fraction(literal)


def _too_big(x: Fraction) -> bool:
    return max(x.numerator.bit_length(), x.denominator.bit_length()) > _MAX_BITS


def _refuse(node: ast.AST, source: str, why: str) -> ExpressionError:
    part = ast.get_source_segment(source, node) or source
    return ExpressionError(
        f"cannot read '{echo(source)}' as a number: {why} (at '{echo(part)}'). Accepted: "
        f"{ALLOWED}, for example 1 + 2**-9 or 65504*2."
    )


def to_fp64(exact: Fraction | float) -> float:
    """The fp64 nearest to an exact value (correctly rounded; +-inf past fp64's range)."""
    if isinstance(exact, float):
        return exact
    try:
        return float(exact)
    except OverflowError:
        return math.inf if exact > 0 else -math.inf
