"""What a run is made of, each piece replaceable: the device it resolves, the machine's facts
it checks the preset against, how it builds and trains, and what a step reads and reports. The
engine's own unless a caller (a test, with a fake GPU or a step that fails) hands in others."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ampscope.core import events as ev
from ampscope.engine.device import DeviceInfo, resolve_device
from ampscope.engine.lifecycle import loop
from ampscope.engine.profiling import ProfileControl
from ampscope.engine.step import setup
from ampscope.engine.step.metrics import MemoryReader, StepReporter
from ampscope.engine.step.validation import Facts, read_facts


@dataclass(frozen=True)
class Parts:
    """Each field is the engine's own piece unless given; the comments say how it is called."""

    resolve_device: Callable[..., DeviceInfo] = resolve_device  # (spec, ranks)
    facts: Callable[[DeviceInfo, bool], Facts] = read_facts  # (info, grouped)
    build: Callable[..., setup.Setup] = setup.build  # (preset, info, link, sizes, ...)
    make_workload: Callable[..., tuple[setup.TrainingWorkload, dict[str, int]]] = (
        setup.make_workload  # (preset, info, link, sizes)
    )
    compile_model: Callable[..., torch.nn.Module] = setup.compile_model  # (model, preset)
    train: Callable[..., ev.DoneStatus] = loop.train  # (setup, writer, tally, peak, stop, ...)
    # (setup, step, measure_zeros, phase, numerics)
    train_step: Callable[..., tuple[torch.Tensor, float]] = loop.train_step
    memory: Callable[..., MemoryReader] = MemoryReader  # (device)
    reporter: Callable[..., StepReporter] = StepReporter  # (setup, writer, tally, peak, ...)
    profiler: Callable[..., ProfileControl] = ProfileControl  # (writer, device, run_dir, first)
