"""A watched model that torch.compile compiles: its compile time and dynamo's counters as the
engine reports them (``compile`` phase and events, recompiles, graph breaks).

Dynamo's counters are looked at only once dynamo is loaded, and then only after a step in which
it compiled a frame (every compile, recompile and graph break does): dict lookups, cheap.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from ampscope.core import events as ev
from ampscope.engine.emitter import EventWriter


class CompileTracker:
    def __init__(self, compiled: bool, emit: Callable[..., None]) -> None:
        self.compiled = compiled  # the model handed in was compiled
        self.emit = emit
        self.started = time.perf_counter()
        self.compile_s: float | None = None
        self._counters: Any = None  # torch._dynamo's, once dynamo is loaded
        self._frames_seen = 0
        self._watch: Any = None

    def first_step_done(self) -> None:
        """The first step of a compiled model is its compile: its time, and the phases."""
        if not self.compiled:
            return
        self.compile_s = round(time.perf_counter() - self.started, 3)
        for event in ev.compile_ended(self.compile_s):
            self.emit(event, urgent=True)

    def after_step(self, step: int, writer: EventWriter | None) -> None:
        counters = self._counters
        if counters is None:
            if "torch._dynamo" not in sys.modules:
                return
            from ampscope.engine.private_apis import dynamo_counters

            counters = self._counters = dynamo_counters()
        frames = counters["frames"].get("total", 0)
        if frames == self._frames_seen:
            return
        self._frames_seen = frames
        if writer is None:  # closed: nothing to write to
            return
        if self._watch is None:
            from ampscope.engine.step.compile_stats import CompileWatch

            self._watch = CompileWatch(writer)
        self._watch.after_step(step, self.compile_s)
