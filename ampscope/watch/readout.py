"""Reading a step's figures without making the user's loop wait for the device.

``HostReadout`` (CPU, and devices without CUDA events) reads each figure at once: on the CPU
that costs nothing more than the read. ``DeviceReadout`` (CUDA) uses the engine's probe: the
step is timed with CUDA events and its figures are stacked into one small device tensor,
copied to pinned memory without blocking, and handed back once they have landed (normally
one step later). Nothing here calls ``.item()`` on a CUDA tensor.

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

from ampscope.engine.probe import FinishedStep, make_probe

NAN = math.nan
LOSS, GRAD_NORM, SCALE_BEFORE, SCALE, ZEROS, TOKENS = range(6)
WIDTH = 6


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


def host_value(value: Any) -> float:
    """A figure that already is on the host (a number, or a CPU tensor) as a float; NaN if none."""
    if value is None:
        return NAN
    if isinstance(value, torch.Tensor):
        return float(value.item() if value.numel() == 1 else value.float().mean().item())
    return float(value)


def _live_scale(scaler: Any) -> torch.Tensor | None:
    """The scaler's current scale tensor (None before its first ``scale()``, or when off)."""
    if scaler is None or not scaler.is_enabled():
        return None
    return getattr(scaler, "_scale", None)


def _init_scale(scaler: Any) -> float:
    if scaler is None or not scaler.is_enabled():
        return NAN
    return float(getattr(scaler, "_init_scale", NAN))


class HostReadout:
    def __init__(self, scaler: Any) -> None:
        self.scaler = scaler
        live = _live_scale(scaler)
        self._previous = host_value(live) if live is not None else _init_scale(scaler)
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
        samples: int,
        lr: float,
    ) -> list[StepValues]:
        now = time.perf_counter()
        step_ms = (now - self._t0) * 1000.0
        self._t0 = now
        live = _live_scale(self.scaler)
        scale = host_value(live) if live is not None else self._previous
        before, self._previous = self._previous, scale
        count = None if tokens is None else host_value(tokens)
        return [
            StepValues(
                step,
                step_ms,
                None if loss is None else host_value(loss),
                host_value(grad_norm),
                before,
                scale,
                host_value(zeros),
                count,
                samples,
                lr,
            )
        ]

    def drain(self) -> list[StepValues]:
        return []


class DeviceReadout:
    """``probe``: the engine's CudaProbe by default; tests hand in one that lands late."""

    def __init__(self, device: torch.device, scaler: Any, probe: Any = None) -> None:
        self.device = device
        self.scaler = scaler
        self.nan = torch.full((), NAN, device=device)
        live = _live_scale(scaler)
        if live is not None:
            self._previous = live.detach().clone().float().reshape(())
        else:
            self._previous = torch.full((), _init_scale(scaler), device=device)
        # per step in flight, what the host knows: loss, grad norm, tokens, given?, samples, lr
        self._host: deque[tuple[Any, ...]] = deque()
        self.probe = probe if probe is not None else make_probe(device, WIDTH)
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
        if value is None:
            return self.nan, None
        return self.nan, host_value(value)

    def end(
        self,
        step: int,
        loss: Any,
        grad_norm: Any,
        zeros: Any,
        tokens: Any,
        samples: int,
        lr: float,
    ) -> list[StepValues]:
        loss_t, loss_h = self._split(loss)
        norm_t, norm_h = self._split(grad_norm)
        zeros_t, _ = self._split(zeros)
        tokens_t, tokens_h = self._split(tokens)
        live = _live_scale(self.scaler)
        scale = live.detach().clone().float().reshape(()) if live is not None else self._previous
        metrics = torch.stack([loss_t, norm_t, self._previous, scale, zeros_t, tokens_t])
        self._previous = scale
        self.probe.end(step, metrics)
        self.probe.begin()
        self._host.append((loss is None, loss_h, norm_h, tokens is None, tokens_h, samples, lr))
        return [self._values(item) for item in self.probe.poll()]

    def _values(self, item: FinishedStep) -> StepValues:
        no_loss, loss_h, norm_h, no_tokens, tokens_h, samples, lr = self._host.popleft()
        v = item.values
        loss = None if no_loss else (v[LOSS] if loss_h is None else loss_h)
        tokens = None if no_tokens else (v[TOKENS] if tokens_h is None else tokens_h)
        return StepValues(
            item.step,
            item.step_ms,
            loss,
            v[GRAD_NORM] if norm_h is None else norm_h,
            v[SCALE_BEFORE],
            v[SCALE],
            v[ZEROS],
            tokens,
            samples,
            lr,
        )

    def drain(self) -> list[StepValues]:
        """Every step still in flight; synchronises, so only at the end of the run."""
        return [self._values(item) for item in self.probe.drain()]


def make_readout(device: torch.device, scaler: Any) -> HostReadout | DeviceReadout:
    return DeviceReadout(device, scaler) if device.type == "cuda" else HostReadout(scaler)
