"""Dense peak TFLOP/s per GPU model and compute dtype, for MFU.

Figures are the vendors' datasheet numbers without structured sparsity (datasheets often
quote sparse figures: those are halved here). GeForce cards are listed with fp32
accumulation, which is what training uses. Sources: NVIDIA datasheets for V100, T4, A10,
A100, L4, L40S, H100 (SXM5 / PCIe / NVL), H200 (SXM / NVL), B200 (HGX), and the Ampere
GA102 and Ada AD102 architecture whitepapers for the RTX 3090 and 4090.

Device names no longer say SXM or PCIe ("NVIDIA H100 80GB HBM3" is an SXM part). Where a
board power limit is known (NVML), it decides: H100/H200 SXM run at 700 W, PCIe and NVL
parts at 350-600 W.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class GpuPeaks:
    model: str
    fp32: float
    tf32: float | None  # None: no TF32 Tensor Cores
    bf16: float | None  # None: no bf16 Tensor Cores
    fp16: float
    fp8: float | None


PEAKS: tuple[GpuPeaks, ...] = (
    GpuPeaks("B200", 75.0, 1100.0, 2250.0, 2250.0, 4500.0),
    GpuPeaks("H200 NVL", 60.0, 418.0, 836.0, 836.0, 1671.0),
    GpuPeaks("H200 SXM", 67.0, 494.7, 989.4, 989.4, 1979.0),
    GpuPeaks("H100 NVL", 60.0, 418.0, 836.0, 836.0, 1671.0),
    GpuPeaks("H100 PCIe", 51.0, 378.0, 756.0, 756.0, 1513.0),
    GpuPeaks("H100 SXM", 67.0, 494.7, 989.4, 989.4, 1979.0),
    GpuPeaks("A100", 19.5, 156.0, 312.0, 312.0, None),
    GpuPeaks("L40S", 91.6, 183.0, 362.0, 362.0, 733.0),
    GpuPeaks("L4", 30.3, 60.0, 121.0, 121.0, 242.0),
    GpuPeaks("A10", 31.2, 62.5, 125.0, 125.0, None),
    GpuPeaks("RTX 4090", 82.6, 82.6, 165.2, 165.2, 330.3),
    GpuPeaks("RTX 3090", 35.6, 35.6, 71.0, 71.0, None),
    GpuPeaks("V100", 15.7, None, None, 125.0, None),
    GpuPeaks("T4", 8.1, None, None, 65.0, None),
)


def identify(device_name: str, power_limit_w: float | None = None) -> GpuPeaks | None:
    """The table entry for a CUDA device name such as 'NVIDIA H100 80GB HBM3'."""
    name = device_name.upper().replace("-", " ")
    for family in ("H200", "H100"):
        if family in name:
            if "NVL" in name:
                return _entry(f"{family} NVL")
            if "PCIE" in name or (power_limit_w is not None and power_limit_w < 600):
                return _entry("H100 PCIe" if family == "H100" else "H200 NVL")
            return _entry(f"{family} SXM")
    for entry in PEAKS:
        key = entry.model.upper()
        if key.startswith(("H100", "H200")):
            continue
        if key == "L4" and "L40" in name:
            continue
        if key == "A10" and "A100" in name:
            continue
        if key in name:
            return entry
    return None


def _entry(model: str) -> GpuPeaks:
    return next(p for p in PEAKS if p.model == model)


def peak_tflops(
    device_name: str, dtype: str, power_limit_w: float | None = None
) -> tuple[float | None, str]:
    """Peak dense TFLOP/s for MFU and a note saying where it came from or why there is none."""
    entry = identify(device_name, power_limit_w)
    if entry is None:
        return None, (
            f"no peak TFLOP/s known for '{device_name}'; set peak_tflops in the preset to get MFU"
        )
    value = getattr(entry, dtype, None) if dtype in DTYPES else None
    if value is None:
        return None, f"{entry.model} has no {dtype} Tensor Core peak in the table"
    return value, f"{entry.model} dense {dtype} datasheet peak"
