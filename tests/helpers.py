"""What the dashboard tests share: driving the app headless and watching processes go."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import psutil

from ampscope.core import events as ev
from ampscope.tui.app import AmpscopeApp
from ampscope.tui.screens.presets import PresetsScreen

FAST = ["workload.kind='mlp'", "device='cpu'"]  # a small MLP: milliseconds a step on a CPU
SIZE = (120, 40)


def run(coro) -> None:
    asyncio.run(coro)


async def wait_for(pilot, cond: Callable[[], bool], timeout: float = 60.0) -> bool:
    """Let the app run until ``cond()`` holds; False if it still does not after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        await pilot.pause(0.2)
    return cond()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.1)
    return gone(pid)


def select_preset(app: AmpscopeApp, name: str) -> None:
    screen = app.screen
    assert isinstance(screen, PresetsScreen)
    options = screen.query_one("#preset-list")
    options.highlighted = [p.name for p in screen.presets].index(name)
    options.focus()


# Fake events for feeding a RunState or writing a record by hand.


def hello(**kw) -> ev.HelloEvent:
    fields = dict(
        run_id="r",
        run_dir=None,
        preset="fp32",
        config={"precision": "fp32", "compile": "off", "steps": 100, "device": "cpu"},
        pid=1,
        host="h",
        started_at=0.0,
        python_version="3",
        torch_version="2",
        cuda_version=None,
        device="cpu",
        device_name="cpu",
        compute_capability=None,
        compute_dtype="float32",
        peak_tflops=None,
        peak_tflops_note="",
        param_count=1000,
        flops_per_step=1.0,
        samples_per_step=8,
        tokens_per_step=None,
    )
    fields.update(kw)
    return ev.HelloEvent(**fields)


def step(i: int, ms: float = 10.0, **kw) -> ev.StepEvent:
    fields = dict(
        step=i,
        step_ms=ms,
        loss=2.0 / (i + 1),
        loss_scale=None,
        skipped=False,
        grad_norm=1.0,
        samples_per_s=800.0,
        tokens_per_s=None,
        tflops=0.5,
        mfu=None,
        mem_allocated=100 << 20,
        mem_reserved=200 << 20,
        mem_peak=150 << 20,
        grad_zero_frac=None,
        lr=1e-3,
        t=1.0 + i * 0.01,
    )
    fields.update(kw)
    return ev.StepEvent(**fields)


# Shapes of one batch of each workload kind, for counting FLOPs without building its data.


def meta_batch(kind: str, dims: dict[str, int], batch_size: int, device: str = "meta"):
    """(inputs, targets) of the right shapes and dtypes, all zeros (valid labels and tokens)."""
    import torch

    if kind == "gpt":
        tokens = torch.zeros(batch_size, dims["seq_len"], dtype=torch.long, device=device)
        return tokens, tokens
    labels = torch.zeros(batch_size, dtype=torch.long, device=device)
    if kind == "mlp":
        return torch.zeros(batch_size, dims["width"], device=device), labels
    size = dims["image_size"]
    return torch.zeros(batch_size, 3, size, size, device=device), labels
