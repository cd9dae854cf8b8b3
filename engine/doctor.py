"""``ampscope doctor``: what this machine offers for precision and compile experiments."""

from __future__ import annotations

import importlib.util
import json
import platform
import shutil
import sys
import warnings
from typing import Any

from ampscope.core.fp8_recipes import INSTALL_HINT


def machine_report() -> dict[str, Any]:
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch

    from ampscope.core.peaks import identify
    from ampscope.engine.device import cpu_has_fast_bf16, cpu_has_fast_fp16, cpu_name
    from ampscope.engine.telemetry import nvml_report

    report: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": str(torch.__version__),
        "cuda_build": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "cpu": {
            "name": cpu_name(),
            "capability": torch.backends.cpu.get_cpu_capability(),
            "fast_bf16": cpu_has_fast_bf16(),
            "fast_fp16": cpu_has_fast_fp16(),
        },
        "gpus": [],
    }
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            cc = (p.major, p.minor)
            peaks = identify(p.name)
            report["gpus"].append(
                {
                    "index": i,
                    "name": p.name,
                    "compute_capability": f"{p.major}.{p.minor}",
                    "memory_bytes": p.total_memory,
                    "uuid": str(getattr(p, "uuid", "")) or None,
                    "bf16": cc >= (8, 0),
                    "tf32": cc >= (8, 0),
                    "fp8": cc >= (8, 9),
                    "peak_table_entry": peaks.model if peaks else None,
                }
            )
    report["nvml"] = nvml_report()
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    triton = importlib.util.find_spec("triton") is not None
    report["compile"] = {
        "cpu": {
            "ok": compiler is not None,
            "why": f"C compiler {compiler}" if compiler else "no C compiler (install gcc)",
        },
        "cuda": {
            "ok": torch.cuda.is_available() and triton,
            "why": "Triton installed"
            if triton
            else "Triton is not installed (comes with CUDA builds of torch)",
        },
    }
    report["torchao"] = _torchao_version()
    return report


def _torchao_version() -> str | None:
    """torchao's version from its metadata: importing it takes seconds and is noisy."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchao")
    except PackageNotFoundError:
        return None


def doctor(as_json: bool = False) -> int:
    report = machine_report()
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
    for where, c in report["compile"].items():
        lines.append(f"torch.compile on {where}: {yes[c['ok']]} ({c['why']})")
    ao = report["torchao"]
    lines.append(
        f"fp8 training: torchao {ao}"
        if ao
        else f"fp8 training: torchao is not installed ({INSTALL_HINT})"
    )
    print("\n".join(lines))
    return 0
