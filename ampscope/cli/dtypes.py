"""``ampscope dtypes``: argparse wiring and text / JSON output."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

from ampscope.cli.output import output_width
from ampscope.core.presets.suggest import did_you_mean
from ampscope.core.text import visible, wrap

# -------------------------------------------------------------------------------------------
# Parsers


def add_dtypes_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "dtypes",
        help="number formats: how fp32, bf16, fp16, fp8, int8... store a value, bit by bit",
        description=(
            "Show how each number format stores values. With no VALUE, lists every format's "
            "range and precision. A VALUE may be an expression such as '1 + 2**-9' or '65504*2' "
            "(numbers, + - * / **, parentheses, inf, nan); quote it for the shell."
        ),
    )
    # "-1e-8" and "-(2**-9)" are values, not options.
    p._negative_number_matcher = re.compile(r"^-(\d|\.\d|\(|inf$|nan$)")
    p.add_argument("values", nargs="*", metavar="VALUE", help="numbers or expressions")
    p.add_argument("--json", action="store_true", help="print facts and results as JSON")
    p.add_argument(
        "--demo", metavar="NAME", help="a demonstration to read aloud ('--demo list' names them)"
    )
    p.add_argument(
        "--formats",
        metavar="LIST",
        help="comma-separated formats to show (default: all), e.g. fp32,bf16,fp16,e4m3",
    )
    p.add_argument(
        "--saturate",
        action="store_true",
        help="clamp fp8 e4m3fn overflow to +-448 (as torch's cast does) instead of NaN",
    )
    return p


def _fail(message: str) -> int:
    print(f"ampscope: {message}", file=sys.stderr)
    return 2


# -------------------------------------------------------------------------------------------
# dtypes

_COLOURS = ("\x1b[31m", "\x1b[32m", "\x1b[36m")  # sign, exponent, mantissa
_RESET = "\x1b[0m"


def use_colour(stream: Any = None) -> bool:
    stream = stream or sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR")


def draw_bits(fields: tuple[str, ...], fmt: Any, colour: bool) -> str:
    """sign|exponent|mantissa, coloured on a terminal (integers: one field)."""
    if not fields:
        return "-"
    if not colour:
        return "|".join(fields)
    if not fmt.is_float:
        return fields[0]
    names = []
    if fmt.sign_bits:
        names.append(_COLOURS[0])
    names.append(_COLOURS[1])
    if fmt.mantissa_bits:
        names.append(_COLOURS[2])
    return "|".join(f"{c}{f}{_RESET}" for c, f in zip(names, fields, strict=False))


def _err(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    return f"{x:.2e}"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def format_description(d: Any, colour: bool = False, width: int | None = None) -> list[str]:
    """One value in every format, a row each. Fitted to ``width`` columns when given: the
    exact-decimal column narrows, then each row's bits move to a line of their own, and the
    notes wrap between words; None keeps one line a format, for a script to read."""
    from ampscope.core import formats

    exact = f"  exact value: {_cut(d.exact_text, 70)}"
    if str(d.fp64) != d.exact_text and formats.shortest_repr(d.fp64, "fp64") != d.exact_text:
        exact += f"   (every format is cast from fp64's {formats.shortest_repr(d.fp64, 'fp64')})"
    flags_w = 19 if width is None else max(5, *(len(",".join(r.flags)) for r in d.rows))
    bits_head = "bits (sign|exponent|mantissa)"
    bits_w = max(len(bits_head), *(len("|".join(r.fields)) for r in d.rows))
    fixed = 2 + 11 + 1 + 14 + 1 + 1 + 10 + 2 + flags_w  # every column but exact and bits
    exact_w, bits_inline = 30, True
    if width is not None and fixed + exact_w + 2 + bits_w > width:
        exact_w = max(14, width - fixed - 2 - bits_w)
        if fixed + exact_w + 2 + bits_w > width:
            exact_w, bits_inline = max(10, min(30, width - fixed)), False
    exact_head = "exact decimal of stored" if exact_w >= 23 else "exact decimal"
    head = (
        f"  {'format':<11} {'stored':<14} {exact_head:<{exact_w}} "
        f"{'rel. error':>10}  {'flags':<{flags_w}}"
    )
    lines = [visible(d.input), *wrap(exact, width, hang="    ")]
    lines.append(f"{head}  {bits_head}" if bits_inline else head.rstrip())
    notes: list[str] = []
    for r in d.rows:
        f = formats.FORMATS[r.format]
        bits = draw_bits(r.fields, f, colour)
        row = (
            f"  {f.label[:11]:<11} {_cut(r.text, 14):<14} {_cut(r.exact, exact_w):<{exact_w}} "
            f"{_err(r.rel_error):>10}  {','.join(r.flags):<{flags_w}}"
        )
        lines += [f"{row}  {bits}"] if bits_inline else [row.rstrip(), f"    bits {bits}"]
        notes += [f"  {f.label}: {n}" for n in r.notes if not n.startswith("quantized")]
    if any(not formats.FORMATS[r.format].is_float for r in d.rows):
        notes.append(
            "  integers are quantized: rounded half to even, then saturated to [min, max] "
            "(a plain cast would wrap around); scales are not applied"
        )
    return lines + [line for note in notes for line in wrap(note, width, hang="    ")]


FACT_COLUMNS = (
    "format",
    "bits",
    "s/e/m",
    "bias",
    "largest",
    "smallest normal",
    "smallest subn.",
    "eps",
    "digits",
    "decades",
)
SHORT_HEADS = {"smallest normal": "min normal", "smallest subn.": "min subn."}
"""Headings a narrow terminal shows in place of the long ones."""
DROPPED_FIRST = ("bias", "digits", "bits")
"""Columns a narrow terminal goes without, in this order: each follows from the others
(bits = s + e + m; digits = mantissa bits x log10(2); the bias from the exponent bits)."""


def format_facts(keys: list[str], width: int | None = None) -> list[str]:
    """Every format's range and precision, a row each. Fitted to ``width`` columns when
    given: what happens past the largest value moves under the table, then the columns that
    follow from others are left out, and the prose wraps between words."""
    from ampscope.core import formats

    rows: list[dict[str, str]] = []
    for k in keys:
        f = formats.FORMATS[k]
        rows.append(
            {
                "format": f.label,
                "bits": str(f.bits),
                "s/e/m": f"{f.sign_bits}/{f.exponent_bits}/{f.mantissa_bits}"
                if f.is_float
                else "int",
                "bias": str(f.bias) if f.bias is not None else "-",
                "largest": f"{f.max:.4g}",
                "smallest normal": f"{f.smallest_normal:.3g}" if f.is_float else "-",
                "smallest subn.": f"{f.smallest_subnormal:.3g}" if f.has_subnormals else "none",
                "eps": f"{f.eps:.3g}",
                "digits": f"{f.decimal_digits:.1f}",
                "decades": f"{f.range_decades:.1f}",
                "past the largest": f.overflow,
            }
        )
    shown = list(FACT_COLUMNS)
    heads = {c: c for c in [*shown, "past the largest"]}
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in heads}

    def span(columns: list[str]) -> int:
        return sum(widths[c] for c in columns) + len(columns) - 1

    room = 1 << 30 if width is None else width  # None: no limit
    past_inline = span(shown) + 2 + widths["past the largest"] <= room
    if not past_inline and span(shown) > room:
        heads.update(SHORT_HEADS)
        widths = {c: max(len(heads[c]), *(len(r[c]) for r in rows)) for c in heads}
    for column in DROPPED_FIRST:
        if past_inline or span(shown) <= room:
            break
        shown.remove(column)

    def line(cells: dict[str, str]) -> str:
        text = " ".join(
            cells[c].ljust(widths[c]) if c == "format" else cells[c].rjust(widths[c]) for c in shown
        )
        return f"{text}  {cells['past the largest']}" if past_inline else text

    lines = [line(heads)]
    lines += [line(r) for r in rows]
    if not past_inline:
        lines += ["", "Past the largest finite value:"]
        label_w = widths["format"]
        for r in rows:
            lines += wrap(
                r["past the largest"], width, f"  {r['format']:<{label_w}}  ", " " * (label_w + 4)
            )
    prose = [
        "s/e/m: sign, exponent and mantissa bits. digits: mantissa bits x log10(2). decades: "
        "log10(largest / smallest positive).",
        "tf32 is not a storage type: it is how Tensor Cores round fp32 matmul inputs "
        "(fp32's range, fp16's 10 mantissa bits).",
    ]
    if SHORT_HEADS["smallest normal"] in heads.values():
        prose.append("min normal, min subn.: the smallest normal and subnormal positive values.")
    if len(shown) < len(FACT_COLUMNS):
        left_out = [c for c in FACT_COLUMNS if c not in shown]
        them = "it" if len(left_out) == 1 else "them"
        prose.append(
            f"Left out to fit {width} columns: {', '.join(left_out)} (a wider terminal shows {them})."
        )
    lines.append("")
    lines += [w for p in prose for w in wrap(p, width)]
    lines.append("Try: ampscope dtypes 65504 1e-8 '1 + 2**-8'   or   ampscope dtypes --demo list")
    return lines


def demo_lines(lines: list[str], width: int | None) -> list[str]:
    """A demonstration's text fitted to ``width``: the sentences of a paragraph (its lines
    that start at the margin) are joined and wrapped between words; an indented line (a row
    of figures) wraps with a deeper indent. None: the lines as written."""
    if width is None:
        return list(lines)
    out: list[str] = []
    paragraph: list[str] = []
    for text in [*lines, ""]:
        if text and not text[0].isspace():
            paragraph.append(text)
            continue
        if paragraph:
            out += wrap(" ".join(paragraph), width)
            paragraph = []
        if text:
            indent = text[: len(text) - len(text.lstrip())]
            out += wrap(text.strip(), width, indent, indent + "    ")
    return out


def cmd_dtypes(args: argparse.Namespace) -> int:
    from ampscope.core import formats

    try:
        keys = formats.keys_from(args.formats)
    except KeyError as exc:
        return _fail(f"--formats {formats.echo(args.formats)}: {exc.args[0]}")
    if args.demo:
        return _run_demo(args.demo, args.json)
    if not args.values:
        if args.json:
            print(json.dumps({"formats": formats.facts_table(keys)}, indent=2, allow_nan=False))
        else:
            print("\n".join(format_facts(keys, output_width())))
        return 0
    described = []
    for text in args.values:
        try:
            described.append(formats.describe(text, keys, saturate_fp8=args.saturate))
        except formats.ExpressionError as exc:
            return _fail(str(exc))
    if args.json:
        out = {
            "values": [d.to_dict() for d in described],
            "formats": formats.facts_table(keys),
            "notes": {
                "integers": "quantized: round half to even, then saturate to [min, max]",
                "conversion": "each format is cast from the value's fp64, as a program would",
                "fp8-e4m3fn": "overflow gives NaN (ml_dtypes, OCP spec); torch's cast and "
                "--saturate clamp to +-448",
            },
        }
        print(json.dumps(out, indent=2, allow_nan=False))
        return 0
    colour = use_colour()
    width = output_width()
    blocks = ["\n".join(format_description(d, colour, width)) for d in described]
    print("\n\n".join(blocks))
    return 0


def _run_demo(name: str, as_json: bool) -> int:
    from ampscope.core import formats

    if name == "list":
        if as_json:
            print(json.dumps({k: v[0] for k, v in formats.DEMOS.items()}, indent=2))
        else:
            width = max(len(k) for k in formats.DEMOS)
            for key, (what, _) in formats.DEMOS.items():
                print("\n".join(wrap(what, output_width(), f"{key:<{width}}  ", " " * (width + 2))))
        return 0
    if name not in formats.DEMOS:
        hint = did_you_mean(name, ["list", *formats.DEMOS])
        return _fail(
            f"--demo {formats.echo(name)}: no such demonstration.{hint} Demos: list, "
            f"{', '.join(formats.DEMOS)}."
        )
    result = formats.run_demo(name)
    if as_json:
        print(
            json.dumps(
                {
                    "name": result.name,
                    "title": result.title,
                    "lines": result.lines,
                    "data": _jsonable(result.data),
                },
                indent=2,
                allow_nan=False,
            )
        )
    else:
        print(result.title)
        print("=" * len(result.title))
        print("\n".join(demo_lines(result.lines, output_width())))
    return 0


def _jsonable(x: Any) -> Any:
    """inf/nan become strings so the output is strict JSON."""
    if isinstance(x, float) and (x != x or x in (float("inf"), float("-inf"))):
        return str(x)
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x
