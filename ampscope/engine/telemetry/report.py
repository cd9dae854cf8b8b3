"""What NVML says about this machine, for ``ampscope doctor``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ampscope.engine.telemetry.nvml import (
    as_text,
    describe_nvml_error,
    load_nvml,
    nvml_call,
    nvml_init,
)


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
        report["driver_version"] = as_text(driver) if driver is not None else None
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

    get("name", "nvmlDeviceGetName", as_text)
    get("uuid", "nvmlDeviceGetUUID", as_text)
    get("pci_bus_id", "nvmlDeviceGetPciInfo", lambda p: as_text(p.busId))
    get("memory_total", "nvmlDeviceGetMemoryInfo", lambda m: int(m.total))
    get("power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", lambda mw: mw / 1000.0)
    get("compute_capability", "nvmlDeviceGetCudaComputeCapability", lambda cc: f"{cc[0]}.{cc[1]}")
    return gpu
