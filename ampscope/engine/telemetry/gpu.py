"""The run's GPU as NVML sees it: utilization, memory, power, clocks, throttling.

Costs: some NVML calls take ~0.4 ms, so slow-changing figures (total memory, the power limit)
are read once or every POWER_LIMIT_REFRESH_S, not every sample.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from ampscope.core import events as ev
from ampscope.engine.telemetry.codes import W_FIELD, W_GPU_LOST, W_GPU_NOT_FOUND, W_PROCESS
from ampscope.engine.telemetry.nvml import (
    decode_throttle_reasons,
    describe_nvml_error,
    find_gpu_handle,
    is_nvml_error,
    missing_function,
    nvml_call,
    nvml_init,
)

POWER_LIMIT_REFRESH_S = 30.0  # the enforced limit changes only when someone runs nvidia-smi -pl
PID_MISSES_BEFORE_WARNING = 5
PARENT_FIELDS = ("utilization", "power")  # read through a MIG slice's parent GPU if need be

_EVENT_REASONS = "nvmlDeviceGetCurrentClocksEventReasons"
_THROTTLE_REASONS = "nvmlDeviceGetCurrentClocksThrottleReasons"  # drivers before 535

FIELD_LABELS = {
    "utilization": "GPU utilization",
    "memory": "GPU memory use",
    "processes": "this process's GPU memory",
    "power": "power draw",
    "power_limit": "the power limit",
    "temperature": "GPU temperature",
    "sm_clock": "the SM clock",
    "throttle": "clock throttle reasons",
}


class GpuReader:
    """The GPU's figures through NVML, one field at a time, never raising.

    A field that fails the first time it is read (NotSupported, no permission, ...) stays null
    and its reason is recorded once. An error on a field that worked before, or GpuIsLost at
    any time, means the GPU is gone: one ``gpu-lost`` reason, and no further NVML calls.
    """

    def __init__(
        self,
        nvml: Any,
        uuid: str | None,
        pci_bus_id: str | None = None,
        *,
        pid: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nvml = nvml
        self.uuid = uuid
        self.pci_bus_id = pci_bus_id
        self.pid = os.getpid() if pid is None else pid
        self.clock = clock
        self.handle: Any = None
        self.opened = False
        self.initialised = False
        self.lost = False
        self.unavailable: str | None = None  # why there are no GPU figures at all
        self.failed: dict[str, str] = {}  # field -> why it stays null
        self._worked: set[str] = set()
        self._fn: dict[str, str] = {}  # field -> the function name that worked
        self._reasons: list[tuple[str, str]] = []  # (code, message) not yet handed out
        self._mem_total: int | None = None
        self._power_limit: float | None = None
        self._power_limit_at = -float("inf")
        self._pid_seen = False
        self._pid_misses = 0
        self._stand_in: int | None = None  # the one process NVML lists, taken for ours
        self._parent: Any = None  # a MIG slice's parent GPU, once a field needed it
        self.via_parent: set[str] = set()  # fields read through the parent (the whole GPU's)

    def open(self) -> bool:
        """Initialise NVML and find the GPU. False (with one reason recorded) if not possible."""
        if self.opened:
            return self.handle is not None
        self.opened = True
        failure = nvml_init(self.nvml)
        if failure is not None:
            code, why = failure
            self._no_gpu(code, why)
            return False
        self.initialised = True
        handle, found = find_gpu_handle(self.nvml, self.uuid, self.pci_bus_id)
        if handle is None:
            self._no_gpu(W_GPU_NOT_FOUND, found or "the GPU was not found")
            return False
        self.handle = handle
        return True

    def close(self) -> None:
        if self.initialised:
            self.initialised = False
            nvml_call(self.nvml, "nvmlShutdown")

    def take_reasons(self) -> list[tuple[str, str]]:
        reasons, self._reasons = self._reasons, []
        return reasons

    @property
    def active(self) -> bool:
        return self.handle is not None and not self.lost

    def call(self, field: str, names: str | Sequence[str], *args: Any) -> Any | None:
        """One NVML read for ``field``; alternatives in ``names`` are tried when a function is
        missing (an older driver or nvidia-ml-py). None when the field cannot be read."""
        if not self.active or field in self.failed:
            return None
        if field in self.via_parent:
            args = (self._parent, *args[1:])
        candidates = [names] if isinstance(names, str) else list(names)
        if field in self._fn:
            candidates = [self._fn[field]]
        exc: BaseException | None = None
        for name in candidates:
            value, exc = nvml_call(self.nvml, name, *args)
            if exc is None:
                self._fn[field] = name
                self._worked.add(field)
                return value
            if not missing_function(self.nvml, exc):
                break
        assert exc is not None
        if field in PARENT_FIELDS and field not in self.via_parent and self._parent_answers(exc):
            self.via_parent.add(field)
            return self.call(field, names, *args)
        self._fail(field, exc)
        return None

    def _parent_answers(self, exc: BaseException) -> bool:
        """A MIG slice answers NOT_SUPPORTED for utilization and power: its parent GPU does."""
        if not is_nvml_error(self.nvml, exc, "NVML_ERROR_NOT_SUPPORTED"):
            return False
        if self._parent is None:
            mig, _ = nvml_call(self.nvml, "nvmlDeviceIsMigDeviceHandle", self.handle)
            if not mig:
                return False
            name = "nvmlDeviceGetDeviceHandleFromMigDeviceHandle"
            self._parent, _ = nvml_call(self.nvml, name, self.handle)
        return self._parent is not None

    def read(self) -> dict[str, Any]:
        """The GPU fields of a SysEvent; every field None when there is no GPU to read."""
        out: dict[str, Any] = dict.fromkeys(ev.SYS_GPU_FIELDS)
        if not self.opened:
            self.open()
        if not self.active:
            return out
        nvml, h = self.nvml, self.handle
        util = self.call("utilization", "nvmlDeviceGetUtilizationRates", h)
        if util is not None:
            out["gpu_util"] = float(util.gpu)
            out["gpu_mem_util"] = float(util.memory)  # memory-controller busy %, not capacity
        mem = self.call("memory", "nvmlDeviceGetMemoryInfo", h)
        if mem is not None:
            if self._mem_total is None:
                self._mem_total = int(mem.total)
            out["gpu_mem_used"] = int(mem.used)
        out["gpu_mem_total"] = self._mem_total if self.active else None
        out["proc_gpu_mem"] = self._process_memory(h)
        power = self.call("power", "nvmlDeviceGetPowerUsage", h)
        out["power_w"] = power / 1000.0 if power is not None else None
        out["power_limit_w"] = self._read_power_limit(h)
        temp = self.call(
            "temperature", "nvmlDeviceGetTemperature", h, getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
        )
        out["temp_c"] = float(temp) if temp is not None else None
        clock = self.call(
            "sm_clock", "nvmlDeviceGetClockInfo", h, getattr(nvml, "NVML_CLOCK_SM", 1)
        )
        out["sm_clock_mhz"] = float(clock) if clock is not None else None
        mask = self.call("throttle", (_EVENT_REASONS, _THROTTLE_REASONS), h)
        out["throttle"] = decode_throttle_reasons(mask) if mask is not None else None
        if self.lost:  # lost during this sample: report none of it rather than half of it
            return dict.fromkeys(out)
        return out

    def _read_power_limit(self, h: Any) -> float | None:
        now = self.clock()
        if now - self._power_limit_at >= POWER_LIMIT_REFRESH_S:
            self._power_limit_at = now
            limit = self.call("power_limit", "nvmlDeviceGetEnforcedPowerLimit", h)
            if limit is not None:
                self._power_limit = limit / 1000.0
        return self._power_limit if "power_limit" not in self.failed and self.active else None

    def _process_memory(self, h: Any) -> int | None:
        procs = self.call("processes", "nvmlDeviceGetComputeRunningProcesses", h)
        if procs is None:
            return None
        for proc in procs:
            if getattr(proc, "pid", None) == self.pid:
                self._pid_seen = True
                return _used(proc)
        if len(procs) == 1 and not self._pid_seen:  # in a container NVML lists host pids
            if self._stand_in is None:
                self._stand_in = getattr(procs[0], "pid", None)
                self._reasons.append((W_PROCESS, self._stand_in_note()))
            if getattr(procs[0], "pid", None) == self._stand_in:
                return _used(procs[0])
        self._pid_misses += 1
        if not self._pid_seen and self._pid_misses == PID_MISSES_BEFORE_WARNING:
            self._reasons.append(
                (
                    W_PROCESS,
                    (
                        f"NVML does not list this process (pid {self.pid}) on the GPU, so its own GPU "
                        "memory stays blank. In a container NVML reports host PIDs; run the container "
                        "with --pid=host to see it."
                    ),
                )
            )
        return None

    def _stand_in_note(self) -> str:
        return (
            f"NVML does not list this process (pid {self.pid}) on the GPU, but exactly one "
            f"compute process (pid {self._stand_in}): in a container NVML reports host pids, so "
            "its GPU memory is shown as this process's."
        )

    def _no_gpu(self, code: str, why: str) -> None:
        self.unavailable = why
        self._reasons.append((code, f"No GPU figures: {why}. Host figures continue."))

    def _fail(self, field: str, exc: BaseException) -> None:
        label = FIELD_LABELS.get(field, field)
        if field in self._worked or is_nvml_error(
            self.nvml, exc, "NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_RESET_REQUIRED"
        ):
            self.lost = True
            self.unavailable = "the GPU stopped answering NVML"
            self._reasons.append(
                (
                    W_GPU_LOST,
                    (
                        f"Lost contact with the GPU while reading {label} "
                        f"({describe_nvml_error(self.nvml, exc)}); GPU figures stop, host figures "
                        "continue. Check nvidia-smi and the kernel log (dmesg) for Xid errors."
                    ),
                )
            )
            return
        why = describe_nvml_error(self.nvml, exc)
        self.failed[field] = why
        self._reasons.append((W_FIELD, f"NVML cannot report {label} ({why}); it stays blank."))


def _used(proc: Any) -> int | None:
    used = getattr(proc, "usedGpuMemory", None)  # None on Windows WDDM / some vGPUs
    return int(used) if used is not None else None
