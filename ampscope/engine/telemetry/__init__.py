"""Live GPU and host figures for the engine: a sampler thread that emits ``sys`` events.

``nvml`` wraps NVML behind one never-raising choke point, ``gpu`` reads the run's GPU through
it, ``host`` reads psutil, ``sampler`` runs both on a daemon thread at 0.25-10 Hz (2 Hz by
default), ``report`` answers ``ampscope doctor``, and ``codes`` lists the warnings they emit.
"""

from ampscope.engine.telemetry.gpu import PID_MISSES_BEFORE_WARNING, GpuReader
from ampscope.engine.telemetry.nvml import (
    _ERR_CODES,
    THROTTLE_REASONS,
    as_text,
    decode_throttle_reasons,
    find_gpu_handle,
    load_nvml,
    nvml_call,
    nvml_init,
)
from ampscope.engine.telemetry.report import nvml_report
from ampscope.engine.telemetry.sampler import (
    DEFAULT_HZ,
    TelemetrySampler,
    start_for_run,
    validate_hz,
)

__all__ = [
    "DEFAULT_HZ",
    "PID_MISSES_BEFORE_WARNING",
    "THROTTLE_REASONS",
    "_ERR_CODES",
    "GpuReader",
    "TelemetrySampler",
    "as_text",
    "decode_throttle_reasons",
    "find_gpu_handle",
    "load_nvml",
    "nvml_call",
    "nvml_init",
    "nvml_report",
    "start_for_run",
    "validate_hz",
]
