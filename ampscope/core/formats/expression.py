"""Safe evaluation of a typed value such as `1 + 2**-9`, kept exact as a Fraction."""

from __future__ import annotations

import ast
import math
from fractions import Fraction

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
