"""The engine's figures against what happened: final losses, timed steps, grad zeros, memory."""

from __future__ import annotations

import re
import statistics
from collections.abc import Set
from types import SimpleNamespace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from ampscope.cli.console import summary_table
from ampscope.cli.runs import EXAMPLES_DIR as EXAMPLES
from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.records.tally import StepTally
from ampscope.core.units import fmt_final_loss
from ampscope.engine.lifecycle.parts import Parts
from ampscope.engine.lifecycle.run import EXIT_FAILED, EXIT_OK, EXIT_USAGE, run
from ampscope.engine.step.metrics import MemoryReader, StepReporter, zero_fraction
from ampscope.engine.step.precision import TF32_API_SINCE
from ampscope.engine.step.timer import FinishedStep
from ampscope.tui.model.figures import cards
from ampscope.tui.model.run_state import RunState
from tests.fakes import FakeCuda
from tests.helpers import FAST, ROOT, hello, step


def run_fast(name: str, *overrides: str, parts: Parts | None = None) -> tuple[int, list[ev.Event]]:
    seen: list[ev.Event] = []
    code = run(name, [*FAST, *overrides], record=False, on_event=seen.append, parts=parts)
    return code, seen


def of(events: list[ev.Event], kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


# --------------------------------------------------------------------------- final loss


@pytest.mark.slow
def test_a_run_that_ends_on_a_non_finite_loss_reports_that_loss_and_its_step() -> None:
    code, seen = run_fast("fp32", "steps=8", "debug.inf_loss_at_step=3")
    done, error = of(seen, ev.DoneEvent)[0], of(seen, ev.ErrorEvent)[0]
    assert code == EXIT_FAILED and error.step == 3
    assert done.loss_final is None and done.loss_nonfinite == "inf"
    assert done.loss_final_step == 3
    assert done.loss_first is not None  # the first loss was finite, and is kept
    assert "-> inf at step 3" in summary_table(done)


@pytest.mark.unit
def test_a_finite_final_loss_is_the_last_steps() -> None:
    code, seen = run_fast("fp32", "steps=4")
    done, last = of(seen, ev.DoneEvent)[0], of(seen, ev.StepEvent)[-1]
    assert code == EXIT_OK and done.loss_nonfinite is None
    assert done.loss_final == last.loss and done.loss_final_step == last.step == 3


@pytest.mark.unit
def test_the_dashboard_names_the_non_finite_final_loss() -> None:
    state = RunState(label="fp16")
    state.ingest(hello(preset="fp16"))
    state.ingest(step(0, loss=2.77))
    state.ingest(step(1, loss=None))
    done = ev.empty_done("failed", "Loss became nan at step 1")
    done.steps_done, done.loss_first, done.loss_final_step, done.loss_nonfinite = 2, 2.77, 1, "nan"
    state.ingest(done)
    card = next(c for c in cards(state) if c.key == "loss")
    assert card.value == "nan" and card.sub == "at step 1, first 2.77"
    assert state.log[-1].text.endswith("final loss nan at step 1")


@pytest.mark.unit
def test_the_shipped_fp16_example_ends_on_its_nan() -> None:
    record = records.load_run(EXAMPLES / "fp16-nan")
    done = record.done
    assert done is not None and done.status == "failed"
    assert done.loss_final is None and done.loss_first is not None
    shown = fmt_final_loss(done.loss_final, done.loss_nonfinite, done.loss_final_step)
    assert shown == "nan at step 1"
    assert "-> nan at step 1" in summary_table(done)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("loss", "nonfinite", "step_index", "shown"),
    [(2.77149, None, 9, "2.7715"), (None, "nan", 1, "nan at step 1"), (None, None, None, "-")],
)
def test_final_loss_text(loss, nonfinite, step_index, shown: str) -> None:
    assert fmt_final_loss(loss, nonfinite, step_index) == shown


# --------------------------------------------------------------------------- timed steps


@pytest.mark.unit
def test_the_compile_step_is_never_timed_even_without_warmup() -> None:
    stats = tally_of([30_000.0, 10.0, 12.0, 11.0], warmup_steps=0, compiled=True)
    done = stats.done("ok", 1e9, None, samples=8)
    assert done.step_ms_median == 11.0 and done.step_ms_p90 == 12.0
    only_compile = tally_of([30_000.0], warmup_steps=0, compiled=True)
    assert only_compile.done("ok", 1e9, None, samples=8).step_ms_median is None


@pytest.mark.unit
def test_a_compiled_run_without_warmup_leaves_its_first_step_out() -> None:
    """The preset asks for compile; the compiler itself is left out (a cold compile takes 30 s)."""
    uncompiled = Parts(compile_model=lambda model, preset: model)
    code, seen = run_fast(
        "mlp-demo", "steps=6", "warmup_steps=0", "compile='default'", parts=uncompiled
    )
    times = [s.step_ms for s in of(seen, ev.StepEvent)]
    assert code == EXIT_OK
    median = of(seen, ev.DoneEvent)[0].step_ms_median
    assert median == pytest.approx(statistics.median(times[1:]), abs=1e-3)  # events round


@pytest.mark.unit
def test_steps_that_count_grad_zeros_are_left_out_of_the_timing() -> None:
    stats = tally_of([500.0, 10.0, 90.0, 10.0, 12.0], warmup_steps=1, instrumented={0, 2})
    assert stats.timed().exact == [10.0, 10.0, 12.0]
    every = tally_of([5.0, 7.0], warmup_steps=0, instrumented={0, 1})
    assert every.timed().exact == [5.0, 7.0]  # every step measured: none left out


def tally_of(
    step_ms: list[float], warmup_steps: int, compiled: bool = False, instrumented: Set[int] = ()
) -> StepTally:
    """A run's tally of steps that took ``step_ms``, the ``instrumented`` ones counting zeros."""
    tally = StepTally(warmup_steps, compiled)
    for i, ms in enumerate(step_ms):
        tally.add(i, ms, 1.0, False, instrumented=i in instrumented)
    return tally


# --------------------------------------------------------------------------- grad zeros


@pytest.mark.unit
def test_zero_fraction_is_exact_in_slices_and_on_strided_views() -> None:
    grad = torch.randn(3, 1000, 7)
    grad.view(-1)[::9] = 0.0  # 2334 zeros of 21000
    exact = (grad == 0).sum().item() / grad.numel()
    assert zero_fraction(grad, chunk=1000).item() == pytest.approx(exact, abs=1e-7)
    strided = grad.transpose(0, 2)  # not contiguous
    assert zero_fraction(strided, chunk=1000).item() == pytest.approx(exact, abs=1e-7)
    assert zero_fraction(torch.zeros(5, dtype=torch.float16)).item() == 1.0


@pytest.mark.unit
def test_zero_fraction_allocates_no_temporary_the_size_of_the_gradient() -> None:
    """torch.profiler's allocator bytes: ``(grad == 0).float().mean()`` took 5 bytes an element."""
    grad = torch.randn(1 << 21)
    grad[::4] = 0.0
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fraction = zero_fraction(grad, chunk=1 << 14)
    largest = max(e.cpu_memory_usage for e in prof.events())
    assert fraction.item() == pytest.approx(0.25)
    assert largest < grad.numel() // 64  # under 32 KiB against an 8 MiB gradient


# --------------------------------------------------------------------------- CUDA memory


class FakeCudaMemory(FakeCuda):
    """Counts how often the allocator's statistics are built, by the one call a step needs
    or by any of its siblings (each rebuilds them whole); the figures are known."""

    builds: int = 0

    def memory_stats_as_nested_dict(self, device=None) -> dict:
        self.builds += 1
        return {
            "allocated_bytes": {"all": {"current": 3 << 30, "peak": 5 << 30}},
            "reserved_bytes": {"all": {"current": 8 << 30, "peak": 8 << 30}},
        }

    def memory_stats(self, device=None) -> dict:
        self.builds += 1
        return {
            "allocated_bytes.all.current": 3 << 30,
            "allocated_bytes.all.peak": 5 << 30,
            "reserved_bytes.all.current": 8 << 30,
        }

    def memory_allocated(self, device=None) -> int:
        return self.memory_stats()["allocated_bytes.all.current"]

    def memory_reserved(self, device=None) -> int:
        return self.memory_stats()["reserved_bytes.all.current"]

    def max_memory_allocated(self, device=None) -> int:
        return self.memory_stats()["allocated_bytes.all.peak"]


@pytest.mark.unit
def test_cuda_memory_is_read_once_a_step() -> None:
    fake = FakeCudaMemory()
    cuda = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))
    setup = SimpleNamespace(
        info=cuda,
        policy=SimpleNamespace(use_scaler=False),
        preset=SimpleNamespace(lr=1e-3, grad_zero_every=0),
        flops=SimpleNamespace(per_step=1e12),
        workload=SimpleNamespace(step_sizes=lambda step: (8, None, 1.0)),
    )
    seen: list[ev.Event] = []
    writer = SimpleNamespace(emit=lambda e, urgent=False: seen.append(e))
    stats = StepTally(warmup_steps=0)
    reporter = StepReporter(setup, writer, stats, None)  # type: ignore[arg-type]
    memory = MemoryReader(cuda.device, cuda=fake)
    nan = float("nan")
    for i in range(3):
        reporter.report([memory.figures(0, FinishedStep(i, 100.0, [2.0, 1.0, nan, nan, nan]))])
    assert fake.builds == 3
    last = of(seen, ev.StepEvent)[-1]
    assert (last.mem_allocated, last.mem_reserved, last.mem_peak) == (3 << 30, 8 << 30, 5 << 30)
    assert stats.mem_peak == 5 << 30  # peak allocated, not the 8 GiB reserved


# --------------------------------------------------------------------------- torch floor


@pytest.mark.unit
def test_a_torch_without_the_tf32_api_is_refused_with_the_version_it_needs(monkeypatch) -> None:
    """torch before 2.9 has no ``fp32_precision``: a user error naming both versions, exit 2."""
    monkeypatch.setattr(torch.backends.cuda, "matmul", SimpleNamespace(allow_tf32=False))
    monkeypatch.setattr(torch, "__version__", "2.6.0+cu124")
    code, seen = run_fast("fp32", "steps=2")
    error = of(seen, ev.ErrorEvent)[0]
    assert code == EXIT_USAGE and error.kind == "config"
    assert "torch 2.9 or newer" in error.message and "torch 2.6.0+cu124" in error.message
    assert of(seen, ev.DoneEvent)[0].status == "failed"


@pytest.mark.unit
def test_the_declared_torch_floor_has_the_tf32_api() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    floor = re.search(r'"torch>=([\d.]+)"', text)
    assert floor and floor.group(1) == TF32_API_SINCE
