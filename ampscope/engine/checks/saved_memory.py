"""What one training step of any model keeps for backward, measured, for the memory planner.

The planner's activation formula is the engine's GPT block; a user's model (a ViT, an LSTM, a
CNN) has none, and planning without activations once put a run at 53x its prediction. Here
the model runs forward on the CPU under ``torch.autograd.graph.saved_tensors_hooks``, in each
regime's dtypes (autocast for AMP, a bf16 or fp16 copy for pure low precision), and every
tensor autograd saves is counted once per storage. Parameters are not activations, and the
16-bit weight copies autocast saves are the plan's casts column: both are left out. The
loss's buffers at the start of backward are what the loss saves plus two fp32 gradients the
size of the model's output (the loss's, and the one it hands back).

A batch of up to 64 samples is measured whole. A larger one is measured at a quarter and a
half of it, and bytes = a + b x samples extrapolated to the batch: less than a step's cost a
regime (slices of a sample or two are cheaper still but not yet linear: kernels pick other
algorithms). A batch that cannot be sliced is measured whole. The step's peak comes from torch.profiler's allocator records over forward and
backward: what it holds beyond the saved tensors is the loss's and backward's buffers.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from ampscope.core.memory.plan import MeasuredStep
from ampscope.engine.workloads.user import UserWorkload

REGIMES: dict[str, tuple[torch.dtype | None, torch.dtype | None]] = {
    # measured key: (autocast dtype, model dtype)
    "fp32": (None, None),
    "amp-bf16": (torch.bfloat16, None),
    "amp-fp16": (torch.float16, None),
    "bf16": (None, torch.bfloat16),
    "fp16": (None, torch.float16),
}
WHOLE_UP_TO = 64
"""Batches up to this many samples are measured whole: backward's buffers (convolution
workspaces, above all) do not grow linearly at small batches, and a quarter-batch slice
extrapolated put a BatchNorm CNN's bf16 step 4 % under its measured peak."""
TWINS = {
    "fp32": "fp32",
    "amp-bf16": "amp-fp16",
    "amp-fp16": "amp-bf16",
    "bf16": "fp16",
    "fp16": "bf16",
}


def measure_step_memory(
    workload: UserWorkload, regimes: Sequence[str] = tuple(REGIMES)
) -> MeasuredStep:
    """Saved-for-backward and loss bytes per regime (keys of ``REGIMES``) for the workload's
    first batch."""
    inputs, target = workload.first_batch()
    batch = workload.samples_per_step or 1
    model = workload.model
    largest = max((p.numel() for p in model.parameters()), default=0)
    sizes = (batch // 4, batch // 2)
    sliced = [_slice((inputs, target), batch, n) for n in sizes] if batch > WHOLE_UP_TO else []
    whole = len(sliced) < 2 or any(s is None for s in sliced)
    activations, loss = {}, {}
    failed: list[str] = []
    for key in regimes:
        autocast, model_dtype = REGIMES[key]
        runner = model if model_dtype is None else _cast_copy(model, model_dtype)
        try:
            if whole:
                activations[key], loss[key] = _saved(workload, runner, inputs, target, autocast)
                continue
            (a1, l1), (a2, l2) = (_saved(workload, runner, x, y, autocast) for x, y in sliced)
        except Exception:  # noqa: BLE001 - a kernel the CPU lacks in this dtype (fp16 LSTM)
            failed.append(key)
            continue
        activations[key] = _extrapolate(a1, a2, sizes, batch)
        loss[key] = _extrapolate(l1, l2, sizes, batch)
    for key in failed:  # its twin keeps values of the same widths
        twin = TWINS[key]
        if twin in activations and twin != key:
            activations[key], loss[key] = activations[twin], loss[twin]
    how = (
        f"measured on the CPU for the whole batch of {batch}"
        if whole
        else f"measured on the CPU at {sizes[0]} and {sizes[1]} samples, extrapolated to the "
        f"batch of {batch}"
    )
    if failed:
        how += f"; {', '.join(failed)} could not run on the CPU: its 16-bit twin's bytes"
    return MeasuredStep(batch, activations, loss, largest, how)


def _extrapolate(at1: int, at2: int, sizes: tuple[int, int], batch: int) -> int:
    """bytes = a + b x samples through the two measured sizes, at the batch."""
    per_sample = max(0, at2 - at1) / (sizes[1] - sizes[0])
    return max(at2, round(at2 + per_sample * (batch - sizes[1])))


def _cast_copy(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    return copy.deepcopy(model).to(dtype)


def _slice(value: Any, batch: int, n: int) -> Any:
    """The first ``n`` samples of every batch-first tensor; None where none is batch-first."""
    found = [False]

    def cut(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == batch:
            found[0] = True
            return v[:n].clone()  # a storage of its own: a view would count the whole batch
        if isinstance(v, Mapping):
            return {k: cut(x) for k, x in v.items()}
        if type(v) in (tuple, list):
            return type(v)(cut(x) for x in v)
        return v

    out = cut(value)
    return out if found[0] else None


def _saved(
    workload: UserWorkload,
    model: nn.Module,
    inputs: Any,
    target: Any,
    autocast: torch.dtype | None,
) -> tuple[int, int]:
    """(bytes autograd saves in the forward, bytes of the loss's buffers) for one batch."""
    model_dtype = next((p.dtype for p in model.parameters()), torch.float32)
    if model_dtype != torch.float32:
        inputs = _floats_to(inputs, model_dtype)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    counter = _Counter(params)
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _no_stderr():  # torch 2.13's profiler writes a line to stderr as it starts and stops
        prof.__enter__()
    try:
        with (
            torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None),
            counter.hooks(),
        ):
            output = workload.forward(model, inputs)
            counter.bucket = "loss"
            value = workload.loss(output, target)
        value.backward()
        del value, output
    finally:
        with _no_stderr():
            prof.__exit__(None, None, None)
    for p in model.parameters():
        p.grad = None
    peak = _allocation_peak(prof)
    saved = counter.bytes["forward"]
    # the loss's buffers and backward's own: what the step's peak holds beyond the saved
    # tensors and the weights' casts (the plan's grads column counts every gradient already)
    rest = max(counter.bytes["loss"], peak - saved - counter.bytes["casts"])
    return saved, rest


@contextlib.contextmanager
def _no_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null for the moment: the profiler's C++ side writes there."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _allocation_peak(prof: profile) -> int:
    """The peak of the running sum of the allocations and frees torch.profiler recorded."""
    results: Any = prof.profiler.kineto_results if prof.profiler is not None else None
    events = [e for e in results.events() if e.name() == "[memory]"] if results else []
    running = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        running += event.nbytes()
        peak = max(peak, running)
    return peak


def _floats_to(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, Mapping):
        return {k: _floats_to(v, dtype) for k, v in value.items()}
    if type(value) in (tuple, list):
        return type(value)(_floats_to(v, dtype) for v in value)
    return value


class _Counter:
    """Saved tensors' storages, once each, by the part of the step that saved them."""

    def __init__(self, params: set[int]) -> None:
        self.params = params
        self.seen: set[int] = set()
        self.bytes = {"forward": 0, "loss": 0, "casts": 0}
        self.bucket = "forward"

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        with torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t):
            yield

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self.seen or ptr in self.params:
            return t
        self.seen.add(ptr)
        self.bytes["casts" if _from_parameter(t) else self.bucket] += storage.nbytes()
        return t


_CAST_OR_VIEW = re.compile(
    r"(ToCopy|T|Transpose|View|Permute|Expand|Unsqueeze|Squeeze|Alias|Reshape\w*|Slice|Select)"
    r"Backward\d*$"
)


def _from_parameter(t: torch.Tensor, depth: int = 4) -> bool:
    """A weight's cast or view (autocast's bf16 copy of a Linear's weight, its transpose): a
    chain of one-input nodes back to a parameter's gradient accumulator."""
    node = t.grad_fn
    for _ in range(depth):
        if node is None or not _CAST_OR_VIEW.match(type(node).__name__):
            return False
        nexts = [n for n, _ in node.next_functions if n is not None]
        if len(nexts) != 1:
            return False
        node = nexts[0]
        if type(node).__name__ == "AccumulateGrad":
            return True
    return False
