"""``ampscope dtypes`` at its edges: negative zero's sign bit, nothing raw echoed to the
terminal, and a reason of its own for each input it cannot read."""

from __future__ import annotations

import math

import pytest
import torch

from ampscope.core import formats
from tests.helpers import cli

pytestmark = pytest.mark.unit


NEGATIVE_ZEROS = {  # typed, and the same in Python's IEEE floats
    "-0.0": -0.0,
    "-0": -(0.0),
    "0 * -1": 0.0 * -1.0,
    "-(0)": -(0.0),
    "0 / -5": 0.0 / -5.0,
    "-0 + -0": -0.0 + -0.0,
    "-0 - 0": -0.0 - 0.0,
    "-1e-400": -1e-400,
}


@pytest.mark.parametrize("text", NEGATIVE_ZEROS)
def test_negative_zero_is_stored_with_its_sign_bit_as_torch_stores_it(text: str) -> None:
    """'dtypes -- -0.0' showed +0, sign bit 0, in every format."""
    value = torch.tensor(NEGATIVE_ZEROS[text], dtype=torch.float64)
    assert math.copysign(1.0, value.item()) < 0  # each of these is -0 by IEEE's rules
    described = formats.describe(text)
    for key, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        row = described.row(key)
        sign = int(value.to(dtype).view(torch.int16 if dtype != torch.float32 else torch.int32))
        assert row.fields[0] == ("1" if sign < 0 else "0") == "1", (text, key)
        assert row.text == "-0"
    assert described.row("fp8-e4m3fn").fields[0] == "1"
    assert described.row("int8").fields == ("00000000",)  # an integer has no negative zero


NEG_ZERO = -0.0
POSITIVE_ZEROS = {
    "0 - 0": 0.0 - 0.0,
    "--0": -NEG_ZERO,
    "-0 * -1": NEG_ZERO * -1.0,
    "-0 + 0": NEG_ZERO + 0.0,
}


@pytest.mark.parametrize("text", [*POSITIVE_ZEROS, "1 - 1"])
def test_a_zero_ieee_calls_positive_stays_positive(text: str) -> None:
    assert math.copysign(1.0, POSITIVE_ZEROS.get(text, 0.0)) > 0
    assert formats.describe(text).row("fp32").fields[0] == "0"


def test_the_command_line_shows_negative_zeros_bits(capsys) -> None:
    said = cli(capsys, "dtypes", "--formats", "fp32", "--", "-0.0")
    assert said.returncode == 0
    assert "1|00000000|00000000000000000000000" in said.stdout
    assert "exact value: -0" in said.stdout


ESC = "\x1b]0;owned\x07\x1b[31m"  # a terminal title and a colour


@pytest.mark.parametrize(
    "argv",
    [
        ["dtypes", f"1{ESC}"],  # an unreadable number
        ["dtypes", "--demo", f"x{ESC}"],
        ["dtypes", "--formats", f"fp32,x{ESC}", "1"],
    ],
    ids=["value", "demo", "formats"],
)
def test_dtypes_never_echoes_a_raw_escape(capsys, argv: list[str]) -> None:
    said = cli(capsys, *argv)
    assert said.returncode == 2
    assert "\x1b" not in said.stderr + said.stdout and "\x07" not in said.stderr
    assert "\\x1b]0;owned\\x07" in said.stderr  # said back, escaped


def test_a_long_input_is_shortened_in_the_echo(capsys) -> None:
    said = cli(capsys, "dtypes", "--demo", "z" * 100_000)
    assert said.returncode == 2
    assert len(said.stderr) < 1000 and "(99,940 more characters)" in said.stderr


def test_a_long_number_and_a_deep_one_each_get_their_own_reason() -> None:
    """Both said 'not valid arithmetic'."""
    with pytest.raises(formats.ExpressionError, match=r"too long \(5,000 characters; up to 1,000"):
        formats.evaluate("1" * 5000)
    for deep in ("(" * 300 + "1" + ")" * 300, "-" * 999 + "1", "2**" * 200 + "1"):
        with pytest.raises(formats.ExpressionError, match="it nests too deep"):
            formats.evaluate(deep)
    with pytest.raises(formats.ExpressionError, match="not valid arithmetic"):
        formats.evaluate("1 +")
    assert formats.evaluate("+".join(["1"] * 400)) == 400  # a long sum is no nesting
    assert formats.evaluate("(" * 150 + "1" + ")" * 150) == 1
    assert formats.evaluate("10**300") == 10**300  # what the long-number reason suggests


def test_inputs_that_crashed_the_parser_are_refused_with_exit_2(capsys) -> None:
    """100,000 minus signs raised MemoryError, 3,000 a RecursionError: tracebacks."""
    for text in ("-" * 100_000 + "1", "-" * 3000 + "1", "1+" * 20_000 + "1"):
        said = cli(capsys, "dtypes", "--", text)
        assert said.returncode == 2 and "Traceback" not in said.stderr
        assert said.stderr.startswith("ampscope: cannot read '")


@pytest.mark.parametrize("name", list(formats.DEMOS))
def test_every_row_of_a_demo_fits_a_lecture_terminal_of_80_columns(name: str) -> None:
    """The sum-0.1 and loss-scale rows wrapped at 80 columns ('(0.1 is stored as' / '0.1)'):
    a row of figures is never broken."""
    rows = [line for line in formats.run_demo(name).lines if line.startswith(" ")]
    assert all(len(line) <= 80 for line in rows), [ln for ln in rows if len(ln) > 80]


def test_numbers_of_thousands_of_digits_are_shown_exactly_without_a_traceback(capsys) -> None:
    """Before: 1e5000 and 1e-5000 (the powers the too-long message suggests) ended in a
    ValueError traceback: str() of an integer past 4,300 digits; 10**5000 was refused."""
    for typed, exact in (
        ("1e5000", "exact value: 1.0000000000000000e+5000 (exact integer, 5001 digits)"),
        ("10**5000", "exact value: 1.0000000000000000e+5000 (exact integer, 5001 digits)"),
        ("-1e5000", "exact value: -1.0000000000000000e+5000 (exact integer, 5001 digits)"),
        ("1e-5000", "exact value: about 1.0000000000000000e-5000"),
        ("3**-4000", "exact value: about 3.2732646578712559e-1909"),
    ):
        said = cli(capsys, "dtypes", "--formats", "fp64,fp16", "--", typed)
        assert said.returncode == 0, said.stderr
        assert exact in said.stdout


def test_a_value_past_the_exact_limit_is_refused_never_shown_as_fp64s_inf_or_zero() -> None:
    """Before: 1e99999 said 'exact value: inf', 1e-99999 and 10**-5000 'exact value: 0' with no
    underflow, and 1e999999999 built a billion-digit integer for minutes, as a product of 110
    numbers of 19,000 digits each did."""
    product = "*".join(["1e19000"] * 110)  # each factor within the limit, the product not
    for typed in (
        "1e99999",
        "1e-99999",
        "(1/2)**100000",
        "1e999999999",
        "1e-999999999",
        product,
        "1e19000*1e19000",
    ):
        with pytest.raises(formats.ExpressionError, match="too large or too small even for an"):
            formats.evaluate(typed)
    assert formats.evaluate("0e999999999") == 0
    assert formats.evaluate("10**-5000") == formats.evaluate("1e-5000") != 0
    row = formats.describe("10**-5000", ["fp64"]).row("fp64")
    assert row.underflow and row.rel_error == 1.0


def test_a_finite_value_past_fp64s_range_is_flagged_overflow_in_every_format() -> None:
    """Before: 10**400 reached each format as fp64's inf and no row said overflow."""
    d = formats.describe("10**400", ["fp64", "fp32", "bf16"])
    assert all(r.overflow and math.isinf(r.value) for r in d.rows)
    assert "past fp64's largest finite value" in " ".join(d.row("fp64").notes)
    assert not formats.describe("inf", ["fp64"]).row("fp64").overflow  # inf is stored as itself
