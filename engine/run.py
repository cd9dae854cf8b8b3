"""One run from preset to record: validation, setup, the loop, and every way it can end.

Exit codes: 0 finished, 1 the run failed (NaN, OOM, exception), 2 a user error in the preset
or for this device, 130 stopped by a signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from ampscope.core import config as cfg
from ampscope.core import events as ev
from ampscope.core import records

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STOPPED = 0, 1, 2, 130
PARENT_GRACE_S = 5.0
HEARTBEAT_S = 1.0

OOM_HINT = (
    "Lower batch_size or the workload size, use amp-bf16 or bf16 (smaller activations and "
    "weights), or recompute activations (activation checkpointing)."
)


def run(
    preset_name: str,
    overrides: Sequence[str] = (),
    *,
    json_out: bool = False,
    runs_dir: Path | None = None,
    record: bool = True,
    on_event: Callable[[ev.Event], None] | None = None,
    exit_with_parent: bool = False,
    run_dir: Path | None = None,
) -> int:
    try:
        preset = cfg.load_preset(preset_name, overrides)
    except cfg.ConfigError as exc:
        return _refuse(str(exc), json_out, on_event)

    if not record:
        run_dir = None
    elif run_dir is not None:  # made by the launcher of a detached run
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        run_dir = records.new_run_dir(runs_dir or records.default_runs_dir(), preset.name)
    heartbeat = _start_heartbeat(run_dir) if run_dir else None
    streams: list[BinaryIO] = [sys.stdout.buffer] if json_out else []
    record_file = (run_dir / records.EVENTS_FILE).open("ab") if run_dir else None
    if record_file:
        streams.append(record_file)
        records.write_json(run_dir / records.CONFIG_FILE, cfg.to_dict(preset))

    from ampscope.engine.emitter import EventWriter  # torch-free, but only needed from here on

    writer = EventWriter(streams, on_event)
    stop = threading.Event()
    _install_signal_handlers(stop)
    if exit_with_parent:
        _watch_parent(stop, writer)
    hello: ev.HelloEvent | None = None
    writer.emit(ev.PhaseEvent(phase="setup", state="start"), urgent=True)  # before torch's import
    try:
        code, hello = _train(preset, run_dir, writer, stop)
    except KeyboardInterrupt:  # stopped while torch was still importing
        writer.emit(ev.empty_done("stopped"), urgent=True)
        code = EXIT_STOPPED
    finally:
        writer.close()
        if record_file:
            record_file.close()
        if run_dir and hello is not None:
            _write_summary(run_dir, hello)
        if heartbeat is not None:
            heartbeat()
    return code


def _train(
    preset: cfg.Preset, run_dir: Path | None, writer, stop: threading.Event
) -> tuple[int, ev.HelloEvent | None]:
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch

    from ampscope.core.peaks import peak_tflops
    from ampscope.engine.device import resolve_device
    from ampscope.engine.precision import check_device_support, precision_policy
    from ampscope.engine.telemetry import TelemetrySampler, start_for_run
    from ampscope.engine.train import NonFiniteLoss, RunStats, build, train

    stats = RunStats(warmup_steps=preset.warmup_steps)
    hello: ev.HelloEvent | None = None
    peak: float | None = None
    samples, tokens, flops = 0, None, 0.0
    sampler: TelemetrySampler | None = None

    def finish(
        status: str, code: int, error: str | None = None
    ) -> tuple[int, ev.HelloEvent | None]:
        if sampler is not None:
            sampler.stop()
        writer.emit(stats.done(status, samples, tokens, flops, peak, error), urgent=True)
        return code, hello

    step = None
    try:
        info = resolve_device(preset.device)
        policy = precision_policy(preset)
        device_warnings = check_device_support(policy, info)
        setup = build(preset, info)
        if preset.peak_tflops is not None:
            peak, note = preset.peak_tflops, "peak_tflops set in the preset"
        elif info.is_cuda:
            peak, note = peak_tflops(info.name, policy.compute_dtype, info.power_limit_w)
        else:
            note = "no peak TFLOP/s for CPUs; set peak_tflops in the preset to get MFU"
        wl = setup.workload
        samples, tokens, flops = wl.samples_per_step, wl.tokens_per_step, wl.flops_per_step
        resolved = cfg.to_dict(preset)
        resolved["batch_size"] = setup.batch_size
        resolved["workload"].update(setup.dims)
        hello = ev.HelloEvent(
            run_id=run_dir.name if run_dir else f"{preset.name}-{os.getpid()}",
            run_dir=str(run_dir.resolve()) if run_dir else None,
            preset=preset.name,
            config=resolved,
            pid=os.getpid(),
            host=socket.gethostname(),
            started_at=time.time(),
            python_version=sys.version.split()[0],
            torch_version=str(torch.__version__),
            cuda_version=torch.version.cuda,
            device=str(info.device),
            device_name=info.name,
            compute_capability=list(info.capability) if info.capability else None,
            compute_dtype=policy.compute_dtype,
            peak_tflops=peak,
            peak_tflops_note=note,
            param_count=sum(p.numel() for p in setup.model.parameters()),
            flops_per_step=flops,
            samples_per_step=samples,
            tokens_per_step=tokens,
            fp8=setup.fp8,
        )
        writer.emit(hello, urgent=True)
        sampler = start_for_run(writer, info, hz=preset.telemetry_hz)
        for code, message in device_warnings:
            writer.emit(ev.WarningEvent(code=code, message=message), urgent=True)
        if preset.compile == "reduce-overhead" and not info.is_cuda:
            writer.emit(
                ev.WarningEvent(
                    code="cudagraphs-cpu",
                    message=(
                        "compile = 'reduce-overhead' relies on CUDA graphs; on the CPU it compiles like "
                        "'default'."
                    ),
                ),
                urgent=True,
            )
        writer.emit(ev.PhaseEvent(phase="setup", state="end"), urgent=True)
        _in_loop.set()
        status = train(setup, writer, stats, peak, stop)
        if status == "stopped":
            return finish("stopped", EXIT_STOPPED)
        return finish("ok", EXIT_OK)
    except cfg.ConfigError as exc:
        writer.emit(ev.ErrorEvent(kind="config", message=str(exc)), urgent=True)
        _print_error(str(exc), writer)
        return finish("failed", EXIT_USAGE, str(exc))
    except NonFiniteLoss as exc:
        message = (
            f"Loss became {exc.loss} at step {exc.step}: the numbers left the format's range. "
            + (
                "Pure fp16 has no master weights or loss scaling; use amp-fp16 or amp-bf16."
                if preset.precision == "fp16"
                else "Lower the learning rate or use a wider format."
            )
        )
        writer.emit(ev.ErrorEvent(kind="nan", message=message, step=exc.step), urgent=True)
        return finish("failed", EXIT_FAILED, message)
    except torch.OutOfMemoryError as exc:
        device = torch.device(preset.device if preset.device != "auto" else "cuda")
        allocated = torch.cuda.memory_allocated(device) if torch.cuda.is_available() else None
        reserved = torch.cuda.memory_reserved(device) if torch.cuda.is_available() else None
        message = f"Out of memory at step {stats.steps_done}: {str(exc).splitlines()[0]}"
        writer.emit(
            ev.ErrorEvent(
                kind="oom",
                message=message,
                step=stats.steps_done,
                hint=OOM_HINT,
                mem_allocated=allocated,
                mem_reserved=reserved,
            ),
            urgent=True,
        )
        return finish("failed", EXIT_FAILED, message)
    except KeyboardInterrupt:
        return finish("stopped", EXIT_STOPPED)
    except Exception as exc:  # noqa: BLE001 - every fault must reach the watcher as an event
        message = f"{type(exc).__name__}: {exc}"
        writer.emit(
            ev.ErrorEvent(
                kind="exception",
                message=message,
                step=stats.steps_done or step,
                traceback=traceback.format_exc(),
            ),
            urgent=True,
        )
        return finish("failed", EXIT_FAILED, message)


def _refuse(message: str, json_out: bool, on_event: Callable[[ev.Event], None] | None) -> int:
    """A user error before anything ran: one message, exit 2, and an error event for watchers."""
    event = ev.ErrorEvent(kind="config", message=message)
    if json_out:
        sys.stdout.buffer.write(ev.encode(event))
        sys.stdout.flush()
    if on_event:
        on_event(event)
    else:
        print(f"ampscope: {message}", file=sys.stderr)
    return EXIT_USAGE


def _print_error(message: str, writer) -> None:
    if writer.on_event is None:
        print(f"ampscope: {message}", file=sys.stderr)


def _write_summary(run_dir: Path, hello: ev.HelloEvent) -> None:
    recs, _ = records.read_events(run_dir / records.EVENTS_FILE)
    done = next((e for e in reversed(recs) if isinstance(e, ev.DoneEvent)), None)
    records.write_json(
        run_dir / records.SUMMARY_FILE,
        {"hello": ev.to_dict(hello), "done": ev.to_dict(done) if done else None},
    )


def _start_heartbeat(run_dir: Path) -> Callable[[], None]:
    """Write ``live.json`` now and refresh it every HEARTBEAT_S; the returned call removes it."""
    started = time.time()
    records.write_live(run_dir, os.getpid(), started)
    ended = threading.Event()

    def beat() -> None:
        while not ended.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                records.write_live(run_dir, os.getpid(), started)

    thread = threading.Thread(target=beat, name="ampscope-heartbeat", daemon=True)
    thread.start()

    def end() -> None:
        ended.set()
        thread.join(2.0)
        records.clear_live(run_dir)

    return end


_in_loop = threading.Event()  # set once setup is over and steps run


def _install_signal_handlers(stop: threading.Event) -> None:
    """SIGTERM/SIGINT in the loop: finish the current step and write ``done``.

    During setup (importing torch, building the model), or on a second signal, interrupt at
    once: setup can take seconds and a stop must not wait for it.
    """

    def handler(signum: int, frame: object) -> None:
        first = not stop.is_set()
        stop.set()
        if not first or not _in_loop.is_set():
            raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)


def _watch_parent(stop: threading.Event, writer) -> None:
    """Stop when the process that started us is gone (its pipe broke or it was killed)."""
    parent = os.getppid()
    _set_parent_death_signal()

    def watch() -> None:
        while not stop.wait(0.5):
            if os.getppid() != parent or writer.broken:
                stop.set()
        deadline = time.monotonic() + PARENT_GRACE_S
        while time.monotonic() < deadline:
            time.sleep(0.2)
        if os.getppid() != parent or writer.broken:
            writer.flush()  # the loop did not come back (a long compile): leave anyway
            os._exit(EXIT_STOPPED)

    threading.Thread(target=watch, name="ampscope-parent-watch", daemon=True).start()


def _set_parent_death_signal() -> None:
    """Linux: the kernel sends SIGTERM when the parent dies, even if it was SIGKILLed."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
