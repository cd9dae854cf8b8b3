"""Telemetry without a GPU: a fake NVML module stands in for nvidia-ml-py's ``pynvml``."""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from ampscope.core import events as ev
from ampscope.core.presets import ConfigError
from ampscope.engine import telemetry
from ampscope.engine.telemetry import TelemetrySampler, nvml_report
from tests.helpers import wait_until

pytestmark = pytest.mark.unit

GPU_FIELDS = ev.SYS_GPU_FIELDS
HOST_FIELDS = ev.SYS_HOST_FIELDS


def test_every_sys_field_is_either_the_gpus_or_the_hosts() -> None:
    """A new SysEvent field must be read by one of the two readers (or be the ranks' list)."""
    fields = set(ev.SysEvent.__struct_fields__) - set(ev.Event.__struct_fields__) - {"ranks"}
    assert fields == set(GPU_FIELDS) | set(HOST_FIELDS)
    assert not set(GPU_FIELDS) & set(HOST_FIELDS)


GiB = 2**30


# --------------------------------------------------------------------------- a fake pynvml


class NVMLError(Exception):
    STRINGS = {
        3: "Not Supported",
        9: "Driver Not Loaded",
        12: "NVML Shared Library Not Found",
        13: "Function Not Found",
        15: "GPU is lost",
        999: "Unknown Error",
    }

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self.STRINGS.get(self.value, f"NVML Error with code {self.value}")


class NVMLError_NotSupported(NVMLError):  # noqa: N801 - nvidia-ml-py's names
    def __init__(self) -> None:
        super().__init__(3)


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    def __init__(self) -> None:
        super().__init__(15)


class NVMLError_Unknown(NVMLError):  # noqa: N801
    def __init__(self) -> None:
        super().__init__(999)


@dataclass
class FakeGpu:
    uuid: str  # as NVML reports it: 'GPU-...'
    pci: str = "00000000:3B:00.0"
    name: str = "NVIDIA H100 80GB HBM3"
    util: int = 50
    mem_util: int = 20
    mem_used: int = 10 * GiB
    mem_total: int = 80 * GiB
    power_mw: int = 250_500
    limit_mw: int = 700_000
    temp: int = 61
    sm_clock: int = 1980
    reasons: int = 0
    procs: list[Any] = field(default_factory=list)
    cc: tuple[int, int] = (9, 0)
    errors: dict[str, Exception] = field(default_factory=dict)  # function name -> raised
    lost: bool = False
    parent: FakeGpu | None = None  # a MIG slice's full GPU


@dataclass
class Obj:
    """What nvidia-ml-py returns: structs read by attribute."""

    gpu: int = 0
    memory: int = 0
    used: int = 0
    total: int = 0
    free: int = 0
    pid: int = 0
    usedGpuMemory: int | None = None  # noqa: N815
    busId: bytes = b""  # noqa: N815


class FakeNvml:
    """The subset of ``pynvml`` the engine uses, with the real names and constants."""

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_Unknown = NVMLError_Unknown
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_DRIVER_NOT_LOADED = 9
    NVML_ERROR_LIBRARY_NOT_FOUND = 12
    NVML_ERROR_FUNCTION_NOT_FOUND = 13
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    nvmlClocksEventReasonGpuIdle = 0x1
    nvmlClocksEventReasonApplicationsClocksSetting = 0x2
    nvmlClocksEventReasonSwPowerCap = 0x4
    nvmlClocksEventReasonHwSlowdown = 0x8
    nvmlClocksEventReasonSyncBoost = 0x10
    nvmlClocksEventReasonSwThermalSlowdown = 0x20
    nvmlClocksEventReasonHwThermalSlowdown = 0x40
    nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80
    nvmlClocksThrottleReasonSwPowerCap = 0x4

    def __init__(self, *gpus: FakeGpu, init_error: Exception | None = None) -> None:
        self.gpus = list(gpus)
        self.init_error = init_error
        self.calls: list[str] = []
        self.inits = self.shutdowns = 0

    def _dev(self, name: str, h: FakeGpu) -> FakeGpu:
        self.calls.append(name)
        if h.lost:
            raise NVMLError_GpuIsLost()
        if name in h.errors:
            raise h.errors[name]
        return h

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.124.06"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12080

    def nvmlDeviceGetCount(self) -> int:
        self.calls.append("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        self.calls.append("nvmlDeviceGetHandleByIndex")
        return self.gpus[i]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeGpu:
        self.calls.append("nvmlDeviceGetHandleByUUID")
        for g in self.gpus:
            if g.uuid == uuid:
                return g
        raise NVMLError(6)  # NVML_ERROR_NOT_FOUND

    def nvmlDeviceGetHandleByPciBusId(self, bus: str) -> FakeGpu:
        self.calls.append("nvmlDeviceGetHandleByPciBusId")
        for g in self.gpus:
            if g.pci.lower() == bus.lower():
                return g
        raise NVMLError(6)

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return self._dev("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return self._dev("nvmlDeviceGetName", h).name

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> Obj:
        return Obj(busId=self._dev("nvmlDeviceGetPciInfo", h).pci.encode())

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Obj:
        g = self._dev("nvmlDeviceGetUtilizationRates", h)
        return Obj(gpu=g.util, memory=g.mem_util)

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Obj:
        g = self._dev("nvmlDeviceGetMemoryInfo", h)
        return Obj(used=g.mem_used, total=g.mem_total, free=g.mem_total - g.mem_used)

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[Any]:
        return list(self._dev("nvmlDeviceGetComputeRunningProcesses", h).procs)

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return self._dev("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        return self._dev("nvmlDeviceGetEnforcedPowerLimit", h).limit_mw

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._dev("nvmlDeviceGetTemperature", h).temp

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return self._dev("nvmlDeviceGetClockInfo", h).sm_clock

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        return self._dev("nvmlDeviceGetCurrentClocksEventReasons", h).reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeGpu) -> int:
        return self._dev("nvmlDeviceGetCurrentClocksThrottleReasons", h).reasons

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeGpu) -> tuple[int, int]:
        return self._dev("nvmlDeviceGetCudaComputeCapability", h).cc

    def nvmlDeviceIsMigDeviceHandle(self, h: FakeGpu) -> int:
        return int(self._dev("nvmlDeviceIsMigDeviceHandle", h).parent is not None)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h: FakeGpu) -> FakeGpu:
        parent = self._dev("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", h).parent
        if parent is None:
            raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT: not a MIG handle
        return parent


UUID_A = "GPU-11111111-2222-3333-4444-555555555555"
UUID_B = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


def torch_uuid(nvml_uuid: str) -> str:
    """torch's ``get_device_properties(i).uuid`` prints without NVML's 'GPU-' prefix."""
    return nvml_uuid.removeprefix("GPU-")


def me(used: int | None = 3 * GiB) -> Obj:
    return Obj(pid=os.getpid(), usedGpuMemory=used)


class Collect:
    def __init__(self) -> None:
        self.events: list[ev.Event] = []
        self.lock = threading.Lock()

    def __call__(self, event: ev.Event) -> None:
        with self.lock:
            self.events.append(event)

    def of(self, kind: type) -> list[Any]:
        with self.lock:
            return [e for e in self.events if isinstance(e, kind)]

    def warnings(self, code: str | None = None) -> list[ev.WarningEvent]:
        return [w for w in self.of(ev.WarningEvent) if code is None or w.code == code]


def sampler(nvml: Any, uuid: str | None = UUID_A, **kw: Any) -> tuple[TelemetrySampler, Collect]:
    out = Collect()
    uuid = torch_uuid(uuid) if uuid else None
    return TelemetrySampler(out, uuid=uuid, nvml_module=nvml, **kw), out


def assert_host_present(e: ev.SysEvent) -> None:
    for name in HOST_FIELDS:
        assert getattr(e, name) is not None, name
    assert e.proc_rss > 0
    assert 0 < e.sys_mem_used <= e.sys_mem_total


# --------------------------------------------------------------------------- the fake is faithful


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is None, reason="nvidia-ml-py missing")
def test_fake_uses_nvidia_ml_py_names_and_values() -> None:
    import pynvml

    for name in dir(FakeNvml):
        if name.startswith(("NVML", "nvml")):
            assert hasattr(pynvml, name), f"pynvml has no {name}"
            value = getattr(FakeNvml, name)
            if isinstance(value, int):
                assert getattr(pynvml, name) == value, name
    for name, code in telemetry._ERR_CODES.items():
        assert getattr(pynvml, name) == code, name
    for bit, short in telemetry.THROTTLE_REASONS:
        camel = {
            "sw_power_cap": "SwPowerCap",
            "hw_slowdown": "HwSlowdown",
            "sync_boost": "SyncBoost",
            "sw_thermal": "SwThermalSlowdown",
            "hw_thermal": "HwThermalSlowdown",
            "power_brake": "HwPowerBrakeSlowdown",
            "display_clock": "DisplayClockSetting",
            "board_limit": "BoardLimit",
            "reliability": "Reliability",
        }[short]
        assert getattr(pynvml, "nvmlClocksThrottleReason" + camel) == bit, short
    assert isinstance(
        pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED), pynvml.NVMLError_NotSupported
    )


# --------------------------------------------------------------------------- samples


def test_full_sample_from_the_gpu_torch_uses() -> None:
    gpu = FakeGpu(UUID_A, procs=[Obj(pid=1, usedGpuMemory=GiB), me(3 * GiB)])
    s, out = sampler(FakeNvml(gpu))
    e = s.tick()
    assert out.warnings() == []
    assert (e.gpu_util, e.gpu_mem_util) == (50.0, 20.0)
    assert (e.gpu_mem_used, e.gpu_mem_total, e.proc_gpu_mem) == (10 * GiB, 80 * GiB, 3 * GiB)
    assert e.power_w == pytest.approx(250.5) and e.power_limit_w == pytest.approx(700.0)
    assert (e.temp_c, e.sm_clock_mhz, e.throttle) == (61.0, 1980.0, [])
    assert_host_present(e)
    assert out.of(ev.SysEvent) == [e]
    assert ev.decode(ev.encode(e)) == e  # the sample fits the wire schema


def test_slow_fields_are_cached_and_figures_follow_the_gpu() -> None:
    gpu = FakeGpu(UUID_A, procs=[me()])
    nvml = FakeNvml(gpu)
    s, _ = sampler(nvml)
    s.tick()
    gpu.util, gpu.power_mw = 97, 690_000
    e = s.tick()
    assert (e.gpu_util, e.power_w) == (97.0, 690.0)
    assert nvml.calls.count("nvmlInit") == 1
    assert nvml.calls.count("nvmlDeviceGetEnforcedPowerLimit") == 1


def test_cpu_run_samples_host_only_without_touching_nvml() -> None:
    nvml = FakeNvml(FakeGpu(UUID_A))
    s, out = sampler(nvml, uuid=None)
    e = s.tick()
    assert out.warnings() == [] and nvml.calls == []
    assert all(getattr(e, f) is None for f in GPU_FIELDS)
    assert_host_present(e)


def test_missing_nvidia_ml_py_warns_once_with_the_install_command(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    out = Collect()
    s = TelemetrySampler(out, uuid=torch_uuid(UUID_A))
    events = [s.tick() for _ in range(3)]
    [w] = out.warnings()
    assert w.code == "nvml-missing" and "pip install nvidia-ml-py" in w.message
    for e in events:
        assert e.gpu_util is None
        assert_host_present(e)
    report = nvml_report()
    assert report["available"] is False and "pip install nvidia-ml-py" in report["why"]


@pytest.mark.parametrize(
    "code", [FakeNvml.NVML_ERROR_DRIVER_NOT_LOADED, FakeNvml.NVML_ERROR_LIBRARY_NOT_FOUND]
)
def test_no_driver_warns_once_naming_libnvidia_ml(code: int) -> None:
    nvml = FakeNvml(FakeGpu(UUID_A), init_error=NVMLError(code))
    s, out = sampler(nvml)
    events = [s.tick() for _ in range(3)]
    [w] = out.warnings()
    assert w.code == "nvml-no-driver"
    assert "libnvidia-ml.so" in w.message and "nvidia-smi" in w.message
    assert all(e.gpu_util is None and e.cpu_util is not None for e in events)
    assert nvml.calls.count("nvmlInit") == 1  # not retried every sample


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is None, reason="nvidia-ml-py missing")
def test_real_nvidia_ml_py_without_a_driver() -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    except pynvml.NVMLError:
        pass
    out = Collect()
    s = TelemetrySampler(out, uuid=torch_uuid(UUID_A))
    e = s.tick()
    s.tick()
    [w] = out.warnings()
    assert w.code == "nvml-no-driver" and "libnvidia-ml.so" in w.message
    assert_host_present(e)
    report = nvml_report()
    assert report["available"] is False and "libnvidia-ml.so" in report["why"]


def test_unsupported_field_is_null_with_one_warning_and_the_rest_present() -> None:
    gpu = FakeGpu(
        UUID_A, procs=[me()], errors={"nvmlDeviceGetPowerUsage": NVMLError_NotSupported()}
    )
    nvml = FakeNvml(gpu)
    s, out = sampler(nvml)
    events = [s.tick() for _ in range(3)]
    [w] = out.warnings()
    assert w.code == "nvml-field-unsupported"
    assert "power draw" in w.message and "not supported" in w.message
    for e in events:
        assert e.power_w is None
        assert e.gpu_util == 50.0 and e.temp_c == 61.0 and e.power_limit_w == 700.0
    assert nvml.calls.count("nvmlDeviceGetPowerUsage") == 1  # not asked again
    assert out.events.index(w) < out.events.index(events[0])  # the reason comes first


@pytest.mark.parametrize("error", [NVMLError_GpuIsLost, NVMLError_Unknown])
def test_gpu_lost_mid_run_warns_once_then_host_only(error: type[NVMLError]) -> None:
    gpu = FakeGpu(UUID_A, procs=[me()])
    nvml = FakeNvml(gpu)
    s, out = sampler(nvml)
    first = s.tick()
    assert first.gpu_util == 50.0
    if error is NVMLError_GpuIsLost:
        gpu.lost = True
    else:  # any error on a field that used to work means the same
        gpu.errors["nvmlDeviceGetUtilizationRates"] = error()
    later = [s.tick() for _ in range(3)]
    [w] = out.warnings()
    assert w.code == "gpu-lost" and "host figures continue" in w.message
    calls_after_loss = len(nvml.calls)
    s.tick()
    assert len(nvml.calls) == calls_after_loss  # NVML is left alone once the GPU is gone
    for e in later:
        assert all(getattr(e, f) is None for f in GPU_FIELDS)
        assert_host_present(e)


def test_lost_on_the_first_read_is_still_gpu_lost() -> None:
    # Utilization and memory answer, then the temperature read finds the GPU gone.
    gpu = FakeGpu(UUID_A, errors={"nvmlDeviceGetTemperature": NVMLError_GpuIsLost()})
    s, out = sampler(FakeNvml(gpu))
    e = s.tick()
    assert [w.code for w in out.warnings()] == ["gpu-lost"]
    assert all(getattr(e, f) is None for f in GPU_FIELDS)  # nothing half-read from a lost GPU
    assert_host_present(e)


def test_cuda_visible_devices_reordering_picks_the_gpu_by_uuid() -> None:
    # CUDA_VISIBLE_DEVICES=1,0: torch's cuda:0 is the GPU NVML numbers 1.
    a = FakeGpu(UUID_A, pci="00000000:18:00.0", util=5, temp=30, procs=[])
    b = FakeGpu(UUID_B, pci="00000000:3B:00.0", util=93, temp=71, procs=[me(7 * GiB)])
    s, out = sampler(FakeNvml(a, b), uuid=UUID_B)
    e = s.tick()
    assert out.warnings() == []
    assert (e.gpu_util, e.temp_c, e.proc_gpu_mem) == (93.0, 71.0, 7 * GiB)


@pytest.mark.parametrize("uuid", [UUID_B, UUID_B.upper(), torch_uuid(UUID_B).upper()])
def test_uuid_matches_however_it_is_spelled(uuid: str) -> None:
    nvml = FakeNvml(FakeGpu(UUID_A, util=5), FakeGpu(UUID_B, util=93))
    out = Collect()
    e = TelemetrySampler(out, uuid=uuid, nvml_module=nvml).tick()
    assert e.gpu_util == 93.0 and out.warnings() == []


def test_pci_bus_id_alone_finds_the_gpu() -> None:
    a = FakeGpu(UUID_A, pci="00000000:18:00.0", util=5)
    b = FakeGpu(UUID_B, pci="00000000:3B:00.0", util=93)
    out = Collect()
    e = TelemetrySampler(out, pci_bus_id="0000:3b:00.0", nvml_module=FakeNvml(a, b)).tick()
    assert e.gpu_util == 93.0 and out.warnings() == []


def test_unknown_uuid_warns_listing_what_nvml_sees() -> None:
    s, out = sampler(FakeNvml(FakeGpu(UUID_A)), uuid="GPU-99999999-0000-0000-0000-000000000000")
    e = s.tick()
    s.tick()
    [w] = out.warnings()
    assert w.code == "nvml-gpu-not-found" and UUID_A in w.message
    assert e.gpu_util is None and e.cpu_util is not None


@pytest.mark.parametrize(
    ("mask", "expected"),
    [
        (0x4 | 0x40, ["sw_power_cap", "hw_thermal"]),
        (0x8 | 0x20 | 0x80, ["hw_slowdown", "sw_thermal", "power_brake"]),
        (0x10, ["sync_boost"]),
        (0x1, []),  # idle is not a slowdown
        (0x2 | 0x1, []),  # nor clocks pinned on purpose
        (0x1 | 0x4, ["sw_power_cap"]),
    ],
)
def test_throttle_reasons_are_decoded(mask: int, expected: list[str]) -> None:
    s, _ = sampler(FakeNvml(FakeGpu(UUID_A, reasons=mask)))
    assert s.tick().throttle == expected


def test_throttle_falls_back_to_the_pre_535_function() -> None:
    class OldNvml(FakeNvml):
        nvmlDeviceGetCurrentClocksEventReasons = None  # an nvidia-ml-py older than 12.535

    del OldNvml.nvmlDeviceGetCurrentClocksEventReasons
    nvml = OldNvml(FakeGpu(UUID_A, reasons=0x4))
    s, out = sampler(nvml)
    assert s.tick().throttle == ["sw_power_cap"] and out.warnings() == []
    assert s.tick().throttle == ["sw_power_cap"]


def test_process_memory_none_when_nvml_cannot_attribute_it() -> None:
    s, out = sampler(FakeNvml(FakeGpu(UUID_A, procs=[me(used=None)])))
    e = s.tick()
    assert e.proc_gpu_mem is None and e.gpu_mem_used == 10 * GiB and out.warnings() == []


def test_process_not_listed_warns_once_about_pid_namespaces() -> None:
    others = [Obj(pid=1, usedGpuMemory=GiB), Obj(pid=2, usedGpuMemory=GiB)]
    s, out = sampler(FakeNvml(FakeGpu(UUID_A, procs=others)))
    events = [s.tick() for _ in range(telemetry.PID_MISSES_BEFORE_WARNING + 3)]
    [w] = out.warnings()
    assert w.code == "nvml-process-not-listed" and "--pid=host" in w.message
    assert all(e.proc_gpu_mem is None and e.gpu_util == 50.0 for e in events)


@pytest.mark.unit
def test_in_a_container_the_one_compute_process_listed_is_taken_for_ours() -> None:
    """NVML lists host pids inside a container: ours is never found under its own pid."""
    s, out = sampler(FakeNvml(FakeGpu(UUID_A, procs=[Obj(pid=4242, usedGpuMemory=3 * GiB)])))
    events = [s.tick() for _ in range(telemetry.PID_MISSES_BEFORE_WARNING + 2)]
    assert all(e.proc_gpu_mem == 3 * GiB for e in events)
    [w] = out.warnings()
    assert w.code == "nvml-process-not-listed"
    assert "exactly one compute process (pid 4242)" in w.message and "host pids" in w.message


NOT_SUPPORTED = NVMLError_NotSupported()


@pytest.mark.unit
def test_a_mig_slice_reads_utilization_and_power_through_its_parent() -> None:
    full = FakeGpu(UUID_B, util=77, power_mw=400_000)
    errors = {
        "nvmlDeviceGetUtilizationRates": NOT_SUPPORTED,
        "nvmlDeviceGetPowerUsage": NOT_SUPPORTED,
    }
    mig = FakeGpu(UUID_A, util=0, power_mw=0, errors=errors, parent=full, procs=[me()])
    s, out = sampler(FakeNvml(mig, full))
    first, second = s.tick(), s.tick()
    for e in (first, second):
        assert e.gpu_util == 77.0 and e.power_w == pytest.approx(400.0)
        assert e.gpu_mem_used == 10 * GiB  # the slice's own figures stay the slice's
    assert out.warnings() == []


@pytest.mark.unit
def test_a_whole_gpu_that_cannot_report_power_says_so_and_has_no_parent() -> None:
    gpu = FakeGpu(UUID_A, errors={"nvmlDeviceGetPowerUsage": NOT_SUPPORTED}, procs=[me()])
    s, out = sampler(FakeNvml(gpu))
    e = s.tick()
    assert e.power_w is None and e.gpu_util == 50.0
    assert [w.code for w in out.warnings()] == ["nvml-field-unsupported"]


# --------------------------------------------------------------------------- rate and thread


@pytest.mark.parametrize("hz", [0.1, 20, 0, -1, float("nan")])
def test_rate_out_of_range_is_refused_with_the_accepted_range(hz: float) -> None:
    with pytest.raises(ConfigError, match=r"accepted 0\.25 to 10 Hz"):
        TelemetrySampler(Collect(), hz=hz)


@pytest.mark.parametrize("hz", [0.25, 2, 10])
def test_rate_in_range_is_accepted(hz: float) -> None:
    assert TelemetrySampler(Collect(), hz=hz).period == pytest.approx(1 / hz)


def test_sampler_thread_emits_at_about_the_rate_and_stops_promptly() -> None:
    s, out = sampler(FakeNvml(FakeGpu(UUID_A, procs=[me()])), hz=10)
    began = time.monotonic()
    s.start()
    assert wait_until(lambda: len(out.of(ev.SysEvent)) >= 2, 30)  # a loaded machine runs it late
    started = time.monotonic()
    s.stop()
    assert time.monotonic() - started < 2.0  # not a period late: the stop wakes the thread
    assert not s.running
    samples = out.of(ev.SysEvent)
    # never faster than the rate: one sample a period, one at the start and one at the stop
    assert 2 <= len(samples) <= (time.monotonic() - began) * 10 + 2
    assert all(e.gpu_util == 50.0 and e.cpu_util is not None for e in samples)
    time.sleep(0.25)
    assert len(out.of(ev.SysEvent)) == len(samples)  # nothing after stop


def test_stop_does_not_wait_out_a_long_period_and_shuts_nvml_down() -> None:
    nvml = FakeNvml(FakeGpu(UUID_A))
    s, out = sampler(nvml, hz=0.25)  # 4 s between samples
    s.start()
    time.sleep(0.05)
    started = time.monotonic()
    s.stop()
    assert time.monotonic() - started < 2.0  # half the period: it did not wait the period out
    # a run shorter than one period still gets one sample, taken at the stop; the NVML that
    # sample opened is closed again
    (only,) = out.of(ev.SysEvent)
    assert only.gpu_util is not None and only.cpu_util is not None
    assert nvml.inits == nvml.shutdowns == 1
    s.stop()  # a second stop takes no more samples
    assert len(out.of(ev.SysEvent)) == 1 and nvml.shutdowns == 1


def test_a_failing_emit_does_not_kill_the_sampler() -> None:
    seen: list[ev.Event] = []

    def emit(event: ev.Event) -> None:
        seen.append(event)
        if len(seen) == 1:
            raise BrokenPipeError

    s = TelemetrySampler(emit, hz=10).start()
    assert wait_until(lambda: len(seen) >= 2, 30)  # the sample after the failed hand-over comes
    s.stop()


def test_a_lost_sample_is_reported_once_in_the_stream_and_sampling_goes_on() -> None:
    seen: list[ev.Event] = []
    calls = 0
    enough = threading.Event()

    def emit(event: ev.Event) -> None:  # an output that fails every other hand-over
        nonlocal calls
        calls += 1
        if calls % 2 == 1:
            raise BrokenPipeError(32, "Broken pipe")
        seen.append(event)
        if sum(isinstance(e, ev.SysEvent) for e in seen) >= 3:
            enough.set()

    s = TelemetrySampler(emit, hz=10).start()
    assert enough.wait(30), "the sampler stopped after a failing hand-over"
    s.stop()
    faults = [e for e in seen if isinstance(e, ev.WarningEvent)]
    assert [w.code for w in faults] == ["telemetry-fault"]
    assert "BrokenPipeError" in faults[0].message and "goes on" in faults[0].message


# --------------------------------------------------------------------------- doctor


def test_nvml_report_lists_every_gpu_in_nvml_order() -> None:
    a = FakeGpu(
        UUID_A, pci="00000000:18:00.0", name="NVIDIA A100-SXM4-80GB", cc=(8, 0), limit_mw=400_000
    )
    b = FakeGpu(
        UUID_B,
        pci="00000000:3B:00.0",
        errors={"nvmlDeviceGetEnforcedPowerLimit": NVMLError_NotSupported()},
    )
    nvml = FakeNvml(a, b)
    report = nvml_report(nvml)
    assert report["available"] is True and report["why"] is None
    assert report["driver_version"] == "570.124.06" and report["cuda_driver_version"] == "12.8"
    first, second = report["gpus"]
    assert first == {
        "nvml_index": 0,
        "name": "NVIDIA A100-SXM4-80GB",
        "uuid": UUID_A,
        "pci_bus_id": "00000000:18:00.0",
        "memory_total": 80 * GiB,
        "power_limit_w": 400.0,
        "compute_capability": "8.0",
        "errors": {},
    }
    assert second["uuid"] == UUID_B and second["compute_capability"] == "9.0"
    assert second["power_limit_w"] is None
    assert second["errors"] == {"power_limit_w": "not supported on this GPU"}
    assert nvml.inits == nvml.shutdowns == 1


def test_nvml_report_when_the_driver_is_missing() -> None:
    nvml = FakeNvml(init_error=NVMLError(FakeNvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    report = nvml_report(nvml)
    assert report["available"] is False and report["gpus"] == []
    assert "libnvidia-ml.so" in report["why"] and "nvidia-smi" in report["why"]


def test_nvml_report_never_raises() -> None:
    class Broken:
        def __getattr__(self, name: str) -> Any:
            raise RuntimeError("binding exploded")

    report = nvml_report(Broken())
    assert report["available"] is False and report["why"]


# --------------------------------------------------------------------------- wiring into a run


def test_start_for_run_writes_decodable_sys_lines_through_the_event_writer() -> None:
    from types import SimpleNamespace

    from ampscope.engine.emitter import EventWriter
    from tests.helpers import MemoryRecord

    record = MemoryRecord()
    writer = EventWriter(record)
    cpu = SimpleNamespace(uuid=None, is_cuda=False)  # what DeviceInfo gives on a CPU run
    s = telemetry.start_for_run(writer, cpu, hz=10)
    time.sleep(0.35)
    s.stop()
    writer.close()
    decoded = [ev.decode(line) for line in record.data.splitlines()]
    samples = [e for e in decoded if isinstance(e, ev.SysEvent)]
    assert len(samples) >= 1 and len(samples) == len(decoded)  # no warnings on a CPU run
    assert all(e.cpu_util is not None and e.gpu_util is None for e in samples)


def test_cuda_run_without_a_uuid_says_so_instead_of_guessing_by_index() -> None:
    nvml = FakeNvml(FakeGpu(UUID_A))
    out = Collect()
    e = TelemetrySampler(out, cuda=True, nvml_module=nvml).tick()
    [w] = out.warnings()
    assert w.code == "nvml-gpu-not-found" and "CUDA_VISIBLE_DEVICES" in w.message
    assert e.gpu_util is None and nvml.calls == []
