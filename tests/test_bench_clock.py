"""bench on a shared machine: ``--clock cpu`` times each step by the process's CPU time, the
table says which clock it used, and when the spread between repeats is what keeps a verdict
back, bench says so and what would help."""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path

import pytest

from ampscope.cli import bench
from ampscope.cli.main import command_args
from ampscope.core import events as ev
from ampscope.core import records
from tests.helpers import hello

# A shared 2-core box: the wall clock swings with the other tenants (547 ms to 3.26 s between
# repeats of one preset), the CPU time hardly moves; amp-bf16 is truly twice as fast.
WALL = {"fp32": [547.0, 3260.0, 1400.0], "amp-bf16": [2900.0, 300.0, 1700.0]}
CPU = {"fp32": [500.0, 510.0, 495.0], "amp-bf16": [251.0, 249.0, 254.0]}


SAMPLES = 32  # a step's samples: each run's samples/s is 32 over its wall-clock median


class FakeRuns:
    """bench's engine runs, answered by records of these figures; ``ran``: the presets in the
    order run."""

    def __init__(self, wall: dict[str, list[float]], cpu: dict[str, list[float]]) -> None:
        self.wall, self.cpu = wall, cpu
        self.ran: list[str] = []
        self.counts: dict[str, itertools.count] = {}

    def __call__(self, preset, overrides, runs_dir, on_line=None, launch=None) -> records.RunRecord:
        wall, cpu, counts = self.wall, self.cpu, self.counts
        self.ran.append(preset)
        i = next(counts.setdefault(preset, itertools.count()))
        done = ev.empty_done("ok")
        done.steps_done = 100
        done.step_ms_median = done.step_ms_p10 = done.step_ms_p90 = wall[preset][i]
        done.samples_per_s = SAMPLES * 1000 / wall[preset][i]
        done.tflops, done.mfu = 1e9 / wall[preset][i] / 1e9, 1e9 / wall[preset][i] / 1e9 / 2
        done.cpu_ms_median = cpu[preset][i]
        done.loss_final = 1.0
        run_hello = hello(preset=preset, device="cpu")
        return records.RunRecord(path=Path(f"/runs/{preset}-{i}"), hello=run_hello, done=done)


@pytest.fixture
def shared_machine() -> FakeRuns:
    return FakeRuns(WALL, CPU)


def bench_cli(
    capsys, runs: FakeRuns, *argv: str, cuda_available=None
) -> subprocess.CompletedProcess[str]:
    """``ampscope bench ARGV`` as its command line reads it, each engine run answered by
    ``runs``: what it prints and returns."""
    code = bench.cmd_bench(command_args(["bench", *argv]), runs, cuda_available)
    said = capsys.readouterr()
    return subprocess.CompletedProcess(["bench", *argv], code, said.out, said.err)


def bench_cpu_clock(capsys, tmp_path: Path, runs: FakeRuns, *more: str) -> str:
    said = bench_cli(
        capsys, runs, "fp32", "amp-bf16", "--device", "cpu", "--clock", "cpu",
        "--runs-dir", str(tmp_path), *more,
    )  # fmt: skip
    assert said.returncode == 0, said.stderr
    return said.stdout


@pytest.mark.unit
def test_the_wall_clock_spread_blocks_the_verdict_and_bench_says_what_would_help(
    shared_machine, capsys, tmp_path: Path
) -> None:
    said = bench_cli(
        capsys, shared_machine, "fp32", "amp-bf16", "--device", "cpu", "--runs-dir", str(tmp_path)
    )
    assert said.returncode == 0, said.stderr
    out = said.stdout
    assert "no significant speed difference" in out  # the honest non-verdict stays
    assert (
        "No speed verdict for amp-bf16: the repeats spread too widely to tell "
        "(step time across repeats: fp32 547.0 ms-3.26 s; amp-bf16 300.0 ms-2.90 s)." in out
    )
    assert "What would help: --clock cpu (each step's process CPU time" in out
    assert "more --repeats, fewer threads (OMP_NUM_THREADS=1" in out
    assert "step time: wall clock (each step's elapsed time)" in out
    assert out.splitlines()[0].split()[:3] == ["preset", "step", "time"]


@pytest.mark.unit
def test_the_cpu_clock_gives_the_verdict_and_the_table_names_it(
    shared_machine, capsys, tmp_path: Path
) -> None:
    said = bench_cli(
        capsys, shared_machine, "fp32", "amp-bf16", "--device", "cpu", "--clock", "cpu",
        "--runs-dir", str(tmp_path),
    )  # fmt: skip
    assert said.returncode == 0, said.stderr
    out = said.stdout
    assert out.splitlines()[0].startswith("preset    CPU time/step")
    assert "amp-bf16: 2x faster than fp32 (95% CI" in out
    assert "No speed verdict" not in out
    assert "step time: CPU clock (each step's process CPU time, all threads: --clock cpu)" in out
    bf16 = next(ln for ln in out.splitlines() if ln.startswith("amp-bf16"))
    assert "251.3 ms (249.0 ms-254.0 ms)" in bf16  # the CPU times, not the wall clock's


def _row(out: str, preset: str) -> list[str]:
    """A row of the text table, split at its column gaps (two spaces or more)."""
    line = next(ln for ln in out.splitlines() if ln.startswith(preset + " "))
    return re.split(r"\s{2,}", line.strip())


@pytest.mark.unit
def test_under_the_cpu_clock_the_speedup_and_the_rates_are_the_printed_cpu_times(
    shared_machine, capsys, tmp_path: Path
) -> None:
    """The speed-up was the ratio of the repeats' plain medians while the step time beside it
    was another aggregate, and samples/s stayed wall-clock beside a CPU time: one row, one
    aggregate, one clock."""
    out = bench_cpu_clock(capsys, tmp_path, shared_machine)
    heads = re.split(r"\s{2,}", out.splitlines()[0].strip())
    assert heads[:6] == ["preset", "CPU time/step", "speedup", "samples/CPU s", "tokens/CPU s",
                         "TFLOP/CPU s"]  # fmt: skip
    base, bf16 = _row(out, "fp32"), _row(out, "amp-bf16")
    base_ms, bf16_ms = (float(r[1].split(" ms")[0]) for r in (base, bf16))
    speedup = float(bf16[2].split("x")[0])
    assert speedup == pytest.approx(base_ms / bf16_ms, abs=0.01)
    for row, ms in ((base, base_ms), (bf16, bf16_ms)):
        assert float(row[3]) == pytest.approx(SAMPLES * 1000 / ms, rel=0.01)  # per CPU second
        assert row[6] == "-"  # no MFU: a CPU second counts every thread
    assert "samples, tokens and TFLOP per CPU second" in " ".join(out.split())


@pytest.mark.unit
def test_a_step_mostly_off_the_cpu_clock_is_named_and_its_speedup_not_called(
    capsys, tmp_path: Path
) -> None:
    """A model that sleeps 50 ms a step showed 9 ms a step and a clean 2x: the wall clock
    says the step is 59 ms, and bf16 gains 8 % of it."""
    runs = FakeRuns(
        wall={"fp32": [59.0, 59.2, 58.9], "amp-bf16": [54.5, 54.6, 54.4]},
        cpu={"fp32": [9.0, 9.1, 8.9], "amp-bf16": [4.5, 4.6, 4.4]},
    )
    out = " ".join(bench_cpu_clock(capsys, tmp_path, runs).split())
    assert "fp32: its CPU time is 15% of its wall time (9.00 ms of 59.0 ms a step)" in out
    assert "most of a step is off the CPU clock" in out
    assert "amp-bf16: its CPU time is 8% of its wall time" in out
    assert "faster" not in out
    assert (
        "amp-bf16: 2x less CPU time a step than fp32, but 1.1x its speed by the wall clock: "
        "no speed verdict" in out
    )
    assert "2.00x (1.95-2.06) !" in out  # the cell is marked


@pytest.mark.unit
def test_busy_dataloader_workers_make_the_clocks_contradict_and_no_speedup_is_called(
    capsys, tmp_path: Path
) -> None:
    """Busy workers in other processes: amp-bf16 was called 2.06x faster by the CPU clock
    while the same row's samples/s was 0.56x fp32's."""
    runs = FakeRuns(
        wall={"fp32": [100.0, 101.0, 99.0], "amp-bf16": [178.0, 180.0, 179.0]},
        cpu={"fp32": [80.0, 81.0, 79.0], "amp-bf16": [38.8, 39.3, 38.5]},
    )
    out = " ".join(bench_cpu_clock(capsys, tmp_path, runs).split())
    assert "faster" not in out and "slower" not in out
    assert (
        "amp-bf16: no speed verdict: the clocks contradict each other (by CPU time a step "
        "2.1x the speed of fp32, by the wall clock 0.56x)" in out
    )
    assert "! marks a CPU-clock speed-up the wall clock rules out" in out


@pytest.mark.unit
@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_the_cpu_clock_is_refused_on_a_gpu(
    shared_machine, capsys, tmp_path: Path, device: str
) -> None:
    said = bench_cli(
        capsys, shared_machine, "fp32", "amp-bf16", "--device", device, "--clock", "cpu",
        "--runs-dir", str(tmp_path), cuda_available=lambda: True,
    )  # fmt: skip
    assert said.returncode == 2
    assert said.stderr.startswith(f"ampscope: --clock cpu: fp32 runs on a GPU (device = '{device}'")
    assert "Accepted: --clock cpu with --device cpu" in said.stderr
    assert "Traceback" not in said.stderr
    assert shared_machine.ran == []  # refused before any run


@pytest.mark.slow
def test_a_cpu_run_records_each_steps_cpu_time_and_its_median_over_the_timed_steps() -> None:
    """The engine's step events carry ``cpu_ms`` on a CPU, and ``done.cpu_ms_median`` is the
    median over the same steps as ``step_ms_median`` (warm-up and grad-zero steps left out)."""
    import statistics

    from ampscope.core.records.summary import timed_steps
    from ampscope.engine.lifecycle.run import EXIT_OK, run

    seen: list[ev.Event] = []
    sets = ["device='cpu'", "steps=7", "warmup_steps=2", "grad_zero_every=3"]
    assert run("mlp-demo", sets, record=False, on_event=seen.append) == EXIT_OK
    steps = [e for e in seen if isinstance(e, ev.StepEvent)]
    (done,) = [e for e in seen if isinstance(e, ev.DoneEvent)]
    assert all(s.cpu_ms is not None and s.cpu_ms > 0 for s in steps)
    zeros = {s.step for s in steps if s.grad_zero_frac is not None}
    kept = timed_steps(len(steps), 2, instrumented=zeros)
    assert kept == [2, 4, 5]  # 3 and 6 measured zeros
    wall = statistics.median(steps[i].step_ms for i in kept)  # the events round to 0.1 us
    assert done.step_ms_median == pytest.approx(wall, abs=1e-3)
    cpu = statistics.median(steps[i].cpu_ms for i in kept)  # type: ignore[type-var]
    assert done.cpu_ms_median == pytest.approx(cpu, abs=1e-3)
