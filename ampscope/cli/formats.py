"""``ampscope dtypes``: argparse wiring and text / JSON output."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

from ampscope.core.suggest import did_you_mean

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


def format_description(d: Any, colour: bool = False) -> list[str]:
    from ampscope.core import formats as fm

    lines = [f"{d.input}", f"  exact value: {_cut(d.exact_text, 70)}"]
    if str(d.fp64) != d.exact_text and fm.shortest_repr(d.fp64, "fp64") != d.exact_text:
        lines[-1] += f"   (every format is cast from fp64's {fm.shortest_repr(d.fp64, 'fp64')})"
    head = f"  {'format':<11} {'stored':<14} {'exact decimal of stored':<30} {'rel. error':>10}  {'flags':<19} bits (sign|exponent|mantissa)"
    lines.append(head)
    notes: list[str] = []
    for r in d.rows:
        f = fm.FORMATS[r.format]
        flags = ",".join(r.flags)
        lines.append(
            f"  {f.label[:11]:<11} {_cut(r.text, 14):<14} {_cut(r.exact, 30):<30} "
            f"{_err(r.rel_error):>10}  {flags:<19} {draw_bits(r.fields, f, colour)}"
        )
        notes += [f"  {f.label}: {n}" for n in r.notes if not n.startswith("quantized")]
    if any(not fm.FORMATS[r.format].is_float for r in d.rows):
        notes.append(
            "  integers are quantized: rounded half to even, then saturated to [min, max] "
            "(a plain cast would wrap around); scales are not applied"
        )
    return lines + notes


def format_facts(keys: list[str]) -> list[str]:
    from ampscope.core import formats as fm

    lines = [
        f"{'format':<15} {'bits':>4} {'s/e/m':>7} {'bias':>5} {'largest':>10} {'smallest normal':>16} "
        f"{'smallest subn.':>15} {'eps':>9} {'digits':>6} {'decades':>7}  past the largest",
    ]
    for k in keys:
        f = fm.FORMATS[k]
        sem = f"{f.sign_bits}/{f.exponent_bits}/{f.mantissa_bits}" if f.is_float else "int"
        normal = f"{f.smallest_normal:.3g}" if f.is_float else "-"
        subn = f"{f.smallest_subnormal:.3g}" if f.has_subnormals else "none"
        lines.append(
            f"{f.label:<15} {f.bits:>4} {sem:>7} {f.bias if f.bias is not None else '-':>5} "
            f"{f.max:>10.4g} {normal:>16} {subn:>15} {f.eps:>9.3g} {f.decimal_digits:>6.1f} "
            f"{f.range_decades:>7.1f}  {f.overflow}"
        )
    lines += [
        "",
        "s/e/m: sign, exponent and mantissa bits. digits: mantissa bits x log10(2). decades: "
        "log10(largest / smallest positive).",
        "tf32 is not a storage type: it is how Tensor Cores round fp32 matmul inputs "
        "(fp32's range, fp16's 10 mantissa bits).",
        "Try: ampscope dtypes 65504 1e-8 '1 + 2**-8'   or   ampscope dtypes --demo list",
    ]
    return lines


def cmd_dtypes(args: argparse.Namespace) -> int:
    from ampscope.core import formats as fm

    try:
        keys = fm.keys_from(args.formats)
    except KeyError as exc:
        return _fail(f"--formats {args.formats}: {exc.args[0]}")
    if args.demo:
        return _run_demo(args.demo, args.json)
    if not args.values:
        if args.json:
            print(json.dumps({"formats": fm.facts_table(keys)}, indent=2, allow_nan=False))
        else:
            print("\n".join(format_facts(keys)))
        return 0
    described = []
    for text in args.values:
        try:
            described.append(fm.describe(text, keys, saturate_fp8=args.saturate))
        except fm.ExpressionError as exc:
            return _fail(str(exc))
    if args.json:
        out = {
            "values": [d.to_dict() for d in described],
            "formats": fm.facts_table(keys),
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
    blocks = ["\n".join(format_description(d, colour)) for d in described]
    print("\n\n".join(blocks))
    return 0


def _run_demo(name: str, as_json: bool) -> int:
    from ampscope.core import formats as fm

    if name == "list":
        if as_json:
            print(json.dumps({k: v[0] for k, v in fm.DEMOS.items()}, indent=2))
        else:
            width = max(len(k) for k in fm.DEMOS)
            for key, (what, _) in fm.DEMOS.items():
                print(f"{key:<{width}}  {what}")
        return 0
    if name not in fm.DEMOS:
        hint = did_you_mean(name, ["list", *fm.DEMOS])
        return _fail(
            f"--demo {name}: no such demonstration.{hint} Demos: list, {', '.join(fm.DEMOS)}."
        )
    result = fm.run_demo(name)
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
        print("\n".join(result.lines))
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
