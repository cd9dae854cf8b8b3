"""The CUDA paths before they meet a GPU: TF32 flags, the device, peaks, OOM, NVML, fp8.

No GPU here: torch.cuda and pynvml are faked where a path needs them.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ampscope.core import events as ev
from ampscope.core.hardware import peak_tflops
from ampscope.engine import device
from ampscope.engine.hello import choose_peak
from ampscope.engine.precision import set_matmul_precision, tf32_disagreements, tf32_getters
from ampscope.engine.run import EXIT_OK, run
from tests.helpers import FAST


def run_fast(name: str, *overrides: str) -> tuple[int, list[ev.Event]]:
    seen: list[ev.Event] = []
    code = run(name, [*FAST, *overrides], record=False, on_event=seen.append)
    return code, seen


# --------------------------------------------------------------------------- TF32 getters


@pytest.mark.unit
def test_after_each_preset_every_tf32_getter_answers_and_agrees() -> None:
    """inductor reads the legacy getters; set through the new API alone, they raise."""
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # a state the new API alone leaves
    for preset, tf32 in [("tf32", True), ("fp32", False), ("tf32", True), ("amp-bf16", False)]:
        code, _ = run_fast(preset, "steps=1")
        assert code == EXIT_OK
        assert tf32_disagreements(tf32) == [], (preset, tf32_getters())
    assert torch.get_float32_matmul_precision() == "highest"
    assert torch.backends.cudnn.allow_tf32 is False


@pytest.mark.unit
def test_tf32_getters_agree_whatever_the_previous_state() -> None:
    for first in ("tf32", "ieee"):
        torch.backends.cudnn.conv.fp32_precision = first
        torch.backends.cuda.matmul.fp32_precision = first
        for tf32 in (True, False):
            set_matmul_precision(tf32)
            assert tf32_disagreements(tf32) == [], tf32_getters()
    set_matmul_precision(False)


# --------------------------------------------------------------------------- cuda:N


def fake_gpus(monkeypatch, name: str = "NVIDIA H200", sms: int = 132) -> list[int]:
    """Two fake CUDA devices; returns the indices torch.cuda.set_device was given."""
    chosen: list[int] = []
    props = SimpleNamespace(
        name=name, major=9, minor=0, total_memory=141 << 30, uuid="u", multi_processor_count=sms
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(device, "nvml_power_limit_w", lambda uuid: 700.0)
    return chosen


@pytest.mark.unit
def test_cuda_n_becomes_the_current_device(monkeypatch) -> None:
    """Events, synchronize() and the current stream follow the current device, not the spec."""
    chosen = fake_gpus(monkeypatch)
    info = device.resolve_device("cuda:1")
    assert info.device == torch.device("cuda", 1) and chosen == [1]
    assert info.multiprocessors == 132


# --------------------------------------------------------------------------- MIG peaks


def peak_of(info: device.DeviceInfo, compute: str = "bf16") -> tuple[float | None, str]:
    s = SimpleNamespace(
        preset=SimpleNamespace(peak_tflops=None),
        info=info,
        policy=SimpleNamespace(compute_dtype=compute),
    )
    return choose_peak(s)  # type: ignore[arg-type]


@pytest.mark.unit
def test_a_mig_slice_gets_its_share_of_the_full_gpus_peak(monkeypatch) -> None:
    fake_gpus(monkeypatch, "NVIDIA H200 MIG 3g.71gb", sms=60)
    peak, note = peak_of(device.resolve_device("cuda:0"))
    assert peak == pytest.approx(989.4 * 60 / 132)
    assert "60 of 132 multiprocessors" in note and "whole GPU's" in note


@pytest.mark.unit
def test_a_full_gpu_keeps_the_datasheet_peak_and_an_unknown_slice_gets_none(monkeypatch) -> None:
    fake_gpus(monkeypatch, "NVIDIA H200", sms=132)
    assert peak_of(device.resolve_device("cuda:0"))[0] == pytest.approx(989.4)
    peak, note = peak_tflops("NVIDIA L4 MIG 1g.5gb", "bf16", None, 10)
    assert peak is None and "set peak_tflops" in note
