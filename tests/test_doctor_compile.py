"""``doctor --try-compile`` judges the compiled tiny function as fp32 arithmetic allows."""

from __future__ import annotations

import pytest
import torch

from ampscope.engine.machine import doctor


@pytest.mark.unit
def test_an_ulp_apart_is_a_working_compiler_and_a_wrong_number_is_not() -> None:
    """Inductor's sin is allowed an ulp; after the + 1.0 that is ~1e-7 absolute where the result
    is near 0, which torch.allclose's default tolerance called broken on a real CPU compile."""

    def an_ulp_off(fn):
        return lambda x: (x * 2.0).sin().nextafter(torch.tensor(2.0)) + 1.0

    assert doctor.try_compiling("cpu", compile=an_ulp_off) is None

    def wrong(fn):
        return lambda x: fn(x) + 1e-3

    assert (
        doctor.try_compiling("cpu", compile=wrong)
        == "the compiled function gave different numbers from the eager one"
    )
