"""The GPU table: a device name finds its own board, and every row says where it comes from."""

from __future__ import annotations

import pytest

from ampscope.core.machine import hardware
from ampscope.core.memory import plan

# Device names as torch.cuda.get_device_name / nvidia-smi print them, and the row each means.
NAMES = {
    "NVIDIA GB200": "GB200",
    "NVIDIA B200": "B200",
    "NVIDIA H200": "H200 SXM",
    "NVIDIA H200 NVL": "H200 NVL",
    "NVIDIA H100 80GB HBM3": "H100 SXM",
    "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H100 NVL": "H100 NVL",
    "NVIDIA A100-SXM4-80GB": "A100 80GB",
    "NVIDIA A100 80GB PCIe": "A100 80GB",
    "NVIDIA A100-SXM4-40GB": "A100 40GB",
    "NVIDIA A100-PCIE-40GB": "A100 40GB",
    "NVIDIA L40S": "L40S",
    "NVIDIA L40": "L40",
    "NVIDIA L4": "L4",
    "NVIDIA A10": "A10",
    "NVIDIA GeForce RTX 4090 D": "RTX 4090 D",
    "NVIDIA GeForce RTX 4090": "RTX 4090",
    "NVIDIA GeForce RTX 3090 Ti": "RTX 3090 Ti",
    "NVIDIA GeForce RTX 3090": "RTX 3090",
    "Tesla V100S-PCIE-32GB": "V100S PCIe",
    "Tesla V100-PCIE-32GB": "V100 PCIe 32GB",
    "Tesla V100-PCIE-16GB": "V100 PCIe 16GB",
    "Tesla V100-SXM2-32GB": "V100 SXM2 32GB",
    "Tesla V100-SXM2-16GB": "V100 SXM2 16GB",
    "Tesla T4": "T4",
}


@pytest.mark.unit
@pytest.mark.parametrize("name,model", NAMES.items())
def test_each_device_name_finds_its_own_row(name: str, model: str) -> None:
    gpu = hardware.identify(name)
    assert gpu is not None and gpu.model == model
    # A power limit never overrides a name that says which board it is.
    for watts in (150.0, 300.0, 450.0, 700.0):
        assert hardware.identify(name, watts) == gpu


@pytest.mark.unit
def test_every_row_is_found_by_some_name_and_is_sourced() -> None:
    assert {gpu.model for gpu in hardware.GPUS} == set(NAMES.values())
    for gpu in hardware.GPUS:
        assert gpu.source and gpu.memory_gib > 0 and gpu.fp32 > 0 and gpu.fp16 >= gpu.fp32


@pytest.mark.unit
def test_the_boards_the_old_table_confused() -> None:
    """Variants that used to get another board's figures (datasheet values, dense)."""
    assert hardware.peak_tflops("NVIDIA GeForce RTX 3090 Ti", "bf16")[0] == 80.0  # not 71
    assert hardware.peak_tflops("NVIDIA GeForce RTX 4090 D", "bf16")[0] == 147.2  # not 165.2
    assert hardware.peak_tflops("Tesla V100-PCIE-16GB", "fp16")[0] == 112.0  # not 125
    assert hardware.peak_tflops("Tesla V100S-PCIE-32GB", "fp16")[0] == 130.0
    assert hardware.peak_tflops("NVIDIA GB200", "bf16")[0] == 2500.0  # not B200's 2250
    # An SXM H100 capped at 450 W by its administrator is still an SXM H100.
    value, note = hardware.peak_tflops("NVIDIA H100 80GB HBM3", "bf16", power_limit_w=450.0)
    assert value == 989.4 and note == "H100 SXM dense bf16 datasheet peak"


@pytest.mark.unit
def test_power_limit_decides_only_for_a_bare_name() -> None:
    assert hardware.identify("NVIDIA H100", 350.0).model == "H100 PCIe"
    assert hardware.identify("NVIDIA H100", 700.0).model == "H100 SXM"
    assert hardware.identify("NVIDIA H100").model == "H100 SXM"


@pytest.mark.unit
def test_unknown_boards_and_dtypes_say_why() -> None:
    assert hardware.identify("NVIDIA A10G") is None  # not an A10: no datasheet peak to use
    value, note = hardware.peak_tflops("Some Accelerator", "bf16")
    assert value is None and "set peak_tflops" in note
    value, note = hardware.peak_tflops("Tesla T4", "bf16")
    assert value is None and note == "T4 has no bf16 Tensor Core peak in the table"


@pytest.mark.unit
def test_the_memory_planner_reads_the_same_table() -> None:
    chart = dict(plan.GPUS)
    for gpu in hardware.GPUS:
        if gpu.chart is not None:
            assert chart[gpu.chart] == gpu.memory_gib
    sizes = [gib for _, gib in plan.GPUS]
    assert sizes == sorted(sizes) and len(set(plan.GPUS)) == len(plan.GPUS)
