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


# A user's own model and loop, for ampscope.watch.


def tiny_model(seed: int = 0):
    """32 -> 64 -> 4 MLP and its AdamW, as a user's script would build them."""
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def linear_flops(batch: int, widths: tuple[int, ...]) -> int:
    """FLOPs of a training step of a stack of linear layers fed by data (no input gradient).

    Forward 2·b·i·o per layer, backward twice that (input and weight gradients), less the
    first layer's input gradient, which nothing needs.
    """
    pairs = list(zip(widths, widths[1:], strict=False))
    return sum(6 * batch * i * o for i, o in pairs) - 2 * batch * pairs[0][0] * pairs[0][1]


def events_of(run_dir, kind: type) -> list:
    """The events of one type in a run record, in order."""
    from ampscope.core import records

    events, _ = records.read_events(run_dir / records.EVENTS_FILE)
    return [e for e in events if isinstance(e, kind)]
