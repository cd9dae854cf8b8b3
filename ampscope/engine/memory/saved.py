"""What one training step of any model holds, measured on the real module, for the planner.

The planner's activation formula is the engine's GPT block; a user's model (a ViT, an LSTM, a
CNN) has none, and planning without activations once put a run at 53x its prediction. Here
the model runs forward on the CPU under ``torch.autograd.graph.saved_tensors_hooks``, in each
regime's dtypes (autocast for AMP, a bf16 or fp16 copy for pure low precision), and every
tensor autograd saves is counted once per storage. Parameters are not activations, and the
16-bit weight copies autocast saves are the plan's casts column: both are left out.

The step runs as the engine's does: no gradient at its start (the engine frees them before
each forward), the output held until backward ends. Its peak comes from torch.profiler's
allocator records over forward and backward, added up in the order they happened: what it
holds beyond the saved tensors and the casts is the loss's and backward's buffers and the
gradients made by then. The optimizer step is measured too (``_update_temporaries``), and
the gradients the step made say which trainable parameters the batch did not reach.

A batch of up to 64 samples is measured whole. A larger one is measured at a quarter and a
half of it, and bytes = a + b x samples extrapolated to the batch: less than a step's cost a
regime (slices of a sample or two are cheaper still but not yet linear: kernels pick other
algorithms). A batch that cannot be sliced is measured whole.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
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
    """What the workload's largest batch holds in a step, per regime (keys of ``REGIMES``),
    and what the model itself holds, from the real module (``MeasuredStep``). The largest of
    the first few batches (``largest_batch``): the first can be a short one, and a run's peak
    is its largest batch's."""
    (inputs, target), batch, which = largest_batch(workload)
    model = workload.model
    params = unique_parameters(model)
    largest = max((p.numel() for p in params.values()), default=0)
    sizes = (batch // 4, batch // 2)
    sliced = [_slice((inputs, target), batch, n) for n in sizes] if batch > WHOLE_UP_TO else []
    whole = len(sliced) < 2 or any(s is None for s in sliced)
    activations, loss, casts, batch_bytes = {}, {}, {}, {}
    reached: set[str] = set()
    failed: list[str] = []
    fault: Exception | None = None
    for key in regimes:
        autocast, model_dtype = REGIMES[key]
        runner = model if model_dtype is None else _cast_copy(model, model_dtype)
        batch_bytes[key] = tensor_bytes((_floats_to(inputs, model_dtype or torch.float32), target))
        try:
            if whole:
                step = _saved(workload, runner, inputs, target, autocast)
                activations[key], loss[key], casts[key] = step.saved, step.rest, step.casts
                reached |= step.reached
                continue
            one, two = (_saved(workload, runner, x, y, autocast) for x, y in sliced)
        except Exception as exc:  # noqa: BLE001 - a kernel the CPU lacks in this dtype (fp16 LSTM)
            failed.append(key)
            fault = exc
            continue
        reached |= one.reached | two.reached
        activations[key] = _extrapolate(one.saved, two.saved, sizes, batch)
        loss[key] = _extrapolate(one.rest, two.rest, sizes, batch)
        casts[key] = max(one.casts, two.casts)
    if fault is not None and not activations:  # the model itself fails: no regime measured
        raise fault
    for key in failed:  # its twin keeps values of the same widths
        twin = TWINS[key]
        if twin in activations and twin != key:
            activations[key], loss[key], casts[key] = activations[twin], loss[twin], casts[twin]
    borrowed = [key for key in failed if key in activations]
    unmeasured = [key for key in failed if key not in activations]
    how = (
        f"measured on the CPU for the whole batch of {batch}"
        if whole
        else f"measured on the CPU at {sizes[0]} and {sizes[1]} samples, extrapolated to the "
        f"batch of {batch}"
    ) + which
    if borrowed:
        how += f"; {', '.join(borrowed)} could not run on the CPU: its 16-bit twin's bytes"
    if unmeasured:
        how += f"; {', '.join(unmeasured)} could not run on the CPU: not measured"
    trainable = {name: p for name, p in params.items() if p.requires_grad}
    return MeasuredStep(
        batch,
        activations,
        loss,
        largest,
        how,
        casts=casts,
        batch_bytes=batch_bytes,
        update_temp=_update_temporaries(model),
        params=sum(p.numel() for p in params.values()),
        trainable=sum(p.numel() for p in trainable.values()),
        unreached={n: p.numel() for n, p in trainable.items() if n not in reached and reached},
        buffers=sum(b.numel() * b.element_size() for b in model.buffers()),
        fp8_layers=_fp8_layers(model),
    )


LOOK_AHEAD = 8
"""Batches read to find the one a step's memory is measured at (the plans' 8 steps too)."""
LOOK_AHEAD_S = 5.0
"""Reading stops past this, whatever the count: a slow data pipeline is not waited on."""


def largest_batch(
    workload: UserWorkload, look: int = LOOK_AHEAD, seconds: float = LOOK_AHEAD_S
) -> tuple[tuple[Any, Any], int, str]:
    """The batch with the most bytes among the first ``look`` (read for at most ``seconds``;
    the end of the batches, or one that cannot be read, ends the look early), its samples,
    and words for the measurement's note when it is not the first ("" when it is)."""
    first = workload.first_batch()
    first_samples = workload.samples_per_step or 1
    best, best_bytes, best_samples, best_at = first, tensor_bytes(first), first_samples, 0
    workload.batch(0)  # the first, read ahead: served again here, so that batch(1) is the next
    looked, deadline = 1, time.monotonic() + seconds
    for step in range(1, look):
        if time.monotonic() > deadline:
            break
        epoch = workload.batches.epoch
        try:
            batch = workload.batch(step)
        except Exception:  # noqa: BLE001 - a generator used up, their pipeline's fault: the
            break  # batches read so far stand
        if workload.batches.epoch != epoch:  # every batch is read: a list of 3 is 3 batches
            break
        looked += 1
        size = tensor_bytes(batch)
        if size > best_bytes:
            samples = workload.step_sizes(step)[0] or 1
            best, best_bytes, best_samples, best_at = batch, size, samples, step
    if best_at == 0:
        return best, best_samples, ""
    return (
        best,
        best_samples,
        f" (batch {best_at}, the largest of the first {looked} read: {_mib(best_bytes)} "
        f"against the first's {_mib(tensor_bytes(first))})",
    )


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB" if nbytes >= 2**20 else f"{nbytes / 1024:.1f} KiB"


def tensor_bytes(value: Any) -> int:
    """The bytes of the tensors in a batch (tuples, lists, dicts), each storage once."""
    seen: dict[int, int] = {}

    def walk(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            storage = v.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        elif isinstance(v, Mapping):
            for item in v.values():
                walk(item)
        elif isinstance(v, (tuple, list)):
            for item in v:
                walk(item)

    walk(value)
    return sum(seen.values())


def unique_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The model's parameters by their first name, each once (a tied weight is one)."""
    return dict(model.named_parameters())


def _update_temporaries(model: nn.Module) -> int | None:
    """The optimizer step's temporaries as the engine's step makes them, in fp32 bytes:
    gradient clipping over every gradient, then per-tensor AdamW (torch's default off CUDA).
    AdamW goes through the parameters one at a time, and what it makes for one (a square
    root, the denominator) is freed as it makes the next one's: run on the neighbours where
    that weighs most (a parameter and the one before it, the pair largest with the second
    counted twice), with a learning rate of 0 (the weights stay as they are) and zero
    gradients, once to make AdamW's state and once under torch.profiler. None when it cannot
    run."""
    params = [p for p in model.parameters() if p.requires_grad and p.is_floating_point()]
    if not params:
        return 0
    sizes = [p.numel() for p in params]
    worst = max(range(len(params)), key=lambda i: 2 * sizes[i] + (sizes[i - 1] if i else 0))
    pair = params[max(0, worst - 1) : worst + 1]
    try:
        for p in params:
            p.grad = torch.zeros_like(p)
        optimizer = torch.optim.AdamW(pair, lr=0.0, weight_decay=0.0, foreach=False)
        optimizer.step()  # AdamW makes its state at its first step

        def update() -> None:
            torch.nn.utils.clip_grad_norm_(params, math.inf)
            optimizer.step()

        return _profiled_peak(update)
    except Exception:  # noqa: BLE001 - the planner's formula stands without it
        return None
    finally:
        for p in params:
            p.grad = None


def _fp8_layers(model: nn.Module) -> int:
    """How many linear layers fp8 training would convert (``engine.step.fp8``)."""
    from ampscope.engine.step.fp8 import choose_layers

    return len(choose_layers(model, skip_head=True)[0])


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


@dataclass
class _Step:
    saved: int  # what autograd saves in the forward, parameters and the weights' casts aside
    rest: int  # what the forward and backward hold at their peak beyond them and the casts
    casts: int  # the weights' casts autograd saves (autocast's 16-bit copies)
    reached: set[str]  # the parameters the step gave a gradient


def _saved(
    workload: UserWorkload,
    model: nn.Module,
    inputs: Any,
    target: Any,
    autocast: torch.dtype | None,
) -> _Step:
    """One forward and backward of a batch, as the engine's step runs it: the output kept
    until the step ends, the gradients made from none (the engine frees them before each
    forward)."""
    model_dtype = next((p.dtype for p in model.parameters()), torch.float32)
    if model_dtype != torch.float32:
        inputs = _floats_to(inputs, model_dtype)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    counter = _Counter(params)
    for p in model.parameters():
        p.grad = None

    def step() -> None:
        with (
            torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None),
            counter.hooks(),
        ):
            output = workload.forward(model, inputs)
            counter.bucket = "loss"
            value = workload.loss(output, target)
        value.backward()
        del value, output

    peak = _profiled_peak(step)
    reached = {name for name, p in model.named_parameters() if p.grad is not None}
    for p in model.parameters():
        p.grad = None
    saved, casts = counter.bytes["forward"], counter.bytes["casts"]
    # the loss's buffers, backward's own and the gradients made by the step's peak: what it
    # holds beyond the saved tensors and the weights' casts
    return _Step(saved, max(counter.bytes["loss"], peak - saved - casts), casts, reached)


def _profiled_peak(run: Callable[[], None]) -> int:
    """The peak of the running sum of the allocations and frees ``run`` makes, as
    torch.profiler records them."""
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _no_stderr():  # torch 2.13's profiler writes a line to stderr as it starts and stops
        prof.__enter__()
    try:
        run()
    finally:
        with _no_stderr():
            prof.__exit__(None, None, None)
    return _allocation_peak(prof)


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
