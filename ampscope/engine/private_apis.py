"""Every private torch API ampscope reads, in one file: a torch upgrade that moves one breaks
this module alone, and ``tests/test_private_apis.py`` says which.

- GradScaler's live scale tensor and initial scale (``_scale``, ``_init_scale``): the public
  ``get_scale()`` copies the scale to the host, a device sync every step.
- dynamo's counters (``torch._dynamo.utils.counters``): graphs, frames, graph breaks and
  CUDA-graph skips have no public reader.
- ``TorchDispatchMode`` (``torch.utils._python_dispatch``): the hook on every op that the FLOP
  count is taken with, as torch's own ``FlopCounterMode`` is built.
- ``torch._scaled_mm``: the fp8 GEMM torchao trains with, which ``ampscope plan fp8`` times on
  a GPU for a model's own shapes.
- torchao's ``_auto_filter_for_recipe`` (``torchao.float8.float8_linear_utils``): the shape rule
  ``ampscope plan fp8 --verify`` trains beside the plan.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import MutableMapping
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "TorchDispatchMode",
    "dynamo_counters",
    "initial_scale",
    "live_scale",
    "scaled_mm",
    "torchao_auto_filter",
]


def live_scale(scaler: Any) -> torch.Tensor | None:
    """The scaler's scale as the device tensor it multiplies by; None when the scaler is off or
    before its first ``scale()`` (then ``initial_scale`` is what step 0 runs with)."""
    if scaler is None or not scaler.is_enabled():
        return None
    return getattr(scaler, "_scale", None)


def initial_scale(scaler: Any) -> float:
    """The scale a GradScaler starts from; NaN when there is none or it is off."""
    if scaler is None or not scaler.is_enabled():
        return math.nan
    return float(getattr(scaler, "_init_scale", math.nan))


def dynamo_counters() -> MutableMapping[str, Counter[Any]]:
    """dynamo's process-wide counters (``frames``, ``stats``, ``graph_break``, ``inductor``).
    Importing them loads dynamo: callers that must not (a watched eager loop) look first."""
    from torch._dynamo.utils import counters

    return counters


def scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    use_fast_accum: bool,
) -> torch.Tensor:
    """An fp8 GEMM with bf16 output, as torchao calls it (scales are the inverse scales)."""
    return torch._scaled_mm(
        a,
        b,
        scale_a=scale_a,
        scale_b=scale_b,
        out_dtype=torch.bfloat16,
        use_fast_accum=use_fast_accum,
    )


def torchao_auto_filter(recipe: str) -> Any:
    """torchao's ``module_filter_fn`` that converts a layer by its weight's shape alone
    (``_auto_filter_for_recipe``; it has none for rowwise_with_gw_hp)."""
    from torchao.float8.float8_linear_utils import _auto_filter_for_recipe

    return _auto_filter_for_recipe(recipe, filter_fqns=[])
