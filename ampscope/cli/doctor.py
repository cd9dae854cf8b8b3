"""``ampscope doctor``: the machine's report (engine/machine/doctor.py) as a person reads it,
and the one command to run for each thing it could not confirm."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ampscope.core.presets.fp8_recipes import INSTALL_HINT
from ampscope.core.text import visible
from ampscope.engine.machine.doctor import TryCompile, machine_report


def next_commands(report: dict[str, Any]) -> list[tuple[str, str]]:
    """(what doctor could not confirm, the one command that would), in the report's order.

    A finding that is settled, yes or no (no GPU in a CPU-only torch, a missing compiler
    named with its fix), needs no command; one left open does: a compile not tried, a GPU
    whose driver or NVML did not answer, an MFU peak not known, fp8 without torchao.
    """
    out: list[tuple[str, str]] = []
    if report.get("cuda_build") and not report.get("gpus"):
        out.append(("GPUs: a CUDA torch that sees none", "nvidia-smi"))
    for g in report.get("gpus", []):
        if not g.get("peak_table_entry"):
            out.append(
                (
                    f"MFU on GPU {g['index']} (no peak known for {g['name']})",
                    "ampscope run amp-bf16 --set peak_tflops=<its dense bf16 TFLOP/s>",
                )
            )
    if report.get("gpus") and not report.get("nvml", {}).get("available"):
        out.append(("NVML (GPU power, clocks, utilization)", "nvidia-smi"))
    for where, c in report.get("compile", {}).items():
        if c.get("ok") is None:
            out.append((f"torch.compile on {where}", f"ampscope doctor --try-compile {where}"))
    if not report.get("torchao"):
        out.append(("fp8 training", "pip install torchao"))
    checks = report.get("machine_checks")
    if checks is not None and (not checks or any(c.get("stale") for c in checks)):
        out.append(("what each format delivers here", "ampscope doctor --bench"))
    return out


def doctor(
    as_json: bool = False,
    try_compile: TryCompile = False,
    report_of: Callable[[TryCompile], dict[str, Any]] = machine_report,
) -> int:
    """Print the report (``--json``: as JSON); 0. ``report_of`` reads the machine:
    ``engine.machine.doctor.machine_report`` unless given."""
    report = report_of(try_compile)
    report["next"] = [{"unconfirmed": what, "command": cmd} for what, cmd in next_commands(report)]
    if as_json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    yes = {True: "yes", False: "no"}
    cpu = report["cpu"]
    lines = [
        f"Python {report['python']}  torch {report['torch']}  "
        f"CUDA build {report['cuda_build'] or 'none (CPU-only torch)'}",
        f"CPU: {cpu['name']} ({cpu['capability']}); bf16 units: {yes[cpu['fast_bf16']]}, "
        f"fp16 units: {yes[cpu['fast_fp16']]}",
    ]
    if not report["gpus"]:
        lines.append("GPUs: none visible to torch (runs use the CPU)")
    for g in report["gpus"]:
        lines.append(
            f"GPU {g['index']}: {g['name']}  cc {g['compute_capability']}  "
            f"{g['memory_bytes'] / 2**30:.0f} GiB  bf16 {yes[g['bf16']]}  tf32 {yes[g['tf32']]}  "
            f"fp8 {yes[g['fp8']]}  MFU peak: {g['peak_table_entry'] or 'unknown (set peak_tflops)'}"
        )
    nvml = report["nvml"]
    lines.append(
        "NVML: "
        + (
            "available, driver " + str(nvml.get("driver_version"))
            if nvml.get("available")
            else f"unavailable: {nvml.get('why')}"
        )
    )
    said = {True: "yes", False: "no", None: "untried"}
    for where, c in report["compile"].items():
        lines.append(f"torch.compile on {where}: {said[c['ok']]} ({c['why']})")
    ao = report["torchao"]
    lines.append(
        f"fp8 training: torchao {ao}"
        if ao
        else f"fp8 training: torchao is not installed ({INSTALL_HINT})"
    )
    lines += [visible(line, 400) for line in machine_lines(report.get("machine_checks", []))]
    todo = next_commands(report)
    if todo:
        width = max(len(what) for what, _cmd in todo)
        lines += ["", "Left to confirm, one command each:"]
        lines += [f"  {what:<{width}}  {cmd}" for what, cmd in todo]
    else:
        lines += ["", "Everything above was confirmed on this machine."]
    print("\n".join(lines))
    return 0


def machine_lines(checks: list[dict[str, Any]]) -> list[str]:
    if not checks:
        return [
            "machine check: none kept here (ampscope doctor --bench measures what each format "
            "delivers, under a minute and a half)"
        ]
    return [
        f"machine check: {c['device']} measured {_day(c['when'])}"
        + (f"; {c['stale']}" if c["stale"] else " (ampscope doctor --bench measures again)")
        if c["device"] is not None
        else f"machine check: {c['stale']}"
        for c in checks
    ]


def _day(when: object) -> str:
    """When a kept check ran, to the minute; a kept file whose date is lost says so."""
    text = str(when or "")[:16].replace("T", " ")
    return f"{text} UTC" if text else "on an unknown day"
