"""The machine check (``ampscope doctor --bench``): its result, its verdicts, where it is kept.

Torch-free, so the dashboard reads a stored check without importing torch, and every verdict
rule is a plain function over figures that tests feed with fakes. The engine measures
(``ampscope.engine.checks.machine_bench``), ``machine_verdicts`` judges, this module holds the result
and keeps it.

A check is kept per host, one entry per device name, under the user's config folder: a run
on a device of that name then shows its MFU against the measured peak as well as against the
datasheet. A check remembers the torch and driver it ran on, because a new torch (other
kernels) or driver (other clocks) can change what the device delivers.
"""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ampscope.core.machine.hardware import Gpu, identify, is_mig, peak_tflops
from ampscope.core.presets import user_config_dir
from ampscope.core.records.files import read_json
from ampscope.core.units import of_measured

if TYPE_CHECKING:
    from ampscope.core.records import RunRecord

MATMUL_FORMATS_GPU = ("fp32", "tf32", "bf16", "fp16", "fp8")
MATMUL_FORMATS_CPU = ("fp32", "bf16", "fp16")
RUN_COMMAND = "ampscope doctor --bench"


@dataclass
class MatmulFigure:
    """The best of a format's sweep: TFLOP/s at the shape that gave it, beside the datasheet."""

    tflops: float
    shape: list[int]  # m, n, k
    datasheet_tflops: float | None = None
    ratio: float | None = None


@dataclass
class GpuState:
    """What NVML says can hold a GPU back: power limit, clock throttling, the PCIe link."""

    power_limit_w: float | None = None
    power_max_w: float | None = None  # the board's default limit
    throttle: list[str] = field(default_factory=list)  # decode_throttle_reasons' names
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_max_gen: int | None = None
    pcie_max_width: int | None = None


@dataclass
class MachineCheck:
    """One run of the check on one device; ``to_json`` is ``doctor --bench --json``'s shape."""

    device: str  # torch's device name, or the CPU's model name
    kind: str  # "cuda" or "cpu"
    matmul: dict[str, MatmulFigure]
    memory_gbps: float | None = None
    memory_datasheet_gbps: float | None = None
    memory_what: str = ""
    h2d_gbps: float | None = None
    allreduce_busbw_gbps: float | None = None
    allreduce_note: str | None = None
    verdicts: list[str] = field(default_factory=list)
    when: str = ""  # ISO 8601, UTC
    torch: str = ""
    driver: str | None = None
    host: str = ""
    threads: int | None = None  # the CPU's matmul threads
    seconds: float | None = None
    cpu_units: list[str] = field(default_factory=list)
    fp32_one_thread_tflops: float | None = None  # a CPU with several threads: fp32 on one
    load_average: float | None = None  # the host's 1-minute load when the check ran
    gpu_state: GpuState | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "kind": self.kind,
            "matmul": {name: asdict(fig) for name, fig in self.matmul.items()},
            "memory": {
                "gbps": self.memory_gbps,
                "datasheet_gbps": self.memory_datasheet_gbps,
                "what": self.memory_what,
                "h2d_gbps": self.h2d_gbps,
                "allreduce_busbw_gbps": self.allreduce_busbw_gbps,
                "allreduce_note": self.allreduce_note,
            },
            "verdicts": list(self.verdicts),
            "when": self.when,
            "torch": self.torch,
            "driver": self.driver,
            "host": self.host,
            "threads": self.threads,
            "seconds": self.seconds,
            "cpu_units": list(self.cpu_units),
            "fp32_one_thread_tflops": self.fp32_one_thread_tflops,
            "load_average": self.load_average,
            "gpu_state": asdict(self.gpu_state) if self.gpu_state else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MachineCheck:
        """Raises KeyError, TypeError or ValueError on a file that is not a check."""
        memory = data.get("memory") or {}
        state = data.get("gpu_state")
        return cls(
            device=str(data["device"]),
            kind=str(data.get("kind", "cpu")),
            matmul={
                str(name): MatmulFigure(
                    tflops=float(fig["tflops"]),
                    shape=[int(x) for x in fig.get("shape") or []],
                    datasheet_tflops=_float(fig.get("datasheet_tflops")),
                    ratio=_float(fig.get("ratio")),
                )
                for name, fig in dict(data["matmul"]).items()
            },
            memory_gbps=_float(memory.get("gbps")),
            memory_datasheet_gbps=_float(memory.get("datasheet_gbps")),
            memory_what=str(memory.get("what") or ""),
            h2d_gbps=_float(memory.get("h2d_gbps")),
            allreduce_busbw_gbps=_float(memory.get("allreduce_busbw_gbps")),
            allreduce_note=memory.get("allreduce_note"),
            verdicts=[str(v) for v in data.get("verdicts") or []],
            when=str(data.get("when") or ""),
            torch=str(data.get("torch") or ""),
            driver=data.get("driver"),
            host=str(data.get("host") or ""),
            threads=data.get("threads"),
            seconds=_float(data.get("seconds")),
            cpu_units=[str(u) for u in data.get("cpu_units") or []],
            fp32_one_thread_tflops=_float(data.get("fp32_one_thread_tflops")),
            load_average=_float(data.get("load_average")),
            gpu_state=GpuState(**state) if isinstance(state, dict) else None,
        )


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


# ---------------------------------------------------------------------------------------------
# Datasheet figures


def with_datasheet(
    device: str,
    kind: str,
    figures: dict[str, MatmulFigure],
    power_w: float | None,
    multiprocessors: int | None = None,
) -> Gpu | None:
    """Fill each figure's datasheet entry and ratio in place; the table's row (or None).

    A MIG slice is held to its share of the chip's peak (``hardware.peak_tflops``), and gets
    no memory figure: its share of the bandwidth is not its share of the multiprocessors."""
    gpu = identify(device, power_w) if kind == "cuda" else None
    for fmt, fig in figures.items():
        peak = peak_tflops(device, fmt, power_w, multiprocessors)[0] if gpu is not None else None
        fig.datasheet_tflops = round(peak, 1) if peak else None
        fig.ratio = fig.tflops / peak if peak else None
    return None if gpu is not None and is_mig(device) else gpu


def allreduce_busbw(algbw_gbps: float, ranks: int) -> float:
    """NCCL's bus bandwidth of an all-reduce: the algorithm bandwidth times 2(n-1)/n, which
    makes the figure comparable with the link's speed whatever the number of GPUs."""
    return algbw_gbps * 2 * (ranks - 1) / ranks


# ---------------------------------------------------------------------------------------------
# Storage


def checks_dir() -> Path:
    return user_config_dir() / "machine"


def host_name() -> str:
    return socket.gethostname() or "localhost"


def check_path(host: str | None = None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host or host_name())
    return checks_dir() / f"{safe}.json"


def load_all(host: str | None = None) -> tuple[dict[str, MachineCheck], str | None]:
    """This host's checks by device name, and a problem with the file (None if fine or absent)."""
    path = check_path(host)
    try:
        data = read_json(path)
        checks = {name: MachineCheck.from_json(c) for name, c in dict(data["checks"]).items()}
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return {}, f"{path} cannot be read ({type(exc).__name__}: {exc}); run {RUN_COMMAND} again"
    return checks, None


def save(check: MachineCheck) -> Path:
    """Keep ``check`` as its host's entry for its device, beside the host's other devices."""
    checks, _ = load_all(check.host or None)
    checks[check.device] = check
    path = check_path(check.host or None)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    payload = {"version": 1, "checks": {name: c.to_json() for name, c in checks.items()}}
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)
    return path


def find(device: str, host: str | None = None) -> MachineCheck | None:
    return load_all(host)[0].get(device)


def measured_peak(
    device: str, fmt: str, host: str | None = None
) -> tuple[float | None, str | None]:
    """This machine's measured matmul TFLOP/s for a run's compute format on ``device``, and a
    note saying when it was measured (None, None when there is no check)."""
    check = find(device)
    if check is None:
        return None, None
    fig = check.matmul.get(fmt)
    if fig is None:
        return None, f"the machine check of {check.when[:10]} has no {fmt} figure"
    return fig.tflops, f"{fmt} matmul measured by {RUN_COMMAND} on {check.when[:10]}"


def mfu_measured(run: RunRecord) -> float | None:
    """MFU against the measured peak: the engine's ``done`` says it; a watched loop's record
    has the measured peak in its ``hello``, so it is worked out from there."""
    d = run.done
    if d is None or d.mfu_measured is not None:
        return d.mfu_measured if d is not None else None
    measured = run.hello.measured_tflops if run.hello is not None else None
    return of_measured(d.tflops, measured, d.world_size)


def nvidia_driver() -> str | None:
    """The loaded NVIDIA driver's version, read from /proc (no NVML, no torch)."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    found = re.search(r"Kernel Module(?: for \S+)?\s+([0-9][0-9.]+)", text)
    return found.group(1) if found else None


def installed_torch() -> str | None:
    """torch's version from its metadata (importing torch takes seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def staleness(check: MachineCheck, torch: str | None, driver: str | None) -> str | None:
    """Why a stored check may no longer hold: it ran on another torch or driver."""
    changed = []
    if torch and check.torch and torch != check.torch:
        changed.append(f"torch {check.torch} (now {torch})")
    if driver and check.driver and driver != check.driver:
        changed.append(f"driver {check.driver} (now {driver})")
    if not changed:
        return None
    return (
        f"measured on {' and '.join(changed)}: the figures may have changed; run "
        f"{RUN_COMMAND} again"
    )
