"""``ampscope doctor --bench``: the sweep, the timing, the verdicts and the stored check.

The GPU paths run here against fakes: a timer that answers from a table of rates, an NVML
with a lowered power limit, thermal throttling and a narrow PCIe link, a CPU whose
/proc/cpuinfo flags lack the bf16 units.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from ampscope.core.machine import check as machine_check
from ampscope.engine.machine import bench
from tests.fakes import FakeThreads
from tests.helpers import cli, engine_env


@dataclass
class FakeCall:
    """A matmul that is never run: the fake timer reads what it would have been."""

    fmt: str
    shape: bench.Shape
    layout: str = "nn"

    def __call__(self) -> None:
        pass


def fake_make(
    fmt: str, shape: bench.Shape, layout: str, device: torch.device
) -> Callable[[], object]:
    return FakeCall(fmt, shape, layout)


@dataclass
class FakeTimer:
    """Seconds from TFLOP/s per format; the GPU sweep's largest shape runs at the full rate,
    others at ``small`` of it (small matmuls leave a GPU idle). Records every batch timed."""

    tflops: dict[str, float]
    small: float = 0.5
    batches: list[tuple[str, bench.Shape, int, int]] = field(default_factory=list)
    calls: list[tuple[str, bench.Shape, str, int]] = field(default_factory=list)
    warmups: list[tuple[str, bench.Shape, str, int]] = field(default_factory=list)

    def __call__(self, fn: Callable[[], object], repeats: int, warmup: int) -> list[float]:
        assert isinstance(fn, FakeCall), "only matmuls are timed through this fake"
        self.batches.append((fn.fmt, fn.shape, repeats, warmup))
        self.calls.append((fn.fmt, fn.shape, fn.layout, repeats))
        self.warmups.append((fn.fmt, fn.shape, fn.layout, warmup))
        rate = self.tflops[fn.fmt] * (
            1.0 if fn.shape == max(bench.GPU_SHAPES, key=bench.flops_of) else self.small
        )
        seconds = bench.flops_of(fn.shape) / (rate * 1e12)
        # one repeat in five is slow (another process): the fastest call is the figure
        return [seconds * (3.0 if i % 5 == 4 else 1.0) for i in range(repeats)]


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeNvml:
    """A GPU capped at 400 of its 700 W, throttled for heat, on a Gen3 x8 link."""

    limit_mw: int = 400_000
    rated_mw: int = 700_000
    reasons: int = 0x20 | 0x1  # sw_thermal, and gpu_idle (ignored)
    link: tuple[int, int, int, int] = (3, 8, 5, 16)
    NVMLError = NVMLError

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.124.06"

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        if uuid != "GPU-58fa5f56-0000":
            raise NVMLError(6)
        return "gpu0"

    def nvmlDeviceGetEnforcedPowerLimit(self, h: str) -> int:
        return self.limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: str) -> int:
        return self.rated_mw

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: str) -> int:
        return self.reasons

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: str) -> int:
        return self.link[0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: str) -> int:
        return self.link[1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: str) -> int:
        return self.link[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: str) -> int:
        return self.link[3]


H100_RATES = {"fp32": 50.0, "tf32": 380.0, "bf16": 790.0, "fp16": 780.0, "fp8": 1300.0}


def fake_gpu_seams(
    nvml: object,
    timer: FakeTimer,
    name: str = "NVIDIA H100 80GB HBM3",
    cc: tuple[int, int] = (9, 0),
    h2d: float = 11.0,
    sms: int | None = None,
) -> bench.Seams:
    return bench.Seams(
        timer=timer,
        nvml=nvml,
        make=fake_make,
        sync=lambda: None,
        gpu=lambda index: bench.GpuInfo(name, cc, "58fa5f56-0000", 1, sms),
        on_gpu=lambda index: contextlib.nullcontext(),
        copy=lambda device, nbytes: lambda t, b: 2800.0,
        h2d=lambda device, nbytes: lambda t, b: h2d,
    )


@pytest.mark.unit
def test_a_capped_hot_gpu_on_a_narrow_link_is_told_why_and_each_format_beside_its_datasheet() -> (
    None
):
    timer = FakeTimer(H100_RATES)
    lines: list[str] = []
    check = bench.run_check(
        on_figure=lambda what, line: lines.append(line), seams=fake_gpu_seams(FakeNvml(), timer)
    )
    assert check.kind == "cuda" and check.device == "NVIDIA H100 80GB HBM3"
    assert list(check.matmul) == ["fp32", "tf32", "bf16", "fp16", "fp8"]
    bf16 = check.matmul["bf16"]
    # the best shape of the sweep, at the rate the fake clock gave it, against the H100 SXM row
    assert bf16.shape == [8192, 8192, 16384]
    assert bf16.tflops == pytest.approx(790.0)
    assert bf16.datasheet_tflops == 989.4
    assert bf16.ratio == pytest.approx(790.0 / 989.4)
    assert check.matmul["fp8"].datasheet_tflops == 1979.0
    assert check.memory_datasheet_gbps == 3350.0
    said = "\n".join(check.verdicts)
    assert "power limit 400 W of 700 W" in said
    assert "SM clock throttled (thermal)" in said
    assert "PCIe Gen3 x8, where the GPU supports Gen5 x16" in said
    assert (
        "matmul at fp32 75 %, tf32 77 %, bf16 80 %, fp16 79 %, fp8 66 % of the datasheet: "
        "typical for this GPU"
    ) in check.verdicts
    # 11 GB/s over a Gen3 x8 link (7.9 GB/s) is fine: no host-to-device verdict
    assert "host-to-device" not in said
    assert check.driver == "570.124.06"
    # a line per round as it lands, then each figure with its datasheet share and its spread
    assert lines[0] == (
        "machine check on NVIDIA H100 80GB HBM3: 3 rounds, the best of each figure kept"
    )
    assert lines[1].startswith("round 1 of 3: fp32 50.0, tf32 380.0, bf16 790.0, fp16 780.0")
    assert lines[6] == (
        "bf16  matmul  790.0 TFLOP/s at 8192x8192x16384 nn (80 % of 989.4; 3 rounds, median "
        "0 % below the best)"
    )
    assert lines[-2].startswith("memory copy  2,800 GB/s")
    assert lines[-1].startswith("pinned host-to-device  11.0 GB/s")
    # a shape's first timing: one warm-up call and a probe, then repeats without warm-up; a
    # shape timed again in a later round needs no warm-up
    warmed = [(f, s, lay) for f, s, lay, w in timer.warmups if w]
    assert sorted(warmed) == sorted(set(warmed)) and len(warmed) < len(timer.warmups)
    # the sweep times each shape in each layout (fp8's kernel takes one)
    swept = {(fmt, shape, layout) for fmt, shape, layout, _ in timer.calls}
    assert {(s, lay) for f, s, lay in swept if f == "bf16"} == {
        (shape, layout) for shape in bench.GPU_SHAPES for layout in ("nn", "nt", "tn")
    }
    assert {lay for f, _, lay in swept if f == "fp8"} == {"nt"}


@pytest.mark.unit
def test_a_healthy_gpu_gets_no_state_verdicts_and_the_json_has_the_issue_shape() -> None:
    healthy = FakeNvml(limit_mw=700_000, reasons=0x1, link=(5, 16, 5, 16))
    check = bench.run_check(seams=fake_gpu_seams(healthy, FakeTimer(H100_RATES), h2d=50.0))
    said = "\n".join(check.verdicts)
    assert "power limit" not in said and "throttled" not in said and "PCIe" not in said
    # the same 11 GB/s that suits a Gen3 x8 link is slow on a Gen5 x16 one
    slow = bench.run_check(seams=fake_gpu_seams(healthy, FakeTimer(H100_RATES), h2d=11.0))
    assert slow.verdicts[-1].startswith(
        "pinned host-to-device at 11 GB/s, under half of what the PCIe link carries (63 GB/s)"
    )
    data = json.loads(json.dumps(check.to_json()))
    assert data["device"] == "NVIDIA H100 80GB HBM3"
    assert data["matmul"]["bf16"] == {
        "tflops": pytest.approx(790.0),
        "shape": [8192, 8192, 16384],
        "datasheet_tflops": 989.4,
        "ratio": pytest.approx(0.7985, abs=1e-4),
        "layout": "nn",
        "rounds": [pytest.approx(790.0)] * 3,
        "spread": pytest.approx(0.0),
    }
    assert (
        data["memory"]["gbps"] == 2800.0
        and data["memory"]["rounds"] == [2800.0] * 3
        and data["memory"]["datasheet_gbps"] == 3350.0
    )
    assert isinstance(data["verdicts"], list) and data["verdicts"]


@pytest.mark.unit
def test_a_slow_gpu_is_called_below_normal_and_an_unknown_one_has_no_ratio() -> None:
    slow = dict(H100_RATES, bf16=350.0)
    check = bench.run_check(seams=fake_gpu_seams(FakeNvml(), FakeTimer(slow)))
    assert any(
        v.startswith("bf16 matmul at 35 % of the datasheet: far below normal")
        for v in check.verdicts
    )
    assert "bf16 35 %" not in "\n".join(check.verdicts)  # not called typical beside it
    unknown = bench.run_check(
        seams=fake_gpu_seams(FakeNvml(), FakeTimer(H100_RATES), name="Mystery GPU 9000")
    )
    assert unknown.matmul["bf16"].ratio is None and unknown.memory_datasheet_gbps is None
    assert "no datasheet figure for 'Mystery GPU 9000'" in "\n".join(unknown.verdicts)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("cc", "formats"),
    [
        ((7, 0), ("fp32", "fp16")),
        ((8, 0), ("fp32", "tf32", "bf16", "fp16")),
        ((8, 9), ("fp32", "tf32", "bf16", "fp16", "fp8")),
    ],
)
def test_only_the_formats_the_gpu_runs_natively_are_measured(cc, formats) -> None:
    timer = FakeTimer(H100_RATES)
    check = bench.run_check(seams=fake_gpu_seams(FakeNvml(), timer, cc=cc))
    assert tuple(check.matmul) == formats
    assert {fmt for fmt, *_ in timer.batches} == set(formats)


def cpu_seams(
    flags: set[str], rates: dict[str, float], timer: FakeTimer | None = None
) -> bench.Seams:
    """A quiet two-thread CPU; ``timer`` times its calls (by default two threads run fp32 at
    twice one thread's rate: an idle machine), on the threads a ``ThreadedTimer`` counts."""
    timer = timer or ThreadedTimer(rates, small=1.0, one=rates.get("fp32", 1.0) / 2)
    return bench.Seams(
        timer=timer,
        threads=timer.cores if isinstance(timer, ThreadedTimer) else FakeThreads(),
        make=fake_make,
        cpu_flags=lambda: flags,
        cpu_name=lambda: "Test CPU",
        gpu=lambda index: None,
        copy=lambda device, nbytes: lambda t, b: 12.5,
        cpu_clock=lambda: None,  # other processes' use of the CPUs not observed: a quiet box
    )


@pytest.mark.unit
def test_a_cpu_without_bf16_units_is_told_why_bf16_is_slower() -> None:
    rates = {"fp32": 0.1, "bf16": 0.03, "fp16": 0.004}
    seams = cpu_seams({"avx2", "fma"}, rates)
    check = bench.run_check(seams=seams)
    assert check.kind == "cpu" and list(check.matmul) == ["fp32", "bf16", "fp16"]
    assert check.threads == seams.threads.get()
    assert check.verdicts[0] == (
        "bf16 matmul runs at 0.3x fp32 here: this CPU has no AMX or AVX512-BF16 units, so bf16 "
        "presets train slower than fp32 on it"
    )
    assert check.verdicts[1].startswith("fp16 matmul runs at 0.04x fp32 here: this CPU has no")
    assert all(fig.datasheet_tflops is None and fig.ratio is None for fig in check.matmul.values())
    assert check.memory_gbps == 12.5 and check.memory_what == "copy in RAM"


@pytest.mark.unit
def test_a_cpu_with_amx_is_credited_and_one_whose_units_go_unused_is_told_to_check() -> None:
    fast = bench.run_check(
        seams=cpu_seams({"amx_bf16", "avx512_bf16"}, {"fp32": 0.1, "bf16": 0.4, "fp16": 0.1})
    )
    assert fast.cpu_units == ["amx_bf16", "avx512_bf16"]
    assert fast.verdicts[0] == "bf16 matmul runs at 4x fp32 here, on its AMX-BF16 units"
    unused = bench.run_check(
        seams=cpu_seams({"avx512_bf16"}, {"fp32": 0.1, "bf16": 0.05, "fp16": 0.1})
    )
    assert unused.verdicts[0].startswith(
        "bf16 matmul runs at 0.5x fp32 here although this CPU has AVX512-BF16 units"
    )


@pytest.mark.unit
def test_a_slow_format_stops_the_sweep_before_a_shape_that_would_take_seconds() -> None:
    """fp16 without fp16 units at 5 GFLOP/s: 2048 cubed would take 3.4 s a call, so it is not
    tried; 1024 cubed (0.4 s) is, in each layout."""
    timer = FakeTimer({"fp16": 0.005}, small=1.0)
    rates = bench.sweep(
        "fp16", bench.CPU_SHAPES, torch.device("cpu"), timer, bench.Budget(seconds=0.5), fake_make
    )
    assert {shape for _, shape, _, _ in timer.batches} == {(n, n, n) for n in (128, 256, 512, 1024)}
    assert {layout for _, layout in rates} == {"nn", "nt", "tn"}
    assert max(rates.values()) == pytest.approx(0.005)


@pytest.mark.unit
def test_a_figure_is_the_fastest_call_and_a_slow_call_is_not_repeated_long() -> None:
    """Other work only ever slows a call: the fastest of the repeats is what the device does."""
    calls: list[tuple[int, int]] = []

    def timer(fn, repeats, warmup):
        calls.append((repeats, warmup))
        return [0.012, 0.011, 0.5, 0.009, 0.011][:repeats] if repeats > 1 else [0.01]

    assert bench.time_best(timer, lambda: None, bench.Budget(seconds=0.05)) == 0.009
    assert calls == [(1, 1), (5, 0)]
    calls.clear()

    def slow(fn, repeats, warmup):
        calls.append((repeats, warmup))
        return [0.9 - 0.1 * len(calls)] * repeats

    assert bench.time_best(slow, lambda: None, bench.Budget(seconds=0.5)) == pytest.approx(0.7)
    assert calls == [(1, 1), (2, 0)]  # three timed calls in all, the probe one of them
    calls.clear()

    def far_too_slow(fn, repeats, warmup):
        calls.append((repeats, warmup))
        return [2.0] * repeats

    assert bench.time_best(far_too_slow, lambda: None, bench.Budget(seconds=0.5)) == 2.0
    assert calls == [(1, 1)]  # over twice the budget: the probe alone


@pytest.mark.unit
def test_the_cuda_timer_reads_the_gpus_own_clock_and_syncs_once() -> None:
    """Events around each call, one synchronisation for the batch: no host sync per call."""
    clock = [0.0]
    synced: list[int] = []

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing
            self.at: float | None = None

        def record(self) -> None:
            self.at = clock[0]

        def elapsed_time(self, end: Event) -> float:  # milliseconds, as CUDA's
            assert synced, "read before the synchronisation"
            return (end.at - self.at) * 1000.0

    cuda = SimpleNamespace(Event=Event, synchronize=lambda: synced.append(1))
    ran: list[int] = []

    def work() -> None:  # the GPU's clock moves 3 ms a call; the host's does not matter
        ran.append(1)
        clock[0] += 0.003

    times = bench.cuda_timer(work, repeats=4, warmup=2, cuda=cuda)
    assert times == pytest.approx([0.003] * 4)
    assert len(ran) == 6 and synced == [1]


@pytest.mark.unit
def test_real_cpu_matmuls_run_in_each_format_and_layout_at_the_shape_asked() -> None:
    cpu = torch.device("cpu")
    for fmt, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        for layout in ("nn", "nt", "tn"):
            out = bench.matmul_call(fmt, (8, 4, 16), layout, cpu)()
            assert isinstance(out, torch.Tensor) and out.shape == (8, 4) and out.dtype == dtype
    # nn.Linear's forward multiplies by a transposed weight (nt), its weight gradient by a
    # transposed activation (tn): the operands lie in memory as they do there
    a, b = bench.operands("fp16", (8, 4, 16), "nt", cpu)
    assert a.is_contiguous() and not b.is_contiguous() and b.t().is_contiguous()
    a, b = bench.operands("fp16", (8, 4, 16), "tn", cpu)
    assert not a.is_contiguous() and a.t().is_contiguous() and b.is_contiguous()
    assert all(t.is_contiguous() for t in bench.operands("fp32", (8, 4, 16), "nn", cpu))
    out = bench.matmul_call("fp8", (8, 4, 16), "nt", cpu)()  # torch._scaled_mm, e4m3
    assert isinstance(out, torch.Tensor) and out.shape == (8, 4) and out.dtype == torch.bfloat16
    with bench._Float32Precision("tf32"):
        assert torch.get_float32_matmul_precision() == "high"
    assert torch.get_float32_matmul_precision() == "highest"


@pytest.mark.unit
def test_several_gpus_get_the_all_reduce_bus_bandwidth_and_a_failed_one_says_why() -> None:
    assert machine_check.allreduce_busbw(100.0, 8) == pytest.approx(175.0)  # nccl-tests' 2(n-1)/n
    assert machine_check.allreduce_busbw(100.0, 2) == pytest.approx(100.0)
    said: list[tuple[str, str]] = []
    asked: list[int] = []

    def eight(count: int) -> float:
        asked.append(count)
        return 361.0

    seams = fake_gpu_seams(FakeNvml(), FakeTimer(H100_RATES))
    gpus8 = bench.GpuInfo("NVIDIA H100 80GB HBM3", (9, 0), "58fa5f56-0000", 8)
    seams = dataclasses.replace(seams, gpu=lambda index: gpus8, allreduce=eight)
    check = bench.run_check(seams=seams, on_figure=lambda what, line: said.append((what, line)))
    assert asked == [8] and check.allreduce_busbw_gbps == 361.0 and check.allreduce_note is None
    assert ("allreduce", "all-reduce  361 GB/s bus bandwidth over 8 GPUs (NCCL)") in said

    def broken(count: int) -> float:
        raise RuntimeError("rank 3 ended with exit code 1")

    check = bench.run_check(seams=dataclasses.replace(seams, allreduce=broken))
    assert check.allreduce_busbw_gbps is None and check.matmul  # the other figures stand
    assert check.allreduce_note == (
        "8 GPUs: the all-reduce could not be measured (RuntimeError: rank 3 ended with exit "
        "code 1); nccl-tests' all_reduce_perf measures it"
    )
    one = bench.run_check(seams=fake_gpu_seams(FakeNvml(), FakeTimer(H100_RATES)))
    assert one.allreduce_busbw_gbps is None and one.allreduce_note is None  # one GPU: none


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_real_all_reduce_over_two_ranks_on_the_cpu() -> None:
    """The same ranks doctor starts on several GPUs, over gloo on the CPU: two processes join,
    reduce 4 MiB ten times and leave; the bus bandwidth is their median time's."""
    from ampscope.engine.machine.allreduce import allreduce_gbps

    busbw = allreduce_gbps(2, nbytes=4 << 20, backend="gloo")
    # 4 MiB in less than 4 s a reduce, and not faster than a copy in memory could be
    assert 1e-3 < busbw < 1e3


# ---------------------------------------------------------------------------------------------
# Storage, staleness, the measured peak a run is shown against


def a_check(**over: object) -> machine_check.MachineCheck:
    check = bench.run_check(seams=cpu_seams(set(), {"fp32": 0.1, "bf16": 0.03, "fp16": 0.004}))
    for key, value in over.items():
        setattr(check, key, value)
    return check


@pytest.mark.unit
def test_a_kept_check_reads_back_whole_and_serves_the_measured_peak() -> None:
    check = a_check(torch="2.13.0+cpu", driver=None)
    path = machine_check.save(check)
    assert (
        path.parent == machine_check.checks_dir()
        and path.name == f"{machine_check.host_name()}.json"
    )
    back = machine_check.find("Test CPU")
    assert back is not None and back.to_json() == check.to_json()
    peak = machine_check.measured_peak("Test CPU", "fp32")
    assert peak.tflops == pytest.approx(0.1) and not peak.fault
    assert peak.note is not None and "ampscope doctor --bench" in peak.note
    assert machine_check.measured_tflops("Test CPU", "fp32") == pytest.approx(
        0.1
    )  # what plan reads
    assert machine_check.measured_peak("Other CPU", "fp32") == machine_check.MeasuredPeak(
        None, None
    )
    # a second device on the same host is kept beside the first
    machine_check.save(a_check(device="Second CPU"))
    assert set(machine_check.load_all()[0]) == {"Test CPU", "Second CPU"}


@pytest.mark.unit
def test_a_damaged_file_is_named_with_what_to_run() -> None:
    machine_check.check_path().parent.mkdir(parents=True, exist_ok=True)
    machine_check.check_path().write_text("{not json")
    checks, problem = machine_check.load_all()
    assert checks == {} and problem is not None
    assert str(machine_check.check_path()) in problem and "ampscope doctor --bench" in problem


@pytest.mark.unit
def test_a_check_from_another_torch_or_driver_says_so() -> None:
    check = a_check(torch="2.12.0", driver="550.54.15")
    assert machine_check.staleness(check, "2.12.0", "550.54.15") is None
    said = machine_check.staleness(check, "2.13.0", "570.124.06")
    assert said == (
        "measured on torch 2.12.0 (now 2.13.0) and driver 550.54.15 (now 570.124.06): the "
        "figures may have changed; run ampscope doctor --bench again"
    )


@pytest.mark.unit
def test_the_driver_version_is_read_from_procs_text(tmp_path) -> None:
    text = (
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.124.06  Release Build  "
        "(dvs-builder@U16-I3-B03-4-3)  Tue Feb 25 04:14:44 UTC 2025\nGCC version:  gcc 12\n"
    )
    fake = tmp_path / "version"
    fake.write_text(text)
    assert machine_check.nvidia_driver(fake) == "570.124.06"


# ---------------------------------------------------------------------------------------------
# The command line


def doctor_bench(
    capsys,
    *argv: str,
    measure: Callable[..., machine_check.MachineCheck] | None = None,
    gpu_count: Callable[[], int] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``ampscope doctor --bench ARGV`` as its parser reads it, with the check's figures taken
    by ``measure`` and the GPUs torch sees counted by ``gpu_count``: what it prints and
    returns."""
    from ampscope.cli.doctor_bench import cmd_machine_check
    from ampscope.cli.main import build_parser

    args = build_parser().parse_args(["doctor", "--bench", *argv])
    code = cmd_machine_check(args, measure, gpu_count)
    said = capsys.readouterr()
    return subprocess.CompletedProcess(["doctor", "--bench", *argv], code, said.out, said.err)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["doctor", "--quick"], "--quick"),
        (["doctor", "--bench-device", "cpu"], "--bench-device"),
        (["doctor", "--bench", "--try-compile"], "--try-compile"),
    ],
)
def test_bench_options_without_bench_or_with_try_compile_are_one_paragraph_exit_2(
    capsys, argv, named
) -> None:
    done = cli(capsys, *argv)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("ampscope: ") and named in done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1


@pytest.mark.unit
@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cuda:", "cuda:-1"])
def test_an_unknown_bench_device_names_the_choices(capsys, device) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli(capsys, "doctor", "--bench", "--bench-device", device)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"'{device}' is not a device" in err
    assert "Accepted: auto, cpu, cuda (GPU 0) or cuda:N" in err and "Traceback" not in err


@pytest.mark.unit
def test_bench_device_cuda_n_measures_gpu_n_and_a_gpu_not_there_is_named(capsys) -> None:
    asked: list[str] = []

    def measure(device: str, quick: bool, on_figure: object) -> machine_check.MachineCheck:
        asked.append(device)
        return a_check()

    done = doctor_bench(capsys, "--bench-device", "cuda:1", measure=measure, gpu_count=lambda: 2)
    assert done.returncode == 0 and asked == ["cuda:1"]
    done = doctor_bench(capsys, "--bench-device", "cuda:2", measure=measure, gpu_count=lambda: 2)
    assert done.returncode == 2 and asked == ["cuda:1"]
    assert done.stderr.startswith(
        "ampscope: --bench-device cuda:2: torch sees 2 GPUs here (cuda:0 to cuda:1); name one"
    )
    done = doctor_bench(capsys, "--bench-device", "cuda:1", measure=measure, gpu_count=lambda: 1)
    assert "torch sees 1 GPU here (cuda:0)" in done.stderr and done.returncode == 2


@pytest.mark.unit
def test_a_check_on_cuda_n_times_gpu_n_with_it_made_current() -> None:
    seen: dict[str, list[object]] = {"info": [], "current": [], "made": []}

    @contextlib.contextmanager
    def on_gpu(index: int) -> Iterator[None]:
        seen["current"].append(index)
        yield

    def make(fmt: str, shape: bench.Shape, layout: str, device: torch.device) -> FakeCall:
        seen["made"].append(device)
        return FakeCall(fmt, shape, layout)

    def info(index: int) -> bench.GpuInfo:
        seen["info"].append(index)
        return bench.GpuInfo("NVIDIA H100 80GB HBM3", (9, 0), None, 4, None)

    seams = dataclasses.replace(
        fake_gpu_seams(None, FakeTimer(H100_RATES)), gpu=info, on_gpu=on_gpu, make=make
    )
    seams.allreduce = lambda gpus: 100.0
    check = bench.run_check("cuda:3", quick=True, seams=seams)
    assert check.kind == "cuda" and check.device == "NVIDIA H100 80GB HBM3"
    assert seen["info"] == [3] and seen["current"] == [3]
    assert set(seen["made"]) == {torch.device("cuda", 3)}
    bench.run_check("auto", quick=True, seams=seams)
    assert seen["info"] == [3, 0] and seen["current"] == [3, 0]


@pytest.mark.unit
def test_bench_device_cuda_without_a_gpu_is_a_user_error(capsys) -> None:
    done = doctor_bench(capsys, "--bench-device", "cuda", gpu_count=lambda: 0)
    assert (
        done.returncode == 2
        and "no CUDA GPU" in done.stderr
        and "--bench-device cpu" in done.stderr
    )


def gflops_here(n: int, dtype: torch.dtype, repeats: int = 7) -> float:
    """This process's own figure for one matmul size: the median of ``repeats``."""
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times) / 1e9


@pytest.mark.subprocess
def test_doctor_bench_json_on_this_cpu_agrees_with_a_matmul_timed_here(tmp_path) -> None:
    """A real ``doctor --bench --quick --json``: the issue's JSON shape on stdout, a line per
    figure on stderr, and fp32 and bf16 within a factor of ten of this process's own timing
    of the same shape, taken before and after (the machine's load moves both). Both on one
    thread: two threads of a small matmul on a busy machine wait on each other for whole
    scheduler slices, which made one figure 50x another here."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        before = {
            f: gflops_here(256, d) for f, d in (("fp32", torch.float32), ("bf16", torch.bfloat16))
        }
        done = subprocess.run(
            [sys.executable, "-m", "ampscope", "doctor", "--bench", "--quick", "--json"],
            capture_output=True,
            text=True,
            env=engine_env(OMP_NUM_THREADS="1"),
            timeout=120,
        )
        after = {
            f: gflops_here(256, d) for f, d in (("fp32", torch.float32), ("bf16", torch.bfloat16))
        }
    finally:
        torch.set_num_threads(threads)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["kind"] == "cpu" and set(data["matmul"]) == {"fp32", "bf16", "fp16"}
    assert data["threads"] == 1  # the process's thread count, as OMP_NUM_THREADS set it
    assert done.stderr.startswith(
        f"machine check on {data['device']}, 1 thread: 3 rounds, the best of each figure kept\n"
    )
    assert data["kept_at"] is None  # --quick figures are not kept
    for fmt in ("fp32", "bf16"):
        fig = data["matmul"][fmt]
        assert set(fig) >= {"tflops", "shape", "datasheet_tflops", "ratio"}
        assert fig["datasheet_tflops"] is None and fig["ratio"] is None  # no CPU datasheet
        theirs = fig["tflops"] * 1e3
        low, high = min(before[fmt], after[fmt]), max(before[fmt], after[fmt])
        assert low / 10 <= theirs <= high * 10, (fmt, theirs, before[fmt], after[fmt])
    assert data["memory"]["gbps"] > 0 and data["memory"]["datasheet_gbps"] is None
    lines = done.stderr.splitlines()
    assert lines[0].startswith("machine check on ")
    assert [line.split(":")[0] for line in lines[1:4]] == [f"round {n} of 3" for n in (1, 2, 3)]
    assert [line.split()[0] for line in lines[4:7]] == ["fp32", "bf16", "fp16"]
    assert lines[7].startswith("memory copy")
    for fmt in ("fp32", "bf16", "fp16"):
        assert len(data["matmul"][fmt]["rounds"]) == 3  # each figure timed in every round
        assert data["matmul"][fmt]["layout"] in ("nn", "nt", "tn")


# ---------------------------------------------------------------------------------------------
# A run's MFU read against the measured peak


@pytest.mark.slow
def test_a_cpu_run_shows_mfu_against_this_machines_measured_peak_everywhere(tmp_path) -> None:
    """No datasheet peak exists for a CPU: with a kept check, the run's TFLOP/s is read
    against the measured fp32 figure in hello, the done event (the record), the console's
    summary, the bench table and the Run view's card."""
    from ampscope.cli.console import summary_table
    from ampscope.core import comparison, records
    from ampscope.core import events as ev
    from ampscope.engine.device import cpu_name
    from ampscope.engine.lifecycle.run import run
    from ampscope.tui.model.figures import cards
    from ampscope.tui.model.run_state import RunState

    measured = 0.5  # TFLOP/s: more than two cores do in fp32, so the run stays below it
    check = a_check(device=cpu_name())
    check.matmul["fp32"].tflops = measured
    machine_check.save(check)
    seen: list[ev.Event] = []
    overrides = ["workload.kind='mlp'", "device='cpu'", "steps=6", "warmup_steps=2"]
    assert run("fp32", overrides, runs_dir=tmp_path, on_event=seen.append) == 0
    hello = next(e for e in seen if isinstance(e, ev.HelloEvent))
    done = next(e for e in seen if isinstance(e, ev.DoneEvent))
    assert hello.peak_tflops is None and hello.measured_tflops == measured
    assert "doctor --bench" in (hello.measured_tflops_note or "")
    assert done.mfu is None and done.tflops is not None
    assert done.mfu_measured == pytest.approx(done.tflops / measured)
    assert 0 < done.mfu_measured <= 1
    assert not any(isinstance(e, ev.WarningEvent) for e in seen)
    share = f"{done.tflops / measured * 100:.0f}% of measured"
    assert re.search(rf"\n  MFU +{share}\n", summary_table(done))
    # the record on disk carries it, and bench's table reads it from there
    (record,) = records.list_runs(tmp_path)
    row = comparison.row_from_runs("fp32", [records.load_run(record.path)])
    assert row.mfu is None and row.mfu_measured == pytest.approx(done.mfu_measured)
    assert comparison.cells(row)["mfu"] == share
    row.mfu = 0.33  # a GPU's: both
    assert comparison.cells(row)["mfu"] == f"33.0% · {share}"
    state = RunState()
    for event in seen:
        state.ingest(event)
    card = next(c for c in cards(state) if c.key == "tflops")
    assert card.sub.endswith("% of measured peak") and len(card.sub) <= 22  # a card's width
    assert card.value.endswith(card.sub.split()[0])  # a CPU: the value's share is the measured one


@pytest.mark.unit
def test_a_run_that_beats_the_kept_peak_says_the_check_is_no_peak_never_a_bare_percentage(
    tmp_path,
) -> None:
    """A kept fp32 figure of 1 MFLOP/s, which any run beats (as a model's small matmuls beat a
    check timed on one 512-cubed shape): no 'MFU 16800 %' anywhere; the summary, bench's table
    and the Run view's card say the peak was beaten and what to run, and the record holds a
    warning before its done that says the same."""
    from ampscope.cli.console import summary_table
    from ampscope.core import comparison, records
    from ampscope.core import events as ev
    from ampscope.engine.device import cpu_name
    from ampscope.engine.lifecycle.run import run
    from ampscope.tui.model.figures import cards
    from ampscope.tui.model.run_state import RunState

    check = a_check(device=cpu_name())
    check.matmul["fp32"].tflops = 1e-6  # the least a kept figure may be
    machine_check.save(check)
    seen: list[ev.Event] = []
    overrides = ["workload.kind='mlp'", "device='cpu'", "steps=4", "warmup_steps=1"]
    assert run("fp32", overrides, runs_dir=tmp_path, on_event=seen.append) == 0
    done = next(e for e in seen if isinstance(e, ev.DoneEvent))
    assert done.mfu_measured is not None and done.mfu_measured > 1
    from ampscope.core.machine.mfu import times

    ratio = times(done.mfu_measured)
    assert "e" not in ratio  # '16,600x', never an exponent
    summary = summary_table(done)
    assert f"over the measured peak ({ratio}): run ampscope doctor --bench again" in summary
    assert "%" not in next(line for line in summary.splitlines() if "MFU" in line)
    warning = next(e for e in seen if isinstance(e, ev.WarningEvent))
    assert warning.code == "mfu-above-measured" and seen.index(warning) < seen.index(done)
    assert "beat the kept fp32 machine check" in warning.message
    assert "ampscope doctor --bench" in warning.message
    run_on_disk = records.load_run(records.list_runs(tmp_path)[0].path)
    assert any(
        isinstance(e, ev.WarningEvent) and e.code == "mfu-above-measured"
        for e in run_on_disk.events
    )
    row = comparison.row_from_runs("fp32", [run_on_disk])
    assert comparison.cells(row)["mfu"].startswith("over the measured peak")
    state = RunState()
    for event in seen:
        state.ingest(event)
    card = next(c for c in cards(state) if c.key == "tflops")
    assert card.sub == "beat measured peak" and card.value.endswith(" · over peak")


@pytest.mark.unit
def test_without_a_check_nothing_changes_and_a_gpu_run_shows_both() -> None:
    from ampscope.core.units import fmt_mfu, of_measured

    assert fmt_mfu(None, None) == "-"
    assert fmt_mfu(0.33, None) == "33.0%"
    assert fmt_mfu(0.33, 0.412) == "33.0% · 41% of measured"
    assert of_measured(400.0, 800.0, world_size=2) == pytest.approx(0.25)
    assert of_measured(None, 800.0) is None and of_measured(1.0, None) is None


@pytest.mark.unit
@pytest.mark.parametrize("peak", [float("nan"), -3.0, 0.0, float("inf"), 10**400, "fast"])
def test_a_peak_that_is_no_number_gives_no_mfu(peak) -> None:
    from ampscope.core.units import of_measured

    assert of_measured(1.0, peak) is None


@pytest.mark.unit
def test_an_mfu_above_100_percent_says_what_it_means_in_every_form() -> None:
    from ampscope.core.machine import mfu
    from ampscope.core.units import fmt_mfu

    assert fmt_mfu(0.33, 1.68) == (
        "33.0% · over the measured peak (1.7x): run ampscope doctor --bench again"
    )
    assert fmt_mfu(1.2, None) == (
        "over the datasheet peak (1.2x): check peak_tflops and the FLOP count"
    )
    assert fmt_mfu(1.0, 1.0) == "100.0% · 100% of measured"  # at the peak is no fault
    assert fmt_mfu(float("nan"), -0.3) == "-"  # a damaged record: no figure
    assert mfu.card_share(1.68) == "over peak" and mfu.card_share(0.41) == "41%"


@pytest.mark.unit
def test_a_watched_loop_reads_its_tflops_against_the_measured_peak_too(tmp_path) -> None:
    import ampscope
    from ampscope.core import comparison, records
    from ampscope.engine.device import cpu_name
    from tests.helpers import tiny_model

    check = a_check(device=cpu_name())
    check.matmul["fp32"].tflops = 0.002
    machine_check.save(check)
    model, opt = tiny_model()
    with ampscope.watch(model, opt, runs_dir=tmp_path, count_flops=True) as mon:
        for _ in range(4):
            loss = model(torch.randn(16, 32)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss, samples=16)
    run = records.load_run(mon.run_dir)
    assert run.hello is not None and run.hello.measured_tflops == 0.002
    assert run.done is not None and run.done.tflops is not None and run.done.mfu is None
    row = comparison.row_from_runs("mine", [run])  # bench and Compare work it out from hello
    assert row.mfu_measured == pytest.approx(run.done.tflops / 0.002)


@pytest.mark.unit
def test_plain_doctor_says_whether_a_check_is_kept_and_whether_it_is_stale(capsys) -> None:
    done = cli(capsys, "doctor")
    assert done.returncode == 0
    assert "machine check: none kept here (ampscope doctor --bench measures" in done.stdout
    machine_check.save(
        a_check(device="Test\x1b[2JCPU", torch="1.0.0", when="2026-12-01T10:00:00+00:00")
    )
    done = cli(capsys, "doctor")
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("machine check:")]
    assert line.startswith("machine check: Test\\x1b[2JCPU measured 2026-12-01 10:00 UTC; ")
    assert (
        f"torch 1.0.0 (now {torch.__version__})" in line and "run ampscope doctor --bench" in line
    )
    data = json.loads(cli(capsys, "doctor", "--json").stdout)
    assert data["machine_checks"][0]["device"] == "Test\x1b[2JCPU"


@pytest.mark.unit
@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp16", "fp8"])
def test_the_flops_a_figure_is_computed_from_are_torchs_own_count(fmt) -> None:
    """TFLOP/s = flops_of(shape) / seconds: the FLOPs are what FlopCounterMode counts for the
    very call that is timed, in every format."""
    from torch.utils.flop_counter import FlopCounterMode

    shape = (64, 32, 128)
    call = bench.matmul_call(fmt, shape, "nt", torch.device("cpu"))
    with FlopCounterMode(display=False) as counter:
        call()
    assert counter.get_total_flops() == bench.flops_of(shape)


@pytest.mark.unit
def test_the_text_output_ends_with_the_verdicts_and_where_the_check_is_kept(capsys) -> None:
    check = a_check(seconds=9.6)
    done = doctor_bench(capsys, measure=lambda *a, **k: check)
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "- bf16 matmul runs at 0.3x fp32 here: this CPU has no AMX or AVX512-BF16 units, so bf16 "
        "presets train slower than fp32 on it"
    )
    assert lines[-1] == f"done in 10 s; kept in {machine_check.check_path()}"
    assert machine_check.find("Test CPU") is not None


@pytest.mark.unit
def test_a_config_folder_that_cannot_be_written_still_prints_the_figures(
    capsys, monkeypatch, tmp_path
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(blocker))
    check = a_check(seconds=3.0)
    done = doctor_bench(capsys, measure=lambda *a, **k: check)
    assert done.returncode == 0 and "Traceback" not in done.stderr
    assert done.stderr.startswith("ampscope: the results could not be kept in ")
    assert done.stdout.splitlines()[-1] == "done in 3 s; not kept"


@pytest.mark.unit
def test_a_mig_slice_is_held_to_its_share_of_the_chip() -> None:
    """A 3g slice of an H100 (60 of 132 multiprocessors) is not 'far below normal' at 45 % of
    the whole chip; its memory has no datasheet share to compare with."""
    rates = {f: r * 60 / 132 for f, r in H100_RATES.items()}
    name = "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    check = bench.run_check(seams=fake_gpu_seams(FakeNvml(), FakeTimer(rates), name=name, sms=60))
    bf16 = check.matmul["bf16"]
    assert bf16.datasheet_tflops == pytest.approx(989.4 * 60 / 132, abs=0.05)
    assert bf16.ratio == pytest.approx(790.0 / 989.4, rel=1e-3)
    assert check.memory_datasheet_gbps is None
    assert not any("far below" in v for v in check.verdicts)


@dataclass
class ThreadedTimer(FakeTimer):
    """fp32 at ``one`` TFLOP/s on one thread, at the table's rate on more."""

    one: float = 0.1
    cores: FakeThreads = field(default_factory=FakeThreads)  # the threads the check sets

    def __post_init__(self) -> None:
        # the check's one-thread run is one thread where it began with several; a process
        # given one thread times every format on one
        self.threads = self.cores.get()

    def __call__(self, fn: Callable[[], object], repeats: int, warmup: int) -> list[float]:
        if self.cores.get() == 1 < self.threads:
            assert isinstance(fn, FakeCall) and fn.fmt == "fp32"
            self.batches.append((fn.fmt, fn.shape, repeats, warmup))
            return [bench.flops_of(fn.shape) / (self.one * 1e12)] * repeats
        return super().__call__(fn, repeats, warmup)


@pytest.mark.unit
@pytest.mark.parametrize(("two", "said"), [(0.05, True), (0.19, False)])
def test_a_cpu_whose_threads_gain_nothing_is_told_other_processes_hold_its_cores(two, said) -> None:
    timer = ThreadedTimer({"fp32": two, "bf16": two, "fp16": two}, small=1.0, one=0.1)
    seams = cpu_seams(set(), {}, timer)
    lines: list[str] = []
    check = bench.run_check(on_figure=lambda what, line: lines.append(line), seams=seams)
    assert seams.threads.get() == 2  # given back after the one-thread run
    assert check.threads == 2 and check.fp32_one_thread_tflops == pytest.approx(0.1)
    assert "fp32  matmul  100.0 GFLOP/s on 1 thread (5 rounds, median 0 % below the best)" in lines
    verdict = next((v for v in check.verdicts if "one thread" in v), None)
    if said:
        assert verdict is not None and verdict.startswith(
            "fp32 matmul on 2 threads runs at 0.5x one thread: other processes are using the cores"
        )
    else:
        assert verdict is None  # 1.9x: the second thread pays
    back = machine_check.MachineCheck.from_json(json.loads(json.dumps(check.to_json())))
    assert back.fp32_one_thread_tflops == check.fp32_one_thread_tflops


# ---------------------------------------------------------------------------------------------
# A kept file that is damaged or was edited: what is no measurement is ignored and said


def kept_with(**fp32: object) -> None:
    """This host's kept file with the CPU check's fp32 figure fields set as given, raw."""
    from ampscope.engine.device import cpu_name

    machine_check.save(a_check(device=cpu_name()))
    data = json.loads(machine_check.check_path().read_text())
    data["checks"][cpu_name()]["matmul"]["fp32"].update(fp32)
    machine_check.check_path().write_text(json.dumps(data))


BAD_FIGURES = [float("nan"), float("inf"), -34.0, 0, 1e-300, 10**400, "fast", None]


@pytest.mark.unit
@pytest.mark.parametrize("bad", BAD_FIGURES, ids=lambda v: repr(v)[:12])
def test_a_kept_figure_that_is_no_number_is_ignored_and_named_with_the_command(bad) -> None:
    from ampscope.engine.device import cpu_name

    kept_with(tflops=bad)
    check = machine_check.find(cpu_name())
    assert check is not None and "fp32" not in check.matmul  # the others stand
    assert "bf16" in check.matmul and check.ignored and check.ignored[0].startswith("fp32 matmul")
    peak = machine_check.measured_peak(cpu_name(), "fp32")
    assert peak.tflops is None and peak.fault and peak.note is not None
    assert "not a finite positive number" in peak.note and "ampscope doctor --bench" in peak.note
    assert machine_check.measured_tflops(cpu_name(), "fp32") is None
    assert machine_check.measured_tflops(cpu_name(), "bf16") == pytest.approx(0.03)


@pytest.mark.unit
@pytest.mark.parametrize("damage", ["rounds", "other_cpus"])
def test_a_kept_check_whose_steadiness_figures_are_damaged_is_no_peak(damage: str) -> None:
    """Damaged rounds (text) or other processes' CPUs (NaN) were read as absent, and absent
    means a check that held still: a busy check's figure became the runs' peak, silently."""
    from ampscope.engine.device import cpu_name

    kept_with(rounds="fast")
    data = json.loads(machine_check.check_path().read_text())
    entry = data["checks"][cpu_name()]
    if damage == "other_cpus":
        entry["matmul"]["fp32"]["rounds"] = [0.1, 0.1, 0.1]
        entry["other_cpus"] = float("nan")
    machine_check.check_path().write_text(json.dumps(data))
    check = machine_check.find(cpu_name())
    assert check is not None and not check.trusted("fp32")
    peak = machine_check.measured_peak(cpu_name(), "fp32")
    assert peak.tflops is None and peak.fault and peak.note is not None
    assert "cannot say whether its fp32 figure held still" in peak.note
    assert "ampscope doctor --bench" in peak.note


@pytest.mark.unit
def test_a_400_digit_figure_and_a_text_thread_count_never_raise() -> None:
    """Before: float() of a 400-digit integer raised OverflowError in every run's start, in
    doctor --bench and in the machine view; threads 'two' a TypeError in the view."""
    from ampscope.engine.device import cpu_name

    kept_with(tflops=10**400, rounds=[10**400, "x"])
    data = json.loads(machine_check.check_path().read_text())
    data["checks"][cpu_name()]["threads"] = "two"
    data["checks"][cpu_name()]["memory"]["gbps"] = float("nan")
    machine_check.check_path().write_text(json.dumps(data))
    checks, problem = machine_check.load_all()
    check = checks[cpu_name()]
    assert problem is None and check.threads is None and check.memory_gbps is None
    assert "fp32 matmul (a 401-digit number)" in check.ignored
    assert "threads ('two')" in check.ignored and "memory copy (nan)" in check.ignored


@pytest.mark.slow
@pytest.mark.parametrize("bad", [float("nan"), 10**400], ids=["nan", "400-digits"])
def test_a_run_beside_a_damaged_check_says_so_once_and_shows_no_mfu_against_it(
    tmp_path, bad
) -> None:
    """The run starts and trains; one warning names the figure and the command; no measured
    peak in hello, the header or done."""
    import io

    from ampscope.cli.console import ConsoleReporter
    from ampscope.core import events as ev
    from ampscope.engine.lifecycle.run import run

    kept_with(tflops=bad)
    seen: list[ev.Event] = []
    overrides = ["workload.kind='mlp'", "device='cpu'", "steps=3", "warmup_steps=1"]
    assert run("fp32", overrides, runs_dir=tmp_path, on_event=seen.append) == 0
    hello = next(e for e in seen if isinstance(e, ev.HelloEvent))
    done = next(e for e in seen if isinstance(e, ev.DoneEvent))
    assert hello.measured_tflops is None and done.mfu_measured is None
    (warning,) = [e for e in seen if isinstance(e, ev.WarningEvent)]
    assert warning.code == "machine-check" and "ampscope doctor --bench" in warning.message
    assert "not a finite positive number" in warning.message
    said, result = io.StringIO(), io.StringIO()
    console = ConsoleReporter(said, result)
    for event in seen:
        console(event)
    header = said.getvalue().splitlines()[0]
    assert "measured" not in header and "nan" not in header and header.endswith("no MFU peak")
    assert said.getvalue().count("ampscope doctor --bench") == 1  # said once
    mfu_row = next(line for line in result.getvalue().splitlines() if "MFU" in line)
    assert mfu_row.split() == ["MFU", "-"]


@pytest.mark.unit
def test_doctor_bench_replaces_a_damaged_file(capsys) -> None:
    kept_with(tflops=10**400)
    machine_check.check_path().write_text(
        '{"version": 1, "checks": {"x": {"matmul": 12'
    )  # cut short
    assert machine_check.load_all()[1] is not None
    check = a_check(seconds=2.0)
    done = doctor_bench(capsys, measure=lambda *a, **k: check)
    assert done.returncode == 0 and "Traceback" not in done.stderr
    checks, problem = machine_check.load_all()
    assert problem is None and checks["Test CPU"].to_json() == check.to_json()


@pytest.mark.unit
def test_two_checks_at_once_never_move_each_others_half_written_file(monkeypatch) -> None:
    """The second check saves while the first is between writing and renaming its file: with
    one fixed temporary name the first's rename found its file gone (FileNotFoundError)."""
    real_replace = os.replace
    moved: list[str] = []

    def replace(src: str, dst: object) -> None:
        if not moved:  # the first save, about to rename: another check saves meanwhile
            moved.append(str(src))
            machine_check.save(a_check(device="Second CPU"))
        else:
            moved.append(str(src))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)  # the one rename every write makes
    machine_check.save(a_check(device="First CPU"))
    assert len(moved) == 2 and moved[0] != moved[1]
    checks, problem = machine_check.load_all()
    assert problem is None and "First CPU" in checks  # a whole file, the last rename's
    assert not [p for p in machine_check.checks_dir().iterdir() if p.suffix == ".tmp"]


@pytest.mark.unit
def test_ctrl_c_during_doctor_bench_is_one_line_and_exit_130(capsys) -> None:
    def interrupted(*args: object, **kwargs: object) -> machine_check.MachineCheck:
        raise KeyboardInterrupt

    done = doctor_bench(capsys, measure=interrupted)
    assert done.returncode == 130 and done.stdout == ""
    assert done.stderr == (
        "ampscope: machine check stopped (Ctrl+C) before it finished: nothing kept.\n"
    )
    assert not machine_check.check_path().exists()


@pytest.mark.unit
def test_one_option_without_bench_is_told_it_applies() -> None:
    import argparse

    from ampscope.cli.doctor_bench import check_options

    one = argparse.Namespace(quick=True, bench_device="auto", bench=False, try_compile=False)
    assert (check_options(one) or "").startswith("--quick only applies to the machine check")
    both = argparse.Namespace(quick=True, bench_device="cpu", bench=False, try_compile=False)
    assert (check_options(both) or "").startswith("--quick and --bench-device only apply")


# ---------------------------------------------------------------------------------------------
# A check that holds still: the best of several rounds, the spread beside it


@pytest.mark.unit
@pytest.mark.parametrize(
    ("rounds", "spread", "steady"),
    [
        ([100.0, 98.0, 97.0, 99.0, 96.0], 0.02, True),
        ([100.0, 20.0, 95.0, 90.0, 30.0], 0.10, True),  # two bad rounds: the median holds
        ([100.0, 20.0, 25.0, 90.0, 30.0], 0.70, False),  # most rounds far below the best
        ([100.0, 84.0, 84.0], 0.16, False),
        ([100.0, 100.0], 0.0, False),  # too few rounds to tell
    ],
)
def test_the_spread_of_rounds_decides_whether_a_figure_is_steady(rounds, spread, steady) -> None:
    from ampscope.core.machine import steady as st

    assert st.spread(rounds) == pytest.approx(spread)
    assert st.steady(rounds) is steady
    assert st.trusted([]) and st.spread([]) is None  # a check kept before rounds: trusted


@dataclass
class LoadedTimer(ThreadedTimer):
    """A machine whose load comes and goes: in each round, the formats (or 'fmt layout') in
    ``slowed`` run at that round's share of their rate. The copy meter turns the rounds."""

    slowed: dict[str, list[float]] = field(default_factory=dict)
    round: int = 0

    def __call__(self, fn: Callable[[], object], repeats: int, warmup: int) -> list[float]:
        times = super().__call__(fn, repeats, warmup)
        assert isinstance(fn, FakeCall)
        factor = self.slowed.get(f"{fn.fmt} {fn.layout}", self.slowed.get(fn.fmt, [1.0] * 10))
        factor = factor[self.round]
        return [t / factor for t in times]

    def copy(self, device: torch.device, nbytes: int) -> bench.Meter:
        def measure(timer: bench.Timer, budget: bench.Budget) -> float:
            self.round += 1
            return 12.5

        return measure


def loaded_check(slowed: dict[str, list[float]]) -> tuple[machine_check.MachineCheck, list[str]]:
    rates = {"fp32": 0.1, "bf16": 0.2, "fp16": 0.01}
    timer = LoadedTimer(rates, small=1.0, one=0.05, slowed=slowed)
    seams = dataclasses.replace(cpu_seams({"avx512_bf16"}, rates, timer), copy=timer.copy)
    lines: list[str] = []
    check = bench.run_check(on_figure=lambda what, line: lines.append(line), seams=seams)
    return check, lines


@pytest.mark.unit
def test_a_busy_machine_is_said_with_the_spread_and_its_figure_is_not_kept_as_a_peak() -> None:
    """bf16 ran at its full rate in round 1 only, a fifth of it after (another job started):
    its figure is the best round, reported with the spread, called too busy, and no run is
    read against it; fp32 held still and is served."""
    check, lines = loaded_check({"bf16": [1.0, 0.2, 0.2, 0.25, 0.2]})
    bf16 = check.matmul["bf16"]
    assert bf16.tflops == pytest.approx(0.2) and len(bf16.rounds) == 5
    assert bf16.rounds[1:] == pytest.approx([0.04, 0.04, 0.05, 0.04])
    assert not bf16.trusted and check.matmul["fp32"].trusted
    assert check.verdicts[0].startswith(
        "the machine was too busy to measure: the rounds of bf16 matmul (median round 80 % "
        "below the best) disagreed by more than 15 % (load average "
    )
    assert "it is not kept as this machine's peak" in check.verdicts[0]
    assert (
        "bf16  matmul  200.0 GFLOP/s at 128x128x128 nn (too busy to measure: 5 rounds, "
        "median 80 % below the best)" in lines
    )
    machine_check.save(check)
    assert machine_check.measured_tflops("Test CPU", "bf16") is None
    peak = machine_check.measured_peak("Test CPU", "bf16")
    assert peak.fault and "too busy" in (peak.note or "")
    assert machine_check.measured_tflops("Test CPU", "fp32") == pytest.approx(0.1)


@pytest.mark.unit
def test_a_later_round_that_runs_faster_is_the_figure() -> None:
    """The first round's sweep ran under load; the later rounds, alone, ran faster: the
    figure is what the device did at its best, not the first sample."""
    check, _ = loaded_check({"fp32": [0.5, 1.0, 1.0, 1.0, 1.0]})
    fp32 = check.matmul["fp32"]
    assert fp32.tflops == pytest.approx(0.1) and fp32.rounds[0] == pytest.approx(0.05)
    assert fp32.trusted and not any("too busy" in v for v in check.verdicts)


@pytest.mark.unit
def test_the_sweep_finds_the_layout_a_linear_layer_runs_fastest_in() -> None:
    """fp16 on a CPU without fp16 units: a @ b at 2 GFLOP/s, nn.Linear's a @ b.T at 20. A
    check that timed a @ b alone kept 2 and a model's layers ran at 8x it."""

    @dataclass
    class Layouts(ThreadedTimer):
        def __call__(self, fn: Callable[[], object], repeats: int, warmup: int) -> list[float]:
            times = super().__call__(fn, repeats, warmup)
            assert isinstance(fn, FakeCall)
            return [t / 10 if fn.fmt == "fp16" and fn.layout == "nt" else t for t in times]

    rates = {"fp32": 0.1, "bf16": 0.2, "fp16": 0.002}
    seams = cpu_seams(set(), rates, Layouts(rates, small=1.0, one=0.05))
    check = bench.run_check(seams=seams)
    fp16 = check.matmul["fp16"]
    assert fp16.layout == "nt" and fp16.tflops == pytest.approx(0.02)


@pytest.mark.unit
def test_the_rounds_stop_at_the_deadline_and_too_few_rounds_are_not_steady() -> None:
    """A machine so slow that a round takes 30 s: the third round would end past a minute and
    a half, so it is not begun; the check keeps what it measured and says two rounds cannot
    tell a steady figure from a lucky one."""
    rates = {"fp32": 0.1, "bf16": 0.2, "fp16": 0.01}
    timer = LoadedTimer(rates, small=1.0, one=0.05)
    seams = dataclasses.replace(
        cpu_seams(set(), rates, timer), copy=timer.copy, clock=lambda: 30.0 * timer.round
    )
    check = bench.run_check(seams=seams)
    assert [len(f.rounds) for f in check.matmul.values()] == [2, 2, 2]
    assert not any(f.trusted for f in check.matmul.values())
    assert check.verdicts[0].startswith(
        "the machine was too busy to measure: only 2 rounds fitted in the check's time"
    )
    assert "too few to tell a steady figure from a lucky one" in check.verdicts[0]


@pytest.mark.unit
def test_past_the_deadline_the_sweep_tries_no_larger_shape() -> None:
    timer = FakeTimer({"fp32": 0.1}, small=1.0)
    rates = bench.sweep(
        "fp32",
        bench.CPU_SHAPES,
        torch.device("cpu"),
        timer,
        bench.Budget(),
        fake_make,
        until=50.0,
        clock=lambda: 100.0,
    )
    assert set(rates) == {((128, 128, 128), layout) for layout in ("nn", "nt", "tn")}


@pytest.mark.unit
def test_a_layout_stops_growing_once_a_shape_runs_at_under_half_its_best() -> None:
    """Past the caches a CPU's larger matmuls only get slower: 1024 cubed at a third of 512's
    rate ends the layout's sweep before 2048 cubed, which would take seconds."""

    @dataclass
    class Caches(FakeTimer):
        def __call__(self, fn: Callable[[], object], repeats: int, warmup: int) -> list[float]:
            times = super().__call__(fn, repeats, warmup)
            assert isinstance(fn, FakeCall)
            return [t * 3 if fn.shape[0] >= 1024 else t for t in times]

    timer = Caches({"fp32": 0.1}, small=1.0)
    rates = bench.sweep(
        "fp32", bench.CPU_SHAPES, torch.device("cpu"), timer, bench.Budget(), fake_make
    )
    assert {shape[0] for shape, _ in rates} == {128, 256, 512, 1024}


@pytest.mark.unit
def test_a_layout_timed_while_the_machine_was_busy_is_timed_again_in_every_round() -> None:
    """fp16's a @ b.T runs 10x its a @ b, but the first round's sweep met it under load: each
    layout's best shape is a finalist, so later rounds find its rate, and the figure is it."""

    @dataclass
    class FastNt(LoadedTimer):
        def __call__(self, fn: Callable[[], object], repeats: int, warmup: int) -> list[float]:
            times = super().__call__(fn, repeats, warmup)
            assert isinstance(fn, FakeCall)
            return [t / 10 if fn.fmt == "fp16" and fn.layout == "nt" else t for t in times]

    rates = {"fp32": 0.1, "bf16": 0.2, "fp16": 0.002}
    timer = FastNt(rates, small=1.0, one=0.05, slowed={"fp16 nt": [0.05, 1, 1, 1, 1]})
    seams = dataclasses.replace(cpu_seams(set(), rates, timer), copy=timer.copy)
    fp16 = bench.run_check(seams=seams).matmul["fp16"]
    assert fp16.layout == "nt" and fp16.tflops == pytest.approx(0.02)
    assert fp16.rounds[0] == pytest.approx(0.002) and fp16.trusted  # 4 of 5 rounds agree


@pytest.mark.unit
def test_a_sweep_stopped_by_a_call_slowed_a_thousandfold_goes_on_once_a_round_runs_fast() -> None:
    """Two threads of a small matmul beside other work: every fp32 call of the first round
    ran 1000x slow, so no larger shape looked affordable. The later rounds run fast, and each
    takes the sweep one shape further."""
    rates = {"fp32": 0.1, "bf16": 0.2, "fp16": 0.01}
    timer = LoadedTimer(rates, small=1.0, one=0.05, slowed={"fp32": [0.001, 1, 1, 1, 1]})
    seams = dataclasses.replace(cpu_seams(set(), rates, timer), copy=timer.copy)
    check = bench.run_check(seams=seams)
    swept = [shape[0] for fmt, shape, layout, _ in timer.calls if fmt == "fp32" and layout == "nn"]
    assert swept[0] == 128 and {256, 512, 1024, 2048} <= set(swept)
    assert check.matmul["fp32"].tflops == pytest.approx(0.1)


def clock_of(others: float, own: float = 2.0) -> Callable[[], tuple[float, float, float]]:
    """A fake /proc/stat and process clock: each reading 10 s on, with ``others`` CPUs of
    other processes' work and ``own`` of this process's between two readings."""
    readings = iter(range(1000))

    def read() -> tuple[float, float, float]:
        n = next(readings)
        return n * 10 * (others + own), n * 10 * own, n * 10.0

    return read


@pytest.mark.unit
def test_other_processes_share_of_the_cpus_is_the_busy_time_that_is_not_the_checks() -> None:
    assert bench.other_cpus((100.0, 10.0, 0.0), (130.0, 25.0, 10.0)) == pytest.approx(1.5)
    assert bench.other_cpus(None, (1.0, 1.0, 1.0)) is None
    here = bench.cpu_seconds()  # this machine's /proc/stat and this process's own time
    assert here is not None and here[0] > 0 and here[1] > 0


@pytest.mark.unit
@pytest.mark.parametrize(
    ("threads", "others", "contended"),
    [(2, 1.0, True), (2, 0.3, False), (1, 1.0, False), (1, 1.7, True)],
)
def test_a_cpu_check_beside_other_processes_keeps_nothing_as_a_peak(
    threads, others, contended
) -> None:
    """A busy loop on one of two cores: a two-thread check's rounds may still agree (a kernel
    that runs on one thread holds still under load), but none of its figures is the machine's
    peak. A one-thread check beside one busy core has a core of its own."""
    rates = {"fp32": 0.1, "bf16": 0.03, "fp16": 0.004}
    seams = dataclasses.replace(
        cpu_seams(set(), rates),
        threads=FakeThreads(threads),
        timer=FakeTimer(rates, small=1.0),  # one rate whatever the threads
        cpu_clock=clock_of(others),
        cpus=lambda: 2,
    )
    check = bench.run_check(seams=seams)
    assert check.other_cpus == pytest.approx(others) and check.cpus == 2
    assert check.contended is contended
    assert all(fig.trusted for fig in check.matmul.values())  # the rounds agree either way
    assert check.trusted("fp32") is not contended
    said = "\n".join(check.verdicts)
    assert (f"other processes kept {others:.1f} of its 2 CPUs busy" in said) is contended
    # a ratio of busy figures is no verdict: it said "bf16 presets train slower than fp32"
    assert ("bf16 presets train slower than fp32" in said) is not contended
    assert ("no verdict on bf16 against fp32 (this CPU has no" in said) is contended
    machine_check.save(check)
    peak = machine_check.measured_peak("Test CPU", "fp32")
    assert (peak.tflops is None) is contended and peak.fault is contended
    back = machine_check.find("Test CPU")
    assert back is not None and back.contended is contended  # kept, and read back the same
    shown = " ".join(line.strip() for line in view_lines_of(back))
    assert ("no figure here is kept as this machine's peak" in shown) is contended


def view_lines_of(check: machine_check.MachineCheck) -> list[str]:
    from ampscope.tui.model.machine_view import view_lines

    return view_lines({check.device: check}, None, 100, None, None)


@pytest.mark.unit
def test_a_busy_check_is_one_sentence_with_the_contention_and_each_spread() -> None:
    from ampscope.core.machine import steady as st

    said = st.busy_verdict(
        [("fp16 matmul", [21.1, 21.0, 6.8, 6.8, 6.8]), ("memory copy", [11, 9, 8, 6, 6])],
        10.9,
        "other processes kept 1.6 of its 2 CPUs busy during the check",
    )
    assert said == (
        "the machine was too busy to measure: other processes kept 1.6 of its 2 CPUs busy "
        "during the check (load average 10.9), and the rounds of fp16 matmul (median round "
        "68 % below the best) and memory copy (27 %) disagreed by more than 15 %. Every figure "
        "here is the busy machine's and none is kept as its peak; run ampscope doctor --bench "
        "again when it is quieter"
    )
    assert st.busy_verdict([], None) is None


@pytest.mark.unit
@pytest.mark.parametrize("peak", [float("nan"), -989.4, 0.0, 1e-300, 10**400])
def test_the_summarys_mfu_comes_only_from_a_peak_that_is_a_number(peak) -> None:
    """core/records/summary.py's rates, which the engine's and a watched loop's done share."""
    from ampscope.core.records.distribution import Figures
    from ampscope.core.records.summary import rates

    speed = rates(Figures(exact=[10.0, 10.0, 10.0]), 8, None, 1e12, peak)
    assert speed.tflops == pytest.approx(100.0) and speed.mfu is None
    assert rates(Figures(exact=[10.0]), 8, None, 1e12, 200.0).mfu == pytest.approx(0.5)


@pytest.mark.unit
def test_verdicts_or_cpu_units_that_are_no_list_are_ignored_and_the_rest_stands() -> None:
    """Before: cpu_units 5 made the whole file unreadable (every device's check ignored), and
    verdicts 'abc' were shown as three verdicts, one a letter."""
    from ampscope.engine.device import cpu_name

    kept_with()
    data = json.loads(machine_check.check_path().read_text())
    data["checks"][cpu_name()]["cpu_units"] = 5
    data["checks"][cpu_name()]["verdicts"] = "abc"
    machine_check.check_path().write_text(json.dumps(data))
    checks, problem = machine_check.load_all()
    check = checks[cpu_name()]
    assert problem is None and "fp32" in check.matmul
    assert check.verdicts == [] and check.cpu_units == []
    assert "CPU units (5)" in check.ignored and "verdicts ('abc')" in check.ignored


@pytest.mark.unit
def test_a_busy_check_whose_cpu_counts_are_unreadable_is_still_no_peak() -> None:
    """Before: threads true (ignored) in a check taken while other processes kept 1.5 CPUs
    busy made it read as quiet, and its busy figure served runs as the measured peak."""
    from ampscope.engine.device import cpu_name

    kept_with()
    data = json.loads(machine_check.check_path().read_text())
    data["checks"][cpu_name()].update(threads=True, cpus=2, other_cpus=1.5)
    machine_check.check_path().write_text(json.dumps(data))
    peak = machine_check.measured_peak(cpu_name(), "fp32")
    assert peak.tflops is None and peak.note is not None and "CPUs busy" in peak.note
    data["checks"][cpu_name()].update(threads=2, cpus=2, other_cpus=0.2)
    machine_check.check_path().write_text(json.dumps(data))
    assert machine_check.measured_peak(cpu_name(), "fp32").tflops is not None


@pytest.mark.unit
@pytest.mark.parametrize("device", [None, "", 7])
def test_a_kept_entry_without_a_device_name_is_a_damaged_file_never_none_measured(
    capsys, device
) -> None:
    machine_check.save(a_check())
    data = json.loads(machine_check.check_path().read_text())
    data["checks"]["Test CPU"]["device"] = device
    machine_check.check_path().write_text(json.dumps(data))
    checks, problem = machine_check.load_all()
    assert checks == {} and problem is not None and "device" in problem
    (line,) = [
        ln for ln in cli(capsys, "doctor").stdout.splitlines() if ln.startswith("machine check:")
    ]
    assert "None" not in line and "cannot be read" in line and "ampscope doctor --bench" in line
