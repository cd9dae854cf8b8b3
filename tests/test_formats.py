"""The dtype explorer: facts, exact conversions, demonstrations and the ``dtypes`` command.

Two references are used. An *oracle* that enumerates every finite value of a small format and
picks the nearest one exactly (Fractions, ties to the even encoding) checks that conversions
from fp64 round once, correctly. torch checks that the explorer agrees with real casts.

torch 2.13 (CPU) differs from a correctly rounded cast in two documented ways, tested here:
- fp64 -> bf16 / fp16 / fp8 goes through fp32 first (double rounding): torch turns
  1 + 2**-8 + 2**-40 into 1.0 in bf16, where the nearest bf16 is 1 + 2**-7. For inputs that
  are exact in fp32, torch and the explorer agree exactly.
- fp8 e4m3fn overflow saturates to +-448 in torch (even inf), where ml_dtypes (and the OCP
  spec's non-saturating conversion) give NaN. The explorer shows NaN by default and matches
  torch with ``saturate=True`` (``ampscope dtypes --saturate``).
"""

from __future__ import annotations

import bisect
import json
import math
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ampscope.cli.main import main
from ampscope.core import formats
from tests.helpers import ROOT, engine_env

TORCH_FLOATS = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8-e4m3fn": torch.float8_e4m3fn,
    "fp8-e5m2": torch.float8_e5m2,
}
SMALL = ("bf16", "fp16", "fp8-e4m3fn", "fp8-e5m2", "fp4-e2m1")
SETTINGS = settings(max_examples=300, deadline=None)


def torch_cast(x: float, key: str) -> float:
    return torch.tensor(x, dtype=torch.float64).to(TORCH_FLOATS[key]).item()


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


# -- facts ------------------------------------------------------------------------------------


@pytest.mark.unit
def test_layout_facts_match_finfo():
    assert formats.crosscheck() == []


@pytest.mark.unit
@pytest.mark.parametrize("key", list(TORCH_FLOATS))
def test_facts_match_torch_finfo(key):
    f, ti = formats.FORMATS[key], torch.finfo(TORCH_FLOATS[key])
    assert f.max == ti.max
    assert f.smallest_normal == ti.tiny == ti.smallest_normal
    assert f.eps == ti.eps
    assert f.smallest_subnormal == ti.tiny * ti.eps  # 2^(1 - bias - mantissa bits)
    assert f.bits == ti.bits


@pytest.mark.unit
@pytest.mark.parametrize("key,dtype", [("int8", torch.int8), ("uint8", torch.uint8)])
def test_integer_facts_match_torch_iinfo(key, dtype):
    f, ii = formats.FORMATS[key], torch.iinfo(dtype)
    assert (f.min, f.max, f.bits) == (ii.min, ii.max, ii.bits)


@pytest.mark.unit
def test_known_values():
    F = formats.FORMATS
    assert F["fp16"].max == 65504 and F["bf16"].eps == 2**-7
    assert F["fp8-e4m3fn"].max == 448 and F["fp8-e5m2"].max == 57344
    assert F["tf32"].max == (2 - 2**-10) * 2.0**127 and F["tf32"].smallest_subnormal == 2.0**-136
    assert round(F["fp32"].decimal_digits, 2) == 6.92
    assert round(F["fp16"].range_decades, 1) == 12.0
    assert F["fp4-e2m1"].max == 6 and F["fp4-e2m1"].smallest_subnormal == 0.5
    assert F["e8m0"].max == 2.0**127 and F["e8m0"].smallest_normal == 2.0**-127
    assert not F["fp8-e4m3fn"].has_inf and F["fp8-e5m2"].has_inf


# -- exact rounding: an enumerating oracle ----------------------------------------------------


def _all_finite(key: str) -> tuple[list[float], dict[float, int]]:
    f = formats.FORMATS[key]
    codes = np.arange(2**f.bits, dtype=np.uint16 if f.bits == 16 else np.uint8)
    with np.errstate(invalid="ignore"):
        values = codes.view(f.dtype).astype(np.float64)  # 4-bit formats: one code per byte
    table: dict[float, int] = {}
    for code, v in zip(codes.tolist(), values.tolist(), strict=True):
        if math.isfinite(v) and not (v == 0 and math.copysign(1, v) < 0):
            table.setdefault(v, code)
    return sorted(table), table


ORACLE = {k: _all_finite(k) for k in SMALL}


def oracle(x: float, key: str) -> float:
    """The nearest finite value, ties to the even encoding; only for |x| <= max."""
    values, codes = ORACLE[key]
    i = bisect.bisect_left(values, x)
    if values[i] == x:
        return x
    lo, hi = values[i - 1], values[i]
    dlo, dhi = Fraction(x) - Fraction(lo), Fraction(hi) - Fraction(x)
    if dlo != dhi:
        return lo if dlo < dhi else hi
    return lo if codes[lo] % 2 == 0 else hi


@pytest.mark.unit
@pytest.mark.parametrize("key", SMALL)
@SETTINGS
@given(st.floats(allow_nan=False, allow_infinity=False))
@example(1 + 2**-8 + 2**-40)
@example(1 + 2**-4 + 2**-30)
@example(2049.0)
@example(5e-324)
def test_rounding_matches_exact_oracle(key, x):
    f = formats.FORMATS[key]
    if abs(x) > f.max:
        x = math.fmod(x, f.max)  # exact, and keeps the low bits random
    got = formats.convert(x, key)
    want = oracle(x, key)
    assert got == want, (key, x, got, want)


# -- agreement with torch ---------------------------------------------------------------------

EDGES = [
    0.0,
    -0.0,
    5e-324,
    -5e-324,
    2.0**-149,
    2.0**-133,
    2.0**-24,
    2.0**-25,
    2.0**-25 * 1.0001,
    1e-8,
    1.0,
    1 + 2**-8,  # bf16 tie: stays 1
    1 + 3 * 2**-8,  # bf16 tie: goes up to the even 1 + 2**-6
    2049.0,  # fp16 tie: 2048
    2051.0,  # fp16 tie: 2052
    448.0,
    464.0,
    465.0,
    57344.0,
    61440.0,
    65504.0,
    65519.0,
    65520.0,
    3.3895313892515355e38,
    3.4028234663852886e38,
    1e39,
    math.inf,
    -math.inf,
    math.nan,
]


@pytest.mark.unit
@pytest.mark.parametrize("key", list(TORCH_FLOATS))
@pytest.mark.parametrize("x", EDGES + [-v for v in EDGES[6:-3]])
def test_edges_agree_with_torch(key, x):
    saturate = key == "fp8-e4m3fn"  # torch saturates e4m3fn overflow (see the module docstring)
    x32 = float(np.float32(x)) if abs(x) < 3.5e38 or not math.isfinite(x) else x
    assert same(formats.convert(x32, key, saturate=saturate), torch_cast(x32, key))


@pytest.mark.unit
@pytest.mark.parametrize("key", list(TORCH_FLOATS))
@SETTINGS
@given(st.floats(width=32))
def test_fp32_inputs_agree_with_torch(key, x):
    """For values an fp32 tensor can hold, the explorer and torch agree bit for bit."""
    saturate = key == "fp8-e4m3fn"
    assert same(formats.convert(x, key, saturate=saturate), torch_cast(x, key))


@pytest.mark.unit
@pytest.mark.parametrize("key", ["bf16", "fp16", "fp8-e4m3fn", "fp8-e5m2"])
@SETTINGS
@given(st.floats())
@example(1 + 2**-8 + 2**-40)
def test_torch_casts_fp64_through_fp32(key, x):
    """torch's fp64 -> 16/8-bit cast equals the explorer's cast of the fp32-rounded value."""
    saturate = key == "fp8-e4m3fn"
    with np.errstate(over="ignore"):
        x32 = float(np.float32(x))
    assert same(torch_cast(x, key), formats.convert(x32, key, saturate=saturate))


@pytest.mark.unit
def test_double_rounding_difference_is_real():
    x = 1 + 2**-8 + 2**-40
    assert formats.convert(x, "bf16") == 1 + 2**-7  # correctly rounded: above the tie
    assert torch_cast(x, "bf16") in (1.0, 1 + 2**-7)  # 1.0 in torch 2.13 (via fp32)


@pytest.mark.unit
def test_e4m3fn_overflow_nan_by_default_saturate_on_request():
    assert math.isnan(formats.convert(500.0, "fp8-e4m3fn"))
    assert formats.convert(464.0, "fp8-e4m3fn") == 448  # the tie goes to the even code, 448
    assert formats.convert(500.0, "fp8-e4m3fn", saturate=True) == 448
    assert formats.convert(-math.inf, "fp8-e4m3fn", saturate=True) == -448
    assert math.isinf(formats.convert(61440.0, "fp8-e5m2"))


# -- tf32 -------------------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    "x,want",
    [
        (1 + 2**-11, 1.0),  # exact tie, 1.0 is even
        (1 + 3 * 2**-11, 1 + 2**-9),  # tie, rounds up to the even neighbour
        (1 + 2**-11 + 2**-20, 1 + 2**-10),  # above the tie
        (1 + 2**-12, 1.0),  # below the tie
        (1 / 3, 0.333251953125),  # 0x3EAAA000
        ((2 - 2**-10) * 2.0**127, (2 - 2**-10) * 2.0**127),  # tf32's largest value
        (3.4028234663852886e38, math.inf),  # fp32's max rounds past tf32's
        (2.0**-137, 0.0),  # half the smallest tf32 subnormal: tie to 0
        (2.0**-137 + 2.0**-149, 2.0**-136),
        (-(1 + 3 * 2**-11), -(1 + 2**-9)),
    ],
)
def test_tf32_rounding_hand_cases(x, want):
    assert formats.to_tf32(x) == want


@pytest.mark.unit
def test_tf32_passes_nan_and_inf():
    assert math.isnan(formats.to_tf32(math.nan)) and formats.to_tf32(-math.inf) == -math.inf


# -- describe: flags, bits, errors ------------------------------------------------------------


@pytest.mark.unit
def test_describe_flags_and_bits():
    d = formats.describe("65504*2", ["fp16", "bf16", "int8", "fp4-e2m1"])
    assert d.row("fp16").overflow and math.isinf(d.row("fp16").value)
    assert d.row("fp16").bits == "0|11111|0000000000"
    assert not d.row("bf16").overflow
    assert d.row("int8").value == 127 and d.row("int8").saturated
    assert d.row("fp4-e2m1").value == 6 and d.row("fp4-e2m1").saturated
    small = formats.describe("1e-8", ["fp16", "bf16"])
    assert small.row("fp16").underflow and small.row("fp16").value == 0
    assert small.row("bf16").rel_error == pytest.approx(1.17e-3, rel=0.01)
    sub = formats.describe("1e-7", ["fp16"])
    assert sub.row("fp16").subnormal
    assert formats.describe("65504", ["fp16"]).row("fp16").bits == "0|11110|1111111111"


@pytest.mark.unit
def test_integer_quantization_rounds_half_even():
    assert formats.convert(2.5, "int8") == 2 and formats.convert(3.5, "int8") == 4
    assert formats.convert(-128.5, "int8") == -128 and formats.convert(127.5, "int8") == 127
    d = formats.describe("127.5", ["int8"])
    assert d.row("int8").overflow  # rounds to 128, saturates to 127
    assert formats.convert(-3.0, "uint8") == 0 and formats.convert(9.0, "int4") == 7


@pytest.mark.unit
def test_exact_decimal_and_errors():
    d = formats.describe("0.1", ["fp64", "fp32"])
    assert d.exact_text == "0.1"
    assert d.row("fp64").exact.startswith("0.1000000000000000055511151231257827")
    assert d.row("fp32").abs_error == pytest.approx(1.4901161193847656e-09)


@pytest.mark.unit
def test_expressions():
    assert formats.evaluate("1 + 2**-9") == 1 + Fraction(1, 512)
    assert formats.evaluate("65504*2") == 131008
    assert formats.evaluate("-(3)") == -3
    assert formats.evaluate("0.1") == Fraction(1, 10)
    assert math.isinf(formats.evaluate("inf"))
    for bad in ("x + 1", "abs(1)", "1 if 1 else 2", "1; 2", "1/0", "9**9**9", "'1'", "1 % 2"):
        with pytest.raises(formats.ExpressionError):
            formats.evaluate(bad)


# -- demonstrations ---------------------------------------------------------------------------


@pytest.mark.unit
def test_demo_fp16_overflow():
    r = formats.run_demo("fp16-overflow")
    assert r.data["fp16"]["65504.0"] == 65504 and r.data["fp16"]["65519.0"] == 65504
    assert math.isinf(r.data["fp16"]["65520.0"])
    assert r.data["bf16"]["65520.0"] == 65536


@pytest.mark.unit
def test_demo_fp16_underflow():
    r = formats.run_demo("fp16-underflow")
    assert r.data["fp16"] == 0.0 and r.data["bf16"] != 0.0


@pytest.mark.unit
def test_demo_bf16_precision():
    r = formats.run_demo("bf16-precision")
    assert r.data["1+2**-8"] == 1.0 and r.data["1+2**-7"] == 1 + 2**-7
    assert r.data["fp16 1+2**-8"] == 1 + 2**-8 and r.data["1+0.001"] == 1.0


@pytest.mark.unit
def test_demo_sum_tenth():
    r = formats.run_demo("sum-0.1")
    e = r.data["errors"]
    assert r.data["order"][0] == "fp64"
    assert e["fp64"] < e["fp32"] < e["fp16"] < e["bf16"] < e["fp8-e4m3fn"] < e["fp8-e5m2"]
    assert r.data["results"]["fp16"] == 256 and r.data["results"]["bf16"] == 32


@pytest.mark.unit
def test_demo_loss_scale():
    r = formats.run_demo("loss-scale")
    first = r.data["rows"][0]
    assert first["grad"] == 1e-8 and first["fp16"] == 0
    assert first["scaled_fp16"] > 0 and first["rel_error_scaled"] < 1e-3
    assert math.isinf(r.data["overflow_example"]["scaled_fp16"])


# -- the command ------------------------------------------------------------------------------


@pytest.mark.unit
def test_cli_json(capsys):
    assert main(["dtypes", "65504", "1e-8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    first, second = out["values"]
    fp16 = first["formats"]["fp16"]
    assert fp16["stored"] == 65504 and fp16["bits"] == "0|11110|1111111111"
    for name in ("exact", "abs_error", "rel_error", "flags", "overflow", "underflow", "subnormal"):
        assert name in fp16
    e4 = first["formats"]["fp8-e4m3fn"]
    assert e4["stored"] is None and e4["stored_str"] == "nan" and e4["overflow"]
    assert second["formats"]["fp16"]["underflow"]
    assert {f["key"] for f in out["formats"]} >= set(TORCH_FLOATS)


@pytest.mark.unit
def test_cli_text_plain_bits(capsys, monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert main(["dtypes", "65504", "-1e-8"]) == 0
    out = capsys.readouterr().out
    assert "0|11110|1111111111" in out and "\x1b[" not in out
    assert "underflow" in out


@pytest.mark.unit
def test_cli_bad_expression(capsys):
    assert main(["dtypes", "1 + x"]) == 2
    err = capsys.readouterr().err
    assert "1 + x" in err and "not allowed" in err


@pytest.mark.unit
def test_cli_demo_list_and_run(capsys):
    assert main(["dtypes", "--demo", "list"]) == 0
    assert "sum-0.1" in capsys.readouterr().out
    assert main(["dtypes", "--demo", "loss-scale", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["name"] == "loss-scale"
    assert main(["dtypes", "--demo", "nope"]) == 2


@pytest.mark.unit
def test_cli_facts_table(capsys):
    assert main(["dtypes", "--formats", "fp16,bf16,e4m3"]) == 0
    out = capsys.readouterr().out
    assert "65504" in out and "448" in out


@pytest.mark.subprocess
def test_import_does_not_pull_torch():
    code = "import ampscope.core.formats, ampscope.core.memory.plan, ampscope.cli.dtypes, sys; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=engine_env())


@pytest.mark.unit
def test_the_formats_table_shows_exact_maxima() -> None:
    from ampscope.tui.screens.formats import _g

    assert [_g(65504.0), _g(57344.0), _g(448.0)] == ["65504", "57344", "448"]
    assert _g(3.4028234663852886e38) == "3.403e+38" and _g(6.103515625e-05) == "6.104e-05"


NARROW_PROSE = (
    "bits min normal, min subn.: the smallest normal and subnormal positive values. "
    "Past the largest finite value: Left out to fit 80 120 columns: bias, digits, bits "
    "(a wider terminal shows it). them)."
)
"""The words only a fitted layout says (its headings and what it left out)."""


def _words(text: str) -> list[str]:
    return text.split()


@pytest.mark.unit
@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize(
    "argv",
    [
        ["65504", "1e-8"],
        ["1 + 2**-8", "-1e-8"],
        [],
        ["--demo", "list"],
        *(["--demo", name] for name in formats.DEMOS),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, list) else str(a),
)
def test_dtypes_fits_the_terminal_without_breaking_words(capsys, monkeypatch, columns, argv):
    """At 80 and 120 columns no line of `ampscope dtypes` is wider than the terminal (which
    would wrap it mid-word, "satur / ate"), and what it says is the same words as the
    unfitted output: nothing cut, no word split. A word is split when a fitted line ends in
    a fragment of a word of the full text."""
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["dtypes", *argv]) == 0
    full = capsys.readouterr().out
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["dtypes", *argv]) == 0
    fitted = capsys.readouterr().out
    wide = [line for line in fitted.splitlines() if len(line) > columns]
    assert not wide, f"{len(wide)} lines wider than {columns}: {wide[:3]}"
    full_words = set(_words(full))
    narrow_words = set(_words(NARROW_PROSE))
    for word in _words(fitted):
        cut = word.endswith("…") and any(w.startswith(word[:-1]) for w in full_words)
        assert word in full_words or cut or word in narrow_words, word


@pytest.mark.unit
def test_dtypes_at_80_columns_keeps_bits_flags_and_what_overflow_does(capsys, monkeypatch):
    """The narrow layout moves each row's bits to a line of their own and the overflow column
    under the table; nothing a lecturer points at is lost."""
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["dtypes", "65504", "1e-8"]) == 0
    out = capsys.readouterr().out
    assert "    bits 0|11110|1111111111" in out  # fp16's 65504
    assert "overflow,saturated" in out and "underflow" in out
    assert main(["dtypes"]) == 0
    out = capsys.readouterr().out
    assert "Past the largest finite value:" in out
    assert "no inf: becomes NaN (torch's cast and FP8 recipes saturate to" in out
    assert "Left out to fit 80 columns: bias" in out


@pytest.mark.unit
def test_dtypes_in_a_pipe_keeps_one_line_a_format(capsys, monkeypatch):
    """Without a terminal or $COLUMNS the output is not fitted: one line per format, bits
    on it, for a script to cut."""
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["dtypes", "65504"]) == 0
    lines = capsys.readouterr().out.splitlines()
    fp16 = next(line for line in lines if line.startswith("  fp16 "))
    assert fp16.endswith("0|11110|1111111111")
