"""What ``mon.step(loss)`` may be given, and what it says of a loss that is no number.

A loss is a tensor (one element; several are recorded as their mean) or a real number that fits
a float. Anything else costs its step's loss only: that step is recorded without one, and a
warning names what it was, once a kind. ``tokens=``, ``grad_norm=`` (a one-element tensor or
a real number) and ``samples=`` (a real number) are checked the same way.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from ampscope.core import events as ev
from ampscope.core.text import value_text
from ampscope.core.workload import MAX_ITEMS_PER_STEP
from ampscope.watching.messages import StepNotes


def checked_loss(step: int, loss: Any, notes: StepNotes) -> tuple[Any, ev.WarningEvent | None]:
    """The loss to record (None where ``loss`` is no loss) and the warning it calls for, if
    any: one a kind of trouble. A tensor of several elements is recorded as their mean."""
    if (
        isinstance(loss, torch.Tensor)
        and loss.layout is torch.strided
        and loss.numel() == 1
        and loss.dtype not in NO_FIGURE_DTYPES
        and not (loss.is_meta or loss.is_nested)
    ):
        return loss, None
    problem = loss_problem(loss)
    if problem is not None:
        return None, notes.bad_loss(step, problem)
    if isinstance(loss, torch.Tensor):
        return loss, notes.not_scalar(step, tuple(loss.shape))
    return loss, None


NO_FIGURE_DTYPES = frozenset(
    {torch.bool, torch.complex32, torch.complex64, torch.complex128}
    | {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}
)
"""Tensors of these hold no real number a loss or a figure could be read from."""
_FITS = 1 << 63
"""An int below this in size is taken as it is (the common case, checked at no cost)."""
TENSOR_FIGURES = ("tokens", "grad_norm")
"""The figures ``mon.step`` takes as a one-element tensor too; ``samples`` is a plain number."""
COUNTS = ("tokens", "samples")
"""The figures that count something: a negative one, or NaN, is no count (a rate from it would
be a negative throughput)."""


def checked_figure(
    step: int, name: str, value: Any, notes: StepNotes
) -> tuple[Any, ev.WarningEvent | None]:
    """``value`` as ``mon.step(name=value)`` records it (None where it is no number) and the
    warning it calls for, once a kind: one bad figure costs that step's figure alone."""
    if value is None or type(value) is float or (type(value) is int and -_FITS < value < _FITS):
        if name in COUNTS and value is not None and not 0 <= value <= MAX_ITEMS_PER_STEP:
            said = f"not a count of one step's {name} ({_shown(value)})"  # nan, inf, 1e308
            return None, notes.bad_figure(step, name, said, TENSOR_FIGURES)
        if name == "grad_norm" and value is not None and value < 0:  # a norm is never below 0
            said = f"no norm ({_shown(value)}, below zero)"
            return None, notes.bad_figure(step, name, said, TENSOR_FIGURES)
        return value, None
    if isinstance(value, torch.Tensor):
        problem = odd_tensor(value) or _figure_tensor_problem(name, value)
    else:
        problem = loss_problem(value)
    if problem is None:
        return value, None
    return None, notes.bad_figure(step, name, problem, TENSOR_FIGURES)


def _figure_tensor_problem(name: str, value: torch.Tensor) -> str | None:
    """What an ordinary (strided) tensor given as ``name`` is, when it is no figure."""
    if name not in TENSOR_FIGURES:
        return f"a tensor ({tuple(value.shape)})"
    if value.numel() != 1:
        return f"a tensor of shape {tuple(value.shape)}, not one number"
    return _no_real_number(value)


def _no_real_number(value: torch.Tensor) -> str | None:
    """A complex or bool tensor, said for a warning: a comparison's result is no figure."""
    if value.is_complex() or value.dtype == torch.bool:
        return f"a {'complex' if value.is_complex() else 'bool'} tensor ({value.dtype})"
    return None


def loss_problem(loss: Any) -> str | None:
    """What ``loss`` is, said for a warning, when it cannot be a step's loss; None when it can
    (a tensor with elements, or a real number that fits a float)."""
    if isinstance(loss, torch.Tensor):
        odd = odd_tensor(loss) or _no_real_number(loss)
        if odd is not None:
            return odd
        return "an empty tensor" if loss.numel() == 0 else None
    kind = type(loss).__name__
    kind = ("an " if kind[:1] in "aeiou" else "a ") + kind
    if isinstance(loss, (str, bytes, bool, numbers.Complex)) and not (
        isinstance(loss, numbers.Real) and not isinstance(loss, bool)
    ):
        return f"{kind} ({_shown(loss)})"
    try:
        float(loss)
    except OverflowError:
        return f"{kind} too large for a float ({_shown(loss)})"
    except (TypeError, ValueError):
        return f"{kind} ({_shown(loss)})"
    except Exception as exc:  # noqa: BLE001 - their __float__ raised: their object's fault
        return f"{kind} whose float() raised {type(exc).__name__}"
    return None


def odd_tensor(value: torch.Tensor) -> str | None:
    """What a tensor is, said for a warning, when no number can be read from it the usual way
    (``.item()``, a mean): a meta tensor holds no values, and torch has no mean or item for
    every sparse, nested, quantized or MKL-DNN one. None for an ordinary (strided) tensor."""
    if value.is_nested:
        return "a nested tensor"
    if value.layout is not torch.strided:
        return f"a {str(value.layout).removeprefix('torch.')} tensor"
    if value.is_meta:
        return "a tensor on the meta device (it holds no values)"
    if value.is_quantized:
        return f"a quantized tensor ({value.dtype})"
    return None


def _shown(value: Any) -> str:
    return value_text(value, 40)
