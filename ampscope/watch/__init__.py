"""Watch a training loop ampscope did not start: ``ampscope.watch(model, optimizer, ...)``.

::

    import ampscope

    mon = ampscope.watch(model, optimizer, scaler=scaler, name="my-run")
    for batch in loader:
        ...                               # your forward, backward, scaler.step, update
        mon.step(loss, tokens=n_tokens)   # once per optimizer step, after it
    mon.close()                           # or: with ampscope.watch(...) as mon:

The run is written as an engine run's record (``runs/<timestamp>-<name>/``), so every ampscope
screen and command reads it. This package imports no torch until ``watch()`` is called. See
docs/watch.md.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ampscope.watch.options import Options
from ampscope.watch.record import WatchWarning

if TYPE_CHECKING:
    import torch

    from ampscope.watch.monitor import Monitor

__all__ = ["Monitor", "Options", "WatchWarning", "count_flops", "watch"]


def watch(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    scaler: Any = None,
    name: str | None = None,
    runs_dir: str | Path | None = None,
    allow_stop: bool = False,
    precision: str | None = None,
    steps: int | None = None,
    flops_per_step: float | None = None,
    count_flops: bool = False,
    peak_tflops: float | None = None,
    grad_norm: bool = False,
    grad_zero_every: int = 0,
    numerics_every: int = 0,
    warmup_steps: int = 5,
    telemetry_hz: float = 2.0,
) -> Monitor:
    """Start recording a training run; returns the monitor to call ``step()`` on.

    - ``scaler``: the loop's ``torch.amp.GradScaler``, for the loss scale and skipped steps.
    - ``name``: the run's name (default: the script's); ``runs_dir``: where its record goes
      (default ``$AMPSCOPE_RUNS_DIR`` or ``./runs``).
    - ``allow_stop``: let a viewer stop the run by sending this process SIGINT, as Ctrl+C would.
    - ``precision``: ``fp32``, ``tf32``, ``amp-bf16``, ``amp-fp16``, ``bf16``, ``fp16`` or
      ``fp64``; inferred from the parameters and the scaler when not given (autocast cannot be
      seen from here). ``steps``: the planned number of steps, for progress.
    - ``flops_per_step`` (given) or ``count_flops=True`` (counted on the first step with
      ``FlopCounterMode``; eager models only): for TFLOP/s and, with a known peak, MFU.
      ``peak_tflops``: the device's peak, where ampscope's table has none (CPUs).
    - ``grad_norm=True``: take the total gradient norm before each ``optimizer.step()`` (one
      fused kernel); or pass ``grad_norm=`` to ``step()`` when the loop clips anyway.
    - ``grad_zero_every=N``: every N steps, the fraction of zeros in the gradient of the
      model's output (fp16 underflow).
    - ``numerics_every=N``: every N steps, each leaf module's outputs and gradients against
      fp16, bf16 and fp8 (``numerics`` events, the Numerics view; eager models only), and
      the step after a skipped or non-finite one (the first inf/NaN module).
    - ``warmup_steps``: first steps the summary leaves out; ``telemetry_hz``: ``sys`` samples a
      second (GPU utilisation, power, memory, CPU).

    Bad arguments raise ``ValueError`` here. After that nothing ampscope does raises into the
    loop: trouble with the record (folder, disk) or the GPU's telemetry is one ``WatchWarning``.
    """
    options = Options(
        name=name,
        runs_dir=Path(runs_dir) if runs_dir is not None else None,
        allow_stop=allow_stop,
        precision=precision,
        steps=steps,
        flops_per_step=flops_per_step,
        count_flops=count_flops,
        peak_tflops=peak_tflops,
        grad_norm=grad_norm,
        grad_zero_every=grad_zero_every,
        numerics_every=numerics_every,
        warmup_steps=warmup_steps,
        telemetry_hz=telemetry_hz,
    )
    from ampscope.watch.monitor import Monitor

    return Monitor(model, optimizer, scaler, options)


def count_flops(fn: Callable[[], Any]) -> float:
    """The floating-point operations of one call of ``fn``, counted by torch's FlopCounterMode
    with the engine's corrections (a grouped or depthwise convolution's backward).

    For ``flops_per_step=`` with a model you will compile: call it once on the eager model with
    a function that runs one training step (it does run that step), before ``torch.compile``.
    """
    from ampscope.engine.flops import flop_counter

    with flop_counter() as counter:
        fn()
    return float(counter.get_total_flops())


def __getattr__(name: str) -> Any:
    if name == "Monitor":
        from ampscope.watch.monitor import Monitor

        return Monitor
    raise AttributeError(f"module 'ampscope.watch' has no attribute {name!r}")


class _CallableModule(types.ModuleType):
    """``ampscope.watch`` is both this package and the function.

    Importing the package binds ``ampscope.watch`` to the module, whatever was there before;
    a callable module keeps ``ampscope.watch(model, ...)`` working whichever came first.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Monitor:
        return watch(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
