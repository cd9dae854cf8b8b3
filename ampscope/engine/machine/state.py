"""What holds a GPU back, as NVML reports it, for the machine check: power limit, clock
throttle reasons, the PCIe link. Read through ``nvml_call`` (never raises), so a fake NVML
module stands in for ``pynvml`` in tests.
"""

from __future__ import annotations

from typing import Any

from ampscope.core.machine.check import GpuState


def gpu_state(
    nvml: Any, uuid: str | None, pci_bus_id: str | None = None
) -> tuple[GpuState | None, str | None]:
    """Power limit, throttle reasons and PCIe link from NVML, and the driver's version.
    ``(None, None)`` when NVML is missing or the GPU is not found; a field NVML refuses is None."""
    from ampscope.engine.telemetry.nvml import (
        as_text,
        decode_throttle_reasons,
        find_gpu_handle,
        nvml_call,
        nvml_init,
    )

    if nvml is None or nvml_init(nvml) is not None:
        return None, None
    try:
        driver, _ = nvml_call(nvml, "nvmlSystemGetDriverVersion")
        handle, _ = find_gpu_handle(nvml, uuid, pci_bus_id)
        if handle is None:
            return None, as_text(driver) if driver else None

        def read(*names: str) -> Any:
            for name in names:
                value, exc = nvml_call(nvml, name, handle)
                if exc is None:
                    return value
            return None

        limit = read("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit")
        rated = read("nvmlDeviceGetPowerManagementDefaultLimit")
        mask = read(
            "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"
        )
        state = GpuState(
            power_limit_w=limit / 1000.0 if limit else None,
            power_max_w=rated / 1000.0 if rated else None,
            throttle=decode_throttle_reasons(mask) if mask is not None else [],
            pcie_gen=read("nvmlDeviceGetCurrPcieLinkGeneration"),
            pcie_width=read("nvmlDeviceGetCurrPcieLinkWidth"),
            pcie_max_gen=read("nvmlDeviceGetMaxPcieLinkGeneration"),
            pcie_max_width=read("nvmlDeviceGetMaxPcieLinkWidth"),
        )
        return state, as_text(driver) if driver else None
    finally:
        nvml_call(nvml, "nvmlShutdown")
