"""NVML behind one choke point: every call returns a value or None, never raises.

GPU figures come from NVML (``nvidia-ml-py``, imported as ``pynvml``; never the deprecated
``pynvml`` distribution). The GPU is matched to the one torch trains on by UUID or PCI bus id,
never by index, so a reordering ``CUDA_VISIBLE_DEVICES`` cannot mix up devices.
"""

from __future__ import annotations

from typing import Any

from ampscope.engine.telemetry.codes import W_NVML_INIT, W_NVML_NO_DRIVER

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


def is_nvml_error(nvml: Any, exc: BaseException, *names: str) -> bool:
    code = nvml_error_code(nvml, exc)
    return code is not None and code in {_code(nvml, n) for n in names}


def missing_function(nvml: Any, exc: BaseException) -> bool:
    return isinstance(exc, AttributeError) or is_nvml_error(
        nvml, exc, "NVML_ERROR_FUNCTION_NOT_FOUND"
    )


def describe_nvml_error(nvml: Any, exc: BaseException) -> str:
    if is_nvml_error(nvml, exc, "NVML_ERROR_NOT_SUPPORTED"):
        return "not supported on this GPU"
    if is_nvml_error(nvml, exc, "NVML_ERROR_NO_PERMISSION"):
        return "no permission"
    if missing_function(nvml, exc):
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
    if is_nvml_error(nvml, exc, "NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED"):
        return W_NVML_NO_DRIVER, f"{NVML_NO_DRIVER_HINT} ({exc})"
    if is_nvml_error(nvml, exc, "NVML_ERROR_LIB_RM_VERSION_MISMATCH"):
        return W_NVML_INIT, (
            "the NVIDIA driver and its NVML library differ in version (driver updated without a "
            "reboot?); reboot or reload the nvidia kernel module"
        )
    if is_nvml_error(nvml, exc, "NVML_ERROR_NO_PERMISSION"):
        return W_NVML_INIT, "no permission to open the GPU (/dev/nvidia*); check nvidia-smi"
    return W_NVML_INIT, f"NVML did not start ({describe_nvml_error(nvml, exc)}); check nvidia-smi"


def as_text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def normalize_uuid(uuid: Any) -> str:
    """'GPU-58FA5F56-...' (NVML), '58fa5f56-...' (torch) and bytes all become '58fa5f56-...'."""
    text = as_text(uuid).strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text


def normalize_pci_bus_id(bus_id: Any) -> tuple[int, int, int, int] | None:
    """'00000000:3B:00.0', '0000:3b:00.0' and '3b:00.0' become (domain, bus, device, function)."""
    text = as_text(bus_id).strip().lower()
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
        handle, exc = nvml_call(nvml, "nvmlDeviceGetHandleByPciBusId", as_text(pci_bus_id))
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
            seen.append(as_text(dev_uuid))
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
