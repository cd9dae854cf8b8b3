"""FLOPs per training step as torch counts them, to check (or stand in for) a workload's formula.

``torch.utils.flop_counter.FlopCounterMode`` charges each matmul, convolution and attention
kernel as it runs, so it sees what autograd really computes (no input gradient for the data,
for one). It runs once, before the first timed step, on a meta-device copy of the model:
no memory, no arithmetic, the same shapes. Attention runs on the math path there, which is
the model-FLOPs convention the formulas use (the flash kernels' formula adds the backward
recompute of QK^T on top). A model that cannot be copied to the meta device is counted on its
own device, with its gradients and buffers put back afterwards.

torch's formula for a convolution's backward charges the weight gradient of a grouped
convolution as if it had one group (``groups`` times over: 64x for a 64-channel depthwise
conv). ampscope counts that kernel itself: each gradient (input, weight) repeats every
multiply-add of the forward exactly once, whatever the groups, stride, dilation or
transposition, so each costs the forward's count.

Some kernels have no FLOP formula in torch (the CPU flash-attention kernel in torch 2.13, for
one): a count that ran one is *partial*, a lower bound, and says which kernels it missed.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count, flop_registry

from ampscope.core import events as ev
from ampscope.engine.private_apis import TorchDispatchMode

LossFn = Callable[[Any, Any], torch.Tensor]
Forward = Callable[[nn.Module, Any], Any]
"""How a workload calls its model on a batch's inputs (a user's model takes tuples and dicts)."""

# Kernels that do the bulk of a network's arithmetic. One of these without a FLOP formula in
# torch makes the count partial; elementwise ops have no formula by design and cost little.
HEAVY_KERNEL = re.compile(r"mm|matmul|conv|attention|einsum|linear|gemm|rnn|lstm|gru")
META = torch.device("meta")
aten = torch.ops.aten


class FlopCount(NamedTuple):
    flops: float
    partial: bool  # kernels without a FLOP formula ran: the count is a lower bound
    missing: tuple[str, ...]  # those kernels, by aten name
    device: str  # where it was counted: "meta", or the model's own device


class _SeenKernels(TorchDispatchMode):
    """Records the kernels that really run, below FlopCounterMode's decompositions."""

    def __init__(self) -> None:
        super().__init__()
        self.packets: set[Any] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.packets.add(func._overloadpacket)
        return func(*args, **(kwargs or {}))


def count_train_flops(
    model: nn.Module, batch: Sequence[torch.Tensor], loss_fn: LossFn
) -> tuple[float, bool]:
    """FLOPs of one forward and backward pass of ``model`` on ``batch`` (inputs, targets), and
    whether the count is partial. The model's weights, gradients and buffers are left as found."""
    count = measure_train_flops(model, batch, loss_fn)
    return count.flops, count.partial


def measure_train_flops(
    model: nn.Module,
    batch: Sequence[Any],
    loss_fn: LossFn,
    *,
    meta: bool = True,
    forward: Forward | None = None,
) -> FlopCount:
    """``count_train_flops`` with the kernels it missed and where it counted (``meta=False``:
    on the model's own device straight away). With ``forward``, ``batch`` is ``(inputs,
    targets)`` in any form the workload feeds (tensors, tuples, dicts) and the model is called
    as ``forward(model, inputs)``; without it, ``model(*batch[:-1])``."""
    if meta:
        try:
            meta_batch = [_to_meta(item) for item in batch]
            with sdpa_kernel(SDPBackend.MATH):
                return _count(meta_copy(model), meta_batch, loss_fn, "meta", forward)
        except Exception:  # noqa: BLE001 - a model the meta device cannot run: count it for real
            pass  # (data-dependent shapes, a tensor kept outside the parameters and buffers)
    device = next(itertools.chain(model.parameters(), model.buffers())).device
    with kept_state(model):
        return _count(model, list(batch), loss_fn, str(device), forward)


def _to_meta(value: Any) -> Any:
    """Tensors to the meta device, inside tuples, lists and dicts too; anything else as is."""
    if isinstance(value, torch.Tensor):  # a leaf of its own: no gradient flows back to the CPU
        return value.detach().to(META).requires_grad_(value.requires_grad)
    if isinstance(value, Mapping):
        return {k: _to_meta(v) for k, v in value.items()}
    if type(value) in (tuple, list):  # (a named tuple stays as it is)
        return type(value)(_to_meta(v) for v in value)
    return value


def conv_backward_flops(
    grad_out_shape: list[int],
    x_shape: list[int],
    w_shape: list[int],
    _bias: Any,
    _stride: Any,
    _padding: Any,
    _dilation: Any,
    transposed: bool,
    _output_padding: Any,
    _groups: int,
    output_mask: Sequence[bool],
    out_shape: Any = None,
    **_: Any,
) -> int:
    """A convolution's backward: the forward's count once for each gradient asked for.

    The weight's shape already holds ``in_channels / groups``, so the forward's count is
    right for grouped convolutions; torch's own backward formula rebuilds the weight gradient
    from the input's full channel count and so counts it ``groups`` times."""
    forward = conv_flop_count(x_shape, w_shape, grad_out_shape, transposed=transposed)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


CUSTOM_FORMULAS = {aten.convolution_backward: conv_backward_flops}


def flop_counter() -> FlopCounterMode:
    """torch's FlopCounterMode with ampscope's corrections (grouped convolutions' backward):
    the one counter the engine and ``ampscope.watch`` both count with."""
    return FlopCounterMode(display=False, custom_mapping=CUSTOM_FORMULAS)


class Counting:
    """``flop_counter()`` and the heavy kernels that ran without a FLOP formula in torch, over
    the code run inside it: what the engine and ``ampscope.watch`` count a step with."""

    def __init__(self) -> None:
        self._seen = _SeenKernels()
        self._counter = flop_counter()

    def __enter__(self) -> Counting:
        self._seen.__enter__()  # outside the counter: it sees the kernels below its decompositions
        self._counter.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._counter.__exit__(*exc)
        self._seen.__exit__(*exc)

    def result(self, where: str) -> FlopCount:
        missing = sorted(
            str(p)
            for p in self._seen.packets
            if p not in flop_registry and HEAVY_KERNEL.search(str(p))
        )
        flops = float(self._counter.get_total_flops())
        return FlopCount(flops, bool(missing), tuple(missing), where)


def _count(
    model: nn.Module, batch: list[Any], loss_fn: LossFn, where: str, forward: Forward | None
) -> FlopCount:
    with Counting() as counting:
        if forward is None:
            output, target = model(*batch[:-1]), batch[-1]
        else:
            output, target = forward(model, batch[0]), batch[1]
        loss_fn(output, target).backward()
    return counting.result(where)


def meta_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers are meta tensors of the same shapes.

    The deep copy is told the meta tensor for each parameter and buffer in advance, so nothing
    of the real weights is copied (tied weights stay tied: one tensor, one meta tensor).
    """
    memo: dict[int, Any] = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        meta = torch.empty_like(t, device=META)
        memo[id(t)] = nn.Parameter(meta, t.requires_grad) if isinstance(t, nn.Parameter) else meta
    return copy.deepcopy(model, memo)


@contextlib.contextmanager
def kept_state(model: nn.Module) -> Iterator[None]:
    """Counting on the real model runs a real step: put its gradients and buffers back
    (batch norm's running statistics, for one), so that training starts where it would have."""
    grads = [(p, p.grad) for p in model.parameters()]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        for p, grad in grads:
            p.grad = grad
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)


class FlopFigures(NamedTuple):
    """Both figures for hello, and the one TFLOP/s and MFU are computed from."""

    per_step: float
    source: ev.FlopsSource  # the workload's formula, or FlopCounterMode's count
    analytic: float | None
    counted: float | None
    partial: bool
    note: str


def choose_flops(analytic: float | None, count: FlopCount | None, error: str | None) -> FlopFigures:
    """The formula when there is one (model FLOPs, the convention MFU is quoted in), else the
    count; the note says which, where it was counted, and how far the two agree."""
    counted = count.flops if count else None
    partial = bool(count and count.partial)
    if count is None:
        said = f"FlopCounterMode could not count this model ({error})" if error else "not counted"
    else:
        said = f"FlopCounterMode counted {count.flops:.4g} on the {count.device} device"
        if count.partial:
            said += f", a lower bound: no FLOP formula in torch for {', '.join(count.missing)}"
    if analytic is not None:
        if counted:
            said += f" (formula / count = {analytic / counted:.4g})"
        return FlopFigures(
            analytic,
            "analytic",
            analytic,
            counted,
            partial,
            f"TFLOP/s and MFU use the formula; {said}",
        )
    if counted:
        return FlopFigures(
            counted, "counted", None, counted, partial, f"TFLOP/s and MFU use the count: {said}"
        )
    return FlopFigures(0.0, "counted", None, None, False, f"no FLOPs per step: {said}")
