"""``ampscope dtypes`` and ``ampscope memory``: argparse wiring and text / JSON output."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

from ampscope.cli.output import fail
from ampscope.core.units import fmt_bytes

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


def add_memory_parser(subparsers: Any) -> argparse.ArgumentParser:
    from ampscope.core import memory_plan as mp

    p = subparsers.add_parser(
        "memory",
        help="training memory per precision regime: bytes per parameter, totals, which GPUs fit",
        description=(
            "Plan training memory: weights, gradients, master weights, optimizer state and "
            "(given a transformer shape) activations, for each precision regime."
        ),
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--params", metavar="N", help="parameter count: 7e9, 7B, 125M, 1.3b, 350k")
    src.add_argument("--preset", metavar="NAME", help="take the model from a preset")
    src.add_argument("--run", metavar="RUNDIR", help="compare with a finished run's measured peak")
    src.add_argument(
        "--model", metavar="SPEC", help="your model's factory, FILE.py:FUNCTION or MODULE:FUNCTION"
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="which size an 'auto' preset takes (default cuda: the large size)",
    )
    p.add_argument("--optimizer", choices=tuple(mp.OPTIMIZER_STATES), default="adamw")
    p.add_argument(
        "--regime",
        action="append",
        choices=tuple(mp.REGIMES),
        help="regimes to show (repeatable; default: all but pure fp16 and fp64)",
    )
    for name, what in (
        ("layers", "transformer layers"),
        ("hidden", "hidden size"),
        ("heads", "attention heads"),
        ("seq", "sequence length"),
        ("batch", "micro-batch size"),
        ("vocab", "vocabulary (adds the logits)"),
    ):
        p.add_argument(f"--{name}", type=_positive_int, metavar="N", help=what)
    p.add_argument(
        "--flash", action="store_true", help="flash attention: no stored s^2 attention scores"
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}' must be at least 1")
    return value


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
        return fail(f"--formats {args.formats}: {exc.args[0]}")
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
            return fail(str(exc))
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
        return fail(f"--demo {name}: no such demonstration. Demos: list, {', '.join(fm.DEMOS)}.")
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


# -------------------------------------------------------------------------------------------
# memory


def _gb(n: int | None) -> str:
    return "-" if n is None else fmt_bytes(n)


def format_plan(rows: list[Any], title: str, shape: Any, flash: bool) -> list[str]:
    from ampscope.core import memory_plan as mp

    lines = [title, ""]
    lines.append(
        f"{'regime':<23} {'w':>2} {'g':>2} {'mst':>3} {'opt':>3} {'=B/p':>4} {'+cast':>5}   "
        f"{'weights':>9} {'grads':>9} {'master':>9} {'optim.':>9} {'activ.':>9} "
        f"{'TRAIN':>9} {'INFER':>9}"
    )
    for r in rows:
        acts = None if r.activations is None else r.activations + (r.logits or 0)
        lines.append(
            f"{r.label:<23} {r.weight_bpp:>2} {r.grad_bpp:>2} {r.master_bpp:>3} "
            f"{r.optimizer_bpp:>3} {r.train_bpp:>4} {r.cast_bpp:>5}   "
            f"{_gb(r.weights):>9} {_gb(r.grads):>9} {_gb(r.master):>9} "
            f"{_gb(r.optimizer_state):>9} {_gb(acts):>9} {_gb(r.train_total):>9} "
            f"{_gb(r.inference_total):>9}"
        )
    lines += ["", "Fits (total <= 90% of GPU memory): T = trains, i = inference only, . = neither"]
    names = mp.gpu_names()
    lines.append(f"{'':<23} " + " ".join(names))
    for r in rows:
        marks = []
        for n in names:
            mark = "T" if n in r.fits_train else ("i" if n in r.fits_inference else ".")
            marks.append(f"{mark:^{len(n)}}")
        lines.append((f"{r.label:<23} " + " ".join(marks)).rstrip())
    lines += [
        "",
        "w, g, mst, opt: bytes per parameter for weights, gradients, fp32 master weights and "
        "optimizer state; =B/p their sum.",
        "+cast: transient low-precision weight copies per parameter (counted in TRAIN, live from "
        "forward to backward).",
    ]
    if shape is None:
        lines.append(
            "activ.: unknown without a transformer shape (--layers --hidden --heads --seq "
            "--batch, or --preset): TRAIN covers the model state only."
        )
    else:
        lines.append(
            f"activ.: {shape.layers} layers x s*b*h*(34{'' if flash else ' + 5*a*s/h'}) bytes in "
            "16-bit (Korthikanti et al.; fp32 doubles it"
            + (", flash attention drops the s^2 term" if flash else "; --flash drops the s^2 term")
            + "), no recomputation"
            + (", plus the logits and their fp32 copy for the loss" if shape.vocab else "")
            + "."
        )
    lines += [
        "INFER: the weights in the regime's compute dtype only (no KV cache, no activations).",
        "90%: the CUDA context, cuBLAS workspaces and allocator fragmentation take the rest.",
    ]
    lines += [f"{r.label}: {r.note}." for r in rows if r.regime.startswith("fp8")]
    return lines


def cmd_memory(args: argparse.Namespace) -> int:
    from ampscope.core import config
    from ampscope.core import memory_plan as mp

    regimes = args.regime or list(mp.DEFAULT_REGIMES)
    if args.run:
        return _memory_run(args)
    shape_opts = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "seq", "batch")}
    shape = None
    if args.preset:
        try:
            wl = mp.workload_from_preset(args.preset, on_cuda=args.device == "cuda")
        except config.ConfigError as exc:
            return fail(str(exc))
        params, shape = wl.params, wl.shape
        if shape is not None:
            shape = mp.Shape(
                args.layers or shape.layers,
                args.hidden or shape.hidden,
                args.heads or shape.heads,
                args.seq or shape.seq,
                args.batch or shape.batch,
                args.vocab or shape.vocab,
            )
            params = mp.gpt_params(shape.vocab or 0, shape.seq, shape.hidden, shape.layers)
        if args.regime is None and wl.regime not in regimes:
            regimes.append(wl.regime)
        dims = ", ".join(f"{k}={v}" for k, v in wl.dims.items())
        title = (
            f"Preset '{args.preset}' ({args.device} size): {wl.kind}, {dims}, batch {wl.batch}; "
            f"{params:,} parameters; the preset trains in '{wl.regime}'"
        )
        if wl.kind == "gpt" and not args.flash:
            title += (
                "\n(the engine's attention is torch SDPA, flash kernels: add --flash to match it)"
            )
    else:
        given = [k for k, v in shape_opts.items() if v is not None]
        if given and len(given) < len(shape_opts):
            missing = [f"--{k}" for k, v in shape_opts.items() if v is None]
            return fail(
                f"a transformer shape needs --layers, --hidden, --heads, --seq and --batch; "
                f"missing {', '.join(missing)}."
            )
        if given:
            shape = mp.Shape(args.layers, args.hidden, args.heads, args.seq, args.batch, args.vocab)
        if args.model is not None:
            from ampscope.cli.model_memory import model_params, refuse

            try:
                params, source = model_params(args.model)
            except config.ConfigError as exc:
                return refuse(exc)
        elif args.params is not None:
            try:
                params = mp.parse_count(args.params)
            except mp.PlanError as exc:
                return fail(f"--params {args.params}: {exc}")
            source = f"{params:,} parameters"
        elif shape is not None:
            params = mp.transformer_params(shape.layers, shape.hidden, shape.vocab)
            source = f"about {params:,} parameters (12*L*h^2{' + 2*V*h' if shape.vocab else ''})"
        else:
            return fail(
                "say which model: --params N (7B, 125M, 7e9), --preset NAME, --model "
                "FILE.py:FUNCTION, a transformer shape (--layers --hidden --heads --seq --batch), "
                "or --run RUNDIR. "
                "See 'ampscope memory --help'."
            )
        title = f"Training memory for {source} ({_count(params)})"
    if shape is not None:
        title += (
            f"\nshape: {shape.layers} layers, hidden {shape.hidden}, {shape.heads} heads, "
            f"seq {shape.seq}, batch {shape.batch}"
            + (f", vocab {shape.vocab}" if shape.vocab else "")
            + (", flash attention" if args.flash else "")
        )
    states = mp.OPTIMIZER_STATES[args.optimizer]
    title += f"\noptimizer: {args.optimizer} ({states} state tensor{'s' if states != 1 else ''} a parameter)"
    rows = mp.plan(params, regimes, args.optimizer, shape, args.flash)
    if args.json:
        print(
            json.dumps(
                {
                    "params": params,
                    "optimizer": args.optimizer,
                    "shape": None if shape is None else shape.__dict__,
                    "flash": args.flash,
                    "fit_fraction": mp.FIT_FRACTION,
                    "gpus": dict(mp.GPUS),
                    "regimes": [r.to_dict() for r in rows],
                },
                indent=2,
            )
        )
        return 0
    print("\n".join(format_plan(rows, title, shape, args.flash)))
    return 0


def _count(n: int) -> str:
    for limit, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "k")):
        if n >= limit:
            return f"{n / limit:.3g}{suffix}"
    return str(n)


def _memory_run(args: argparse.Namespace) -> int:
    from ampscope.core import memory_plan as mp

    try:
        c = mp.compare_run(args.run, flash=args.flash)
    except mp.PlanError as exc:
        return fail(str(exc))
    if args.json:
        print(json.dumps(c.to_dict(), indent=2))
        return 0
    p = c.plan
    lines = [
        f"Run {c.run}: {c.params:,} parameters, regime '{c.regime}', device {c.device or '?'}",
        f"  predicted  weights {_gb(p.weights)}, grads {_gb(p.grads)}, master {_gb(p.master)}, "
        f"optimizer {_gb(p.optimizer_state)}, casts {_gb(p.cast_copies)}, "
        f"activations {_gb(None if p.activations is None else p.activations + (p.logits or 0))}",
        f"  predicted  {c.predicted_what}: {_gb(c.predicted)}",
        f"  measured   peak: {_gb(c.measured_peak)}",
    ]
    if c.ratio is not None and c.percent is not None:
        lines.append(f"  measured / predicted = {c.ratio:.2f} ({c.percent:+.0f}%)")
    else:
        lines.append("  no measured peak in this record")
    lines += [f"  note: {n}" for n in c.notes]
    print("\n".join(lines))
    return 0
