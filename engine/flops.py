"""Model FLOPs counted, not derived: one forward and backward under torch's FlopCounterMode.

For a model nobody wrote a formula for, the engine runs one training step's forward and
backward on the first batch before timing starts (as Lightning's ``measure_flops`` does) and
takes the count as the model FLOPs per step.

The counter's gaps are filled or named:

- torch has no formula for the CPU flash-attention kernel; ``ATTENTION_FORMULAS`` adds one;
- torch counts the flash and memory-efficient backward with the forward's recomputation of
  the scores (2.5 x the forward). Model FLOPs, as MFU defines them (PaLM, appendix B), leave
  recomputation out: the backward is counted as 2 x the forward, as for every other layer;
- any other heavy op without a formula (an RNN kernel, an int8 matmul) is named, and the
  count is marked partial.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, flop_registry

aten = torch.ops.aten

HEAVY_WORDS = frozenset(
    {
        "mm",
        "bmm",
        "mv",
        "dot",
        "matmul",
        "linear",
        "einsum",
        "conv",
        "convolution",
        "conv1d",
        "conv2d",
        "conv3d",
        "attention",
        "rnn",
        "lstm",
        "gru",
    }
)
"""Words in an op's name that mean real arithmetic (a matmul, a convolution, attention)."""


def _attention_forward(q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> int:
    """scores = q @ k^T and out = scores @ v: 2 x b x heads x s_q x s_k x (d_qk + d_v)."""
    b, h, s_q, d_qk = q
    s_k, d_v = k[-2], v[-1]
    return 2 * b * h * s_q * s_k * (d_qk + d_v)


def _attention_backward(grad_out: Any, q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> int:
    """Gradients for q, k, v and the scores: twice the forward, no recomputation."""
    return 2 * _attention_forward(q, k, v)


ATTENTION_FORMULAS = {
    aten._scaled_dot_product_flash_attention_for_cpu: _attention_forward,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _attention_backward,
    aten._scaled_dot_product_flash_attention_backward: _attention_backward,
    aten._scaled_dot_product_efficient_attention_backward: _attention_backward,
    aten._scaled_dot_product_cudnn_attention_backward: _attention_backward,
}


class FlopCount(NamedTuple):
    flops: int
    partial: bool
    uncounted: tuple[str, ...]  # heavy ops that ran with no formula

    @property
    def note(self) -> str:
        """What hello says about the count."""
        text = "counted with torch's FlopCounterMode over one forward and backward"
        if self.partial:
            text += f"; partial: no formula for {', '.join(self.uncounted)}"
        return text


class _OpsSeen(TorchDispatchMode):
    """Every op that really ran (after FlopCounterMode's decompositions)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[Any] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.add(func._overloadpacket)
        return func(*args, **(kwargs or {}))


def _heavy(op: Any) -> bool:
    name = str(op).removeprefix("aten.")
    return bool(HEAVY_WORDS & set(name.strip("_").split("_")))


def count_flops(step: Callable[[], None]) -> FlopCount:
    """The FLOPs of ``step()`` (one forward and backward), and the heavy ops left uncounted."""
    seen = _OpsSeen()
    counter = FlopCounterMode(display=False, custom_mapping=ATTENTION_FORMULAS)
    with seen, counter:  # the counter runs first and decomposes; ``seen`` sees what is left
        step()
    known = set(flop_registry) | set(ATTENTION_FORMULAS)
    uncounted = sorted(str(op) for op in seen.ops if _heavy(op) and op not in known)
    return FlopCount(int(counter.get_total_flops()), bool(uncounted), tuple(uncounted))


def count_train_flops(
    model: torch.nn.Module,
    batch: tuple[Any, Any],
    loss_fn: Callable[[Any, Any], torch.Tensor],
) -> tuple[int, bool]:
    """FLOPs of one forward and backward of ``model`` on ``batch`` (inputs, targets), and
    whether the count is known to be partial. Leaves no gradients behind."""

    def step() -> None:
        inputs, targets = batch
        loss_fn(model(inputs), targets).backward()

    try:
        found = count_flops(step)
    finally:
        model.zero_grad(set_to_none=True)
    return found.flops, found.partial
