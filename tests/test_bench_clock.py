"""bench on a shared machine: ``--clock cpu`` times each step by the process's CPU time, the
table says which clock it used, and when the spread between repeats is what keeps a verdict
back, bench says so and what would help."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from ampscope.cli import bench
from ampscope.core import events as ev
from ampscope.core import records
from tests.helpers import cli, hello

pytestmark = pytest.mark.unit

# A shared 2-core box: the wall clock swings with the other tenants (547 ms to 3.26 s between
# repeats of one preset), the CPU time hardly moves; amp-bf16 is truly twice as fast.
WALL = {"fp32": [547.0, 3260.0, 1400.0], "amp-bf16": [2900.0, 300.0, 1700.0]}
CPU = {"fp32": [500.0, 510.0, 495.0], "amp-bf16": [251.0, 249.0, 254.0]}


@pytest.fixture
def shared_machine(monkeypatch) -> list[str]:
    """bench's engine runs, replaced by records of the figures above (in the order run)."""
    ran: list[str] = []
    counts: dict[str, itertools.count] = {}

    def run_one(preset, overrides, runs_dir, on_line=None, launch=None) -> records.RunRecord:
        ran.append(preset)
        i = next(counts.setdefault(preset, itertools.count()))
        done = ev.empty_done("ok")
        done.steps_done = 100
        done.step_ms_median = done.step_ms_p10 = done.step_ms_p90 = WALL[preset][i]
        done.cpu_ms_median = CPU[preset][i]
        done.loss_final = 1.0
        run_hello = hello(preset=preset, device="cpu")
        return records.RunRecord(path=Path(f"/runs/{preset}-{i}"), hello=run_hello, done=done)

    monkeypatch.setattr(bench, "run_one", run_one)
    return ran


def test_the_wall_clock_spread_blocks_the_verdict_and_bench_says_what_would_help(
    shared_machine, capsys, tmp_path: Path
) -> None:
    said = cli(capsys, "bench", "fp32", "amp-bf16", "--device", "cpu", "--runs-dir", str(tmp_path))
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


def test_the_cpu_clock_gives_the_verdict_and_the_table_names_it(
    shared_machine, capsys, tmp_path: Path
) -> None:
    said = cli(
        capsys, "bench", "fp32", "amp-bf16", "--device", "cpu", "--clock", "cpu",
        "--runs-dir", str(tmp_path),
    )  # fmt: skip
    assert said.returncode == 0, said.stderr
    out = said.stdout
    assert out.splitlines()[0].startswith("preset    CPU time/step")
    assert "amp-bf16: 2x faster than fp32 (95% CI" in out
    assert "No speed verdict" not in out
    assert "step time: CPU clock (each step's process CPU time, all threads: --clock cpu)" in out
    bf16 = next(ln for ln in out.splitlines() if ln.startswith("amp-bf16"))
    assert "251.0 ms (249.0 ms-254.0 ms)" in bf16  # the CPU times, not the wall clock's


@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_the_cpu_clock_is_refused_on_a_gpu(
    shared_machine, capsys, monkeypatch, tmp_path: Path, device: str
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    said = cli(
        capsys, "bench", "fp32", "amp-bf16", "--device", device, "--clock", "cpu",
        "--runs-dir", str(tmp_path),
    )  # fmt: skip
    assert said.returncode == 2
    assert said.stderr.startswith(f"ampscope: --clock cpu: fp32 runs on a GPU (device = '{device}'")
    assert "Accepted: --clock cpu with --device cpu" in said.stderr
    assert "Traceback" not in said.stderr
    assert shared_machine == []  # refused before any run


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
