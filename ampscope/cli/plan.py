"""``ampscope plan fp8|fp16``: which layer in which format, and why; proven by training; written
as files to apply (docs/plan.md).

The measurements are the engine's (``ampscope.engine.plan``), the decisions, words and files
the core's (``ampscope.core.plan``). Progress and notes go to stderr; with ``--json`` stdout
carries the plan's JSON alone. A bad flag or model is exit 2; Ctrl+C 130.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ampscope.cli.output import fail, output_width, stdout_for_json_only
from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.plan import RECIPE_CHOICES, gemm_plan
from ampscope.core.plan import files as plan_files
from ampscope.core.plan.proof import Outcome, table, verify_rows
from ampscope.core.plan.report import Plan, to_json
from ampscope.core.plan.speed import UnknownGpu, datasheet_machine, find_gpu
from ampscope.core.plan.steps import MAX_STEPS, STEPS
from ampscope.core.plan.text import files_lines, render
from ampscope.core.presets import ConfigError
from ampscope.core.presets.fp8_recipes import MIN_CAPABILITY
from ampscope.core.presets.workload_spec import SpecError, check_model_spec
from ampscope.core.records.folders import runs_dir_argument
from ampscope.core.text import is_utf8, visible

MAX_VERIFY_STEPS = 100_000
MAX_ROWS = 1 << 24  # the largest M planned: 16,777,216 rows (tokens a step per GPU)
CPU_TIMES = (
    "the runs ran on a CPU, eager (nothing compiled){fp8}: their step times say nothing of a "
    "GPU's, so judge the losses"
)
EMULATED = ", fp8 emulated (fp8 rounding, fp32 matmuls)"


def add_plan_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="which layer in which format (fp8 or fp16), and why: measured on your model, "
        "predicted for a GPU, proven by training, written as files to apply",
        description=(
            "fp8: for every linear layer of your model, its three GEMMs at the M that ran, what "
            "each of torchao's six fp8 casts loses in every recipe (from a few fp32 steps), the "
            "predicted speed-up on the GPU, and a decision with its reason; --gemm plans bare "
            "shapes. fp16: which modules amp-fp16 keeps in fp32. Writes a preset ('ampscope run' "
            "trains it), torchao's module_filter_fn, torchtitan's filter_fqns and the JSON. "
            "See docs/plan.md."
        ),
    )
    p.add_argument("target", choices=["fp8", "fp16"], help="the format to plan for")
    p.add_argument(
        "--model", metavar="SPEC", help="your model: FILE.py:FUNCTION or MODULE:FUNCTION"
    )
    p.add_argument(
        "--gemm",
        action="append",
        default=[],
        metavar="M,K,N",
        help="fp8: plan a bare forward GEMM shape instead of a model (repeatable); the speed "
        "model alone, never timed, numerics unknown",
    )
    p.add_argument(
        "--recipe",
        choices=RECIPE_CHOICES,
        default="auto",
        help="fp8: the recipe to plan (default auto: the best that fits, per layer); the "
        "numerics of every recipe are shown whatever it says",
    )
    p.add_argument(
        "--gpu",
        metavar="NAME",
        help="fp8: the GPU to predict for, as the peak table names it (h100 is the SXM part; "
        "h200, b200, l40s, rtx 4090 ...); default: this machine's GPU, else an H100 SXM, said so",
    )
    p.add_argument(
        "--tokens",
        type=int,
        metavar="N",
        help="fp8: tokens per step (per GPU) of the real training: every layer's M is scaled by "
        "N over the rows of the step measured; the numerics stay the batch's own",
    )
    p.add_argument(
        "--steps",
        type=int,
        metavar="N",
        help=f"the fp32 training steps to watch, on your batches in order (default {STEPS}): a "
        "layer is never called only if no step ran it, and each figure is the worst step's",
    )
    p.add_argument(
        "--verify",
        type=int,
        metavar="STEPS",
        help="train STEPS steps each of the plan and what it is measured against (fp8: amp-bf16, "
        "every layer in fp8, torchao's auto filter; fp16: amp-fp16, amp-bf16), same seed and "
        "batches, and print final loss, gap, skipped steps, step time and verdict",
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="where to write the plan's files (default: runs/plans/<time>-<target>-<model>, "
        "beside the run records)",
    )
    p.add_argument("--device", help="where to run the measured step: auto, cpu, cuda or cuda:N")
    p.add_argument(
        "--runs-dir",
        type=runs_dir_argument,
        help="where run records go (default ./runs or $AMPSCOPE_RUNS_DIR)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the plan as one JSON object on stdout (docs/plan.md); progress on stderr",
    )


def cmd_plan(args: argparse.Namespace) -> int:
    problem = _refused(args)
    if problem is not None:
        return fail(problem)
    if args.gemm:
        return _gemm_mode(args)
    if args.out is not None and (why := _unwritable(args.out)) is not None:
        return fail(
            f"--out {visible(args.out, 0)}: {why}. Accepted: a folder you can write in (made if missing)."
        )
    try:
        spec = check_model_spec(args.model)
    except SpecError as exc:
        return fail(exc)
    model = _absolute(args.model, spec)
    if not is_utf8(model):  # a byte that is no UTF-8: the TOML and Python files cannot name it
        return fail(
            f"--model {visible(args.model, 0)}: the path is not UTF-8 text (a file name in "
            "another encoding?), and the plan's files (TOML, Python) hold only text. Rename "
            "the file or its folder."
        )
    try:
        with stdout_for_json_only(args.json):  # their code's prints: stderr, with --json
            code, plan = _model_mode(args, model)
    except KeyboardInterrupt:
        print("ampscope: plan stopped (Ctrl+C).", file=sys.stderr)
        return 130
    if plan is not None:
        _print(plan, args.json)
    return code


def _refused(args: argparse.Namespace) -> str | None:
    """A combination of flags that cannot be planned, in one paragraph; None when fine."""
    fp8_only = [
        flag
        for flag, given in (
            ("--gemm", bool(args.gemm)),
            ("--recipe", args.recipe != "auto"),
            ("--gpu", args.gpu is not None),
            ("--tokens", args.tokens is not None),
        )
        if given
    ]
    if args.target == "fp16" and fp8_only:
        return (
            f"plan fp16 takes no {fp8_only[0]}: an fp16 plan keeps the modules whose values leave "
            "fp16's range in fp32, whatever the shapes and the GPU. Accepted: plan fp16 --model "
            "SPEC [--steps N] [--verify STEPS] [--out DIR] [--json]; or plan fp8 with those flags."
        )
    if args.gemm and args.model is not None:
        return (
            "--gemm and --model together: --gemm plans bare shapes, --model your model's own. "
            "Accepted: one of them."
        )
    if args.gemm:
        extra = [
            flag
            for flag, given in (
                ("--verify", args.verify is not None),
                ("--tokens", args.tokens is not None),
                ("--steps", args.steps is not None),
                ("--out", args.out is not None),
                ("--device", args.device is not None),
            )
            if given
        ]
        if extra:
            return (
                f"--gemm with {extra[0]}: a bare shape has no model to train, measure or write "
                "files for; give M as the rows you will train with. Accepted: plan fp8 --gemm "
                "M,K,N [--gemm ...] [--gpu NAME] [--recipe R] [--json]."
            )
        return None
    if args.model is None:
        shape = " or --gemm M,K,N" if args.target == "fp8" else ""
        return f"plan {args.target} needs a model: --model FILE.py:FUNCTION (docs/model.md){shape}."
    if args.steps is not None and not 1 <= args.steps <= MAX_STEPS:
        return (
            f"--steps {args.steps}: not a number of steps to watch. Accepted: a whole number of "
            f"fp32 training steps from 1 to {MAX_STEPS:,} (default {STEPS}); the plan watches "
            "that many steps of your batches, in order, before it decides."
        )
    if args.tokens is not None and not 1 <= args.tokens <= MAX_ROWS:
        return (
            f"--tokens {args.tokens}: accepted: a whole number of tokens a step per GPU, from 1 "
            f"to {MAX_ROWS:,} (the most rows a GEMM is planned at, as --gemm's M)."
        )
    if args.verify is not None and not 1 <= args.verify <= MAX_VERIFY_STEPS:
        return (
            f"--verify {args.verify}: accepted: a whole number of training steps from 1 to "
            f"{MAX_VERIFY_STEPS:,}."
        )
    return None


def _unwritable(out: Path) -> str | None:
    """Why the plan's files could not be written in ``out``, known before the minutes of
    measuring (the folder is made only once there is a plan to write), or None."""
    there = next((p for p in (out, *out.absolute().parents) if p.exists()), None)
    if there is None:
        return None
    if not there.is_dir():
        return "it is a file, not a folder" if there == out else f"{visible(there, 0)} is a file"
    if not os.access(there, os.W_OK | os.X_OK):
        return (
            "the folder is not writable" if there == out else f"{visible(there, 0)} is not writable"
        )
    return None


def parse_gemm(text: str) -> tuple[int, int, int]:
    """``M,K,N`` as three positive integers; ValueError naming what is wrong."""
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 3 or any(v < 1 or v > MAX_ROWS for v in values):
        raise ValueError(
            f"--gemm {text}: not a GEMM shape. Accepted: M,K,N, three whole numbers from 1 to "
            f"{MAX_ROWS:,} (the forward GEMM's rows, inner and output dimensions: --gemm 8192,4096,14336)."
        )
    m, k, n = values
    return m, k, n


def _gemm_mode(args: argparse.Namespace) -> int:
    try:
        shapes = [parse_gemm(text) for text in args.gemm]
        target = _target_without_model(args.gpu)
    except (ValueError, UnknownGpu) as exc:
        return fail(exc)
    machine, source = target
    plan = gemm_plan(shapes, machine, args.recipe, source)
    _print(plan, args.json)
    return 0


def _target_without_model(name: str | None) -> tuple[Any, str]:
    """--gemm's GPU: --gpu, else this machine's (only then is torch imported), else assumed."""
    if name is not None:
        return datasheet_machine(find_gpu(name)), f"--gpu {name}"
    from ampscope.engine.plan import choose_gpu, this_gpu

    chosen = choose_gpu(None, this_gpu())
    return chosen.machine, chosen.source


def _model_mode(args: argparse.Namespace, model: str) -> tuple[int, Plan | None]:
    """Measure, decide, write, verify: the exit code and the plan (None: refused)."""
    import torch

    from ampscope.cli.model_memory import Interrupted, left_early, os_exit_said, refuse
    from ampscope.engine.plan import choose_gpu, plan_fp8, plan_fp16, this_gpu
    from ampscope.engine.plan.capture import build
    from ampscope.engine.workloads.user_code import UserCodeError

    try:
        device = _device(args.device, torch)
    except ValueError as exc:
        return fail(exc), None
    here = this_gpu() if device.type == "cuda" else None
    try:
        target = choose_gpu(args.gpu, here) if args.target == "fp8" else None
    except UnknownGpu as exc:
        return fail(exc), None
    steps = args.steps or STEPS
    what = "one fp32 training step" if steps == 1 else f"{steps} fp32 training steps"
    say(f"measuring {what} of {visible(model, 300)} on {device} ...")
    try:
        with os_exit_said(model):
            workload = build(model, device)
            try:
                if target is not None:
                    timer = _timer() if target.here else None
                    plan, capture = plan_fp8(
                        workload, target, args.recipe, args.tokens, timer, steps
                    )
                    linears = capture.linears
                    bf16_instead = False
                else:
                    plan, bf16_instead = plan_fp16(workload, steps)
                    linears = []
            except ConfigError:
                raise
            except Exception as exc:  # noqa: BLE001 - their model's step: their error
                raise workload.first_step_failure(exc) from None
    except SystemExit as exc:
        return refuse(left_early(model, exc)), None
    except Interrupted as exc:
        return fail(exc, 130), None
    except (UserCodeError, ConfigError) as exc:
        return refuse(exc), None
    plan.model = model
    folder = args.out or plan_files.plan_dir(
        args.runs_dir or records.default_runs_dir(), args.target, workload.name
    )
    fp8_hardware = here is not None and here[1] >= MIN_CAPABILITY
    where = plan_files.Where(cuda=device.type == "cuda", fp8_hardware=fp8_hardware)
    name = f"plan-{args.target}-{records.safe_file_name(workload.name)}"
    try:
        plan_files.write(plan, folder, name, where, linears, bf16_instead)
    except OSError as exc:
        return fail(
            f"cannot write the plan's files in {folder} ({exc.strerror or exc}); --out DIR."
        ), None
    code = 0
    if args.verify:
        code = _verify(args, plan, model, device, workload, folder, fp8_hardware)
        records.write_json(Path(plan.files.json or folder / plan_files.JSON_FILE), _builtins(plan))
    return code, plan


def _verify(
    args: argparse.Namespace,
    plan: Plan,
    model: str,
    device: Any,
    workload: Any,
    folder: Path,
    fp8_hardware: bool,
) -> int:
    """Train the variants; put the rows in ``plan.verify``; 1 when the plan's own run failed."""
    from ampscope.engine.plan import verify

    preset = Path(plan.files.preset or folder / plan_files.PRESET_FILE)
    if args.target == "fp8":
        # --recipe's, else torchao's default (tensorwise); its auto filter has no rule for
        # rowwise_with_gw_hp, whose rowwise one stands in for it.
        main = "tensorwise" if args.recipe == "auto" else args.recipe
        auto_recipe = "rowwise" if main == "rowwise_with_gw_hp" else main
        eligible = [layer.name for layer in plan.layers if layer.gemm is not None]
        auto = verify.auto_filter_layers(workload.model, auto_recipe, eligible)
        variants = verify.fp8_variants(model, args.verify, device, preset, main, auto, auto_recipe)
        baseline = variants[0].name
    else:
        variants = verify.fp16_variants(model, args.verify, device, preset)
        baseline = variants[-1].name
    if device.type != "cuda":
        plan.notes.append(CPU_TIMES.format(fp8=EMULATED if args.target == "fp8" else ""))
    elif args.target == "fp8" and not fp8_hardware:
        plan.notes.append(
            "this GPU has no fp8 Tensor Cores: fp8 ran emulated, its step times are no fp8 GPU's"
        )
    say(
        f"verifying: {len(variants)} runs of {args.verify} steps each, records in {folder / 'verify'}"
    )
    ran = verify.run_variants(variants, folder / "verify", _progress)
    outcomes = [Outcome(r.variant.name, r.variant.preset, r.record, r.variant.skip) for r in ran]
    plan.verify = verify_rows(outcomes, baseline)
    mine = next((r for r in plan.verify if r.name == "the plan"), None)
    return 1 if mine is not None and mine.status == "failed" else 0


def _progress(name: str, event: ev.Event) -> None:
    if isinstance(event, ev.DoneEvent):
        loss = f", final loss {event.loss_final:.4f}" if event.loss_final is not None else ""
        say(f"  {name}: {event.status}{loss}")
    elif isinstance(event, ev.ErrorEvent):
        say(f"  {name}: {visible(event.message, 500)}")


def _timer() -> Any:
    from ampscope.engine.plan.timing import time_gemms

    def timed(shapes: list[tuple[int, int, int]]) -> Any:
        say(f"timing {len(shapes)} GEMM shape(s) on this GPU (bf16, tensorwise, rowwise) ...")
        return time_gemms(shapes)

    return timed


def _device(text: str | None, torch: Any) -> Any:
    if text in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text == "cpu" or text == "cuda" or (text.startswith("cuda:") and text[5:].isdigit()):
        if text.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"--device {text}: this machine has no CUDA GPU. Accepted: cpu, auto.")
        return torch.device(text)
    raise ValueError(f"--device {text}: not a device. Accepted: auto, cpu, cuda or cuda:N.")


def _absolute(text: str, spec: Any) -> str:
    """A file spec with the file's absolute path: the preset trains it from any folder."""
    if spec.source != "file":
        return text
    return f"{spec.path.resolve()}:{spec.function}"


def _builtins(plan: Plan) -> Any:
    from ampscope.core.plan.report import to_builtins

    return to_builtins(plan)


def _print(plan: Plan, as_json: bool) -> None:
    if as_json:
        print(to_json(plan))
        return
    width = output_width()
    text = render(plan, width)
    lines = [text]
    if plan.verify:
        lines += ["", f"verify ({len(plan.verify)} runs, same seed and batches):"]
        lines += table(plan.verify)
    lines += files_lines(plan)
    print("\n".join(lines))


def say(text: str) -> None:
    print(f"ampscope: {text}", file=sys.stderr, flush=True)
