"""The machine check (``ampscope doctor --bench``): its result, its verdicts, where it is kept.

Torch-free, so the dashboard reads a stored check without importing torch, and every verdict
rule is a plain function over figures that tests feed with fakes. The engine measures
(``ampscope.engine.machine.bench``), ``machine_verdicts`` judges, this module holds the result
and keeps it.

A check is kept per host, one entry per device name, under the user's config folder: a run
on a device of that name then shows its MFU against the measured peak as well as against the
datasheet. A check remembers the torch and driver it ran on, because a new torch (other
kernels) or driver (other clocks) can change what the device delivers.
"""

from __future__ import annotations

import json
import re
import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ampscope.core.machine import steady
from ampscope.core.machine.hardware import Gpu, identify, is_mig, peak_tflops
from ampscope.core.machine.mfu import LEAST_FIGURE, of_measured, positive
from ampscope.core.presets import user_config_dir
from ampscope.core.records.files import read_json
from ampscope.core.records.folders import write_text

if TYPE_CHECKING:
    from ampscope.core.records import RunRecord

MATMUL_FORMATS_GPU = ("fp32", "tf32", "bf16", "fp16", "fp8")
MATMUL_FORMATS_CPU = ("fp32", "bf16", "fp16")
RUN_COMMAND = "ampscope doctor --bench"


@dataclass
class MatmulFigure:
    """The best of a format's sweep: TFLOP/s at the shape and layout that gave it, beside the
    datasheet, and each round's best (``ampscope.core.machine.steady``)."""

    tflops: float
    shape: list[int]  # m, n, k
    datasheet_tflops: float | None = None
    ratio: float | None = None
    layout: str = "nn"  # LAYOUTS' key: which operand is transposed
    rounds: list[float] = field(default_factory=list)  # each round's best TFLOP/s, in order

    @property
    def trusted(self) -> bool:
        """Held still (or kept before the check took rounds): a peak runs are read against."""
        return steady.trusted(self.rounds)


# How a matmul's operands lie in memory, as a training step meets them: a @ b, a @ b.T
# (nn.Linear's forward, x @ W.T) and a.T @ b (its weight gradient). Some kernels are fast in one
# and slow in another: fp16 on a CPU without fp16 units ran 1-4 GFLOP/s as a @ b and 10-30 as
# a @ b.T, so a peak timed in one layout alone was beaten by a model's small layers.
LAYOUTS = {"nn": "a @ b", "nt": "a @ b.T", "tn": "a.T @ b"}


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
    memory_rounds: list[float] = field(default_factory=list)
    h2d_rounds: list[float] = field(default_factory=list)
    fp32_one_thread_rounds: list[float] = field(default_factory=list)
    cpus: int | None = None  # a CPU check: the CPUs this process may run on
    other_cpus: float | None = None  # a CPU check: how many CPUs other processes kept busy
    # what a kept file held that is no measurement (NaN, a negative, text): read as absent and
    # named here, never written back
    ignored: list[str] = field(default_factory=list)

    @property
    def contended(self) -> bool:
        """A CPU check during which other processes held CPUs its threads needed (more than
        the CPUs its threads left free, and half a CPU): every figure is the busy machine's.
        A figure of a steady round can hide it: a kernel that runs on one thread holds still
        under load while the fast one, on every thread, never got its cores."""
        if self.kind != "cpu" or self.other_cpus is None:
            return False
        if not self.cpus or not self.threads:  # counts a damaged file lost: any half CPU busy
            return self.other_cpus > 0.5
        return self.other_cpus > self.cpus - self.threads + 0.5

    def trusted(self, fmt: str) -> bool:
        """``fmt``'s figure is one runs are read against: steady, not a busy CPU's, and
        with the figures that say so intact (``steadiness_lost``)."""
        fig = self.matmul.get(fmt)
        return (
            fig is not None and fig.trusted and not self.contended and not self.steadiness_lost(fmt)
        )

    def steadiness_lost(self, fmt: str) -> list[str]:
        """The damaged figures of a kept file that said whether ``fmt``'s measurement held
        still (its rounds; on a CPU, the other processes' CPUs): read as absent, they would
        make a busy check's figure a peak."""
        said = (f"{fmt} matmul's rounds", "other CPUs")
        return [what for what in self.ignored if what.startswith(said)]

    def rounds_of(self) -> list[tuple[str, list[float]]]:
        """Every figure timed in rounds, by the name a person reads, with its rounds."""
        named = [(f"{fmt} matmul", fig.rounds) for fmt, fig in self.matmul.items()]
        named += [
            ("fp32 matmul on 1 thread", self.fp32_one_thread_rounds),
            ("memory copy", self.memory_rounds),
            ("host-to-device copy", self.h2d_rounds),
        ]
        return [(what, rounds) for what, rounds in named if rounds]

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "kind": self.kind,
            "matmul": {
                name: {**asdict(fig), "spread": steady.spread(fig.rounds)}
                for name, fig in self.matmul.items()
            },
            "memory": {
                "gbps": self.memory_gbps,
                "datasheet_gbps": self.memory_datasheet_gbps,
                "what": self.memory_what,
                "rounds": list(self.memory_rounds),
                "h2d_gbps": self.h2d_gbps,
                "h2d_rounds": list(self.h2d_rounds),
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
            "fp32_one_thread_rounds": list(self.fp32_one_thread_rounds),
            "load_average": self.load_average,
            "cpus": self.cpus,
            "other_cpus": self.other_cpus,
            "gpu_state": asdict(self.gpu_state) if self.gpu_state else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MachineCheck:
        """A kept check as far as it holds measurements: a figure that is not a finite positive
        number (NaN, a negative, 1e-300, a 400-digit integer, text) is read as absent and named
        in ``ignored``. Raises KeyError, TypeError or ValueError on a file that is not a check."""
        read = _Reader()
        device = data.get("device")
        if not isinstance(device, str) or not device:
            raise ValueError(
                f"an entry's device is {_shown(device)}, not a name"
                if device
                else "an entry has no device name"
            )
        memory = dict(data.get("memory") or {})
        matmul: dict[str, MatmulFigure] = {}
        for name, fig in dict(data["matmul"]).items():
            fig = dict(fig)
            tflops = read.figure(f"{name} matmul", fig.get("tflops"), needed=True)
            if tflops is None:
                continue
            matmul[str(name)] = MatmulFigure(
                tflops=tflops,
                shape=read.shape(f"{name} matmul's shape", fig.get("shape")),
                datasheet_tflops=read.figure(f"{name} datasheet", fig.get("datasheet_tflops")),
                ratio=read.figure(f"{name} ratio", fig.get("ratio"), least=0.0),
                layout=str(fig.get("layout") or "nn"),
                rounds=read.rounds(f"{name} matmul's rounds", fig.get("rounds")),
            )
        state = data.get("gpu_state")
        return cls(
            device=device,
            kind=str(data.get("kind", "cpu")),
            matmul=matmul,
            memory_gbps=read.figure("memory copy", memory.get("gbps")),
            memory_datasheet_gbps=read.figure("memory datasheet", memory.get("datasheet_gbps")),
            memory_what=str(memory.get("what") or ""),
            h2d_gbps=read.figure("host-to-device copy", memory.get("h2d_gbps")),
            allreduce_busbw_gbps=read.figure("all-reduce", memory.get("allreduce_busbw_gbps")),
            allreduce_note=_text(memory.get("allreduce_note")),
            verdicts=read.texts("verdicts", data.get("verdicts")),
            when=str(data.get("when") or ""),
            torch=str(data.get("torch") or ""),
            driver=_text(data.get("driver")),
            host=str(data.get("host") or ""),
            threads=read.count("threads", data.get("threads")),
            seconds=read.non_negative("seconds", data.get("seconds")),
            cpu_units=read.texts("CPU units", data.get("cpu_units")),
            fp32_one_thread_tflops=read.figure(
                "fp32 matmul on 1 thread", data.get("fp32_one_thread_tflops")
            ),
            load_average=read.non_negative("load average", data.get("load_average")),
            cpus=read.count("cpus", data.get("cpus")),
            other_cpus=read.non_negative("other CPUs", data.get("other_cpus")),
            gpu_state=_gpu_state(state, read) if isinstance(state, dict) else None,
            memory_rounds=read.rounds("memory copy's rounds", memory.get("rounds")),
            h2d_rounds=read.rounds("host-to-device rounds", memory.get("h2d_rounds")),
            fp32_one_thread_rounds=read.rounds(
                "1-thread rounds", data.get("fp32_one_thread_rounds")
            ),
            ignored=read.ignored,
        )


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _shown(value: Any) -> str:
    """A value as an ignored-figure note shows it: short, whatever the file held."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**20:
        return f"a {len(str(abs(value)))}-digit number"
    text = repr(value)
    return text if len(text) <= 24 else text[:21] + "..."


class _Reader:
    """A kept file's fields as measurements, noting each value that is not one."""

    def __init__(self) -> None:
        self.ignored: list[str] = []

    def figure(
        self, what: str, value: Any, needed: bool = False, least: float = LEAST_FIGURE
    ) -> float | None:
        if value is None and not needed:
            return None
        number = positive(value, least)
        if number is None:
            self.ignored.append(f"{what} ({_shown(value)})")
        return number

    def count(self, what: str, value: Any) -> int | None:
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 20:
            return value
        self.ignored.append(f"{what} ({_shown(value)})")
        return None

    def non_negative(self, what: str, value: Any) -> float | None:
        """A figure that may be zero (an idle machine's load average), never negative."""
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
            return 0.0
        return self.figure(what, value, least=0.0)

    def rounds(self, what: str, value: Any) -> list[float]:
        if not value:
            return []
        numbers = [positive(v, LEAST_FIGURE) for v in value] if isinstance(value, list) else [None]
        if any(n is None for n in numbers):
            self.ignored.append(f"{what} ({_shown(value)})")
            return []
        return [n for n in numbers if n is not None]

    def texts(self, what: str, value: Any) -> list[str]:
        """A list of lines; anything else (a string read letter by letter, a number that
        made the whole file unreadable) is noted and left out."""
        if isinstance(value, list):
            return [str(v) for v in value]
        if value:
            self.ignored.append(f"{what} ({_shown(value)})")
        return []

    def shape(self, what: str, value: Any) -> list[int]:
        if isinstance(value, list) and all(
            isinstance(x, int) and not isinstance(x, bool) and 0 < x < 1 << 31 for x in value
        ):
            return list(value)
        if value:
            self.ignored.append(f"{what} ({_shown(value)})")
        return []


def _gpu_state(state: dict[str, Any], read: _Reader) -> GpuState:
    throttle = state.get("throttle")
    return GpuState(
        power_limit_w=read.figure("power limit", state.get("power_limit_w")),
        power_max_w=read.figure("rated power", state.get("power_max_w")),
        throttle=[str(t) for t in throttle] if isinstance(throttle, list) else [],
        pcie_gen=read.count("PCIe generation", state.get("pcie_gen")),
        pcie_width=read.count("PCIe width", state.get("pcie_width")),
        pcie_max_gen=read.count("PCIe generation", state.get("pcie_max_gen")),
        pcie_max_width=read.count("PCIe width", state.get("pcie_max_width")),
    )


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
    """This host's checks by device name, and a problem with the file (None if fine or absent).
    A figure in the file that is no measurement is left out of its check (``ignored``)."""
    path = check_path(host)
    try:
        data = read_json(path)
        checks = {str(n): MachineCheck.from_json(c) for n, c in dict(data["checks"]).items()}
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
        return {}, f"{path} cannot be read ({type(exc).__name__}: {exc}); run {RUN_COMMAND} again"
    return checks, None


def save(check: MachineCheck) -> Path:
    """Keep ``check`` as its host's entry for its device, beside the host's other devices (a
    damaged file is replaced). Written through a temporary file of its own, then renamed: two
    checks at once never move each other's half-written file."""
    checks, _ = load_all(check.host or None)
    checks[check.device] = check
    path = check_path(check.host or None)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"version": 1, "checks": {name: c.to_json() for name, c in checks.items()}}
    write_text(path, json.dumps(payload, indent=1))
    return path


def find(device: str, host: str | None = None) -> MachineCheck | None:
    return load_all(host)[0].get(device)


@dataclass(frozen=True)
class MeasuredPeak:
    """What a run on ``device`` is read against: the kept figure for its format, or why none."""

    tflops: float | None  # finite, positive and steady, or None
    note: str | None  # where the figure came from, or why there is none; None: no check kept
    fault: bool = False  # the note names something wrong with the kept check: say it once


def measured_peak(device: str, fmt: str, host: str | None = None) -> MeasuredPeak:
    """This machine's measured matmul TFLOP/s for a run's compute format on ``device``: only a
    figure that is a finite positive number and held still when it was measured
    (``ampscope.core.machine.steady``)."""
    checks, problem = load_all(host)
    if problem:
        return MeasuredPeak(None, f"the kept machine check is ignored: {problem}", fault=True)
    check = checks.get(device)
    if check is None:
        return MeasuredPeak(None, None)
    day = check.when[:10] or "an unknown day"
    fig = check.matmul.get(fmt)
    bad = [what for what in check.ignored if what.startswith(f"{fmt} matmul ")]
    if fig is None and bad:
        return MeasuredPeak(
            None,
            f"the machine check of {day} holds no {fmt} measurement: its figure "
            f"{bad[0][len(fmt) + 9 : -1]} is not a finite positive number, so it is ignored; run "
            f"{RUN_COMMAND} to measure again",
            fault=True,
        )
    if fig is None:
        return MeasuredPeak(None, f"the machine check of {day} has no {fmt} figure")
    if check.contended:
        return MeasuredPeak(
            None,
            f"the machine check of {day} ran while other processes kept {check.other_cpus:.1f} "
            f"of its {check.cpus or '?'} CPUs busy: not read as a peak; run {RUN_COMMAND} again when "
            "the machine is quieter",
            fault=True,
        )
    lost = check.steadiness_lost(fmt)
    if lost:
        return MeasuredPeak(
            None,
            f"the machine check of {day} cannot say whether its {fmt} figure held still: "
            f"{lost[0]} is not a measurement, so it is not read as a peak; run {RUN_COMMAND} "
            "to measure again",
            fault=True,
        )
    if not fig.trusted:
        return MeasuredPeak(
            None,
            f"the {fmt} figure of the machine check of {day} is not read as a peak: the machine "
            f"was too busy ({steady.rounds_text(fig.rounds)}); run {RUN_COMMAND} again when it "
            "is quieter",
            fault=True,
        )
    return MeasuredPeak(fig.tflops, f"{fmt} matmul measured by {RUN_COMMAND} on {day}")


def measured_tflops(device: str, fmt: str, host: str | None = None) -> float | None:
    """The kept figure for ``fmt`` on ``device`` that runs are read against, or None."""
    return measured_peak(device, fmt, host).tflops


def mfu_measured(run: RunRecord) -> float | None:
    """MFU against the measured peak: the engine's ``done`` says it; a watched loop's record
    has the measured peak in its ``hello``, so it is worked out from there."""
    d = run.done
    if d is None:
        return None
    if d.mfu_measured is not None:
        return positive(d.mfu_measured)  # a record from before the figure was checked
    measured = run.hello.measured_tflops if run.hello is not None else None
    return of_measured(d.tflops, measured, d.world_size)


def nvidia_driver(version_file: str | Path = "/proc/driver/nvidia/version") -> str | None:
    """The loaded NVIDIA driver's version, read from /proc (no NVML, no torch)."""
    try:
        text = Path(version_file).read_text()
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
