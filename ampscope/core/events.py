"""The event stream between the engine and everything that watches it.

One JSON object per line. Every event carries ``v`` (the schema version) and ``type``;
``t`` is seconds since the run started. The same lines go to the engine's stdout (with
``--json``) and to ``events.jsonl`` in the run record. See docs/events.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Union

import msgspec

from ampscope.core.numerics.event import FirstNonfinite, ModuleNumerics
from ampscope.core.text import surrogate_text

SCHEMA_VERSION = 1


class Event(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=False):
    v: int = SCHEMA_VERSION
    t: float = 0.0


class Fp8Layers(msgspec.Struct, kw_only=True):
    """Which linear layers an fp8 run trains in fp8, and why the others stay in bf16."""

    recipe: str  # torchao's recipe: tensorwise | rowwise | rowwise_with_gw_hp
    emulate: bool  # fp8 rounding with fp32 matmuls (no fp8 Tensor Cores used)
    converted: list[str]  # layer names, as in model.named_modules()
    skipped: dict[str, str]  # layer name -> why it stays in bf16
    recipes: dict[str, str] = {}  # converted layer -> its recipe, where it is not ``recipe``


class RankDevice(msgspec.Struct, kw_only=True):
    """Where one rank of a run on several processes runs."""

    rank: int
    host: str
    device: str
    device_name: str
    pid: int


class HelloEvent(Event, tag="hello"):
    """First line of every run: what runs, where, and the numbers MFU is computed from.

    ``param_count``, ``flops_per_step``, ``samples_per_step`` and ``tokens_per_step`` are one
    rank's; a step of the whole job does ``world_size`` times as much.
    """

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
    flops_per_step: float  # the figure TFLOP/s and MFU use: see flops_source
    samples_per_step: int
    tokens_per_step: int | None
    flops_source: FlopsSource | None = None  # None: a record from before
    flops_analytic: float | None = None  # the workload's formula
    flops_counted: float | None = None  # FlopCounterMode, one forward and backward
    flops_counted_partial: bool = False  # kernels without a FLOP formula ran: a lower bound
    flops_note: str | None = None  # for people: which figure MFU uses, where it was counted
    fp8: Fp8Layers | None = None  # precision = "fp8" runs only
    # Process RSS read before the model was built (null: not read). RSS growth from it is
    # what `ampscope memory --run` compares with the planner on a CPU.
    rss_before_model: int | None = None
    # What trains: the built-in kind, or the name of a user's model (``workload.model``).
    workload: str | None = None
    world_size: int = 1
    backend: str | None = None  # "nccl" or "gloo"; null on one process
    strategy: str | None = None  # "ddp" or "fsdp2"; null on one process
    ranks: list[RankDevice] | None = None
    # this machine's measured matmul TFLOP/s for the compute format (ampscope doctor --bench)
    measured_tflops: float | None = None
    measured_tflops_note: str | None = None
    # Who trains: ampscope's engine, or a user's own loop seen through ``ampscope.watch``.
    source: Literal["engine", "watch"] = "engine"
    # Whether a viewer may stop the run; a watched process allows it only when asked to.
    allow_stop: bool = True

    def folder(self) -> Path | None:
        """The run's folder, where ``run_dir`` names one; see :func:`named_path`."""
        return named_path(self.run_dir) if self.run_dir else None


Phase = Literal["setup", "compile", "train"]
DoneStatus = Literal["ok", "failed", "stopped"]
FlopsSource = Literal["analytic", "counted"]


class PhaseEvent(Event, tag="phase"):
    """A stretch of the run a UI should name: setup, compile, train."""

    phase: Phase
    state: Literal["start", "end"]
    seconds: float | None = None
    step: int | None = None


def compile_ended(seconds: float) -> tuple[PhaseEvent, PhaseEvent]:
    """A compiled model's first step is its compile: its end after step 0, then training from
    step 1. Engine runs and watched loops say it alike."""
    return (
        PhaseEvent(phase="compile", state="end", seconds=seconds, step=0),
        PhaseEvent(phase="train", state="start", step=1),
    )


class RankStep(msgspec.Struct, kw_only=True):
    """One rank's share of a step."""

    rank: int
    step_ms: float
    loss: float | None
    skipped: bool
    mem_allocated: int | None
    mem_reserved: int | None
    mem_peak: int | None


class StepEvent(Event, tag="step"):
    """One optimizer step. ``loss`` and ``grad_norm`` are null when not finite (inf or NaN).

    On several processes the step is the job's: ``step_ms`` is the slowest rank's, the rates
    are for the global batch, ``loss`` is the mean over ranks, memory the largest rank's, and
    ``ranks`` holds each rank's own figures.
    """

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
    lr: float | None  # null when the optimizer's is no finite number (a user's lr = nan)
    # Milliseconds the host waited for this step's batch (no GPU sync): part of step_ms.
    data_ms: float | None = None
    ranks: list[RankStep] | None = None
    profiled: bool = False  # ran under torch.profiler (slower): left out of step-time figures
    # CPU devices: the process's CPU time over the same span as step_ms (all its threads);
    # unmoved by other tenants' load, unlike the wall clock. Null on CUDA and in older records.
    cpu_ms: float | None = None


def peak_memory(step: StepEvent) -> int | None:
    """What every screen, record and table calls a step's peak memory: the bytes torch's CUDA
    allocator had given to tensors at most (``max_memory_allocated``; reserved memory is the
    allocator's cache, not the model's need), or on the CPU the process RSS."""
    return step.mem_peak if step.mem_peak is not None else step.mem_allocated


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


EPOCH_NOTE, RANK_STALLED, NUMERICS_OFF = "epoch", "rank-stalled", "numerics-off"
GRAD_ZEROS_OFF = "grad-zeros-off"
"""Warning codes: notes (a compiled run measures no per-layer numerics; no gradient reaches
the model's output to count its zeros; records from before ``note`` events said a user's
batches began a new epoch this way), and a rank that holds up. NOTE_CODES are said as notes,
not warnings."""
NOTE_CODES = frozenset({EPOCH_NOTE, NUMERICS_OFF, GRAD_ZEROS_OFF})


class NoteEvent(Event, tag="note"):
    """Not trouble: what a reader may want to know, said once in words and then counted. The
    code ``epoch``: a user's batches ran out and began pass ``count`` at ``step``; the first
    restart's message says so, later ones only move the count."""

    code: str
    message: str
    step: int | None = None
    count: int | None = None


class WarningEvent(Event, tag="warning"):
    code: str
    message: str
    step: int | None = None


class ErrorEvent(Event, tag="error"):
    """A fault that ends the run. ``rank`` names the rank it struck on several processes.

    ``io``: the run record could not be written (a full disk, a removed folder).
    """

    kind: Literal["config", "oom", "nan", "exception", "diverged", "io"]
    message: str
    step: int | None = None
    traceback: str | None = None
    hint: str | None = None
    mem_allocated: int | None = None
    mem_reserved: int | None = None
    rank: int | None = None


class NumericsEvent(Event, tag="numerics"):
    """One sampled step's per-layer numerics (see ampscope.core.numerics and docs/events.md)."""

    step: int
    loss_scale: float | None  # the GradScaler's scale the gradients carry; null without one
    modules: list[ModuleNumerics]
    modules_total: int  # leaf modules in the model; more than len(modules) beyond the cap
    modules_idle: dict[str, str] = msgspec.field(default_factory=dict)  # hooked, never ran: why
    first_nonfinite: FirstNonfinite | None = None  # this step's first inf/NaN tensor
    replayed: bool = False  # measured by running a skipped or non-finite step again


class RankSys(msgspec.Struct, kw_only=True):
    """One rank's device and process, as last sampled."""

    rank: int
    gpu_util: float | None = None
    gpu_mem_used: int | None = None
    gpu_mem_total: int | None = None
    power_w: float | None = None
    proc_cpu: float | None = None
    proc_rss: int | None = None


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
    ranks: list[RankSys] | None = None


SYS_GPU_FIELDS = (
    "gpu_util",
    "gpu_mem_util",
    "gpu_mem_used",
    "gpu_mem_total",
    "proc_gpu_mem",
    "power_w",
    "power_limit_w",
    "temp_c",
    "sm_clock_mhz",
    "throttle",
)
"""The SysEvent fields NVML fills (all null without a GPU); the rest come from the host."""
SYS_HOST_FIELDS = ("cpu_util", "proc_cpu", "proc_rss", "sys_mem_used", "sys_mem_total")


class RankDone(msgspec.Struct, kw_only=True):
    """One rank at the end: its typical step, memory peak, skips, and a checksum of its weights."""

    rank: int
    step_ms_median: float | None
    mem_peak: int | None
    skipped_steps: int
    param_checksum: str | None = None


class DoneEvent(Event, tag="done"):
    """Last line of every run. Timing figures exclude warm-up and compile steps."""

    status: DoneStatus
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
    loss_final: float | None  # the last step's loss; null when it was not finite (see below)
    skipped_steps: int
    compile_s: float | None
    wall_s: float
    error: str | None = None
    loss_final_step: int | None = None  # the step loss_final (or loss_nonfinite) is from
    loss_nonfinite: Literal["nan", "inf", "-inf"] | None = None  # the last loss, when not finite
    world_size: int = 1
    ranks: list[RankDone] | None = None
    mem_peak_compile: int | None = None  # CUDA, compiled runs: the compile step's own peak
    mfu_measured: float | None = None  # against world_size x hello.measured_tflops
    cpu_ms_median: float | None = None  # CPU devices: the timed steps' median cpu_ms
    step_ms_mean: float | None = None  # the timed steps' summed time over their count


class ProfileOp(msgspec.Struct, kw_only=True):
    """One op (CPU) or kernel (GPU) of a profile, by its self time."""

    name: str
    kind: str = msgspec.field(name="class")  # the class of the split it counts in
    share: float  # of the measured step time
    calls: int  # over the profiled steps
    dtype: str | None = None  # matmul and conv: the format they ran in, when known


class ProfileEvent(Event, tag="profile"):
    """Where the step goes, over ``steps`` steps from ``step`` on, asked for while the run runs
    (the Run view's key) or by ``ampscope profile``. ``classes`` are shares of the measured
    step time (summing to 1); ``timing`` says whose time: kernels on the GPU, or CPU ops."""

    step: int
    steps: int
    step_ms: float
    timing: Literal["device", "cpu"]
    classes: dict[str, float]
    dtypes: dict[str, dict[str, float]] = {}  # matmul, conv: share by number format
    casts: float = 0.0  # the part of elementwise that converts number formats
    top_ops: list[ProfileOp] = []
    trace: str | None = None  # the Chrome trace in the run folder (Perfetto opens it)
    trace_bytes: int | None = None
    note: str | None = None


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
    HelloEvent, PhaseEvent, StepEvent, CompileEvent, WarningEvent, ErrorEvent, SysEvent,
    DoneEvent, NumericsEvent, ProfileEvent, NoteEvent,
]  # fmt: skip

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AnyEvent)


def encode(event: Event) -> bytes:
    """One event as a JSON line, newline included. A string that is no Unicode text (a path
    of bytes that are not UTF-8, which Python holds as lone surrogates) is written with those
    bytes escaped (``\\xff``): JSON has no form for them, and the line is still written."""
    try:
        return _encoder.encode(event) + b"\n"
    except UnicodeEncodeError:
        return _encoder.encode(text_only(msgspec.to_builtins(event))) + b"\n"


def text_only(value: Any) -> Any:
    """``value`` with every string made encodable as UTF-8 (JSON, TOML): the bytes a file name
    held that are not UTF-8 escaped as ``\\xff``."""
    if isinstance(value, str):
        return "".join(surrogate_text(c) if "\ud800" <= c <= "\udfff" else c for c in value)
    if isinstance(value, dict):
        return {text_only(k): text_only(v) for k, v in value.items()}
    if isinstance(value, list):
        return [text_only(v) for v in value]
    return value


_ESCAPED_BYTE = re.compile(r"\\x([89a-f][0-9a-f])")


def named_path(text: str) -> Path:
    """The path an event's string names. A path with bytes that are not UTF-8 (a Latin-1
    folder name) is written with them escaped (``\\xe9``, see :func:`encode`), and no folder
    has that name: where the path as written is not there, the one with those bytes is."""
    path = Path(text)
    if "\\x" not in text or path.exists():
        return path
    raw = Path(_ESCAPED_BYTE.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)), text))
    return raw if raw.exists() else path


class UnknownEvent(msgspec.Struct):
    """A line this version cannot read: a newer schema or an unknown type. Shown, not fatal."""

    line: str
    reason: str
    v: int | None = None
    """The schema version the line names, when it is a JSON object that names one."""


class _Versioned(msgspec.Struct):
    v: int | None = None


_version_decoder = msgspec.json.Decoder(_Versioned)


def decode(line: bytes | str) -> Event | UnknownEvent:
    """Parse one line. Never raises: a line that does not parse comes back as UnknownEvent."""
    try:
        return _decoder.decode(line)
    except (msgspec.MsgspecError, ValueError, RecursionError) as exc:
        text = line.decode(errors="replace") if isinstance(line, bytes) else line
        try:
            version = _version_decoder.decode(line).v
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            version = None
        return UnknownEvent(line=text.rstrip("\n"), reason=str(exc), v=version)


def newer_schema_warning(item: Event | UnknownEvent) -> str | None:
    """What to tell a reader when ``item`` comes from a newer schema than this one reads
    (docs/events.md: a newer stream is read for what this version knows, and said so)."""
    if item.v is None or item.v <= SCHEMA_VERSION:
        return None
    return (
        f"these events are schema version {item.v}; this ampscope reads version "
        f"{SCHEMA_VERSION}, so it shows what it knows and skips the rest (upgrade ampscope "
        "to see everything)"
    )


def to_dict(event: Event) -> dict[str, Any]:
    return msgspec.to_builtins(event)
