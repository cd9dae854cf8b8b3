"""Which of a model's modules its forward pass really calls, and why one is not called.

A module can own weights that something else multiplies: ``nn.MultiheadAttention`` keeps
``out_proj`` as an ``nn.Linear`` but hands ``out_proj.weight`` to
``F.multi_head_attention_forward``, and keeps q/k/v in a bare ``in_proj_weight``. Swapping such
a layer for an fp8 one, or hooking it to measure its outputs, does nothing: the fp8 line and
the numerics table must say so instead of counting it. That much is the model's structure,
true of every batch.

Which other modules run is data: an MoE's expert runs only when a batch routes tokens to it.
One forward of the first batch, on a meta copy of the model (no memory, no arithmetic), with a
pre-hook on every module, says which ran first and last (the output head is the last linear
layer to run), never which modules will not run later: only the whole run can say that
(``engine.numerics.hooks``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from ampscope.engine.step.flops import _to_meta, kept_state, meta_copy

Forward = Callable[[nn.Module, Any], Any]


def called_modules(model: nn.Module, batch: Sequence[Any], forward: Forward) -> list[str] | None:
    """The names (as ``named_modules()`` gives them) of the modules one forward pass of
    ``batch`` (``(inputs, targets)``) calls, in the order they are first called; None when
    neither a meta copy nor the real model could run it (then nothing is known)."""
    try:
        return _calls(meta_copy(model), _to_meta(batch[0]), forward)
    except Exception:  # noqa: BLE001 - data-dependent shapes: the real model, without grads
        pass
    try:
        with kept_state(model), torch.no_grad():
            return _calls(model, batch[0], forward)
    except Exception as exc:  # noqa: BLE001 - a probe never fails the run
        exc.__traceback__ = None  # as count_flops: not the probe's frames on a later raise
        return None


def _calls(model: nn.Module, inputs: Any, forward: Forward) -> list[str]:
    called: dict[str, None] = {}  # first calls, in order
    handles = [
        module.register_forward_pre_hook(lambda _m, _a, name=name: called.setdefault(name))
        for name, module in model.named_modules()
    ]
    try:
        with sdpa_kernel(SDPBackend.MATH), contextlib.suppress(StopIteration):
            forward(model, inputs)
    finally:
        for handle in handles:
            handle.remove()
    return list(called)


def never_runs_as_module(model: nn.Module, name: str) -> str | None:
    """Why the module ``name`` never runs whatever the data, from the model's structure (its
    weight is multiplied by its parent's own code); None when nothing says so."""
    parent_name, _, own = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    if isinstance(parent, nn.MultiheadAttention) and own == "out_proj":
        return (
            "nn.MultiheadAttention's out_proj: its weight is multiplied by "
            "F.multi_head_attention_forward, the layer itself is never called"
        )
    return None


def why_not_called(model: nn.Module, name: str) -> str:
    """Why the module ``name`` never ran, in a user's words."""
    return never_runs_as_module(model, name) or (
        "never called in the forward pass (unused, or its weight is used directly)"
    )


def attention_projections(model: nn.Module) -> dict[str, str]:
    """The q/k/v projections ``nn.MultiheadAttention`` keeps as bare parameters: matmuls no
    linear-layer swap reaches, by parameter name, with why."""
    return {
        f"{name}.in_proj_weight" if name else "in_proj_weight": (
            "nn.MultiheadAttention's q/k/v projection: a bare Parameter, not a linear layer"
        )
        for name, module in model.named_modules()
        if isinstance(module, nn.MultiheadAttention) and module.in_proj_weight is not None
    }


def foreign_linear_layers(model: nn.Module) -> dict[str, str]:
    """Matmul layers of other libraries that fp8 conversion, which swaps ``nn.Linear`` alone,
    never reaches: Hugging Face's ``Conv1D`` (GPT-2's every projection), by module name."""
    return {
        name: "transformers' Conv1D, GPT-2's linear layer with its weight stored transposed: "
        "fp8 conversion takes nn.Linear only"
        for name, module in model.named_modules()
        if type(module).__name__ == "Conv1D" and type(module).__module__.startswith("transformers")
    }
