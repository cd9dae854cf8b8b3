"""``ampscope doctor --bench``: the machine check's front-end, a line per figure as it lands."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from ampscope.cli.output import fail
from ampscope.core.machine.check import MachineCheck, check_path, save
from ampscope.core.presets.preset import DEVICE_PATTERN
from ampscope.core.text import visible

Measure = Callable[..., MachineCheck]
"""What takes the figures: ``ampscope.engine.machine.bench.run_check``'s arguments and result."""


def add_bench_options(doctor: argparse.ArgumentParser) -> None:
    doctor.add_argument(
        "--bench",
        action="store_true",
        help="measure what this machine delivers: matmul TFLOP/s per number format and memory "
        "bandwidth, beside the datasheet, with verdicts (under a minute and a half); the "
        "results are kept, and runs then show MFU against the measured peak too",
    )
    doctor.add_argument(
        "--bench-device",
        type=bench_device,
        default="auto",
        metavar="{auto,cpu,cuda,cuda:N}",
        help="with --bench: the device to measure (default: GPU 0 when there is one, else the CPU)",
    )
    doctor.add_argument(
        "--quick",
        action="store_true",
        help="with --bench: small shapes only, a few seconds (a smoke test; the figures are low "
        "and are not kept)",
    )


def bench_device(text: str) -> str:
    """``--bench-device``'s value: auto, cpu, cuda or cuda:N, as ``run --device`` takes."""
    if DEVICE_PATTERN.match(text):
        return text
    raise argparse.ArgumentTypeError(
        f"{visible(repr(text), 80)} is not a device. Accepted: auto, cpu, cuda (GPU 0) or cuda:N"
    )


def check_options(args: argparse.Namespace) -> str | None:
    """The message for options that need --bench given without it, else None."""
    alone = [
        flag
        for flag, given in (
            ("--quick", args.quick),
            ("--bench-device", args.bench_device != "auto"),
        )
        if given
    ]
    if alone and not args.bench:
        given = " and ".join(alone)
        verb, them = ("apply", "them") if len(alone) > 1 else ("applies", "it")
        return (
            f"{given} only {verb} to the machine check: add --bench (for example 'ampscope "
            f"doctor --bench {alone[0]}{' cpu' if alone[0] == '--bench-device' else ''}'), or "
            f"leave {them} out for the plain report"
        )
    if args.bench and args.try_compile:
        return (
            "--try-compile and --bench each take a while and measure different things: run "
            "'ampscope doctor --try-compile' and 'ampscope doctor --bench' one after the other"
        )
    return None


def missing_gpu(device: str, gpu_count: Callable[[], int] | None = None) -> str | None:
    """Why ``--bench-device cuda`` or ``cuda:N`` cannot be measured here, or None.
    ``gpu_count`` is how many GPUs torch sees (torch's answer unless given)."""
    if gpu_count is None:
        import torch

        gpu_count = torch.cuda.device_count
    count = gpu_count()
    if count == 0:
        return (
            f"--bench-device {device}: torch sees no CUDA GPU here (CPU-only torch, or no "
            "driver); use --bench-device cpu or auto"
        )
    _, _, number = device.partition(":")
    if number and int(number) >= count:
        seen = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
        return (
            f"--bench-device {device}: torch sees {count} GPU{'s' if count > 1 else ''} here "
            f"({seen}); name one of them, or leave the option out for GPU 0"
        )
    return None


def and_list(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def cmd_machine_check(
    args: argparse.Namespace,
    measure: Measure | None = None,
    gpu_count: Callable[[], int] | None = None,
) -> int:
    """``doctor --bench``; ``measure`` takes the figures (the engine's ``run_check`` unless
    given) and ``gpu_count`` says how many GPUs torch sees (torch's answer unless given)."""
    problem = check_options(args)
    if problem:
        return fail(problem)
    try:
        return machine_check(args, measure, gpu_count)
    except KeyboardInterrupt:  # the kept file is written whole or not at all (check.save)
        return fail("machine check stopped (Ctrl+C) before it finished: nothing kept.", 130)


def machine_check(
    args: argparse.Namespace,
    measure: Measure | None = None,
    gpu_count: Callable[[], int] | None = None,
) -> int:
    """Measure, keep (unless --quick), print: a line per figure as it lands, then verdicts."""
    if args.bench_device.startswith("cuda"):
        problem = missing_gpu(args.bench_device, gpu_count)
        if problem:
            return fail(problem)
    out = sys.stderr if args.json else sys.stdout

    def said(what: str, line: str) -> None:
        print(visible(line), file=out, flush=True)

    if measure is None:
        from ampscope.engine.machine.bench import run_check

        measure = run_check
    check = measure(args.bench_device, quick=args.quick, on_figure=said)
    where = None
    if not args.quick:
        try:
            where = save(check)
        except OSError as exc:  # the figures still print; runs just cannot read them later
            print(
                visible(
                    f"ampscope: the results could not be kept in {check_path()} ({exc}); "
                    "runs will not show MFU against them. Check that the folder is writable "
                    "(or set XDG_CONFIG_HOME)."
                ),
                file=sys.stderr,
            )
    if args.json:
        data = check.to_json()
        data["kept_at"] = str(where) if where else None
        print(json.dumps(data, indent=2))
        return 0
    for line in check.verdicts:
        print(visible(f"- {line}"))
    if check.allreduce_note:
        print(visible(f"- {check.allreduce_note}"))
    kept = f"kept in {where}" if where else "not kept" + (" (--quick)" if args.quick else "")
    busy = [fmt for fmt in check.matmul if not check.trusted(fmt)]
    if where and busy:
        kept += (
            f" (runs are not read against {and_list(busy)}: the machine was too busy to "
            f"measure {'it' if len(busy) == 1 else 'them'})"
        )
    print(visible(f"done in {check.seconds:.0f} s; {kept}"))
    return 0
