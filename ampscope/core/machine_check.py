"""The machine check (``ampscope doctor --bench``): its result, its verdicts, where it is kept.

Torch-free, so the dashboard reads a stored check without importing torch, and every verdict
rule is a plain function over figures that tests feed with fakes. The engine measures
(``ampscope.engine.machine_bench``); this module judges and stores.

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
from typing import Any

from ampscope.core.config import user_config_dir
from ampscope.core.hardware import Gpu, identify, is_mig, peak_tflops

MATMUL_FORMATS_GPU = ("fp32", "tf32", "bf16", "fp16", "fp8")
MATMUL_FORMATS_CPU = ("fp32", "bf16", "fp16")
RUN_COMMAND = "ampscope doctor --bench"

# A dense matmul reaching this share of the datasheet is healthy (an H100 SXM reaches about
# 0.8 in bf16, MAMF-finder style sweeps); below LOW something holds the device back.
TYPICAL_MATMUL = 0.6
LOW_MATMUL = 0.4
TYPICAL_MEMORY = 0.7  # an H200 copies at about 4.3 of its 4.8 TB/s

# Datasheet memory bandwidth, GB/s (the same vendors' datasheets as the peak table).
MEMORY_GBPS: dict[str, float] = {
    "GB200": 8000.0,
    "B200": 8000.0,
    "H200 NVL": 4800.0,
    "H200 SXM": 4800.0,
    "H100 NVL": 3900.0,
    "H100 PCIe": 2000.0,
    "H100 SXM": 3350.0,
    "A100 80GB": 2039.0,
    "A100 40GB": 1555.0,
    "L40S": 864.0,
    "L40": 864.0,
    "L4": 300.0,
    "A10": 600.0,
    "RTX 4090 D": 1008.0,
    "RTX 4090": 1008.0,
    "RTX 3090 Ti": 1008.0,
    "RTX 3090": 936.0,
    "V100S PCIe": 1134.0,
    "V100 PCIe 32GB": 900.0,
    "V100 PCIe 16GB": 900.0,
    "V100 SXM2 32GB": 900.0,
    "V100 SXM2 16GB": 900.0,
    "T4": 320.0,
}

# What one PCIe lane carries per direction, GB/s, after line coding (PCI-SIG figures).
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
TYPICAL_H2D = 0.5  # pinned copies reach 0.7-0.85 of the link; under half points at the host

CPU_UNITS = {
    "bf16": (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16")),
    "fp16": (("amx_fp16", "AMX-FP16"), ("avx512_fp16", "AVX512-FP16")),
}


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
            gpu_state=GpuState(**state) if isinstance(state, dict) else None,
        )


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


# ---------------------------------------------------------------------------------------------
# Datasheet figures


def datasheet_gbps(gpu: Gpu | None) -> float | None:
    return MEMORY_GBPS.get(gpu.model) if gpu is not None else None


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
# Verdicts: each a sentence a person can act on


def pct(ratio: float) -> str:
    return f"{ratio * 100:.0f} %"


def matmul_verdicts(check: MachineCheck) -> list[str]:
    if check.kind == "cpu":
        return cpu_verdicts(check.matmul, check.cpu_units)
    said = []
    typical = [
        (f, fig.ratio) for f, fig in check.matmul.items() if (fig.ratio or 0) >= TYPICAL_MATMUL
    ]
    if typical:  # one line for every healthy format: the ones that are not stand out
        shares = ", ".join(f"{f} {pct(r or 0.0)}" for f, r in typical)
        said.append(
            f"{typical[0][0]} matmul at {pct(typical[0][1] or 0.0)} of the datasheet: typical for "
            "this GPU"
            if len(typical) == 1
            else f"matmul at {shares} of the datasheet: typical for this GPU"
        )
    for fmt, fig in check.matmul.items():
        if fig.ratio is None:
            said.append(
                f"{fmt} matmul {fig.tflops:.3g} TFLOP/s: no datasheet figure for "
                f"'{check.device}' to compare with"
            )
        elif fig.ratio >= TYPICAL_MATMUL:
            continue
        elif fig.ratio >= LOW_MATMUL:
            said.append(
                f"{fmt} matmul at {pct(fig.ratio)} of the datasheet: below the usual "
                f"{pct(TYPICAL_MATMUL)}-85 %; see the power, clock and other-process lines"
            )
        else:
            said.append(
                f"{fmt} matmul at {pct(fig.ratio)} of the datasheet: far below normal; another "
                "process on the GPU, a power cap or throttled clocks (nvidia-smi -q -d "
                "PERFORMANCE,POWER)"
            )
    return said


def cpu_verdicts(matmul: dict[str, MatmulFigure], units: list[str]) -> list[str]:
    """How bf16 and fp16 compare with fp32 on this CPU, and why: the units it has or lacks."""
    fp32 = matmul.get("fp32")
    said = []
    for fmt, candidates in CPU_UNITS.items():
        fig = matmul.get(fmt)
        if fig is None or fp32 is None or fp32.tflops <= 0:
            continue
        x = fig.tflops / fp32.tflops
        have = [label for flag, label in candidates if flag in units]
        names = " or ".join(label for _, label in candidates)
        if not have:
            units_text = "AMX or AVX512-BF16" if fmt == "bf16" else "AMX-FP16 or AVX512-FP16"
            said.append(
                f"{fmt} matmul runs at {x:.2g}x fp32 here: this CPU has no {units_text} units"
                + (f", so {fmt} presets train slower than fp32 on it" if x < 1 else "")
            )
        elif x >= 1:
            said.append(f"{fmt} matmul runs at {x:.2g}x fp32 here, on its {have[0]} units")
        else:
            said.append(
                f"{fmt} matmul runs at {x:.2g}x fp32 here although this CPU has {have[0]} "
                f"units: torch may not use them (check torch.backends.cpu.get_cpu_capability(); "
                f"looked for {names})"
            )
    return said


def memory_verdicts(check: MachineCheck, link_gbps: float | None) -> list[str]:
    said = []
    if check.memory_gbps is not None and check.memory_datasheet_gbps:
        ratio = check.memory_gbps / check.memory_datasheet_gbps
        said.append(
            f"memory copy at {pct(ratio)} of the datasheet: typical"
            if ratio >= TYPICAL_MEMORY
            else f"memory copy at {pct(ratio)} of the datasheet: low (usual: "
            f"{pct(TYPICAL_MEMORY)} or more); ECC errors, memory clocks or another process"
        )
    if check.h2d_gbps is not None and link_gbps and check.h2d_gbps < TYPICAL_H2D * link_gbps:
        said.append(
            f"pinned host-to-device at {check.h2d_gbps:.3g} GB/s, under half of what the "
            f"PCIe link carries ({link_gbps:.3g} GB/s): the GPU's NUMA node, an IOMMU or a "
            "shared switch"
        )
    return said


def state_verdicts(state: GpuState | None) -> list[str]:
    """Power limit, clock throttling and PCIe link, said only when they hold the GPU back."""
    if state is None:
        return []
    said = []
    if (
        state.power_limit_w is not None
        and state.power_max_w is not None
        and state.power_limit_w < 0.95 * state.power_max_w
    ):
        said.append(
            f"power limit {state.power_limit_w:.0f} W of {state.power_max_w:.0f} W: the GPU is "
            "capped below its rating (nvidia-smi -pl raises it, as root)"
        )
    for reason in state.throttle:
        said.append(THROTTLE_TEXT.get(reason, f"SM clock held down ({reason})"))
    if state.pcie_gen is not None and state.pcie_width is not None:
        gen_low = state.pcie_max_gen is not None and state.pcie_gen < state.pcie_max_gen
        width_low = state.pcie_max_width is not None and state.pcie_width < state.pcie_max_width
        if gen_low or width_low:
            said.append(
                f"PCIe Gen{state.pcie_gen} x{state.pcie_width}, where the GPU supports "
                f"Gen{state.pcie_max_gen} x{state.pcie_max_width}: host-device copies are slower "
                "(a riser, the slot, or BIOS settings)"
            )
    return said


THROTTLE_TEXT = {
    "sw_power_cap": "SM clock throttled (power cap): the GPU is at its power limit",
    "hw_slowdown": "SM clock throttled (hardware slowdown: power brake or overheating)",
    "sw_thermal": "SM clock throttled (thermal): the GPU is too hot; check cooling and airflow",
    "hw_thermal": "SM clock throttled (thermal, hardware): the GPU is too hot; check cooling",
    "power_brake": "SM clock throttled (power brake asserted by the system)",
    "board_limit": "SM clock throttled (board limit)",
    "reliability": "SM clock throttled (reliability voltage limit)",
    "sync_boost": "SM clock held to its sync-boost group's slowest GPU",
}


def pcie_link_gbps(state: GpuState | None) -> float | None:
    if state is None or state.pcie_gen is None or not state.pcie_width:
        return None
    lane = PCIE_LANE_GBPS.get(state.pcie_gen)
    return lane * state.pcie_width if lane else None


def judge(check: MachineCheck) -> list[str]:
    """Every verdict, the device's state first (the likely cause), then each figure."""
    return [
        *state_verdicts(check.gpu_state),
        *matmul_verdicts(check),
        *memory_verdicts(check, pcie_link_gbps(check.gpu_state)),
    ]


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
        data = json.loads(path.read_text())
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


def of_measured(tflops: float | None, measured: float | None, world_size: int = 1) -> float | None:
    """A run's TFLOP/s as a share of what ``world_size`` devices measured: its MFU against
    the achievable peak rather than the datasheet's."""
    if tflops is None or not measured:
        return None
    return tflops / (measured * max(1, world_size))


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
