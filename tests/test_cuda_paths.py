"""The CUDA paths before they meet a GPU: TF32 flags, the device, peaks, OOM, NVML, fp8.

No GPU here: torch.cuda and pynvml are faked where a path needs them.
"""

from __future__ import annotations

import io
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ampscope.cli.console import ConsoleReporter
from ampscope.core import events as ev
from ampscope.core.machine.hardware import peak_tflops
from ampscope.core.presets import load_preset
from ampscope.core.records.tally import StepTally
from ampscope.engine import device
from ampscope.engine.lifecycle import loop
from ampscope.engine.lifecycle.faults import failure
from ampscope.engine.lifecycle.hello import choose_peak
from ampscope.engine.lifecycle.parts import Parts
from ampscope.engine.lifecycle.run import EXIT_FAILED, EXIT_OK, run
from ampscope.engine.machine import doctor
from ampscope.engine.step.metrics import MemoryReader, StepReporter
from ampscope.engine.step.precision import set_matmul_precision, tf32_disagreements, tf32_getters
from ampscope.tui.model.run_state import RunState
from tests.fakes import FakeCuda
from tests.helpers import FAST


def run_fast(name: str, *overrides: str, parts: Parts | None = None) -> tuple[int, list[ev.Event]]:
    seen: list[ev.Event] = []
    code = run(name, [*FAST, *overrides], record=False, on_event=seen.append, parts=parts)
    return code, seen


# --------------------------------------------------------------------------- TF32 getters


@pytest.mark.slow
def test_after_each_preset_every_tf32_getter_answers_and_agrees() -> None:
    """inductor reads the legacy getters; set through the new API alone, they raise."""
    torch.backends.cuda.matmul.fp32_precision = "tf32"  # a state the new API alone leaves
    for preset, tf32 in [("tf32", True), ("fp32", False), ("tf32", True), ("amp-bf16", False)]:
        code, _ = run_fast(preset, "steps=1")
        assert code == EXIT_OK
        assert tf32_disagreements(tf32) == [], (preset, tf32_getters())
    assert torch.get_float32_matmul_precision() == "highest"
    assert torch.backends.cudnn.allow_tf32 is False


@pytest.mark.unit
def test_tf32_getters_agree_whatever_the_previous_state() -> None:
    for first in ("tf32", "ieee"):
        torch.backends.cudnn.conv.fp32_precision = first
        torch.backends.cuda.matmul.fp32_precision = first
        for tf32 in (True, False):
            set_matmul_precision(tf32)
            assert tf32_disagreements(tf32) == [], tf32_getters()
    set_matmul_precision(False)


@pytest.mark.slow  # inductor lowers a convolution: seconds of compiler work
def test_tf32_reaches_inductors_convolution_templates() -> None:
    """inductor's Triton convolution templates take ``ALLOW_TF32`` from cuDNN's own
    ``fp32_precision`` (torch/_inductor/kernel/conv.py); on an H200 the tf32 preset's compiled
    convolutions autotuned with ``ALLOW_TF32=False`` while only conv's flag was set."""
    import inspect

    from torch._inductor.kernel import conv

    assert "torch.backends.cudnn.fp32_precision" in inspect.getsource(conv)
    for tf32 in (True, False, True):
        set_matmul_precision(tf32)
        assert torch.backends.cudnn.fp32_precision == ("tf32" if tf32 else "ieee")  # type: ignore[attr-defined]
    set_matmul_precision(False)


# --------------------------------------------------------------------------- cuda:N


def resolve(spec: str, cuda: FakeCuda) -> device.DeviceInfo:
    """``spec`` resolved on the fake GPUs, whose board NVML would say draws 700 W."""
    return device.resolve_device(spec, cuda=cuda, power_limit_w=lambda uuid: 700.0)


@pytest.mark.unit
def test_cuda_n_becomes_the_current_device(fake_cuda: FakeCuda) -> None:
    """Events, synchronize() and the current stream follow the current device, not the spec."""
    info = resolve("cuda:1", fake_cuda)
    assert info.device == torch.device("cuda", 1) and fake_cuda.chosen == [1]
    assert info.multiprocessors == 132


# --------------------------------------------------------------------------- MIG peaks


def peak_of(info: device.DeviceInfo, compute: str = "bf16") -> tuple[float | None, str]:
    s = SimpleNamespace(
        preset=SimpleNamespace(peak_tflops=None),
        info=info,
        policy=SimpleNamespace(compute_dtype=compute),
    )
    return choose_peak(s)  # type: ignore[arg-type]


@pytest.mark.unit
def test_a_mig_slice_gets_its_share_of_the_full_gpus_peak(fake_cuda: FakeCuda) -> None:
    fake_cuda.name, fake_cuda.sms = "NVIDIA H200 MIG 3g.71gb", 60
    peak, note = peak_of(resolve("cuda:0", fake_cuda))
    assert peak == pytest.approx(989.4 * 60 / 132)
    assert "60 of 132 multiprocessors" in note and "whole GPU's" in note


@pytest.mark.unit
def test_a_full_gpu_keeps_the_datasheet_peak_and_an_unknown_slice_gets_none(
    fake_cuda: FakeCuda,
) -> None:
    fake_cuda.name, fake_cuda.sms = "NVIDIA H200", 132
    assert peak_of(resolve("cuda:0", fake_cuda))[0] == pytest.approx(989.4)
    peak, note = peak_tflops("NVIDIA L4 MIG 1g.5gb", "bf16", None, 10)
    assert peak is None and "set peak_tflops" in note


# --------------------------------------------------------------------------- peak memory


@pytest.mark.unit
def test_the_peak_is_restarted_after_setup_and_after_the_compile_step() -> None:
    """mem_peak is training's; the compile step's peak (autotuning included) is its own field."""
    calls: list[int | None] = []
    compile_peak = 7 << 30

    class Reader(MemoryReader):
        def reset_peak(self) -> int | None:
            calls.append(stats_step())
            return None if len(calls) == 1 else compile_peak

    stats_seen: list = []
    real_train = loop.train

    def train(s, writer, stats, *rest, **kw):
        stats_seen.append(stats)
        return real_train(s, writer, stats, *rest, **kw)

    def stats_step() -> int | None:
        return stats_seen[0].step_running if stats_seen else None

    parts = Parts(
        memory=Reader,
        compile_model=lambda model, preset: model,  # no cost
        train=train,
    )
    code, seen = run_fast("amp-bf16", "steps=3", "compile='default'", parts=parts)
    assert code == EXIT_OK
    assert calls == [None, 0]  # before the first step, and right after the compile step
    done = [e for e in seen if isinstance(e, ev.DoneEvent)][0]
    assert done.mem_peak_compile == compile_peak
    assert ev.decode(ev.encode(done)) == done
    # shown apart from the training peak: ampscope run's summary, the Run view's event log
    out, result = io.StringIO(), io.StringIO()
    console = ConsoleReporter(out=out, result=result)
    for event in seen:
        console(event)
    assert re.search(r"^  compile peak +7 GiB \(the compile step's own\)$", result.getvalue(), re.M)
    state = RunState()
    state.ingest_many(seen)
    assert state.log[-1].text.endswith(", compile peak 7 GiB")


@pytest.mark.unit
def test_reset_peak_reads_then_restarts_the_cuda_allocators_peak(fake_cuda: FakeCuda) -> None:
    fake_cuda.peak, fake_cuda.held = 9 << 30, 2 << 30
    reader = MemoryReader(torch.device("cuda", 0), cuda=fake_cuda)
    assert reader.reset_peak() == 9 << 30 and fake_cuda.peak == 2 << 30
    assert MemoryReader(torch.device("cpu")).reset_peak() is None


# --------------------------------------------------------------------------- OOM in compile


def compile_oom() -> Exception:
    """An OOM of inductor's autotuning, as torch.compile raises it: wrapped."""
    from torch._dynamo.exc import BackendCompilerFailed

    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    try:
        try:
            raise oom
        except torch.OutOfMemoryError as exc:
            raise BackendCompilerFailed(lambda: None, exc, None) from exc
    except BackendCompilerFailed as wrapped:
        return wrapped


@pytest.mark.unit
def test_an_oom_wrapped_by_the_compiler_is_an_oom_at_the_step_that_ran_out() -> None:
    preset = load_preset("amp-bf16")
    stats = StepTally(warmup_steps=0, compiled=True)
    stats.steps_done, stats.step_running = 4, 5  # on CUDA metrics land a step late
    event, code = failure(compile_oom(), preset, None, stats)
    assert event.kind == "oom" and event.step == 5 and code == EXIT_FAILED
    assert (
        "Out of memory at step 5: CUDA out of memory. Tried to allocate 20.00 GiB" in event.message
    )


@pytest.mark.unit
def test_an_oom_inside_a_run_reports_oom_and_its_step() -> None:
    real_step = loop.train_step

    def train_step(s, step, measure_zeros, phase, numerics=None):
        if step == 2:
            raise compile_oom()
        return real_step(s, step, measure_zeros, phase, numerics)

    code, seen = run_fast("fp32", "steps=4", parts=Parts(train_step=train_step))
    [error] = [e for e in seen if isinstance(e, ev.ErrorEvent)]
    assert code == EXIT_FAILED and error.kind == "oom" and error.step == 2


# --------------------------------------------------------------------------- step time


@pytest.mark.unit
def test_host_work_between_steps_is_in_the_step_time() -> None:
    """step k runs from the end of step k-1 to its own end: 1000 / step_ms is the loop's rate."""

    class SlowReporter(StepReporter):
        def report(self, ranks):
            time.sleep(0.05)  # a slow reader of figures, between two steps
            return super().report(ranks)

    code, seen = run_fast("fp32", "steps=5", parts=Parts(reporter=SlowReporter))
    steps = [e for e in seen if isinstance(e, ev.StepEvent)]
    assert code == EXIT_OK and len(steps) == 5
    assert all(e.step_ms >= 50.0 for e in steps[1:]), [e.step_ms for e in steps]


# --------------------------------------------------------------------------- doctor

EVERY_TOOL = doctor.Toolchain(
    "/usr/bin/cc", Path("/usr/include/python3"), headers=True, triton=True
)
"""A machine with everything inductor needs to build kernels."""


@pytest.mark.unit
def test_doctor_says_yes_to_compile_only_after_trying(capsys) -> None:
    def compiles(device: str) -> None:
        return None

    report = doctor.compile_report(cuda=True, try_compile=False, attempt=compiles)
    if report["cpu"]["ok"] is False:
        pytest.skip(f"this machine cannot compile: {report['cpu']['why']}")
    triton = report["cuda"]["why"] != "Triton is not installed (comes with CUDA torch)"
    assert (
        report["cpu"]["ok"] is None
        and "not tried (ampscope doctor --try-compile cpu)" in (report["cpu"]["why"])
    )
    assert report["cuda"]["ok"] is (None if triton else False)
    tried = doctor.compile_report(cuda=False, try_compile=True, attempt=compiles)
    assert tried["cpu"]["ok"] is True and tried["cuda"]["ok"] is False
    from ampscope.cli.doctor import doctor as print_doctor

    assert print_doctor(try_compile=False) == 0
    assert "torch.compile on cpu: untried" in capsys.readouterr().out


@pytest.mark.unit
def test_doctor_try_compile_cuda_tries_the_gpu_alone() -> None:
    """On an H200 box ``doctor --try-compile`` (the CPU's first C++ build, then the GPU's)
    ran past the GPU check's 75 s; ``--try-compile cuda`` compiles on the GPU alone."""
    from ampscope.cli.main import build_parser

    tried: list[str] = []
    parse = build_parser().parse_args
    assert parse(["doctor", "--try-compile", "cuda"]).try_compile == "cuda"
    assert parse(["doctor", "--try-compile"]).try_compile is True
    assert parse(["doctor"]).try_compile is False
    report = doctor.compile_report(
        cuda=True, try_compile="cuda", toolchain=EVERY_TOOL, attempt=tried.append
    )
    assert tried == ["cuda"] and report["cuda"]["ok"] is True
    assert report["cpu"]["ok"] is None and "--try-compile cpu)" in report["cpu"]["why"]


@pytest.mark.unit
def test_doctor_names_a_missing_c_compiler_and_python_h() -> None:
    bare = doctor.Toolchain(None, Path("/nowhere/include"), headers=False, triton=False)
    report = doctor.compile_report(cuda=False, try_compile=True, toolchain=bare)
    assert report["cpu"]["ok"] is False
    assert "no C compiler (install gcc)" in report["cpu"]["why"]
    assert "no Python.h in /nowhere/include (install python3-dev)" in report["cpu"]["why"]


@pytest.mark.unit
def test_doctor_try_compile_reports_the_failure() -> None:
    def broken(fn):
        raise RuntimeError("Triton needs a C compiler\nmore lines")

    assert doctor.try_compiling("cpu", compile=broken) == "RuntimeError: Triton needs a C compiler"
    report = doctor.compile_report(
        cuda=False,
        try_compile=True,
        toolchain=EVERY_TOOL,
        attempt=lambda device: "RuntimeError: no",
    )
    assert report["cpu"] == {
        "ok": False,
        "why": "a tiny function did not compile: RuntimeError: no",
    }
