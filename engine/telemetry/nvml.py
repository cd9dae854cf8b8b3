"""NVML behind one choke point: every call returns a value or None, never raises.

GPU figures come from NVML (``nvidia-ml-py``, imported as ``pynvml``). The GPU is matched to the
one torch trains on by UUID or PCI bus id, never by index.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

DEFAULT_HZ = 2.0
MIN_HZ, MAX_HZ = 0.25, 10.0
POWER_LIMIT_REFRESH_S = 30.0  # the enforced limit changes only when someone runs nvidia-smi -pl
PID_MISSES_BEFORE_WARNING = 5
STOP_TIMEOUT_S = 2.0

# Warning codes this module emits (each at most once per sampler).
W_NVML_MISSING = "nvml-missing"  # the nvidia-ml-py package is not installed
W_NVML_NO_DRIVER = "nvml-no-driver"  # libnvidia-ml.so not found or the driver is not loaded
W_NVML_INIT = "nvml-init-failed"  # NVML did not start for another reason
W_GPU_NOT_FOUND = "nvml-gpu-not-found"  # no NVML device has the UUID / bus id torch reports
W_FIELD = "nvml-field-unsupported"  # one figure NVML cannot report on this GPU
W_PROCESS = "nvml-process-not-listed"  # NVML does not list this process (PID namespaces)
W_GPU_LOST = "gpu-lost"  # the GPU stopped answering mid-run
W_HOST = "host-field-unavailable"  # psutil missing or one host figure failing

NVML_PIP_HINT = "nvidia-ml-py is not installed: pip install nvidia-ml-py"
NVML_NO_DRIVER_HINT = (
    "the NVIDIA driver's NVML library (libnvidia-ml.so) was not found or the driver is not "
    "loaded; check that nvidia-smi works"
)

# NVML return codes (stable ABI values; read from the module when it has them).
_ERR_CODES = {
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_RESET_REQUIRED": 16,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": 18,
}

# nvmlClocksEventReason* bits (same values as the older nvmlClocksThrottleReason* names).
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x0004, "sw_power_cap"),
    (0x0008, "hw_slowdown"),
    (0x0010, "sync_boost"),
    (0x0020, "sw_thermal"),
    (0x0040, "hw_thermal"),
    (0x0080, "power_brake"),
    (0x0100, "display_clock"),
    (0x0200, "board_limit"),
    (0x0400, "reliability"),
)
# Not a slowdown: the GPU is idle, or clocks are pinned on purpose.
THROTTLE_IGNORED = 0x0001 | 0x0002  # gpu_idle | applications_clocks_setting

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


# --------------------------------------------------------------------------- NVML choke point


def load_nvml() -> tuple[Any | None, str | None]:
    """``(pynvml module, None)``, or ``(None, why)`` when nvidia-ml-py is not installed."""
    try:
        import pynvml
    except Exception:  # noqa: BLE001 - ImportError, or a broken install: both mean "missing"
        return None, NVML_PIP_HINT
    return pynvml, None


def nvml_call(nvml: Any, name: str, *args: Any) -> tuple[Any, BaseException | None]:
    """Call ``nvml.<name>(*args)``: ``(value, None)`` or ``(None, the exception)``. Never raises.

    The one place the engine calls NVML. Catches NVMLError (NotSupported, GpuIsLost, ...), a
    function this nvidia-ml-py lacks (AttributeError) and anything else a binding may throw.
    """
    try:
        return getattr(nvml, name)(*args), None
    except Exception as exc:  # noqa: BLE001 - a telemetry getter must never take the run down
        return None, exc


def nvml_error_code(nvml: Any, exc: BaseException) -> int | None:
    """The NVML return code of an NVMLError, else None."""
    try:
        base = getattr(nvml, "NVMLError", None)
        if isinstance(base, type) and isinstance(exc, base):
            value = getattr(exc, "value", None)
            return value if isinstance(value, int) else None
    except Exception:  # noqa: BLE001 - a broken binding is "not an NVML code"
        pass
    return None


def _code(nvml: Any, name: str) -> int:
    try:
        value = getattr(nvml, name, None)
    except Exception:  # noqa: BLE001
        value = None
    return value if isinstance(value, int) else _ERR_CODES[name]


def _is(nvml: Any, exc: BaseException, *names: str) -> bool:
    code = nvml_error_code(nvml, exc)
    return code is not None and code in {_code(nvml, n) for n in names}


def _missing_function(nvml: Any, exc: BaseException) -> bool:
    return isinstance(exc, AttributeError) or _is(nvml, exc, "NVML_ERROR_FUNCTION_NOT_FOUND")


def describe_nvml_error(nvml: Any, exc: BaseException) -> str:
    if _is(nvml, exc, "NVML_ERROR_NOT_SUPPORTED"):
        return "not supported on this GPU"
    if _is(nvml, exc, "NVML_ERROR_NO_PERMISSION"):
        return "no permission"
    if _missing_function(nvml, exc):
        return "not available in this driver or nvidia-ml-py"
    text = str(exc) or type(exc).__name__
    return (
        f"NVML: {text}"
        if nvml_error_code(nvml, exc) is not None
        else f"{type(exc).__name__}: {text}"
    )


def nvml_init(nvml: Any) -> tuple[str, str] | None:
    """Initialise NVML. None on success, else ``(warning code, why)``."""
    _, exc = nvml_call(nvml, "nvmlInit")
    if exc is None:
        return None
    if _is(nvml, exc, "NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED"):
        return W_NVML_NO_DRIVER, f"{NVML_NO_DRIVER_HINT} ({exc})"
    if _is(nvml, exc, "NVML_ERROR_LIB_RM_VERSION_MISMATCH"):
        return W_NVML_INIT, (
            "the NVIDIA driver and its NVML library differ in version (driver updated without a "
            "reboot?); reboot or reload the nvidia kernel module"
        )
    if _is(nvml, exc, "NVML_ERROR_NO_PERMISSION"):
        return W_NVML_INIT, "no permission to open the GPU (/dev/nvidia*); check nvidia-smi"
    return W_NVML_INIT, f"NVML did not start ({describe_nvml_error(nvml, exc)}); check nvidia-smi"


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def normalize_uuid(uuid: Any) -> str:
    """'GPU-58FA5F56-...' (NVML), '58fa5f56-...' (torch) and bytes all become '58fa5f56-...'."""
    text = _text(uuid).strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text


def normalize_pci_bus_id(bus_id: Any) -> tuple[int, int, int, int] | None:
    """'00000000:3B:00.0', '0000:3b:00.0' and '3b:00.0' become (domain, bus, device, function)."""
    text = _text(bus_id).strip().lower()
    try:
        head, _, function = text.rpartition(".")
        parts = head.split(":")
        if len(parts) == 2:
            parts.insert(0, "0")
        domain, bus, device = (int(p, 16) for p in parts)
        return domain, bus, device, int(function or "0", 16)
    except ValueError:
        return None


def find_gpu_handle(
    nvml: Any, uuid: str | None, pci_bus_id: str | None = None
) -> tuple[Any | None, str | None]:
    """The NVML handle of the GPU torch uses: ``(handle, None)`` or ``(None, why)``.

    Matched by UUID (torch's ``get_device_properties(i).uuid``, with or without NVML's
    'GPU-'/'MIG-' prefix), then by PCI bus id; never by index, because torch's index counts
    only the devices ``CUDA_VISIBLE_DEVICES`` exposes, in its order. NVML must be initialised.
    """
    want_uuid = normalize_uuid(uuid) if uuid else None
    want_pci = normalize_pci_bus_id(pci_bus_id) if pci_bus_id else None
    if not want_uuid and not want_pci:
        return None, "no GPU UUID or PCI bus id to look for"
    if want_uuid:
        for prefix in ("GPU-", "MIG-"):  # a direct lookup also finds MIG instances
            handle, exc = nvml_call(nvml, "nvmlDeviceGetHandleByUUID", prefix + want_uuid)
            if exc is None and handle is not None:
                return handle, None
    if pci_bus_id:
        handle, exc = nvml_call(nvml, "nvmlDeviceGetHandleByPciBusId", _text(pci_bus_id))
        if exc is None and handle is not None:
            return handle, None
    # Fallback: walk every device and compare normalised identifiers.
    count, exc = nvml_call(nvml, "nvmlDeviceGetCount")
    if exc is not None:
        return None, f"NVML could not count GPUs ({describe_nvml_error(nvml, exc)})"
    seen: list[str] = []
    for index in range(count or 0):
        handle, exc = nvml_call(nvml, "nvmlDeviceGetHandleByIndex", index)
        if exc is not None:
            continue
        dev_uuid, _ = nvml_call(nvml, "nvmlDeviceGetUUID", handle)
        if dev_uuid is not None:
            seen.append(_text(dev_uuid))
            if want_uuid and normalize_uuid(dev_uuid) == want_uuid:
                return handle, None
        if want_pci:
            pci, _ = nvml_call(nvml, "nvmlDeviceGetPciInfo", handle)
            bus = getattr(pci, "busId", None) if pci is not None else None
            if bus is not None and normalize_pci_bus_id(bus) == want_pci:
                return handle, None
    looked_for = f"UUID {uuid}" if uuid else f"PCI bus id {pci_bus_id}"
    return None, (
        f"NVML lists no GPU with {looked_for} (it sees {len(seen)}: {', '.join(seen) or 'none'})"
    )


def decode_throttle_reasons(mask: int) -> list[str]:
    """Short names of the reasons holding the clock down; idle and pinned clocks are not."""
    mask = int(mask) & ~THROTTLE_IGNORED
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    known = 0
    for bit, _ in THROTTLE_REASONS:
        known |= bit
    if mask & ~known:
        names.append(f"other_0x{mask & ~known:x}")
    return names


# --------------------------------------------------------------------------- GPU reader


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
        handle, why = find_gpu_handle(self.nvml, self.uuid, self.pci_bus_id)
        if handle is None:
            self._no_gpu(W_GPU_NOT_FOUND, why or "the GPU was not found")
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
            if not _missing_function(self.nvml, exc):
                break
        assert exc is not None
        self._fail(field, exc)
        return None

    def read(self) -> dict[str, Any]:
        """The GPU fields of a SysEvent; every field None when there is no GPU to read."""
        out: dict[str, Any] = dict.fromkeys(
            (
                "gpu_util",
                "gpu_mem_util",
                "gpu_mem_used",
                "gpu_mem_total",
                "proc_gpu_mem",
                "power_w",
                "power_limit_w",
                "temp_c",
                "sm_clock_mhz",
                "throttle",
            )
        )
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
                used = getattr(proc, "usedGpuMemory", None)  # None on Windows WDDM / some vGPUs
                return int(used) if used is not None else None
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

    def _no_gpu(self, code: str, why: str) -> None:
        self.unavailable = why
        self._reasons.append((code, f"No GPU figures: {why}. Host figures continue."))

    def _fail(self, field: str, exc: BaseException) -> None:
        label = FIELD_LABELS.get(field, field)
        if field in self._worked or _is(
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


# --------------------------------------------------------------------------- doctor


def nvml_report(nvml_module: Any = None) -> dict[str, Any]:
    """What NVML says about this machine, for ``ampscope doctor``. Never raises.

    ``{"available": bool, "why": str | None, "nvidia_ml_py": str | None,
    "driver_version": str | None, "cuda_driver_version": str | None, "gpus": [...]}`` where
    each GPU is ``{"nvml_index", "name", "uuid", "pci_bus_id", "memory_total",
    "power_limit_w", "compute_capability" ("9.0"), "errors": {field: why}}``. ``nvml_index`` is
    NVML's order (all GPUs, PCI order), which is not torch's under CUDA_VISIBLE_DEVICES.
    """
    report: dict[str, Any] = {
        "available": False,
        "why": None,
        "nvidia_ml_py": None,
        "driver_version": None,
        "cuda_driver_version": None,
        "gpus": [],
    }
    try:
        return _nvml_report(report, nvml_module)
    except Exception as exc:  # noqa: BLE001 - doctor must always print something
        report["available"] = False
        report["why"] = f"unexpected {type(exc).__name__}: {exc}"
        return report


def _nvml_report(report: dict[str, Any], nvml: Any) -> dict[str, Any]:
    if nvml is None:
        nvml, why = load_nvml()
        if nvml is None:
            report["why"] = why
            return report
        try:
            from importlib.metadata import version

            report["nvidia_ml_py"] = version("nvidia-ml-py")
        except Exception:  # noqa: BLE001
            pass
    failure = nvml_init(nvml)
    if failure is not None:
        report["why"] = failure[1]
        return report
    try:
        report["available"] = True
        driver, _ = nvml_call(nvml, "nvmlSystemGetDriverVersion")
        report["driver_version"] = _text(driver) if driver is not None else None
        cuda, _ = nvml_call(nvml, "nvmlSystemGetCudaDriverVersion")
        if isinstance(cuda, int) and cuda > 0:
            report["cuda_driver_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        count, exc = nvml_call(nvml, "nvmlDeviceGetCount")
        if exc is not None:
            report["why"] = f"NVML could not count GPUs ({describe_nvml_error(nvml, exc)})"
            return report
        for index in range(count or 0):
            report["gpus"].append(_gpu_report(nvml, index))
    finally:
        nvml_call(nvml, "nvmlShutdown")
    return report


def _gpu_report(nvml: Any, index: int) -> dict[str, Any]:
    gpu: dict[str, Any] = {
        "nvml_index": index,
        "name": None,
        "uuid": None,
        "pci_bus_id": None,
        "memory_total": None,
        "power_limit_w": None,
        "compute_capability": None,
        "errors": {},
    }
    handle, exc = nvml_call(nvml, "nvmlDeviceGetHandleByIndex", index)
    if exc is not None:
        gpu["errors"]["handle"] = describe_nvml_error(nvml, exc)
        return gpu

    def get(field: str, name: str, convert: Callable[[Any], Any]) -> None:
        value, exc = nvml_call(nvml, name, handle)
        if exc is not None:
            gpu["errors"][field] = describe_nvml_error(nvml, exc)
            return
        try:
            gpu[field] = convert(value)
        except Exception as exc:  # noqa: BLE001
            gpu["errors"][field] = f"{type(exc).__name__}: {exc}"

    get("name", "nvmlDeviceGetName", _text)
    get("uuid", "nvmlDeviceGetUUID", _text)
    get("pci_bus_id", "nvmlDeviceGetPciInfo", lambda p: _text(p.busId))
    get("memory_total", "nvmlDeviceGetMemoryInfo", lambda m: int(m.total))
    get("power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", lambda mw: mw / 1000.0)
    get("compute_capability", "nvmlDeviceGetCudaComputeCapability", lambda cc: f"{cc[0]}.{cc[1]}")
    return gpu
