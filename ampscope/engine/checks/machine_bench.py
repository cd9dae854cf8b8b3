"""The machine check's measurements: matmul TFLOP/s per format, memory bandwidth, GPU state.

Every figure is timed through a ``Timer``: CUDA events on a GPU (the device's own clock, one
synchronisation per batch of repeats), ``perf_counter`` on a CPU. Tests swap in a fake timer,
a fake NVML and a fake ``/proc/cpuinfo`` reader, so the sweep and the verdicts are checked
without a GPU. The verdicts themselves are ``ampscope.core.machine.check``'s.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Protocol

import torch

from ampscope.core.machine import check as mc
from ampscope.core.machine import verdicts as mv
from ampscope.core.machine.check import GpuState, MachineCheck, MatmulFigure
from ampscope.core.machine.hardware import CPU_UNITS, datasheet_gbps
from ampscope.engine.checks.allreduce import allreduce_gbps
from ampscope.engine.checks.machine_state import gpu_state

Shape = tuple[int, int, int]

# The sweep: the best of a few shapes, as the MAMF finder does with many more. Large enough on
# a GPU to fill it (8192 cubed ran at ~790 bf16 TFLOP/s on an H200); on a CPU the largest
# fp16 matmul without fp16 units takes about a second.
GPU_SHAPES: tuple[Shape, ...] = ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 16384))
CPU_SHAPES: tuple[Shape, ...] = ((512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048))
QUICK_SHAPES: tuple[Shape, ...] = ((128, 128, 128), (256, 256, 256))
GPU_COPY_BYTES = 1 << 30
CPU_COPY_BYTES = 256 << 20
QUICK_COPY_BYTES = 16 << 20
H2D_BYTES = 256 << 20


class Timer(Protocol):
    """Seconds each call of ``fn`` took, ``repeats`` calls, after ``warmup`` untimed ones."""

    def __call__(self, fn: Callable[[], object], repeats: int, warmup: int) -> list[float]: ...


def cpu_timer(fn: Callable[[], object], repeats: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def cuda_timer(fn: Callable[[], object], repeats: int, warmup: int) -> list[float]:
    """CUDA events around each call: the GPU's own timing, with no host sync between calls."""
    for _ in range(warmup):
        fn()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(repeats)
    ]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) / 1000.0 for start, end in events]


@dataclass(frozen=True)
class Budget:
    """How long one shape may be timed: enough repeats for a median, not a minute each."""

    seconds: float = 0.5
    min_repeats: int = 3
    max_repeats: int = 50


def time_median(timer: Timer, fn: Callable[[], object], budget: Budget) -> float:
    """The median seconds of ``fn``: one warm-up and one probe decide how many repeats fit.
    A call slower than the budget is repeated ``min_repeats`` times in all, the probe one."""
    probe = min(timer(fn, 1, 1))
    if probe >= budget.seconds:
        return statistics.median([probe, *timer(fn, budget.min_repeats - 1, 0)])
    repeats = int(budget.seconds / probe) if probe > 0 else budget.max_repeats
    repeats = max(budget.min_repeats, min(budget.max_repeats, repeats))
    return statistics.median(timer(fn, repeats, 0))


def matmul_call(fmt: str, shape: Shape, device: torch.device) -> Callable[[], object]:
    """One matmul of ``shape`` in ``fmt``: operands made once, outside the timed call."""
    m, n, k = shape
    if fmt == "fp8":
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major
        one = torch.tensor(1.0, device=device)
        return lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
    dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}.get(
        fmt, torch.float16
    )
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    return lambda: torch.mm(a, b)


class _Float32Precision:
    """fp32 with TF32 off, or tf32, for the duration of a block; restored afterwards."""

    def __init__(self, fmt: str) -> None:
        self.want = "high" if fmt == "tf32" else "highest"

    def __enter__(self) -> None:
        self.before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(self.want)

    def __exit__(self, *exc: object) -> None:
        torch.set_float32_matmul_precision(self.before)


MatmulMaker = Callable[[str, Shape, torch.device], Callable[[], object]]


def sweep(
    fmt: str,
    shapes: Sequence[Shape],
    device: torch.device,
    timer: Timer,
    budget: Budget,
    make: MatmulMaker = matmul_call,
) -> MatmulFigure:
    """The best TFLOP/s over ``shapes`` (each the median of its repeats), and its shape."""
    best: MatmulFigure | None = None
    with _Float32Precision(fmt):
        for shape in sorted(shapes, key=flops_of):
            if best is not None and flops_of(shape) / (best.tflops * 1e12) > 2 * budget.seconds:
                break  # a slow format (fp16 on a CPU without fp16 units) gains nothing larger
            seconds = time_median(timer, make(fmt, shape, device), budget)
            tflops = flops_of(shape) / seconds / 1e12
            if best is None or tflops > best.tflops:
                best = MatmulFigure(tflops=tflops, shape=list(shape))
    assert best is not None, "a sweep needs at least one shape"
    return best


def flops_of(shape: Shape) -> float:
    m, n, k = shape
    return 2.0 * m * n * k


def copy_gbps(device: torch.device, nbytes: int, timer: Timer, budget: Budget) -> float:
    """A copy inside the device's memory, counted as bytes read plus bytes written (the
    convention of the datasheet's bandwidth: an H200 copies at about 4.3 of 4.8 TB/s)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    seconds = time_median(timer, lambda: dst.copy_(src), budget)
    return 2 * src.numel() * 4 / seconds / 1e9


def h2d_gbps(device: torch.device, nbytes: int, timer: Timer, budget: Budget) -> float:
    """Pinned host memory to the GPU, as a data loader's batches travel."""
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    seconds = time_median(timer, lambda: dst.copy_(src, non_blocking=True), budget)
    return nbytes / seconds / 1e9


def cpu_units(flags: set[str]) -> list[str]:
    """The reduced-precision matmul units among /proc/cpuinfo's flags."""
    wanted = {flag for units in CPU_UNITS.values() for flag, _ in units}
    return sorted(wanted & flags)


def formats_for(kind: str, capability: tuple[int, int] | None) -> tuple[str, ...]:
    """The matmul formats a device runs natively: bf16 and tf32 from 8.0, fp8 from 8.9."""
    if kind == "cpu":
        return mc.MATMUL_FORMATS_CPU
    cc = capability or (0, 0)
    return tuple(
        f
        for f in mc.MATMUL_FORMATS_GPU
        if not (f in ("tf32", "bf16") and cc < (8, 0)) and not (f == "fp8" and cc < (8, 9))
    )


@dataclass(frozen=True)
class GpuInfo:
    name: str
    capability: tuple[int, int]
    uuid: str | None
    count: int  # GPUs torch sees
    multiprocessors: int | None = None  # a MIG slice's share of the chip


def first_gpu() -> GpuInfo | None:
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return GpuInfo(
        props.name,
        (props.major, props.minor),
        str(getattr(props, "uuid", "")) or None,
        torch.cuda.device_count(),
        props.multi_processor_count,
    )


Bandwidth = Callable[[torch.device, int, Timer, Budget], float]


@dataclass
class Seams:
    """What the check reads from the outside world, replaced by fakes in tests."""

    timer: Timer | None = None  # None: CUDA events on a GPU, perf_counter on a CPU
    nvml: Any = None  # None: pynvml when installed
    cpu_flags: Callable[[], set[str]] | None = None
    cpu_name: Callable[[], str] | None = None
    make: MatmulMaker = matmul_call
    sync: Callable[[], None] = torch.cuda.synchronize
    gpu: Callable[[], GpuInfo | None] = first_gpu
    copy: Bandwidth = copy_gbps
    h2d: Bandwidth = h2d_gbps
    allreduce: Callable[[int], float] = allreduce_gbps  # several GPUs: one rank each, NCCL


def measure_allreduce(
    gpus: int, seams: Seams, said: Callable[[str, str], None]
) -> tuple[float | None, str | None]:
    """The all-reduce's bus bandwidth across every GPU, or why it could not be measured;
    nothing for one GPU (or none)."""
    if gpus < 2:
        return None, None
    try:
        busbw = seams.allreduce(gpus)
    except Exception as exc:  # noqa: BLE001 - the other figures stand; the note says why
        return None, (
            f"{gpus} GPUs: the all-reduce could not be measured ({type(exc).__name__}: "
            f"{exc}); nccl-tests' all_reduce_perf measures it"
        )
    said("allreduce", f"all-reduce  {busbw:,.0f} GB/s bus bandwidth over {gpus} GPUs (NCCL)")
    return busbw, None


def state_under_load(
    nvml: Any,
    uuid: str | None,
    figures: dict[str, MatmulFigure],
    device: torch.device,
    seams: Seams,
) -> tuple[GpuState | None, str | None]:
    """NVML's view while about half a second of matmuls is queued: an idle GPU reports no
    throttling and lowers its PCIe link's speed, so a reading at rest would miss a hot GPU
    and accuse a healthy link."""
    fmt = "bf16" if "bf16" in figures else next(iter(figures))
    fig = figures[fmt]
    shape = (fig.shape[0], fig.shape[1], fig.shape[2])
    call = seams.make(fmt, shape, device)
    calls = max(1, min(2000, int(0.5 * fig.tflops * 1e12 / flops_of(shape))))
    for _ in range(calls):
        call()
    try:
        return gpu_state(nvml, uuid)
    finally:
        seams.sync()


Progress = Callable[[str, str], None]
"""Told each figure as it lands: (what, the line a person reads)."""


def run_check(
    device_kind: str = "auto",
    quick: bool = False,
    on_figure: Progress | None = None,
    seams: Seams | None = None,
) -> MachineCheck:
    """Measure this machine's GPU 0 (or its CPU: ``device_kind`` "cpu", or no GPU)."""
    from ampscope.engine.checks import device as dev

    seams = seams or Seams()
    said = on_figure or (lambda what, line: None)
    started = time.monotonic()
    gpu = seams.gpu() if device_kind != "cpu" else None
    cuda = gpu is not None
    budget = Budget(seconds=0.1 if quick else (0.3 if cuda else 0.5))
    if gpu is not None:
        device = torch.device("cuda", 0)
        name, capability = gpu.name, gpu.capability
        timer = seams.timer or cuda_timer
        shapes: Sequence[Shape] = QUICK_SHAPES if quick else GPU_SHAPES
        copy_bytes = QUICK_COPY_BYTES if quick else GPU_COPY_BYTES
        nvml = seams.nvml
        if nvml is None:
            from ampscope.engine.telemetry.nvml import load_nvml

            nvml, _ = load_nvml()
        state, driver = gpu_state(nvml, gpu.uuid)
        units: list[str] = []
        threads = None
    else:
        device = torch.device("cpu")
        name = (seams.cpu_name or dev.cpu_name)()
        capability = None
        timer = seams.timer or cpu_timer
        shapes = QUICK_SHAPES if quick else CPU_SHAPES
        copy_bytes = QUICK_COPY_BYTES if quick else CPU_COPY_BYTES
        state, driver = None, mc.nvidia_driver()
        units = cpu_units((seams.cpu_flags or dev.cpu_flags)())
        threads = torch.get_num_threads()
    kind = "cuda" if cuda else "cpu"
    where = name + (f", {threads} thread{'s' if threads > 1 else ''}" if threads else "")
    said("device", f"machine check on {where}")
    figures: dict[str, MatmulFigure] = {}
    power = state.power_limit_w if state else None
    sms = gpu.multiprocessors if gpu is not None else None
    driver = driver or mc.nvidia_driver()
    for fmt in formats_for(kind, capability):
        fig = sweep(fmt, shapes, device, timer, budget, seams.make)
        figures[fmt] = fig
        mc.with_datasheet(name, kind, {fmt: fig}, power, sms)
        said("matmul", matmul_line(fmt, fig, kind))
    one_thread = one_thread_fp32(figures, threads, device, timer, budget, seams.make)
    if one_thread is not None:
        said("threads", f"fp32  matmul  {one_thread * 1e3:,.1f} GFLOP/s on 1 thread")
    if gpu is not None and nvml is not None:
        state, driver = state_under_load(nvml, gpu.uuid, figures, device, seams)
        driver = driver or mc.nvidia_driver()
    gpu_row = mc.with_datasheet(name, kind, figures, power, sms)
    gbps = seams.copy(device, copy_bytes, timer, budget)
    said("memory", f"memory copy  {gbps:,.0f} GB/s" + (" (in RAM)" if not cuda else ""))
    h2d = None
    if cuda:
        h2d = seams.h2d(device, QUICK_COPY_BYTES if quick else H2D_BYTES, timer, budget)
        said("h2d", f"pinned host-to-device  {h2d:,.1f} GB/s")
    gpus = gpu.count if gpu is not None and not quick else 0
    busbw, busbw_note = measure_allreduce(gpus, seams, said)
    check = MachineCheck(
        device=name,
        kind=kind,
        matmul=figures,
        memory_gbps=gbps,
        memory_datasheet_gbps=datasheet_gbps(gpu_row),
        memory_what="device-to-device copy" if cuda else "copy in RAM",
        h2d_gbps=h2d,
        allreduce_busbw_gbps=busbw,
        allreduce_note=busbw_note,
        when=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        torch=str(torch.__version__),
        driver=driver,
        host=mc.host_name(),
        threads=threads,
        cpu_units=units,
        gpu_state=state,
        fp32_one_thread_tflops=one_thread,
        load_average=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    )
    check.verdicts = mv.judge(check)
    check.seconds = round(time.monotonic() - started, 2)
    return check


def one_thread_fp32(
    figures: dict[str, MatmulFigure],
    threads: int | None,
    device: torch.device,
    timer: Timer,
    budget: Budget,
    make: MatmulMaker,
) -> float | None:
    """fp32 at the best shape on one thread, where a CPU runs several: a busy machine's
    threads gain nothing, which the verdicts then say."""
    fig = figures.get("fp32")
    if fig is None or not threads or threads < 2:
        return None
    torch.set_num_threads(1)
    try:
        shape = (fig.shape[0], fig.shape[1], fig.shape[2])
        return sweep("fp32", [shape], device, timer, budget, make).tflops
    finally:
        torch.set_num_threads(threads)


def matmul_line(fmt: str, fig: MatmulFigure, kind: str) -> str:
    """'bf16 matmul  612 TFLOP/s at 8192x8192x8192 (62 % of 989)': the line as it lands."""
    value = f"{fig.tflops:,.1f} TFLOP/s" if kind == "cuda" else f"{fig.tflops * 1e3:,.1f} GFLOP/s"
    shape = "x".join(str(x) for x in fig.shape)
    tail = (
        f" ({mv.pct(fig.ratio)} of {fig.datasheet_tflops:g})"
        if fig.ratio is not None and fig.datasheet_tflops
        else ""
    )
    return f"{fmt:<5} matmul  {value} at {shape}{tail}"
