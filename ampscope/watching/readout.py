"""Reading a step's figures without making the user's loop wait for the device.

``HostReadout`` (CPU, and devices without CUDA events) reads each figure at once: on the CPU
that costs nothing more than the read. ``DeviceReadout`` (CUDA) uses the engine's probe: the
step is timed with CUDA events and its figures are stacked into one small device tensor,
copied to pinned memory without blocking, and handed back once they have landed (normally
one step later). Nothing here calls ``.item()`` on a CUDA tensor.

Both put each step that has landed on ``landed`` as a plain tuple (``Raw``): the training
thread does as little as it can, and the monitor's own thread makes ``StepValues`` of them.
Right after torch's kernels every line of Python runs on cold caches, so the per-step path
here is kept short.

Loss scale: a step the scaler skipped is one whose scale dropped across ``update()``, which is
what Hugging Face's Trainer checks too; the scale after the previous step is this step's
"before".
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from ampscope.engine.private_apis import initial_scale, live_scale
from ampscope.engine.step.timer import FinishedStep, make_step_timer

NAN = math.nan
LOSS, GRAD_NORM, SCALE_BEFORE, SCALE, ZEROS, TOKENS = range(6)
WIDTH = 6
RSS_EVERY_S = 0.5

Raw = tuple
"""(step, step_ms, loss, grad_norm, scale_before, scale, zeros, tokens, samples, lr), each
figure a float, or None where the loop gave none; lr as the optimizer holds it."""


@dataclass
class StepValues:
    step: int
    step_ms: float
    loss: float | None  # None: the loop gave none
    grad_norm: float
    scale_before: float
    scale: float
    zeros: float
    tokens: float | None
    samples: int
    lr: float

    @classmethod
    def from_raw(cls, raw: Raw) -> StepValues:
        step, step_ms, loss, norm, before, scale, zeros, tokens, samples, lr = raw
        return cls(
            step,
            step_ms,
            loss,
            NAN if norm is None else norm,
            before,
            scale,
            NAN if zeros is None else zeros,
            tokens,
            samples or 0,
            host_lr(lr),
        )


def host_value(value: Any) -> float | None:
    """A figure already on the host (a number, or a CPU tensor) as a float; None stays None."""
    if value is None or type(value) is float:
        return value
    if isinstance(value, torch.Tensor):
        try:
            return value.item()
        except RuntimeError:  # more than one element: their mean
            return value.float().mean().item()
    return float(value)


def host_lr(lr: Any) -> float:
    """A learning rate as the optimizer holds it, as a float; 0 where reading it would sync."""
    if type(lr) is float:
        return lr
    if isinstance(lr, torch.Tensor):
        return float(lr) if lr.device.type == "cpu" and lr.numel() == 1 else 0.0
    return float(lr) if isinstance(lr, (int, float)) else 0.0


class HostReadout:
    def __init__(self, scaler: Any) -> None:
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        live = live_scale(scaler)
        self._previous = float(live.item()) if live is not None else initial_scale(scaler)
        self.landed: deque[Raw] = deque()
        self._t0 = time.perf_counter()

    def restart(self) -> None:
        self._t0 = time.perf_counter()

    def end(
        self,
        step: int,
        loss: Any,
        grad_norm: Any,
        zeros: Any,
        tokens: Any,
        samples: int | None,
        lr: Any,
    ) -> None:
        now = time.perf_counter()
        step_ms = (now - self._t0) * 1000.0
        self._t0 = now
        before = scale = self._previous
        if self.scaler is not None:
            live = self.scaler._scale
            if live is not None:
                scale = self._previous = live.item()
        self.landed.append(
            (
                step,
                step_ms,
                host_value(loss),
                host_value(grad_norm),
                before,
                scale,
                None if zeros is None else host_value(zeros),
                tokens if tokens is None or type(tokens) is int else host_value(tokens),
                samples,
                lr,
            )
        )

    def drain(self) -> None:
        """Nothing is in flight on the host."""


class DeviceReadout:
    """``probe``: the engine's CudaStepTimer by default; tests hand in one that lands late."""

    def __init__(self, device: torch.device, scaler: Any, probe: Any = None) -> None:
        self.device = device
        self.scaler = scaler
        self.nan = torch.full((), NAN, device=device)
        live = live_scale(scaler)
        if live is not None:
            self._previous = live.detach().clone().float().reshape(())
        else:
            self._previous = torch.full((), initial_scale(scaler), device=device)
        self.landed: deque[Raw] = deque()
        # per step in flight, what the host knows: loss, grad norm, tokens, given?, samples, lr
        self._host: deque[tuple[Any, ...]] = deque()
        self.probe = probe if probe is not None else make_step_timer(device, WIDTH)
        self.probe.begin()

    def restart(self) -> None:
        self.probe.begin()

    def _split(self, value: Any) -> tuple[torch.Tensor, float | None]:
        """A figure on the device stays there; one already on the host is kept aside."""
        if isinstance(value, torch.Tensor) and (
            value.device == self.device or value.device.type == "cuda"
        ):
            t = value.detach()
            if t.device != self.device:  # a loss on another GPU: copied, never read
                t = t.to(self.device, non_blocking=True)
            return (t.float().reshape(()) if t.numel() == 1 else t.float().mean()), None
        return self.nan, host_value(value)

    def end(
        self,
        step: int,
        loss: Any,
        grad_norm: Any,
        zeros: Any,
        tokens: Any,
        samples: int | None,
        lr: Any,
    ) -> None:
        loss_t, loss_h = self._split(loss)
        norm_t, norm_h = self._split(grad_norm)
        zeros_t, _ = self._split(zeros)
        tokens_t, tokens_h = self._split(tokens)
        live = live_scale(self.scaler)
        scale = live.detach().clone().float().reshape(()) if live is not None else self._previous
        metrics = torch.stack([loss_t, norm_t, self._previous, scale, zeros_t, tokens_t])
        self._previous = scale
        self.probe.end(step, metrics)
        self.probe.begin()
        self._host.append((loss is None, loss_h, norm_h, tokens is None, tokens_h, samples, lr))
        self.landed.extend(self._raw(item) for item in self.probe.poll())

    def _raw(self, item: FinishedStep) -> Raw:
        no_loss, loss_h, norm_h, no_tokens, tokens_h, samples, lr = self._host.popleft()
        v = item.values
        return (
            item.step,
            item.step_ms,
            None if no_loss else (v[LOSS] if loss_h is None else loss_h),
            v[GRAD_NORM] if norm_h is None else norm_h,
            v[SCALE_BEFORE],
            v[SCALE],
            v[ZEROS],
            None if no_tokens else (v[TOKENS] if tokens_h is None else tokens_h),
            samples,
            lr,
        )

    def drain(self) -> None:
        """Every step still in flight; synchronises, so only at the end of the run."""
        self.landed.extend(self._raw(item) for item in self.probe.drain())


def make_readout(device: torch.device, scaler: Any) -> HostReadout | DeviceReadout:
    return DeviceReadout(device, scaler) if device.type == "cuda" else HostReadout(scaler)
