"""What one telemetry sample costs the engine process, in microseconds (median of many).

    python benchmarks/sampler_cost.py [--samples N]

Rows: the psutil calls one sample makes, a host-only sample (CPU runs), a sample against an
in-process fake NVML (the sampler's own overhead, NVML itself costing nothing), and, where an
NVIDIA driver answers, a sample against the real NVML on GPU 0 plus its single calls.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ampscope.engine import telemetry  # noqa: E402
from ampscope.engine.telemetry import TelemetrySampler  # noqa: E402

UUID = "GPU-11111111-2222-3333-4444-555555555555"


class _NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


def fake_nvml() -> SimpleNamespace:
    """Answers every call the sampler makes at once, like a very fast driver."""
    gpu = object()
    util = SimpleNamespace(gpu=87, memory=41)
    mem = SimpleNamespace(used=40 * 2**30, total=80 * 2**30, free=40 * 2**30)
    procs = [
        SimpleNamespace(pid=1, usedGpuMemory=2**30),
        SimpleNamespace(pid=os.getpid(), usedGpuMemory=30 * 2**30),
    ]
    return SimpleNamespace(
        NVMLError=_NVMLError,
        NVML_TEMPERATURE_GPU=0,
        NVML_CLOCK_SM=1,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByUUID=lambda u: gpu,
        nvmlDeviceGetUtilizationRates=lambda h: util,
        nvmlDeviceGetMemoryInfo=lambda h: mem,
        nvmlDeviceGetComputeRunningProcesses=lambda h: procs,
        nvmlDeviceGetPowerUsage=lambda h: 612_000,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700_000,
        nvmlDeviceGetTemperature=lambda h, s: 66,
        nvmlDeviceGetClockInfo=lambda h, c: 1980,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x4,
    )


def median_us(fn: Any, n: int) -> tuple[float, float]:
    for _ in range(min(50, n)):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    times.sort()
    return statistics.median(times) / 1000, times[int(len(times) * 0.9)] / 1000


def real_nvml_rows(n: int) -> list[tuple[str, float, float]]:
    pynvml, why = telemetry.load_nvml()
    if pynvml is None:
        print(f"(real NVML skipped: {why})")
        return []
    failure = telemetry.nvml_init(pynvml)
    if failure is not None:
        print(f"(real NVML skipped: {failure[1]})")
        return []
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            print("(real NVML skipped: no GPU)")
            return []
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        uuid = telemetry.as_text(pynvml.nvmlDeviceGetUUID(h))
        calls = [
            ("nvmlDeviceGetUtilizationRates", (h,)),
            ("nvmlDeviceGetMemoryInfo", (h,)),
            ("nvmlDeviceGetComputeRunningProcesses", (h,)),
            ("nvmlDeviceGetPowerUsage", (h,)),
            ("nvmlDeviceGetTemperature", (h, pynvml.NVML_TEMPERATURE_GPU)),
            ("nvmlDeviceGetClockInfo", (h, pynvml.NVML_CLOCK_SM)),
            ("nvmlDeviceGetCurrentClocksEventReasons", (h,)),
        ]
        rows = []
        for name, args in calls:
            fn = getattr(pynvml, name, None)
            if fn is None:
                continue
            try:
                fn(*args)
            except pynvml.NVMLError as exc:
                print(f"({name}: {exc})")
                continue
            rows.append((f"  real {name}", *median_us(lambda f=fn, a=args: f(*a), n)))
        s = TelemetrySampler(lambda e: None, uuid=uuid)
        s.read()
        rows.insert(0, ("sample, real NVML (GPU 0) + host", *median_us(s.read, n)))
        s.stop()
        return rows
    finally:
        pynvml.nvmlShutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    n = parser.parse_args().samples

    import psutil

    proc = psutil.Process()
    rows = [
        ("  psutil.cpu_percent", *median_us(lambda: psutil.cpu_percent(None), n)),
        ("  Process.cpu_percent", *median_us(lambda: proc.cpu_percent(None), n)),
        ("  Process.memory_info", *median_us(proc.memory_info, n)),
        ("  psutil.virtual_memory", *median_us(psutil.virtual_memory, n)),
    ]
    host = TelemetrySampler(lambda e: None)
    rows.insert(0, ("sample, host only (CPU run)", *median_us(host.read, n)))
    faked = TelemetrySampler(lambda e: None, uuid=UUID, nvml_module=fake_nvml())
    assert faked.read().gpu_util == 87.0
    rows.append(("sample, fake NVML + host", *median_us(faked.read, n)))
    rows += real_nvml_rows(min(n, 500))

    width = max(len(r[0]) for r in rows)
    print(f"{'what':<{width}}  {'median us':>9}  {'p90 us':>7}")
    print(f"{'-' * width}  {'-' * 9}  {'-' * 7}")
    for name, med, p90 in rows:
        print(f"{name:<{width}}  {med:>9.1f}  {p90:>7.1f}")
    host_us, hz = rows[0][1], telemetry.DEFAULT_HZ
    print(
        f"\n{n} samples each. At the default {hz:g} Hz a host-only sampler costs about "
        f"{host_us * hz / 1e4:.3f}% of one core."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
