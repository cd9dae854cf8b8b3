"""The machine check's measurements: matmul TFLOP/s per format, memory bandwidth, GPU state.

Every figure is timed through a ``Timer``: CUDA events on a GPU (the device's own clock, one
synchronisation per batch of repeats), ``perf_counter`` on a CPU. Tests swap in a fake timer,
a fake NVML and a fake ``/proc/cpuinfo`` reader, so the sweep and the verdicts are checked
without a GPU. The verdicts themselves are ``ampscope.core.machine.check``'s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

import torch

from ampscope.core.machine import steady, verdicts
from ampscope.core.machine.check import (
    LAYOUTS,
    MATMUL_FORMATS_CPU,
    MATMUL_FORMATS_GPU,
    GpuState,
    MachineCheck,
    MatmulFigure,
    host_name,
    nvidia_driver,
    with_datasheet,
)
from ampscope.core.machine.hardware import CPU_UNITS, datasheet_gbps
from ampscope.engine.machine.allreduce import allreduce_gbps
from ampscope.engine.machine.state import gpu_state

Shape = tuple[int, int, int]
Combo = tuple[Shape, str]  # a shape and a layout (``check.LAYOUTS``)

# The sweep: the best of several shapes in each layout, as the MAMF finder does with many more.
# Large enough on a GPU to fill it (8192 cubed ran at ~790 bf16 TFLOP/s on an H200). On a CPU
# from 128 cubed up, since small matmuls can be the fastest there (fp16 without fp16 units
# ran 4 GFLOP/s at 128 and 3 at 512 as a @ b): a layout stops before a shape that would take
# over twice the budget a call.
GPU_SHAPES: tuple[Shape, ...] = ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 16384))
CPU_SHAPES: tuple[Shape, ...] = tuple((n, n, n) for n in (128, 256, 512, 1024, 2048))
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


def cuda_timer(
    fn: Callable[[], object], repeats: int, warmup: int, cuda: Any = None
) -> list[float]:
    """CUDA events around each call: the GPU's own timing, with no host sync between calls.
    ``cuda`` gives ``Event`` and ``synchronize``: ``torch.cuda`` unless given."""
    cuda = cuda or torch.cuda
    for _ in range(warmup):
        fn()
    events = [
        (cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)) for _ in range(repeats)
    ]
    for start, end in events:
        start.record()
        fn()
        end.record()
    cuda.synchronize()
    return [start.elapsed_time(end) / 1000.0 for start, end in events]


@dataclass(frozen=True)
class Budget:
    """How long one figure may be timed in one round: enough calls that one of them runs
    while nothing else does, not a minute each."""

    seconds: float = 0.1
    min_repeats: int = 3
    max_repeats: int = 400


def time_best(timer: Timer, fn: Callable[[], object], budget: Budget, warmup: int = 1) -> float:
    """The shortest seconds of ``fn``: one warm-up and one probe decide how many calls fit.
    The shortest, not the median: a call is only ever slowed by other work (a peak is what
    nothing beats), and on a busy machine the fastest calls are the ones that ran alone. A
    call slower than the budget is repeated ``min_repeats`` times in all, the probe one; one
    slower than twice the budget is not repeated (it is no peak, and would cost seconds)."""
    probe = min(timer(fn, 1, warmup))
    if probe >= 2 * budget.seconds:  # far slower than it looked: no second call of it
        return probe
    if probe >= budget.seconds:
        return min([probe, *timer(fn, budget.min_repeats - 1, 0)])
    repeats = int(budget.seconds / probe) if probe > 0 else budget.max_repeats
    repeats = max(budget.min_repeats, min(budget.max_repeats, repeats))
    return min([probe, *timer(fn, repeats, 0)])


def matmul_call(fmt: str, shape: Shape, layout: str, device: torch.device) -> Callable[[], object]:
    """One matmul of ``shape`` (m, n, k) in ``fmt`` and ``layout``: ``nt`` multiplies by a
    transposed view, as nn.Linear does; operands made once, outside the timed call."""
    m, n, k = shape
    if fmt == "fp8":  # torch._scaled_mm takes a row-major a and a column-major b: "nt" only
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()
        one = torch.tensor(1.0, device=device)
        return lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
    a, b = operands(fmt, shape, layout, device)
    return lambda: torch.mm(a, b)


def operands(
    fmt: str, shape: Shape, layout: str, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """a (m x k) and b (k x n), each a transposed view where ``layout`` says so."""
    m, n, k = shape
    dtype = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}.get(
        fmt, torch.float16
    )

    def made(rows: int, cols: int, transposed: bool) -> torch.Tensor:
        if transposed:
            return torch.randn(cols, rows, device=device, dtype=dtype).t()
        return torch.randn(rows, cols, device=device, dtype=dtype)

    return made(m, k, layout == "tn"), made(k, n, layout == "nt")


def layouts_for(fmt: str) -> tuple[str, ...]:
    return ("nt",) if fmt == "fp8" else tuple(LAYOUTS)


class _Float32Precision:
    """fp32 with TF32 off, or tf32, for the duration of a block; restored afterwards."""

    def __init__(self, fmt: str) -> None:
        self.want = "high" if fmt == "tf32" else "highest"

    def __enter__(self) -> None:
        self.before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(self.want)

    def __exit__(self, *exc: object) -> None:
        torch.set_float32_matmul_precision(self.before)


MatmulMaker = Callable[[str, Shape, str, torch.device], Callable[[], object]]


def rate_of(
    fmt: str,
    combo: Combo,
    device: torch.device,
    timer: Timer,
    budget: Budget,
    make: MatmulMaker,
    warmup: int = 1,
) -> float:
    """TFLOP/s of one shape and layout: its fastest call this round."""
    shape, layout = combo
    with _Float32Precision(fmt):
        call = make(fmt, shape, layout, device)
        return flops_of(shape) / time_best(timer, call, budget, warmup) / 1e12


@dataclass
class LayoutSweep:
    """One format's shapes in one layout, smallest first, and the best rate each one ran at.

    The next shape is timed while it can pay: not when its call would take over twice the
    budget at the layout's best rate so far (a slow format, fp16 on a CPU without fp16 units,
    gains nothing larger and would take seconds a call), nor after a shape that ran at under
    half the best (past the caches larger only gets slower). The best rate, not the latest,
    judges the next shape, and every round may take one more step: a call slowed a
    thousandfold by other work (two threads of a small matmul on a busy 2-core machine) stops
    the sweep only until a later round runs fast."""

    shapes: list[Shape]
    rates: dict[Shape, float] = field(default_factory=dict)
    stopped: bool = False

    def best(self) -> tuple[Shape, float] | None:
        if not self.rates:
            return None
        shape = max(self.rates, key=lambda s: self.rates[s])
        return shape, self.rates[shape]

    def next_shape(self, budget: Budget) -> Shape | None:
        untimed = [s for s in self.shapes if s not in self.rates]
        if self.stopped or not untimed:
            return None
        best = self.best()
        if best is not None and flops_of(untimed[0]) / (best[1] * 1e12) > 2 * budget.seconds:
            return None
        return untimed[0]

    def record(self, shape: Shape, rate: float) -> None:
        best = self.best()
        self.rates[shape] = max(rate, self.rates.get(shape, 0.0))
        if best is not None and rate < best[1] / 2 and shape != best[0]:
            self.stopped = True


def sweep(
    fmt: str,
    shapes: Sequence[Shape],
    device: torch.device,
    timer: Timer,
    budget: Budget,
    make: MatmulMaker = matmul_call,
    until: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> dict[Combo, float]:
    """TFLOP/s of every shape in every layout that can pay (``LayoutSweep``), and none
    larger than the first past ``until`` (on ``clock``: the check's deadline)."""
    return Rounds(fmt, shapes).sweep(device, timer, budget, make, until, clock)


@dataclass
class Rounds:
    """One format's timings over the check. The first round sweeps every layout's shapes;
    each later one times each layout's fastest shape again, and its next shape when the
    layout's best rate now says it can pay. Each round's best is kept.

    Each layout's best, not the two fastest overall: a layout timed while the machine was busy
    would then never be timed again, and a slower one that held still would pass for the
    peak."""

    fmt: str
    shapes: Sequence[Shape]
    layouts: dict[str, LayoutSweep] = field(default_factory=dict)
    best: list[float] = field(default_factory=list)  # each round's best TFLOP/s
    top: tuple[float, Combo] | None = None  # the fastest call of the check, and where

    def __post_init__(self) -> None:
        ordered = sorted(self.shapes, key=flops_of)
        self.layouts = {lay: LayoutSweep(list(ordered)) for lay in layouts_for(self.fmt)}

    def sweep(
        self,
        device: torch.device,
        timer: Timer,
        budget: Budget,
        make: MatmulMaker,
        until: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> dict[Combo, float]:
        """The first round: every shape of every layout that can pay."""
        rates: dict[Combo, float] = {}
        for layout, state in self.layouts.items():
            while (shape := state.next_shape(budget)) is not None:
                if state.rates and until is not None and clock() > until:
                    break
                rates[(shape, layout)] = self.time(shape, layout, device, timer, budget, make)
        self.add(rates)
        return rates

    def again(self, device: torch.device, timer: Timer, budget: Budget, make: MatmulMaker) -> None:
        """A later round: each layout's fastest shape, then its next one if it can pay now."""
        rates: dict[Combo, float] = {}
        for layout, state in self.layouts.items():
            best = state.best()
            if best is not None:
                rates[(best[0], layout)] = self.time(best[0], layout, device, timer, budget, make)
            if (shape := state.next_shape(budget)) is not None:
                rates[(shape, layout)] = self.time(shape, layout, device, timer, budget, make)
        self.add(rates)

    def time(
        self,
        shape: Shape,
        layout: str,
        device: torch.device,
        timer: Timer,
        budget: Budget,
        make: MatmulMaker,
    ) -> float:
        """One shape's rate this round; one timed before needs no warm-up call (on a busy
        machine one call of two threads can take seconds)."""
        state = self.layouts[layout]
        warmup = 0 if shape in state.rates else 1
        rate = rate_of(self.fmt, (shape, layout), device, timer, budget, make, warmup)
        state.record(shape, rate)
        return rate

    def add(self, rates: dict[Combo, float]) -> None:
        combo = max(rates, key=lambda c: rates[c])
        self.best.append(rates[combo])
        if self.top is None or rates[combo] > self.top[0]:
            self.top = (rates[combo], combo)

    def figure(self) -> MatmulFigure:
        assert self.top is not None, "a figure needs a round"
        rate, (shape, layout) = self.top
        return MatmulFigure(tflops=rate, shape=list(shape), layout=layout, rounds=list(self.best))


def flops_of(shape: Shape) -> float:
    m, n, k = shape
    return 2.0 * m * n * k


Meter = Callable[[Timer, Budget], float]
"""One round's figure of a bandwidth: its buffers made once, timed again each round."""


def copy_gbps(device: torch.device, nbytes: int) -> Meter:
    """A copy inside the device's memory, counted as bytes read plus bytes written (the
    convention of the datasheet's bandwidth: an H200 copies at about 4.3 of 4.8 TB/s)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)

    def measure(timer: Timer, budget: Budget) -> float:
        return 2 * src.numel() * 4 / time_best(timer, lambda: dst.copy_(src), budget) / 1e9

    return measure


def h2d_gbps(device: torch.device, nbytes: int) -> Meter:
    """Pinned host memory to the GPU, as a data loader's batches travel."""
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def measure(timer: Timer, budget: Budget) -> float:
        seconds = time_best(timer, lambda: dst.copy_(src, non_blocking=True), budget)
        return nbytes / seconds / 1e9

    return measure


CpuClock = tuple[float, float, float]
"""Seconds every CPU has spent busy, seconds this process has, and ``time.monotonic()``."""


def cpu_seconds() -> CpuClock | None:
    """Every CPU's busy seconds since boot (/proc/stat's busy columns), this process's own CPU
    seconds, and when they were read. None where there is no /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    own = os.times()
    return busy, own.user + own.system, time.monotonic()


def cpus_here() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def other_cpus(before: CpuClock | None, after: CpuClock | None) -> float | None:
    """How many CPUs other processes kept busy, on average, between two ``cpu_seconds``."""
    if before is None or after is None or after[2] <= before[2]:
        return None
    others = (after[0] - before[0]) - (after[1] - before[1])
    return round(max(0.0, others) / (after[2] - before[2]), 2)


def cpu_units(flags: set[str]) -> list[str]:
    """The reduced-precision matmul units among /proc/cpuinfo's flags."""
    wanted = {flag for units in CPU_UNITS.values() for flag, _ in units}
    return sorted(wanted & flags)


def formats_for(kind: str, capability: tuple[int, int] | None) -> tuple[str, ...]:
    """The matmul formats a device runs natively: bf16 and tf32 from 8.0, fp8 from 8.9."""
    if kind == "cpu":
        return MATMUL_FORMATS_CPU
    cc = capability or (0, 0)
    return tuple(
        f
        for f in MATMUL_FORMATS_GPU
        if not (f in ("tf32", "bf16") and cc < (8, 0)) and not (f == "fp8" and cc < (8, 9))
    )


@dataclass(frozen=True)
class GpuInfo:
    name: str
    capability: tuple[int, int]
    uuid: str | None
    count: int  # GPUs torch sees
    multiprocessors: int | None = None  # a MIG slice's share of the chip


def gpu_index(device_kind: str) -> int:
    """The GPU a check on ``device_kind`` measures: N for "cuda:N", else GPU 0."""
    _, _, number = device_kind.partition(":")
    return int(number) if number.isdigit() else 0


def gpu_info(index: int) -> GpuInfo | None:
    """GPU ``index`` as torch sees it, or None where there is no such GPU."""
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return None
    props = torch.cuda.get_device_properties(index)
    return GpuInfo(
        props.name,
        (props.major, props.minor),
        str(getattr(props, "uuid", "")) or None,
        torch.cuda.device_count(),
        props.multi_processor_count,
    )


Bandwidth = Callable[[torch.device, int], Meter]


class Threads(Protocol):
    """The threads a CPU's matmuls run on: the check times fp32 on one as well."""

    def get(self) -> int: ...
    def set(self, n: int) -> None: ...


class TorchThreads:
    """torch's own intra-op thread count."""

    def get(self) -> int:
        return torch.get_num_threads()

    def set(self, n: int) -> None:
        torch.set_num_threads(n)


@dataclass
class Seams:
    """What the check reads from the outside world, replaced by fakes in tests."""

    timer: Timer | None = None  # None: CUDA events on a GPU, perf_counter on a CPU
    nvml: Any = None  # None: pynvml when installed
    cpu_flags: Callable[[], set[str]] | None = None
    cpu_name: Callable[[], str] | None = None
    make: MatmulMaker = matmul_call
    sync: Callable[[], None] = torch.cuda.synchronize
    gpu: Callable[[int], GpuInfo | None] = gpu_info
    # makes GPU N current while it is timed: CUDA events and synchronize act on the current GPU
    on_gpu: Callable[[int], AbstractContextManager[object]] = torch.cuda.device
    copy: Bandwidth = copy_gbps
    h2d: Bandwidth = h2d_gbps
    allreduce: Callable[[int], float] = allreduce_gbps  # several GPUs: one rank each, NCCL
    cpu_clock: Callable[[], CpuClock | None] = cpu_seconds
    cpus: Callable[[], int] = cpus_here
    threads: Threads = field(default_factory=TorchThreads)
    clock: Callable[[], float] = time.monotonic  # the check's deadlines and its own seconds


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
    call = seams.make(fmt, shape, fig.layout, device)
    calls = max(1, min(2000, int(0.5 * fig.tflops * 1e12 / flops_of(shape))))
    for _ in range(calls):
        call()
    try:
        return gpu_state(nvml, uuid)
    finally:
        seams.sync()


Progress = Callable[[str, str], None]
"""Told each figure as it lands: (what, the line a person reads)."""


@dataclass
class Plan:
    """What one check measures, and how long each figure may take a round."""

    device: torch.device
    formats: tuple[str, ...]
    shapes: Sequence[Shape]
    copy_bytes: int
    h2d_bytes: int | None  # a GPU: the pinned host-to-device copy
    threads: int | None  # a CPU: its matmul threads (fp32 is also timed on one)
    budget: Budget
    rounds: int = steady.ROUNDS
    # the sweep tries no larger shape past sweep_s, and no round begins that would end past
    # deadline_s at the pace of the round before: with torch's import the check stays under a
    # minute and a half on a loaded machine
    sweep_s: float = 40.0
    deadline_s: float = 60.0


def run_check(
    device_kind: str = "auto",
    quick: bool = False,
    on_figure: Progress | None = None,
    seams: Seams | None = None,
) -> MachineCheck:
    """Measure one of this machine's GPUs (``device_kind`` "cuda:N": GPU N; "auto" or "cuda":
    GPU 0), or its CPU (``device_kind`` "cpu", or no such GPU).

    Every figure is timed in rounds spread over the whole check, each round measuring every
    figure once, so that a burst of other work lands in one round of each figure rather than
    in every round of one (``ampscope.core.machine.steady`` judges the rounds)."""
    from ampscope.engine import device as dev

    seams = seams or Seams()
    said = on_figure or (lambda what, line: None)
    started = seams.clock()
    index = gpu_index(device_kind)
    gpu = seams.gpu(index) if device_kind != "cpu" else None
    cuda = gpu is not None
    budget = Budget(seconds=0.05 if quick else 0.1)
    # a GPU's matmuls rarely share it with other work, and its large shapes take the time: the
    # fewest rounds that can tell a steady figure; a CPU, shared with every process, the most
    rounds = steady.MIN_ROUNDS if quick or cuda else steady.ROUNDS
    if gpu is not None:
        device = torch.device("cuda", index)
        name, capability = gpu.name, gpu.capability
        timer = seams.timer or cuda_timer
        nvml = seams.nvml
        if nvml is None:
            from ampscope.engine.telemetry.nvml import load_nvml

            nvml, _ = load_nvml()
        state, driver = gpu_state(nvml, gpu.uuid)
        units: list[str] = []
        plan = Plan(
            device,
            formats_for("cuda", capability),
            QUICK_SHAPES if quick else GPU_SHAPES,
            QUICK_COPY_BYTES if quick else GPU_COPY_BYTES,
            QUICK_COPY_BYTES if quick else H2D_BYTES,
            None,
            budget,
            rounds,
        )
    else:
        device = torch.device("cpu")
        name = (seams.cpu_name or dev.cpu_name)()
        timer = seams.timer or cpu_timer
        state, driver = None, nvidia_driver()
        units = cpu_units((seams.cpu_flags or dev.cpu_flags)())
        plan = Plan(
            device,
            formats_for("cpu", None),
            QUICK_SHAPES if quick else CPU_SHAPES,
            QUICK_COPY_BYTES if quick else CPU_COPY_BYTES,
            None,
            seams.threads.get(),
            budget,
            rounds,
        )
    kind = "cuda" if cuda else "cpu"
    threads = plan.threads
    where = name + (f", {threads} thread{'s' if threads > 1 else ''}" if threads else "")
    said(
        "device",
        f"machine check on {where}: {plan.rounds} rounds, the best of each figure kept",
    )
    power = state.power_limit_w if state else None
    sms = gpu.multiprocessors if gpu is not None else None
    driver = driver or nvidia_driver()
    clock_before = seams.cpu_clock()
    with seams.on_gpu(index) if cuda else nullcontext():
        timed = measure_rounds(plan, timer, seams, said, kind, started)
        others = other_cpus(clock_before, seams.cpu_clock()) if not cuda else None
        figures = {fmt: r.figure() for fmt, r in timed.formats.items()}
        if gpu is not None and nvml is not None:
            state, driver = state_under_load(nvml, gpu.uuid, figures, device, seams)
            driver = driver or nvidia_driver()
    gpu_row = with_datasheet(name, kind, figures, power, sms)
    for fmt, fig in figures.items():
        said("matmul", matmul_line(fmt, fig, kind))
    if timed.one_thread:
        one = max(timed.one_thread)
        said("threads", f"fp32  matmul  {gflops(one)} on 1 thread{rounds_tail(timed.one_thread)}")
    said(
        "memory",
        f"memory copy  {max(timed.copy):,.0f} GB/s"
        + (" (in RAM)" if not cuda else "")
        + rounds_tail(timed.copy),
    )
    if timed.h2d:
        said("h2d", f"pinned host-to-device  {max(timed.h2d):,.1f} GB/s{rounds_tail(timed.h2d)}")
    gpus = gpu.count if gpu is not None and not quick else 0
    busbw, busbw_note = measure_allreduce(gpus, seams, said)
    check = MachineCheck(
        device=name,
        kind=kind,
        matmul=figures,
        memory_gbps=max(timed.copy),
        memory_datasheet_gbps=datasheet_gbps(gpu_row),
        memory_what="device-to-device copy" if cuda else "copy in RAM",
        h2d_gbps=max(timed.h2d) if timed.h2d else None,
        allreduce_busbw_gbps=busbw,
        allreduce_note=busbw_note,
        when=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        torch=str(torch.__version__),
        driver=driver,
        host=host_name(),
        threads=threads,
        cpu_units=units,
        gpu_state=state,
        fp32_one_thread_tflops=max(timed.one_thread) if timed.one_thread else None,
        load_average=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        memory_rounds=timed.copy,
        h2d_rounds=timed.h2d,
        fp32_one_thread_rounds=timed.one_thread,
        cpus=seams.cpus() if not cuda else None,
        other_cpus=others,
    )
    check.verdicts = verdicts.judge(check)
    check.seconds = round(seams.clock() - started, 2)
    return check


@dataclass
class Timed:
    """Every figure's rounds."""

    formats: dict[str, Rounds]
    one_thread: list[float] = field(default_factory=list)  # fp32 TFLOP/s on one thread
    copy: list[float] = field(default_factory=list)  # GB/s
    h2d: list[float] = field(default_factory=list)  # GB/s


def measure_rounds(
    plan: Plan, timer: Timer, seams: Seams, said: Progress, kind: str, started: float
) -> Timed:
    """``plan.rounds`` rounds of every figure (``Rounds``). A round that would end past the
    deadline at the pace of the round before is not begun."""
    timed = Timed({fmt: Rounds(fmt, plan.shapes) for fmt in plan.formats})
    copy = seams.copy(plan.device, plan.copy_bytes)
    h2d = seams.h2d(plan.device, plan.h2d_bytes) if plan.h2d_bytes else None
    last_round = 0.0
    for number in range(plan.rounds):
        begun = seams.clock()
        if number and begun + last_round - started > plan.deadline_s:
            break
        for rounds in timed.formats.values():
            if not rounds.best:
                until = started + plan.sweep_s
                rounds.sweep(plan.device, timer, plan.budget, seams.make, until, seams.clock)
            else:
                rounds.again(plan.device, timer, plan.budget, seams.make)
        fp32 = timed.formats.get("fp32")
        if plan.threads and plan.threads > 1 and fp32 is not None and fp32.top is not None:
            timed.one_thread.append(
                one_thread(
                    fp32.top[1],
                    plan.threads,
                    plan.device,
                    timer,
                    plan.budget,
                    seams.make,
                    seams.threads,
                )
            )
        timed.copy.append(copy(timer, plan.budget))
        if h2d is not None:
            timed.h2d.append(h2d(timer, plan.budget))
        said("round", round_line(number + 1, plan.rounds, timed, kind))
        last_round = seams.clock() - begun
    return timed


def one_thread(
    combo: Combo,
    threads: int,
    device: torch.device,
    timer: Timer,
    budget: Budget,
    make: MatmulMaker,
    on: Threads | None = None,
) -> float:
    """fp32 at its best shape on one thread, where a CPU runs several: a busy machine's
    threads gain nothing, which the verdicts then say. ``on``: torch's threads unless given."""
    on = on or TorchThreads()
    on.set(1)
    try:
        return rate_of("fp32", combo, device, timer, budget, make)
    finally:
        on.set(threads)


def gflops(tflops: float) -> str:
    return f"{tflops * 1e3:,.1f} GFLOP/s"


def rate_text(tflops: float, kind: str) -> str:
    return f"{tflops:,.1f} TFLOP/s" if kind == "cuda" else gflops(tflops)


def rounds_tail(rounds: Sequence[float]) -> str:
    """' (5 rounds, median 4 % below the best)', or ' (too busy to measure: ...)'."""
    text = steady.rounds_text(rounds)
    if not text:
        return ""
    return f" ({text})" if steady.steady(rounds) else f" (too busy to measure: {text})"


def round_line(number: int, of: int, timed: Timed, kind: str) -> str:
    """'round 2 of 5: fp32 190.1, bf16 401.0, fp16 9.0 GFLOP/s; copy 21 GB/s'."""
    unit = "TFLOP/s" if kind == "cuda" else "GFLOP/s"
    scale = 1.0 if kind == "cuda" else 1e3
    rates = ", ".join(f"{fmt} {r.best[-1] * scale:,.1f}" for fmt, r in timed.formats.items())
    return f"round {number} of {of}: {rates} {unit}; copy {timed.copy[-1]:,.0f} GB/s"


def matmul_line(fmt: str, fig: MatmulFigure, kind: str) -> str:
    """'bf16  matmul  612.0 TFLOP/s at 8192x8192x8192 nt (62 % of 989.4; 5 rounds, the median
    3 % below the best)': the figure with its datasheet share and its rounds' spread."""
    shape = "x".join(str(x) for x in fig.shape)
    notes = []
    if fig.ratio is not None and fig.datasheet_tflops:
        notes.append(f"{verdicts.pct(fig.ratio)} of {fig.datasheet_tflops:g}")
    tail = rounds_tail(fig.rounds)
    if tail:
        notes.append(tail[2:-1])
    said = f" ({'; '.join(notes)})" if notes else ""
    return f"{fmt:<5} matmul  {rate_text(fig.tflops, kind)} at {shape} {fig.layout}{said}"
