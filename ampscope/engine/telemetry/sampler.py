"""Live GPU and host figures for the engine: a sampler thread that emits ``sys`` events.

A field that cannot be read is null in the event, and the reason is emitted once as a warning:
NVML through its never-raising choke point (``nvml``), the GPU's figures by ``gpu``, the host's
by ``host``. NVML is initialised once per sampler and device handles are cached.

NVML averages utilization over 1/6 s to 1 s, so sampling faster than about 4 Hz adds nothing;
the accepted range is 0.25-10 Hz and the default 2 Hz.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ampscope.core import events as ev
from ampscope.core.presets import ConfigError
from ampscope.engine.telemetry.codes import (
    W_GPU_LOST,
    W_GPU_NOT_FOUND,
    W_NVML_MISSING,
    W_SAMPLER_FAULT,
)
from ampscope.engine.telemetry.gpu import GpuReader
from ampscope.engine.telemetry.host import HostReader
from ampscope.engine.telemetry.nvml import load_nvml

DEFAULT_HZ = 2.0
MIN_HZ, MAX_HZ = 0.25, 10.0
STOP_TIMEOUT_S = 2.0


def validate_hz(hz: float) -> float:
    try:
        value = float(hz)
    except (TypeError, ValueError):
        value = float("nan")
    if not MIN_HZ <= value <= MAX_HZ:  # also refuses NaN
        raise ConfigError(
            f"telemetry rate {hz!r} Hz is out of range: accepted {MIN_HZ:g} to {MAX_HZ:g} Hz "
            f"(default {DEFAULT_HZ:g}). NVML averages utilization over 1/6 s to 1 s, so more "
            "than about 4 Hz adds nothing."
        )
    return value


class TelemetrySampler:
    """A daemon thread in the engine process emitting one ``SysEvent`` every 1/hz seconds.

    ``emit`` receives the SysEvents and, once each, a ``WarningEvent`` for every figure that
    is unavailable and why (emitted before the sample it concerns). On a CPU run (``cuda``
    false, which is the default when no ``uuid`` or ``pci_bus_id`` is given) only host figures
    are sampled and NVML is never touched. ``nvml_module`` and ``psutil_module`` replace the
    real modules (tests); by default ``pynvml`` is imported lazily, on the sampler's thread.
    """

    def __init__(
        self,
        emit: Callable[[ev.Event], Any],
        *,
        uuid: str | None = None,
        pci_bus_id: str | None = None,
        cuda: bool | None = None,
        hz: float = DEFAULT_HZ,
        nvml_module: Any = None,
        psutil_module: Any = None,
        pid: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hz = validate_hz(hz)
        self.period = 1.0 / self.hz
        self.emit = emit
        self.uuid = str(uuid) if uuid else None
        self.pci_bus_id = pci_bus_id
        self.cuda = bool(self.uuid or pci_bus_id) if cuda is None else bool(cuda)
        self.pid = os.getpid() if pid is None else pid
        self.clock = clock
        self._nvml_module = nvml_module
        self.host = HostReader(psutil_module, self.pid)
        self.gpu: GpuReader | None = None
        self._gpu_ready = False
        self._pending: list[tuple[str, str]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._fault_reported = False
        self.samples = 0

    # -- one sample

    def read(self) -> ev.SysEvent:
        """Take one sample without emitting it (reasons are queued for :meth:`tick`)."""
        with self._lock:
            self._ensure_gpu()
            fields = self.host.read()
            if self.gpu is not None:
                fields.update(self._read_gpu(self.gpu))
                self._pending += self.gpu.take_reasons()
            self._pending += self.host.take_reasons()
            self.samples += 1
            return ev.SysEvent(**fields)

    def tick(self) -> ev.SysEvent:
        """Take one sample and emit it, preceded by any new warnings."""
        event = self.read()
        with self._lock:
            pending, self._pending = self._pending, []
        for code, message in pending:
            self.emit(ev.WarningEvent(code=code, message=message))
        self.emit(event)
        return event

    def _read_gpu(self, gpu: GpuReader) -> dict[str, Any]:
        try:
            return gpu.read()
        except Exception as exc:  # noqa: BLE001 - a broken binding: report once, carry on
            if not gpu.lost:
                gpu.lost = True
                self._pending.append(
                    (
                        W_GPU_LOST,
                        (
                            f"Reading the GPU failed ({type(exc).__name__}: {exc}); GPU figures stop, "
                            "host figures continue."
                        ),
                    )
                )
            return {}

    def _ensure_gpu(self) -> None:
        if self._gpu_ready:
            return
        self._gpu_ready = True
        if not self.cuda:
            return  # a CPU run: the dashboard says "no NVIDIA GPU"; nothing to warn about
        if not (self.uuid or self.pci_bus_id):
            self._pending.append(
                (
                    W_GPU_NOT_FOUND,
                    (
                        "No GPU figures: torch gave no UUID or PCI bus id for the GPU, and matching by "
                        "index is unreliable under CUDA_VISIBLE_DEVICES. Host figures continue."
                    ),
                )
            )
            return
        nvml = self._nvml_module
        if nvml is None:
            nvml, why = load_nvml()
            if nvml is None:
                self._pending.append(
                    (W_NVML_MISSING, (f"No GPU figures: {why}. Host figures continue."))
                )
                return
        self.gpu = GpuReader(nvml, self.uuid, self.pci_bus_id, pid=self.pid, clock=self.clock)
        self.gpu.open()

    # -- the thread

    def start(self) -> TelemetrySampler:
        """Start sampling in a daemon thread; the first sample comes one period later."""
        if self._thread is not None:
            if self._stop.is_set():
                raise RuntimeError("a TelemetrySampler runs once; create a new one")
            return self
        self.host.prime()
        self._thread = threading.Thread(target=self._run, name="ampscope-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the thread (wakes it at once) and shut NVML down. Safe to call more than once.

        A run shorter than one period still gets one sample, over its whole length."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                return  # stuck in a driver call: leave NVML initialised rather than race it
            if self.samples == 0:
                with contextlib.suppress(Exception):  # the run is ending: a lost sample is no fault
                    self.tick()
        with self._lock:
            if self.gpu is not None:
                self.gpu.close()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        next_at = time.monotonic() + self.period
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - the thread's edge: a fault costs one sample, never the run
                self._fault(exc)
            next_at += self.period
            now = time.monotonic()
            if next_at < now:  # fell behind (a slow driver call): skip, don't burst
                next_at = now + self.period

    def _fault(self, exc: Exception) -> None:
        """Warn once, with the next sample, that one could not be taken or handed over (a
        broken output, a failing ``emit``); sampling goes on."""
        if self._fault_reported:
            return
        self._fault_reported = True
        message = (
            f"A telemetry sample was lost ({type(exc).__name__}: {exc}); sampling goes on. "
            "Further losses are not reported."
        )
        with self._lock:
            self._pending.append((W_SAMPLER_FAULT, message))


def start_for_run(writer: Any, info: Any, hz: float = DEFAULT_HZ) -> TelemetrySampler:
    """Start a sampler for a run: ``writer`` is the EventWriter, ``info`` the DeviceInfo.

    Warnings are flushed at once, like every other warning; samples ride the normal flush.
    """

    def emit(event: ev.Event) -> None:
        writer.emit(event, urgent=isinstance(event, ev.WarningEvent))

    return TelemetrySampler(emit, uuid=info.uuid, cuda=info.is_cuda, hz=hz).start()
