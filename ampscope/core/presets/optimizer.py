"""The preset's ``[optimizer]`` table: which implementation of AdamW's step runs.

torch.optim.AdamW steps the parameters one tensor at a time (a Python loop: many small
kernels), as one ``_foreach_`` call over all of them (``foreach``), or as one fused kernel
(``fused``). Where the step is small and the model has many tensors, the choice shows in
``ampscope profile`` as the optimizer's share of the step. ``auto`` is ampscope's choice:
the fused kernel on CUDA (foreach beside FSDP2's sharded GradScaler, which fused AdamW
cannot take), torch's own default elsewhere (per tensor on a CPU, where fused and foreach
are both available and faster: ``--set optimizer.fused=true``).

Torch-free: validated with the rest of the preset, and read by ``ampscope profile``'s advice
to name what ran and what else there is.
"""

from __future__ import annotations

from typing import Literal

import msgspec

Implementation = Literal["fused", "foreach", "per-tensor"]
WORDS: dict[Implementation, str] = {
    "fused": "fused AdamW (one kernel for every parameter)",
    "foreach": "foreach AdamW (one call over all parameters)",
    "per-tensor": "per-tensor AdamW (a loop over the parameters)",
}


class OptimizerOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``[optimizer]``: torch.optim.AdamW's ``fused`` and ``foreach`` flags, or ``auto``."""

    fused: bool | Literal["auto"] = "auto"
    foreach: bool | Literal["auto"] = "auto"


def check_optimizer(options: OptimizerOptions, sharded_scaler: bool) -> list[tuple[str, str]]:
    """(key at fault, message) for flags torch's AdamW would refuse at its first step.
    ``sharded_scaler``: FSDP2 with a GradScaler, whose found-inf flag fused AdamW cannot take
    (``engine/step/precision.py`` says why)."""
    if options.fused is True and options.foreach is True:
        return [
            (
                "optimizer.foreach",
                "optimizer.fused = true and optimizer.foreach = true cannot both be set: AdamW "
                "runs one implementation. Accepted: one of them true (fused is the faster), "
                "or 'auto'.",
            )
        ]
    if options.fused is True and sharded_scaler:
        return [
            (
                "optimizer.fused",
                "optimizer.fused = true cannot be used with parallel.strategy = 'fsdp2' and a "
                "GradScaler: fused AdamW cannot take the sharded scaler's found-inf flag. "
                "Accepted: optimizer.foreach = true, 'auto' (which picks it), or a precision "
                "without a scaler (amp-bf16).",
            )
        ]
    return []


def adamw_flags(options: OptimizerOptions, auto_fused: bool) -> tuple[bool | None, bool | None]:
    """``(fused, foreach)`` for torch.optim.AdamW: the preset's flags, with ``auto`` the fused
    kernel where ``auto_fused`` (CUDA without a sharded scaler: ``PrecisionPolicy.fused_adamw``
    in engine/step/precision.py), else None, which leaves the choice to torch."""
    fused: bool | None = None if options.fused == "auto" else options.fused
    foreach: bool | None = None if options.foreach == "auto" else options.foreach
    if fused is None and foreach is None and auto_fused:
        fused = True
    return fused, foreach


def implementation(options: OptimizerOptions, on_cuda: bool, auto_fused: bool) -> Implementation:
    """Which AdamW step runs with these flags (torch's own default: foreach on CUDA, per
    tensor on a CPU)."""
    fused, foreach = adamw_flags(options, auto_fused)
    if fused:
        return "fused"
    if foreach or (foreach is None and on_cuda):
        return "foreach"
    return "per-tensor"
