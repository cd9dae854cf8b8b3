"""doctor ends with the one command to run for each thing it could not confirm."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from ampscope.cli import doctor

pytestmark = pytest.mark.unit

H100 = {
    "index": 0,
    "name": "NVIDIA H100 80GB HBM3",
    "compute_capability": "9.0",
    "memory_bytes": 80 << 30,
    "bf16": True,
    "tf32": True,
    "fp8": True,
    "peak_table_entry": "H100 SXM",
}

GPU_BOX: dict[str, Any] = {
    "python": "3.11.7",
    "platform": "Linux",
    "torch": "2.13.0",
    "cuda_build": "12.8",
    "cuda_available": True,
    "cpu": {"name": "Xeon", "capability": "AVX512", "fast_bf16": True, "fast_fp16": False},
    "gpus": [H100],
    "nvml": {"available": True, "driver_version": "570.1"},
    "compile": {
        "cpu": {"ok": True, "why": "a tiny function compiled and ran"},
        "cuda": {"ok": None, "why": "not tried (ampscope doctor --try-compile cuda)"},
    },
    "torchao": "0.18.0",
}


def test_each_open_finding_gets_its_command_and_settled_ones_none() -> None:
    assert doctor.next_commands(GPU_BOX) == [
        ("torch.compile on cuda", "ampscope doctor --try-compile cuda")
    ]
    worse = copy.deepcopy(GPU_BOX)
    worse["gpus"][0]["peak_table_entry"] = None
    worse["nvml"] = {"available": False, "why": "libnvidia-ml.so not found"}
    worse["torchao"] = None
    worse["compile"]["cpu"] = {"ok": None, "why": "not tried"}
    assert [cmd for _what, cmd in doctor.next_commands(worse)] == [
        "ampscope run amp-bf16 --set peak_tflops=<its dense bf16 TFLOP/s>",
        "nvidia-smi",
        "ampscope doctor --try-compile cpu",
        "ampscope doctor --try-compile cuda",
        "pip install torchao",
    ]
    blind = copy.deepcopy(GPU_BOX) | {"gpus": []}  # a CUDA torch that sees no GPU
    assert ("GPUs: a CUDA torch that sees none", "nvidia-smi") in doctor.next_commands(blind)
    laptop = copy.deepcopy(GPU_BOX) | {"gpus": [], "cuda_build": None}
    laptop["compile"] = {"cpu": {"ok": False, "why": "no C compiler (install gcc)"}}
    assert doctor.next_commands(laptop) == []  # all settled: no GPU, no compiler (said why)
    unmeasured = copy.deepcopy(laptop) | {"machine_checks": []}
    assert doctor.next_commands(unmeasured) == [
        ("what each format delivers here", "ampscope doctor --bench")
    ]
    stale = [{"device": "Test CPU", "stale": "measured on torch 1.0.0, this is 2.13.0"}]
    assert (
        doctor.next_commands(laptop | {"machine_checks": stale})[-1][1] == "ampscope doctor --bench"
    )
    fresh = [{"device": "Test CPU", "stale": None}]
    assert doctor.next_commands(laptop | {"machine_checks": fresh}) == []


def test_doctor_prints_them_last_and_in_its_json(capsys) -> None:
    def gpu_box(try_compile) -> dict:
        return copy.deepcopy(GPU_BOX)

    assert doctor.doctor(report_of=gpu_box) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == [
        "Left to confirm, one command each:",
        "  torch.compile on cuda  ampscope doctor --try-compile cuda",
    ]
    assert doctor.doctor(as_json=True, report_of=gpu_box) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["next"] == [
        {"unconfirmed": "torch.compile on cuda", "command": "ampscope doctor --try-compile cuda"}
    ]
    settled = copy.deepcopy(GPU_BOX)
    settled["compile"]["cuda"] = {"ok": True, "why": "compiled"}
    assert doctor.doctor(report_of=lambda try_compile: settled) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "Everything above was confirmed on this machine."
    )


def test_a_kept_check_without_its_date_says_the_day_is_unknown() -> None:
    from ampscope.cli.doctor import machine_lines

    dated = {"device": "AMD EPYC", "when": "2026-12-06T17:15:00", "stale": None}
    assert machine_lines([dated]) == [
        "machine check: AMD EPYC measured 2026-12-06 17:15 UTC "
        "(ampscope doctor --bench measures again)"
    ]
    undated = dated | {"when": ""}
    assert machine_lines([undated]) == [
        "machine check: AMD EPYC measured on an unknown day "
        "(ampscope doctor --bench measures again)"
    ]
