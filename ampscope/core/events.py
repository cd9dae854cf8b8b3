"""The event stream between the engine and everything that watches it.

One JSON object per line. Every event carries ``v`` (the schema version) and ``type``;
``t`` is seconds since the run started. The same lines go to the engine's stdout (with
``--json``) and to ``events.jsonl`` in the run record. See docs/events.md.
"""

from __future__ import annotations

from typing import Any, Literal, Union

import msgspec

SCHEMA_VERSION = 1


class Event(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=False):
    v: int = SCHEMA_VERSION
    t: float = 0.0


class HelloEvent(Event, tag="hello"):
    """First line of every run: what runs, where, and the numbers MFU is computed from."""

    run_id: str
    run_dir: str | None
    preset: str
    config: dict[str, Any]
    pid: int
    host: str
    started_at: float
    python_version: str
    torch_version: str
    cuda_version: str | None
    device: str
    device_name: str
    compute_capability: list[int] | None
    compute_dtype: str
    peak_tflops: float | None
    peak_tflops_note: str
    param_count: int
    flops_per_step: float
    samples_per_step: int
    tokens_per_step: int | None
    # Who trains: ampscope's engine, or a user's own loop seen through ``ampscope.watch``.
    source: Literal["engine", "watch"] = "engine"
    # Whether a viewer may stop the run; a watched process allows it only when asked to.
    allow_stop: bool = True


class PhaseEvent(Event, tag="phase"):
    """A stretch of the run a UI should name: setup, compile, train."""

    phase: Literal["setup", "compile", "train"]
    state: Literal["start", "end"]
    seconds: float | None = None
    step: int | None = None


class StepEvent(Event, tag="step"):
    """One optimizer step. ``loss`` and ``grad_norm`` are null when not finite (inf or NaN)."""

    step: int
    step_ms: float
    loss: float | None
    loss_scale: float | None
    skipped: bool
    grad_norm: float | None
    samples_per_s: float
    tokens_per_s: float | None
    tflops: float
    mfu: float | None
    mem_allocated: int | None
    mem_reserved: int | None
    mem_peak: int | None
    grad_zero_frac: float | None
    lr: float


class CompileEvent(Event, tag="compile"):
    """torch._dynamo's counters, emitted after the first compiled step and on every change."""

    step: int
    graphs: int
    frames: int
    recompiles: int
    graph_breaks: int
    break_reasons: dict[str, int]
    cudagraph_skips: int
    compile_s: float | None


class WarningEvent(Event, tag="warning"):
    code: str
    message: str
    step: int | None = None


class ErrorEvent(Event, tag="error"):
    kind: Literal["config", "oom", "nan", "exception"]
    message: str
    step: int | None = None
    traceback: str | None = None
    hint: str | None = None
    mem_allocated: int | None = None
    mem_reserved: int | None = None


class SysEvent(Event, tag="sys"):
    """A sample of device and host figures; a field the machine cannot report is null."""

    gpu_util: float | None = None
    gpu_mem_util: float | None = None
    gpu_mem_used: int | None = None
    gpu_mem_total: int | None = None
    proc_gpu_mem: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    sm_clock_mhz: float | None = None
    throttle: list[str] | None = None
    cpu_util: float | None = None
    proc_cpu: float | None = None
    proc_rss: int | None = None
    sys_mem_used: int | None = None
    sys_mem_total: int | None = None


class DoneEvent(Event, tag="done"):
    """Last line of every run. Timing figures exclude warm-up and compile steps."""

    status: Literal["ok", "failed", "stopped"]
    steps_done: int
    step_ms_median: float | None
    step_ms_p10: float | None
    step_ms_p90: float | None
    samples_per_s: float | None
    tokens_per_s: float | None
    tflops: float | None
    mfu: float | None
    mem_peak: int | None
    loss_first: float | None
    loss_final: float | None
    skipped_steps: int
    compile_s: float | None
    wall_s: float
    error: str | None = None


def empty_done(status: str, error: str | None = None, wall_s: float = 0.0) -> DoneEvent:
    """A ``done`` for a run that ended before any step (stopped during setup, never started)."""
    return DoneEvent(
        status=status,  # type: ignore[arg-type]
        steps_done=0,
        step_ms_median=None,
        step_ms_p10=None,
        step_ms_p90=None,
        samples_per_s=None,
        tokens_per_s=None,
        tflops=None,
        mfu=None,
        mem_peak=None,
        loss_first=None,
        loss_final=None,
        skipped_steps=0,
        compile_s=None,
        wall_s=wall_s,
        error=error,
    )


AnyEvent = Union[  # noqa: UP007 - msgspec needs a real Union object here
    HelloEvent,
    PhaseEvent,
    StepEvent,
    CompileEvent,
    WarningEvent,
    ErrorEvent,
    SysEvent,
    DoneEvent,
]

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AnyEvent)


def encode(event: Event) -> bytes:
    """One event as a JSON line, newline included."""
    return _encoder.encode(event) + b"\n"


class UnknownEvent(msgspec.Struct):
    """A line this version cannot read: a newer schema or an unknown type. Shown, not fatal."""

    line: str
    reason: str


def decode(line: bytes | str) -> Event | UnknownEvent:
    """Parse one line. Never raises: a line that does not parse comes back as UnknownEvent."""
    try:
        return _decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        text = line.decode(errors="replace") if isinstance(line, bytes) else line
        return UnknownEvent(line=text.rstrip("\n"), reason=str(exc))


def to_dict(event: Event) -> dict[str, Any]:
    return msgspec.to_builtins(event)
