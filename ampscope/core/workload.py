"""What a user's model factory (``--model FILE.py:make``) returns, ``ampscope.Workload``, and
what it is given, ``ampscope.ModelContext``: the two types a user's code builds and reads.

Plain dataclasses, torch-free: ``ampscope.Workload`` is loaded without torch or textual. How
the factory is named and found is in core/presets/workload_spec.py; how the engine calls it
and checks its answer, in engine/workloads/user.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_FLOPS_PER_STEP = 1e24
"""The most FLOPs one step is taken to do: a trillion-parameter model over a million tokens does
about 6e18, and a figure near float's range would make TFLOP/s inf."""

MAX_ITEMS_PER_STEP = 10**15
"""The most samples or tokens one step is taken to see (a thousand times the largest batches)."""


@dataclass
class Workload:
    """What a model factory returns: the model, its batches and, when needed, its loss.

    ``batches`` is an iterable of ``(inputs, targets)`` (a DataLoader included; it restarts
    when it runs out) or a callable ``step -> (inputs, targets)``. ``inputs`` may be a tensor,
    a tuple (passed as positional arguments) or a dict (passed as keyword arguments); a batch
    that is a dict alone is taken as keyword arguments with no targets. ``loss`` is
    ``(output, targets) -> scalar``; without it the model's output must be the loss, or carry
    it as ``.loss`` (as Hugging Face models do when given labels). ``flops_per_step`` is
    counted with torch's FlopCounterMode when not given (on the first batch, then in
    proportion to each batch's inputs); ``samples_per_step`` is read from each batch, and
    ``tokens_per_step`` from integer (token id) inputs of two dimensions. One given holds
    for every batch.
    """

    model: Any
    batches: Any
    loss: Callable[[Any, Any], Any] | None = None
    flops_per_step: float | None = None
    tokens_per_step: int | None = None
    samples_per_step: int | None = None
    name: str | None = None
    sharded: bool = False  # the batches are this rank's already (a DistributedSampler)


@dataclass(frozen=True)
class ModelContext:
    """What the factory is told: build on ``device``, batches of ``batch_size`` (None: the
    preset says ``auto``, so the factory picks), seeded with ``seed``, for ``precision`` (the
    preset's name for it, such as ``amp-bf16``: the engine applies it, the factory need not).
    Under torchrun, ``rank`` of ``world_size`` (``local_rank`` on its node) is this process:
    for a ``DistributedSampler``, with ``sharded=True`` in the answer."""

    device: Any  # a torch.device
    batch_size: int | None
    seed: int
    precision: str
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
