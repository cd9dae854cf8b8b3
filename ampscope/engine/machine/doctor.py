"""What this machine offers for precision and compile experiments, as one report
(``ampscope doctor`` prints it: cli/doctor.py)."""

from __future__ import annotations

import importlib.util
import platform
import shutil
import sys
import sysconfig
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

TryCompile = bool | Literal["cpu", "cuda"]
"""``--try-compile``: every device (True), one of them, or none."""


def machine_report(
    try_compile: TryCompile = False, torchao: Callable[[], str | None] | None = None
) -> dict[str, Any]:
    """What ``ampscope doctor`` prints; ``torchao`` says torchao's version (None: not
    installed), read from its metadata unless given."""
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch

    from ampscope.core.machine.hardware import identify
    from ampscope.engine.device import cpu_has_fast_bf16, cpu_has_fast_fp16, cpu_name
    from ampscope.engine.telemetry import nvml_report

    report: dict[str, Any] = {
        "python": sys.version.split()[0],
        # not platform.platform(): it asks a `uname -p` child for the processor's name
        "platform": f"{platform.system()}-{platform.release()}-{platform.machine()}",
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
    report["compile"] = compile_report(torch.cuda.is_available(), try_compile)
    report["torchao"] = (torchao or _torchao_version)()
    report["machine_checks"] = kept_checks(
        str(torch.__version__), report["nvml"].get("driver_version")
    )
    return report


def kept_checks(torch_version: str, driver: str | None) -> list[dict[str, Any]]:
    """What ``doctor --bench`` kept for this host: each device, when, and whether it is stale."""
    from ampscope.core.machine import check

    checks, problem = check.load_all()
    if problem:
        return [{"device": None, "when": None, "stale": problem}]
    return [
        {"device": c.device, "when": c.when, "stale": check.staleness(c, torch_version, driver)}
        for c in checks.values()
    ]


@dataclass(frozen=True)
class Toolchain:
    """What inductor needs here to build kernels at run time: a C compiler, Python's headers
    (Python.h in ``include``), and Triton for CUDA."""

    compiler: str | None
    include: Path
    headers: bool
    triton: bool

    @classmethod
    def here(cls) -> Toolchain:
        include = Path(sysconfig.get_paths()["include"])
        return cls(
            shutil.which("cc") or shutil.which("gcc") or shutil.which("clang"),
            include,
            (include / "Python.h").is_file(),
            importlib.util.find_spec("triton") is not None,
        )


Attempt = Callable[[str], str | None]
"""Compile a tiny function on a device: None if it worked, else the failure's first line."""


def compile_report(
    cuda: bool,
    try_compile: TryCompile,
    toolchain: Toolchain | None = None,
    attempt: Attempt | None = None,
) -> dict[str, dict[str, Any]]:
    """Whether torch.compile can work here, per device. ``ok`` is true only once a tiny
    function compiled (``--try-compile``, or ``--try-compile cuda`` for one device: each cold
    compile takes 20-40 s, and a GPU box's first C++ build for the CPU can take as long again);
    null when everything it needs is present but it was not tried; false when a piece is
    missing or the try failed.

    inductor builds C++ (CPU) and Triton (CUDA) kernels at run time, and both need a C
    compiler and Python's headers (Python.h): a machine with torch and Triton but without
    them fails on the first compiled step. ``toolchain`` is this machine's unless given;
    ``attempt`` is ``try_compiling`` unless given.
    """
    tools = toolchain or Toolchain.here()
    attempt = attempt or try_compiling
    compiler = tools.compiler
    header = tools.include / "Python.h"
    missing = []
    if compiler is None:
        missing.append("no C compiler (install gcc)")
    if not tools.headers:
        missing.append(f"no Python.h in {header.parent} (install python3-dev)")
    found = f"C compiler {compiler}, {header}" if not missing else "; ".join(missing)
    report = {"cpu": _verdict("cpu", missing, found, try_compile, attempt)}
    if not cuda:
        report["cuda"] = {"ok": False, "why": "no CUDA GPU visible to torch"}
    elif not tools.triton:
        report["cuda"] = {"ok": False, "why": "Triton is not installed (comes with CUDA torch)"}
    else:
        report["cuda"] = _verdict("cuda", missing, f"Triton, {found}", try_compile, attempt)
    return report


def _verdict(
    device: str, missing: list[str], found: str, try_compile: TryCompile, attempt: Attempt
) -> dict[str, Any]:
    if missing:
        return {"ok": False, "why": found}
    if try_compile is not True and try_compile != device:
        return {"ok": None, "why": f"{found}; not tried (ampscope doctor --try-compile {device})"}
    failed = attempt(device)
    if failed is not None:
        return {"ok": False, "why": f"a tiny function did not compile: {failed}"}
    return {"ok": True, "why": f"a tiny function compiled and ran ({found})"}


def try_compiling(device: str, compile: Callable[..., Any] | None = None) -> str | None:
    """Compile and run a tiny function on ``device`` (20-40 s cold) with ``compile``
    (``torch.compile`` unless given); None if it worked, else the failure's first line."""
    import torch

    compile = compile or torch.compile

    def tiny(x: torch.Tensor) -> torch.Tensor:
        return (x * 2.0).sin() + 1.0

    try:
        x = torch.arange(64, dtype=torch.float32, device=device)
        got = compile(tiny)(x)
        # Compiled sin may differ from eager's by an ulp (1.2e-7 near 1), which the + 1.0
        # turns into that much absolute error where the result is near 0: allclose's default
        # atol of 1e-8 then calls a working compiler broken (seen on a 2-core CPU).
        if not torch.allclose(got, tiny(x), rtol=1e-5, atol=1e-6):
            return "the compiled function gave different numbers from the eager one"
    except Exception as exc:  # noqa: BLE001 - every failure is the finding
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"{type(exc).__name__}: {first}"[:300]
    return None


def _torchao_version() -> str | None:
    """torchao's version from its metadata: importing it takes seconds and is noisy."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchao")
    except PackageNotFoundError:
        return None
