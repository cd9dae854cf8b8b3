"""The GPUs ampscope knows: how to recognise one by name, its dense peaks, its memory.

One table serves MFU (the peak for the run's compute dtype) and the memory planner (which
GPUs a training step fits on). Peaks are the vendors' dense figures: datasheets often quote
the 2:4 structured-sparsity figure, which is halved here. GeForce cards are listed with fp32
accumulation, which is what training uses (their fp16-accumulate rate is twice as high).
Memory is the datasheet's nominal size, read as GiB by the planner.

A device name is matched against each row's pattern in order, so the longer names come
first: "RTX 4090 D" before "RTX 4090", "GB200" before "B200", "V100S" before "V100". The
board power limit is consulted only where the name does not say which board it is (a bare
"NVIDIA H100"): a power limit is something an administrator sets, a name is not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")


@dataclass(frozen=True)
class Gpu:
    """One board: dense peak TFLOP/s per dtype (None: no Tensor Core path), memory, source."""

    model: str
    pattern: str  # regex on the upper-cased device name, '-' and '_' read as spaces
    fp32: float
    tf32: float | None
    bf16: float | None
    fp16: float
    fp8: float | None
    memory_gib: float
    source: str
    chart: str | None = None  # the planner's fit chart label; None: same size as another row


_H100_SXM = "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column"
_H100_NVL = "NVIDIA H100 NVL / H200 NVL datasheets"
_V100 = "NVIDIA V100 datasheet (V100 for NVLink, V100 for PCIe) and V100S datasheet"
_A100 = "NVIDIA A100 datasheet (SXM4 and PCIe list the same peaks)"

GPUS: tuple[Gpu, ...] = (
    Gpu(
        "GB200", r"\bGB200\b", 80.0, 1250.0, 2500.0, 2500.0, 5000.0, 186,
        "NVIDIA GB200 NVL72 datasheet, rack figures / 72 GPUs", "GB200",
    ),
    Gpu(
        "B200", r"\bB200\b", 75.0, 1100.0, 2250.0, 2250.0, 4500.0, 180,
        "NVIDIA HGX B200 datasheet, 8-GPU figures / 8", "B200",
    ),
    Gpu("H200 NVL", r"\bH200\b.*\bNVL\b", 60.0, 418.0, 836.0, 836.0, 1671.0, 141, _H100_NVL),
    Gpu(
        "H200 SXM", r"\bH200\b", 67.0, 494.7, 989.4, 989.4, 1979.0, 141,
        "NVIDIA H200 datasheet, H200 SXM column", "H200",
    ),
    Gpu("H100 NVL", r"\bH100\b.*\bNVL\b", 60.0, 418.0, 836.0, 836.0, 1671.0, 94, _H100_NVL, "H100 NVL"),
    Gpu(
        "H100 PCIe", r"\bH100\b.*\bPCIE\b", 51.0, 378.0, 756.0, 756.0, 1513.0, 80,
        "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe column",
    ),
    Gpu("H100 SXM", r"\bH100\b", 67.0, 494.7, 989.4, 989.4, 1979.0, 80, _H100_SXM, "H100"),
    Gpu("A100 80GB", r"\bA100\b.*\b80GB\b", 19.5, 156.0, 312.0, 312.0, None, 80, _A100, "A100-80"),
    Gpu("A100 40GB", r"\bA100\b", 19.5, 156.0, 312.0, 312.0, None, 40, _A100, "A100-40"),
    Gpu(
        "L40S", r"\bL40S\b", 91.6, 183.0, 362.0, 362.0, 733.0, 48,
        "NVIDIA L40S datasheet", "L40S",
    ),
    Gpu("L40", r"\bL40\b", 90.5, 90.5, 181.0, 181.0, 362.0, 48, "NVIDIA L40 datasheet"),
    Gpu("L4", r"\bL4\b", 30.3, 60.0, 121.0, 121.0, 242.0, 24, "NVIDIA L4 datasheet", "L4"),
    Gpu("A10", r"\bA10\b", 31.2, 62.5, 125.0, 125.0, None, 24, "NVIDIA A10 datasheet", "A10"),
    Gpu(
        "RTX 4090 D", r"\bRTX 4090 D\b", 73.5, 73.5, 147.2, 147.2, 294.3, 24,
        "NVIDIA GeForce RTX 4090 D specifications: 14,592 CUDA cores at 2.52 GHz, 1,177 AI "
        "TOPS (the RTX 4090's 1,321 scaled by its Tensor Cores, 456 of 512)",
    ),
    Gpu(
        "RTX 4090", r"\bRTX 4090\b", 82.6, 82.6, 165.2, 165.2, 330.3, 24,
        "NVIDIA Ada Lovelace (AD102) architecture whitepaper, GeForce RTX 4090", "RTX 4090",
    ),
    Gpu(
        "RTX 3090 Ti", r"\bRTX 3090 TI\b", 40.0, 40.0, 80.0, 80.0, None, 24,
        "NVIDIA GeForce RTX 3090 Ti specifications: 10,752 CUDA cores at 1.86 GHz, 320 "
        "sparse fp16-accumulate Tensor TFLOPS (80 dense with fp32 accumulation)",
    ),
    Gpu(
        "RTX 3090", r"\bRTX 3090\b", 35.6, 35.6, 71.0, 71.0, None, 24,
        "NVIDIA Ampere GA102 architecture whitepaper, GeForce RTX 3090", "RTX 3090",
    ),
    Gpu("V100S PCIe", r"\bV100S\b", 16.4, None, None, 130.0, None, 32, _V100),
    Gpu("V100 PCIe 32GB", r"\bV100\b.*\bPCIE\b.*\b32GB\b", 14.0, None, None, 112.0, None, 32, _V100),
    Gpu("V100 PCIe 16GB", r"\bV100\b.*\bPCIE\b", 14.0, None, None, 112.0, None, 16, _V100),
    Gpu("V100 SXM2 32GB", r"\bV100\b.*\b32GB\b", 15.7, None, None, 125.0, None, 32, _V100, "V100-32"),
    Gpu("V100 SXM2 16GB", r"\bV100\b", 15.7, None, None, 125.0, None, 16, _V100, "V100-16"),
    Gpu("T4", r"\bT4\b", 8.1, None, None, 65.0, None, 16, "NVIDIA T4 datasheet", "T4"),
)  # fmt: skip

# A bare "NVIDIA H100" (no PCIe, NVL or HBM3 in the name): SXM boards run at up to 700 W,
# PCIe boards at up to 350 W and NVL boards at up to 400 W.
_BARE_H100 = re.compile(r"^(NVIDIA )?H100$")
_PCIE_MAX_W = 400.0


def _normal(device_name: str) -> str:
    return " ".join(device_name.upper().replace("-", " ").replace("_", " ").split())


def identify(device_name: str, power_limit_w: float | None = None) -> Gpu | None:
    """The row for a CUDA device name such as 'NVIDIA H100 80GB HBM3', or None.

    The name decides; ``power_limit_w`` (NVML's board limit) only where the name leaves the
    board open, as a bare 'NVIDIA H100' does: at most 400 W reads as the PCIe board.
    """
    name = _normal(device_name)
    if _BARE_H100.match(name) and power_limit_w is not None and power_limit_w <= _PCIE_MAX_W:
        return by_model("H100 PCIe")
    return next((gpu for gpu in GPUS if re.search(gpu.pattern, name)), None)


def by_model(model: str) -> Gpu:
    return next(gpu for gpu in GPUS if gpu.model == model)


# Streaming multiprocessors of the full chip, for the boards that can be split into MIG slices
# (the vendors' architecture whitepapers and datasheets).
FULL_CHIP_SMS = {
    "A100 80GB": 108,
    "A100 40GB": 108,
    "H100 SXM": 132,
    "H100 PCIe": 114,
    "H100 NVL": 132,
    "H200 SXM": 132,
    "H200 NVL": 132,
    "B200": 148,
}
MIG_NOTE = (
    "; where the slice cannot report GPU utilization or power, the figures are the whole GPU's"
)


def is_mig(device_name: str) -> bool:
    """A MIG slice: torch names it after the full GPU plus its profile ('... MIG 3g.40gb')."""
    return re.search(r"\bMIG\b", _normal(device_name)) is not None


def peak_tflops(
    device_name: str,
    dtype: str,
    power_limit_w: float | None = None,
    multiprocessors: int | None = None,
) -> tuple[float | None, str]:
    """Peak dense TFLOP/s for MFU and a note saying where it came from or why there is none.

    A MIG slice matches the full GPU's row, so its peak is scaled by its share of the chip's
    multiprocessors (``multiprocessors``, torch's ``multi_processor_count`` for the slice).
    """
    gpu = identify(device_name, power_limit_w)
    if gpu is None:
        return None, (
            f"no peak TFLOP/s known for '{device_name}'; set peak_tflops in the preset to get MFU"
        )
    value = getattr(gpu, dtype, None) if dtype in DTYPES else None
    if value is None:
        return None, f"{gpu.model} has no {dtype} Tensor Core peak in the table"
    note = f"{gpu.model} dense {dtype} datasheet peak"
    if not is_mig(device_name):
        return value, note
    full = FULL_CHIP_SMS.get(gpu.model)
    if full is None or not multiprocessors:
        return None, (
            f"'{device_name}' is a MIG slice of a {gpu.model}, whose share of the chip is not "
            "known here; set peak_tflops in the preset to get MFU"
        )
    share = min(multiprocessors, full) / full
    return value * share, (
        f"{note} scaled to this MIG slice's {multiprocessors} of {full} multiprocessors{MIG_NOTE}"
    )


def cannot_run(dtype: str) -> frozenset[str]:
    """The fit chart's GPUs without a Tensor Core path for ``dtype`` ("bf16" or "fp8"): bf16
    needs compute capability 8.0 (Ampere), fp8 8.9 (Ada, Hopper); the engine refuses fp8 there."""
    return frozenset(
        gpu.chart for gpu in GPUS if gpu.chart is not None and getattr(gpu, dtype, 0.0) is None
    )


def fit_chart() -> tuple[tuple[str, float], ...]:
    """(label, GiB) for the memory planner's chart, smallest first, one per memory size."""
    rows = [(gpu.chart, gpu.memory_gib) for gpu in GPUS if gpu.chart is not None]
    return tuple(sorted(rows, key=lambda row: row[1]))


# Datasheet memory bandwidth, GB/s (the same vendors' datasheets as the peak table).
MEMORY_GBPS: dict[str, float] = {
    "GB200": 8000.0,
    "B200": 8000.0,
    "H200 NVL": 4800.0,
    "H200 SXM": 4800.0,
    "H100 NVL": 3900.0,
    "H100 PCIe": 2000.0,
    "H100 SXM": 3350.0,
    "A100 80GB": 2039.0,
    "A100 40GB": 1555.0,
    "L40S": 864.0,
    "L40": 864.0,
    "L4": 300.0,
    "A10": 600.0,
    "RTX 4090 D": 1008.0,
    "RTX 4090": 1008.0,
    "RTX 3090 Ti": 1008.0,
    "RTX 3090": 936.0,
    "V100S PCIe": 1134.0,
    "V100 PCIe 32GB": 900.0,
    "V100 PCIe 16GB": 900.0,
    "V100 SXM2 32GB": 900.0,
    "V100 SXM2 16GB": 900.0,
    "T4": 320.0,
}


def datasheet_gbps(gpu: Gpu | None) -> float | None:
    """The datasheet memory bandwidth of a row of ``GPUS`` (None: not listed, or no GPU)."""
    return MEMORY_GBPS.get(gpu.model) if gpu is not None else None


CPU_UNITS = {
    "bf16": (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16")),
    "fp16": (("amx_fp16", "AMX-FP16"), ("avx512_fp16", "AVX512-FP16")),
}
"""A CPU's matmul units for a 16-bit format: /proc/cpuinfo's flag and the name said for it."""
