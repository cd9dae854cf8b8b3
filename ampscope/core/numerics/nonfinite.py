"""What to do about a loss that left its format's range: advice that fits the format it ran in.

"Use a wider format" is sound advice in fp16 or fp8, and wrong in fp32, which is as wide as a
training run gets: there a non-finite loss is the run diverging, or the data or the loss
computing one. bf16 has fp32's range, so the same holds there. The engine's error and the
watched loop's note both take their words from here. No torch here.
"""

from __future__ import annotations

WIDE_RANGE = ("fp32", "tf32", "fp64", "bf16", "amp-bf16")
"""Precisions with fp32's range or more: a wider format gives no more room."""


def range_advice(precision: str, grad_clip: float | None = None) -> str:
    """The advice after "the numbers left the format's range" for a run in ``precision``
    (``grad_clip``: the preset's gradient clipping, 0 when off; None in the user's own loop)."""
    if precision not in WIDE_RANGE:
        return "Lower the learning rate or use a wider format (amp-bf16 has fp32's range)."
    if grad_clip is None:
        clip = "clip the gradients (torch.nn.utils.clip_grad_norm_)"
    elif grad_clip == 0:
        clip = "turn gradient clipping on (grad_clip = 1.0)"
    else:
        clip = f"clip the gradients harder (grad_clip = {grad_clip:g} now)"
    wide = "has fp32's range" if "bf16" in precision else "is as wide as training goes"
    return (
        f"{precision} {wide}, so a wider format gives no more room: lower the learning rate, "
        f"{clip}, and check the batches and the loss for an inf or NaN (a log of 0, a division "
        "by zero)."
    )
