"""``ampscope memory``: the training-memory planner on the command line, and ``--run``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ampscope.cli.output import fail, output_width
from ampscope.core.presets import ConfigError
from ampscope.core.text import visible
from ampscope.core.units import fmt_bytes

SHAPE_FLAGS = ("layers", "hidden", "heads", "seq", "batch")


def add_memory_parser(subparsers: Any) -> argparse.ArgumentParser:
    from ampscope.core.memory import plan

    p = subparsers.add_parser(
        "memory",
        help="training memory per precision regime: bytes per parameter, totals, which GPUs fit",
        description=(
            "Plan training memory: weights, gradients, master weights, optimizer state and "
            "(given a transformer shape) activations and the loss's logits, for each precision "
            "regime. Activations are the engine's GPT block with the attention it runs (torch "
            "SDPA flash / memory-efficient kernels: no s x s scores stored)."
        ),
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--params", metavar="N", help="parameter count: 7e9, 7B, 125M, 1.3b, 350k")
    src.add_argument("--preset", metavar="NAME", help="take the model from a preset")
    src.add_argument(
        "--run",
        metavar="RUN",
        help="compare with a finished run's measured peak: its folder, or its name in the runs "
        "folder (./runs or $AMPSCOPE_RUNS_DIR), as 'ampscope runs' lists it",
    )
    src.add_argument(
        "--model", metavar="SPEC", help="your model's factory, FILE.py:FUNCTION or MODULE:FUNCTION"
    )
    p.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="which size an 'auto' preset takes (default cuda: the large size)",
    )
    p.add_argument("--optimizer", choices=tuple(plan.OPTIMIZER_STATES), default="adamw")
    p.add_argument(
        "--regime",
        action="append",
        choices=tuple(plan.REGIMES),
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
    # Flash-style attention is the only model now; the flag stays accepted for old scripts.
    p.add_argument("--flash", action="store_true", help=argparse.SUPPRESS)
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


def _fail(message: str) -> int:
    return fail(message)  # escaped: a preset's name or a path as the user typed it


def _gb(n: int | None) -> str:
    return "-" if n is None else fmt_bytes(n)


LABEL_WIDTH = 24  # the regime column and its gap: repeated in every block of a folded table


def fold_table(lines: list[str], width: int | None) -> list[str]:
    """A table wider than ``width`` as blocks of whole columns, each led by the regime column:
    a terminal that wraps a long row itself scatters its cells over the next row. Columns are
    cut only where every row has a space; ``width`` None (a pipe) keeps one row a line."""
    widest = max((len(line) for line in lines), default=0)
    if width is None or widest <= width:
        return lines
    cells = [line[LABEL_WIDTH:].ljust(widest - LABEL_WIDTH) for line in lines]
    gaps = [i for i in range(widest - LABEL_WIDTH) if all(c[i] == " " for c in cells)]
    room, start = max(width - LABEL_WIDTH, 1), 0
    blocks: list[str] = []
    while start < widest - LABEL_WIDTH:
        fits = [g for g in gaps if start < g <= start + room]
        end = fits[-1] if fits and start + room < widest - LABEL_WIDTH else widest - LABEL_WIDTH
        block = [
            (line[:LABEL_WIDTH] + c[start:end]).rstrip()
            for line, c in zip(lines, cells, strict=True)
        ]
        blocks += ([""] if blocks else []) + block
        start = end
    return blocks


def format_plan(
    rows: list[Any], title: str, shape: Any, measured: Any = None, width: int | None = None
) -> list[str]:
    """The planner's tables and notes, fitted to ``width`` columns (None: as they are)."""
    from ampscope.core.memory import plan
    from ampscope.core.text import wrap

    values = (
        "weights", "grads", "master", "optim.", "casts", "activ.", "logits", "opt.tmp", "TRAIN",
        "INFER",
    )  # fmt: skip
    table = [
        f"{'regime':<23} {'w':>2} {'g':>2} {'mst':>3} {'opt':>3} {'=B/p':>4} {'+cast':>5}  "
        + " ".join(f"{v:>9}" for v in values)
    ]
    for r in rows:
        figures = (
            r.weights,
            r.grads,
            r.master,
            r.optimizer_state,
            r.cast_copies,
            r.activations,
            r.logits,
            r.optimizer_temp,
            r.train_total,
            r.inference_total,
        )
        table.append(
            f"{r.label:<23} {r.weight_bpp:>2} {r.grad_bpp:>2} {r.master_bpp:>3} "
            f"{r.optimizer_bpp:>3} {r.train_bpp:>4} {r.cast_bpp:>5}  "
            + " ".join(f"{_gb(f):>9}" for f in figures)
        )
    # the title names a preset path, a model spec or a run as typed: control characters escaped
    lines = [
        *_wrapped(visible(title, 0, keep_newlines=True), width),
        "",
        *fold_table(table, width),
        "",
    ]
    lines += wrap(
        "Fits (total <= 90% of GPU memory): T = trains, i = inference only, . = neither, "
        "x = cannot run the format (bf16 needs compute capability 8.0, fp8 8.9)",
        width,
    )
    names = plan.gpu_names()
    fits = [f"{'':<23} " + " ".join(names)]
    for r in rows:
        marks = []
        for n in names:
            mark = "T" if n in r.fits_train else ("i" if n in r.fits_inference else ".")
            mark = "x" if n in plan.unable_gpus(r.regime) else mark
            marks.append(f"{mark:^{len(n)}}")
        fits.append((f"{r.label:<23} " + " ".join(marks)).rstrip())
    notes = _plan_notes(rows, shape, measured)
    return lines + fold_table(fits, width) + [w for n in notes for w in _wrapped(n, width)]


def _wrapped(text: str, width: int | None) -> list[str]:
    """Each line of ``text`` broken between words at ``width`` (a blank line kept)."""
    from ampscope.core.text import wrap

    return [w for line in text.split("\n") for w in (wrap(line, width) or [line])]


def _plan_notes(rows: list[Any], shape: Any, measured: Any = None) -> list[str]:
    from ampscope.core.memory import plan

    lines = [
        "",
        "w, g, mst, opt: bytes per parameter for weights, gradients, fp32 master weights and "
        "optimizer state; =B/p their sum.",
        "+cast: transient low-precision weight copies per parameter (live from forward to "
        "backward).",
    ]
    if measured is not None and shape is None:
        lines += _measured_notes(rows, measured)
    else:
        lines += [
            "opt.tmp: the optimizer step's temporaries: per-tensor AdamW (torch's default off "
            "CUDA) makes two copies of the largest parameter in its state's dtype; fused AdamW "
            "on CUDA none.",
            "TRAIN: weights to optim., plus the larger of the backward's transients (casts, "
            "activ., logits) and opt.tmp (the backward's are freed before the step). It counts "
            "the gradients, which the engine frees before each forward "
            "(zero_grad(set_to_none=True)): its measured peak is up to the grads column lower.",
        ]
    if shape is None and measured is None:
        lines.append(
            "activ., logits: unknown without a transformer shape (--layers --hidden --heads "
            "--seq --batch, or --preset): TRAIN covers the model state only."
        )
    elif shape is not None:
        lines.append(
            f"activ.: {shape.layers} layers x s*b*h*(2*R + 14*C) bytes, C the compute dtype's "
            "bytes, R the residual stream's (fp32 under autocast): what autograd keeps in the "
            "engine's GPT block, no recomputation; " + plan.ATTENTION + "."
        )
        if shape.vocab:
            lines.append(
                "logits: s*b*vocab x (C + 12) bytes at the start of backward: the logits, the "
                "loss's fp32 log-softmax, its incoming gradient and the gradient it makes."
            )
    lines += [
        "INFER: the weights in the regime's compute dtype only (no KV cache, no activations).",
        "90%: the CUDA context, cuBLAS workspaces and allocator fragmentation take the rest.",
    ]
    lines += [f"{r.label}: {r.note}." for r in rows if r.regime.startswith("fp8")]
    absent = plan.fp8_not_applicable(measured if shape is None else None)
    if absent:
        lines.append(f"{absent}.")
    return lines


def _measured_notes(rows: list[Any], measured: Any) -> list[str]:
    """How a measured model's columns and TRAIN were found (``core.memory.plan.measured_plan``)."""
    lines = [
        "casts: the weights' casts the step saves for backward, as measured (fp8: "
        "amp-bf16's, an upper bound); the others are in logits.",
        "activ.: what autograd saves for backward in one step of this model "
        "(saved_tensors_hooks; storages once, parameters and the casts left out), in each "
        f"regime's dtypes, {measured.how}; logits: everything else the forward and backward "
        "hold at their peak (torch.profiler's allocator records, in the order they happened): "
        "the loss's and backward's buffers and the gradients made by then.",
        "opt.tmp: the optimizer step's temporaries as the engine's step makes them, measured: "
        "gradient clipping and per-tensor AdamW (torch's default off CUDA; fused AdamW on CUDA "
        "makes none), in the state's dtype.",
        "TRAIN: weights, master and optim., plus the larger of the step's two peaks: the "
        "forward and backward's (casts + activ. + logits; the engine frees the gradients "
        "before each forward, so there they are those made by then) and the optimizer step's "
        "(grads + opt.tmp).",
    ]
    params, trainable = measured.params, measured.trainable
    if params is not None and trainable is not None and trainable < params:
        lines.append(
            f"g, mst, opt: for the {trainable:,} parameters that take gradients; "
            f"{params - trainable:,} frozen (requires_grad = False) get none."
        )
    if measured.unreached:
        names = list(measured.unreached)
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        count = sum(measured.unreached.values())
        lines.append(
            f"{', '.join(names[:3])}{more} ({count:,} parameters) got no gradient in the "
            "measured step: a later batch may reach them (an MoE's experts), so their "
            "gradients and optimizer state are counted; if they never train, TRAIN is lower "
            "by their grads and optim."
        )
    held = []
    if measured.batch_bytes:
        held.append(f"the batch on the device ({_gb(max(measured.batch_bytes.values()))} at most)")
    if measured.buffers:
        held.append(f"the model's buffers ({_gb(measured.buffers)})")
    if held:
        lines.append(f"TRAIN also holds {' and '.join(held)} all step.")
    return lines


def cmd_memory(args: argparse.Namespace) -> int:
    from ampscope.core.memory import plan

    if args.run:
        return _memory_run(args)
    regimes = args.regime or list(plan.DEFAULT_REGIMES)
    try:
        if args.model is not None:
            from ampscope.cli.model_memory import Interrupted, from_model

            try:
                params, shape, title, measured = from_model(args)
            except Interrupted as exc:
                print(f"ampscope: {exc}", file=sys.stderr)
                return 130
            if measured is None and shape is None:
                title += "\n(the model could not run a step on the CPU: activations not measured)"
        else:
            measured = None
            params, shape, title = (_from_preset if args.preset else _from_flags)(args, regimes)
        plan.check_shape(params, shape)
    except plan.PlanError as exc:
        return _fail(str(exc))
    except ConfigError as exc:  # a --model whose own code fails: their traceback under it
        from ampscope.cli.model_memory import refuse

        return refuse(exc)
    if shape is not None:
        title += (
            f"\nshape: {shape.layers} layers, hidden {shape.hidden}, {shape.heads} heads, "
            f"seq {shape.seq}, batch {shape.batch}"
            + (f", vocab {shape.vocab}" if shape.vocab else "")
            + f"\n{plan.ATTENTION}"
        )
    states = plan.OPTIMIZER_STATES[args.optimizer]
    title += f"\noptimizer: {args.optimizer} ({states} state tensor{'s' if states != 1 else ''} a parameter)"
    rows = plan.plan(params, regimes, args.optimizer, shape, measured)
    if args.json:
        out = {
            "params": params,
            "optimizer": args.optimizer,
            "shape": None if shape is None else shape.__dict__,
            "attention": plan.ATTENTION,
            "fit_fraction": plan.FIT_FRACTION,
            "gpus": dict(plan.GPUS),
            "regimes": [r.to_dict() for r in rows],
            "measured": None if measured is None else measured.__dict__,
            "fp8_not_applicable": plan.fp8_not_applicable(measured if shape is None else None),
        }
        print(json.dumps(out, indent=2))
        return 0
    print("\n".join(format_plan(rows, title, shape, measured, output_width())))
    return 0


def _from_preset(args: argparse.Namespace, regimes: list[str]) -> tuple[int, Any, str]:
    from ampscope.core import presets
    from ampscope.core.memory import plan

    try:
        wl = plan.workload_from_preset(args.preset, on_cuda=args.device == "cuda")
    except presets.ConfigError as exc:
        raise plan.PlanError(str(exc)) from None
    params, shape = wl.params, wl.shape
    if shape is not None:
        shape = plan.Shape(
            args.layers or shape.layers,
            args.hidden or shape.hidden,
            args.heads or shape.heads,
            args.seq or shape.seq,
            args.batch or shape.batch,
            args.vocab or shape.vocab,
        )
        count = plan.gpt2_params if wl.kind == "gpt2-124m" else plan.gpt_params
        params = count(shape.vocab or 0, shape.seq, shape.hidden, shape.layers)
    if args.regime is None and wl.regime not in regimes:
        regimes.append(wl.regime)
    dims = ", ".join(f"{k}={v}" for k, v in wl.dims.items())
    title = (
        f"Preset '{args.preset}' ({args.device} size): {wl.kind}, {dims}, batch {wl.batch}; "
        f"{params:,} parameters; the preset trains in '{wl.regime}'"
    )
    return params, shape, title


def _from_flags(args: argparse.Namespace, regimes: list[str]) -> tuple[int, Any, str]:
    from ampscope.core.memory import plan

    given = [k for k in SHAPE_FLAGS if getattr(args, k) is not None]
    if given and len(given) < len(SHAPE_FLAGS):
        missing = [f"--{k}" for k in SHAPE_FLAGS if getattr(args, k) is None]
        raise plan.PlanError(
            f"a transformer shape needs --layers, --hidden, --heads, --seq and --batch; "
            f"missing {', '.join(missing)}."
        )
    shape = None
    if given:
        shape = plan.Shape(args.layers, args.hidden, args.heads, args.seq, args.batch, args.vocab)
    if args.params is not None:
        try:
            params = plan.parse_count(args.params)
        except plan.PlanError as exc:
            raise plan.PlanError(f"--params {args.params}: {exc}") from None
        source = f"{params:,} parameters"
    elif shape is not None:
        params = plan.transformer_params(shape.layers, shape.hidden, shape.vocab)
        source = f"about {params:,} parameters (12*L*h^2{' + 2*V*h' if shape.vocab else ''})"
    else:
        raise plan.PlanError(
            "say which model: --params N (7B, 125M, 7e9), --preset NAME, --model "
            "FILE.py:FUNCTION, a transformer shape (--layers --hidden --heads --seq --batch), or "
            "--run RUNDIR. "
            "See 'ampscope memory --help'."
        )
    return params, shape, f"Training memory for {source} ({_count(params)})"


def _count(n: int) -> str:
    for limit, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "k")):
        if n >= limit:
            return f"{n / limit:,.4g}{suffix}" if n < 1000 * limit else f"{n // limit:,}{suffix}"
    return str(n)


def _memory_run(args: argparse.Namespace) -> int:
    from ampscope.cli.runs import resolve_run
    from ampscope.core import records
    from ampscope.core.memory import plan
    from ampscope.core.memory.measured import compare_run

    # `ampscope --runs-dir X memory --run NAME` looks in X, as every command that takes a run
    root = getattr(args, "runs_dir", None) or records.default_runs_dir()
    found = resolve_run(args.run, root)
    if found is None and not Path(args.run).exists():
        return _fail(f"no run record '{args.run}' (a run folder, or a name in {root}).")
    folder = str(found) if found is not None else args.run
    try:
        c = compare_run(folder, _measure_recorded(folder))
    except plan.PlanError as exc:
        return _fail(str(exc))
    if args.json:
        print(json.dumps(c.to_dict(), indent=2))
        return 0
    p = c.plan
    lines = [
        f"Run {c.run}: {c.params:,} parameters, regime '{c.regime}', device {c.device or '?'}",
        f"  predicted  weights {_gb(p.weights)}, grads {_gb(p.grads)}, master {_gb(p.master)}, "
        f"optimizer {_gb(p.optimizer_state)}, casts {_gb(p.cast_copies)}, "
        f"activations {_gb(p.activations)}, logits {_gb(p.logits)}",
        f"  predicted  {c.predicted_what}: {_gb(c.predicted)}",
        f"  recorded   peak: {_gb(c.measured_peak)} ({c.measured_what})",
    ]
    notes = c.notes
    if c.ratio is not None and c.percent is not None and _own_growth_dominates(c):
        lines.append(f"  compared   {c.compared_what}: {_gb(c.compared)}")
        lines.append(
            f"  not compared: the plan ({_gb(c.predicted)}) is under four times the "
            f"{_gb(CPU_OWN_GROWTH)} a CPU run's process grows by on its own (torch's runtime, "
            "threads, the allocator's caches), so this RSS growth is mostly the process's, "
            f"not the model's. A model planned above {_gb(4 * CPU_OWN_GROWTH)}, or a GPU run "
            "(max_memory_allocated), is compared."
        )
        notes = [n for n in notes if "read the ratio" not in n]  # there is none to read
    elif c.ratio is not None and c.percent is not None:
        lines.append(f"  compared   {c.compared_what}: {_gb(c.compared)}")
        lines.append(f"  compared / predicted = {c.ratio:.2f} ({c.percent:+.0f}%)")
    elif c.measured_peak is None:
        lines.append("  no measured peak in this record")
    else:
        lines.append("  not compared: the record has no tensor-memory figure (see the note)")
    lines += [f"  note: {n}" for n in notes]
    print(visible("\n".join(lines), 0, keep_newlines=True))  # the record's words, as text
    return 0


CPU_OWN_GROWTH = 92 * 2**20
"""How much a CPU run's process RSS grows besides the training state: 92.5 MiB for a
544-parameter MLP (8.5 KiB of training state) on this project's CPU test machine."""


def _own_growth_dominates(c: Any) -> bool:
    """A CPU run whose predicted training state is under four times the process's own RSS
    growth: the ratio would measure the process (19.72, +1872 %, for 132k parameters)."""
    return not c.on_cuda and c.predicted is not None and c.predicted < 4 * CPU_OWN_GROWTH


def _measure_recorded(folder: str) -> Any:
    """A recorded run of a user's model: its activations measured again at the run's batch,
    from the model file it names (None when that no longer builds, or for a built-in)."""
    from ampscope.core import records

    try:
        hello = records.load_run(Path(folder)).hello
        conf = (hello.config or {}) if hello is not None else {}
        spec = (conf.get("workload") or {}).get("model")
        batch = conf.get("batch_size")
    except Exception:  # noqa: BLE001 - compare_run says what is wrong with the record
        return None
    if not isinstance(spec, str) or not spec:
        return None
    from ampscope.cli.model_memory import measure

    return measure(spec, batch if isinstance(batch, int) and batch > 0 else None)
