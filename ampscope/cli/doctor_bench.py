"""``ampscope doctor --bench``: the machine check's front-end, a line per figure as it lands."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from ampscope.cli.output import fail
from ampscope.core.machine.check import MachineCheck, check_path, save
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
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="with --bench: the device to measure (default: GPU 0 when there is one, else the CPU)",
    )
    doctor.add_argument(
        "--quick",
        action="store_true",
        help="with --bench: small shapes only, a few seconds (a smoke test; the figures are low "
        "and are not kept)",
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


def and_list(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def cmd_machine_check(
    args: argparse.Namespace,
    measure: Measure | None = None,
    cuda_available: Callable[[], bool] | None = None,
) -> int:
    """``doctor --bench``; ``measure`` takes the figures (the engine's ``run_check`` unless
    given) and ``cuda_available`` says whether torch sees a GPU (torch's answer unless given)."""
    problem = check_options(args)
    if problem:
        return fail(problem)
    try:
        return machine_check(args, measure, cuda_available)
    except KeyboardInterrupt:  # the kept file is written whole or not at all (check.save)
        return fail("machine check stopped (Ctrl+C) before it finished: nothing kept.", 130)


def machine_check(
    args: argparse.Namespace,
    measure: Measure | None = None,
    cuda_available: Callable[[], bool] | None = None,
) -> int:
    """Measure, keep (unless --quick), print: a line per figure as it lands, then verdicts."""
    if args.bench_device == "cuda":
        if cuda_available is None:
            import torch

            cuda_available = torch.cuda.is_available
        if not cuda_available():
            return fail(
                "--bench-device cuda: torch sees no CUDA GPU here (CPU-only torch, or no "
                "driver); use --bench-device cpu or auto"
            )
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
