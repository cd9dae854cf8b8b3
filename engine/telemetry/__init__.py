"""Live GPU and host figures for the engine: a sampler thread that emits ``sys`` events.

``nvml`` wraps NVML behind one never-raising choke point, ``host`` reads psutil, and
``sampler`` runs both on a daemon thread at 0.25-10 Hz (2 Hz by default). NVML averages
utilization over 1/6 s to 1 s, so sampling faster than about 4 Hz adds nothing.
"""

from ampscope.engine.telemetry.nvml import (
    _ERR_CODES,
    DEFAULT_HZ,
    PID_MISSES_BEFORE_WARNING,
    THROTTLE_REASONS,
    _text,
    decode_throttle_reasons,
    find_gpu_handle,
    load_nvml,
    nvml_call,
    nvml_init,
    nvml_report,
)
from ampscope.engine.telemetry.sampler import TelemetrySampler, start_for_run, validate_hz

__all__ = [
    "DEFAULT_HZ",
    "PID_MISSES_BEFORE_WARNING",
    "THROTTLE_REASONS",
    "_ERR_CODES",
    "_text",
    "TelemetrySampler",
    "decode_throttle_reasons",
    "find_gpu_handle",
    "load_nvml",
    "nvml_call",
    "nvml_init",
    "nvml_report",
    "start_for_run",
    "validate_hz",
]
