"""The CUDA paths before they meet a GPU: TF32 flags, the device, peaks, OOM, NVML, fp8.

No GPU here: torch.cuda and pynvml are faked where a path needs them.
"""

from __future__ import annotations

import pytest
import torch

from ampscope.core import events as ev
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
