"""``fp32_modules``: the modules an AMP run keeps in fp32, for ranges its format cannot hold.

Autocast picks each op's dtype; a module named here runs with autocast off inside it and its
floating-point inputs cast to fp32, so every op of its forward (and so of its backward)
computes in fp32. Its outputs leave it in fp32, and the next autocast op casts them down
again: an fp32 output beyond fp16's 65504 overflows in the op that takes it, so ``ampscope
plan fp16`` keeps that op's module in fp32 too. The GradScaler is the run's, the same for
these modules as for every other: their gradients are scaled and unscaled with the rest.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from ampscope.core.presets import ConfigError
from ampscope.core.presets.suggest import did_you_mean


def keep_in_fp32(model: nn.Module, names: list[str], device_type: str) -> None:
    """Make each named module of ``model`` compute in fp32 under autocast (in place).

    Raises ConfigError (exit 2) naming the first name the model does not have."""
    modules = dict(model.named_modules())
    modules.pop("", None)  # the model itself: in fp32 altogether, that is no AMP at all
    for name in names:
        if name not in modules:
            raise ConfigError(unknown_module(name, list(modules)), key="fp32_modules")
    for name in dict.fromkeys(names):
        module = modules[name]
        module.forward = _in_fp32(module.forward, device_type)


def unknown_module(name: str, known: list[str]) -> str:
    """One paragraph: the name at fault, the close one, and what the model has."""
    hint = did_you_mean(name, known)
    shown = ", ".join(known[:10]) + (f" and {len(known) - 10} more" if len(known) > 10 else "")
    return (
        f"fp32_modules names '{name}', which is not a module of this model.{hint} Accepted: "
        f"module names as model.named_modules() gives them ({shown or 'none'}); "
        "'ampscope plan fp16' writes the list for a model."
    )


def _in_fp32(forward: Callable[..., Any], device_type: str) -> Callable[..., Any]:
    @functools.wraps(forward)
    def run_in_fp32(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=device_type, enabled=False):
            return forward(*_to_fp32(args), **_to_fp32(kwargs))

    return run_in_fp32


def _to_fp32(value: Any) -> Any:
    """Floating-point tensors in ``value`` (tuples, lists, dicts) as fp32; the rest as is."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() else value
    if isinstance(value, Mapping):
        return {k: _to_fp32(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_to_fp32(v) for v in value)
    if isinstance(value, list):
        return [_to_fp32(v) for v in value]
    return value
