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

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ampscope.watching.options import Options, RecordOptions, WatchOptions, check_objects
from ampscope.watching.troubles import WatchWarning

if TYPE_CHECKING:
    import torch
    from typing_extensions import Unpack

    from ampscope.watching.monitor import Monitor

__all__ = [
    "Monitor",
    "Options",
    "RecordOptions",
    "WatchOptions",
    "WatchWarning",
    "count_flops",
    "watch",
]


def watch(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    scaler: Any = None,
    **options: Unpack[WatchOptions],
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
      ``FlopCounterMode``, a later step's in proportion to its ``tokens`` or ``samples``;
      eager models only): for TFLOP/s and, with a known peak, MFU.
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
    checked = Options.of(options)
    check_objects(model, optimizer, scaler)
    from ampscope.watching.monitor import Monitor

    return Monitor(model, optimizer, scaler, checked)


def count_flops(fn: Callable[[], Any]) -> float:
    """The floating-point operations of one call of ``fn``, counted by torch's FlopCounterMode
    with the engine's corrections (a grouped or depthwise convolution's backward). A count
    that ran kernels torch has no formula for (an LSTM's, the CPU's flash attention) is a
    lower bound, and a ``UserWarning`` names them.

    For ``flops_per_step=`` with a model you will compile: call it once on the eager model with
    a function that runs one training step (it does run that step), before ``torch.compile``.
    """
    import warnings

    from ampscope.engine.step.flops import Counting
    from ampscope.watching.messages import partial_count

    with Counting() as counting:
        fn()
    counted = counting.result("own")
    if counted.partial:
        warnings.warn(partial_count(counted.flops, counted.missing), stacklevel=2)
    return counted.flops


def __getattr__(name: str) -> Any:
    if name == "Monitor":
        from ampscope.watching.monitor import Monitor

        return Monitor
    raise AttributeError(f"module 'ampscope.watching' has no attribute {name!r}")
