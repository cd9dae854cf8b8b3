"""The engine on the CPU: real training, a well-formed stream, and every way a run can end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.processes.launch import engine_command
from ampscope.engine.lifecycle.parts import Parts
from ampscope.engine.lifecycle.run import EXIT_FAILED, EXIT_OK, EXIT_STOPPED, EXIT_USAGE, run
from tests.helpers import ROOT, engine_env

FAST = ["workload.kind='mlp'", "device='cpu'"]  # a small MLP: milliseconds per step on a CPU


def run_preset(
    name: str, *overrides: str, runs_dir: Path | None = None, parts: Parts | None = None
) -> tuple[int, list[ev.Event]]:
    seen: list[ev.Event] = []
    code = run(
        name,
        [*FAST, *overrides],
        runs_dir=runs_dir,
        record=runs_dir is not None,
        on_event=seen.append,
        parts=parts,
    )
    return code, seen


def of(events: list[ev.Event], kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "fp32",
        "tf32",
        "amp-bf16",
        "amp-fp16",
        "amp-fp16-noscale",
        "bf16",
        "fp16",
        "mlp-demo",
        "cnn-amp-bf16",
    ],
)
def test_preset_runs_and_emits_a_well_formed_stream(name: str, tmp_path: Path) -> None:
    overrides = ["steps=3", "warmup_steps=1"]
    if name == "cnn-amp-bf16":
        code = run(name, [*overrides, "device='cpu'"], runs_dir=tmp_path, on_event=None)
    else:
        code, _ = run_preset(name, *overrides, runs_dir=tmp_path)
    (record_dir,) = tmp_path.iterdir()
    lines = (record_dir / records.EVENTS_FILE).read_bytes().splitlines()
    decoded = [ev.decode(line) for line in lines]
    assert not [d for d in decoded if isinstance(d, ev.UnknownEvent)]
    assert all(json.loads(line)["v"] == ev.SCHEMA_VERSION for line in lines)
    assert isinstance(decoded[0], ev.PhaseEvent) and decoded[0].phase == "setup"
    hello = of(decoded, ev.HelloEvent)[0]
    assert hello.preset == name and hello.device == "cpu" and hello.flops_per_step > 0
    assert isinstance(decoded[-1], ev.DoneEvent)
    steps = of(decoded, ev.StepEvent)
    if name == "fp16":  # pure fp16 runs out of range: a nan error, not a hang
        assert code == EXIT_FAILED and decoded[-1].status == "failed"
        assert of(decoded, ev.ErrorEvent)[0].kind == "nan"
    else:
        assert code == EXIT_OK and decoded[-1].status == "ok"
        assert [s.step for s in steps] == [0, 1, 2]
    assert all(s.step_ms > 0 and s.samples_per_s > 0 and s.tflops > 0 for s in steps)
    summary = json.loads((record_dir / records.SUMMARY_FILE).read_text())
    assert summary["done"]["status"] == decoded[-1].status
    assert json.loads((record_dir / records.CONFIG_FILE).read_text())["name"] == name


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fp32", "amp-bf16"])
def test_loss_falls(name: str) -> None:
    code, seen = run_preset(name, "steps=60", "lr=3e-3")
    losses = [s.loss for s in of(seen, ev.StepEvent)]
    assert code == EXIT_OK
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5


@pytest.mark.slow
def test_gpt_loss_falls_in_fp32() -> None:
    code = run("fp32", ["device='cpu'", "steps=40"], record=False, on_event=(seen := []).append)
    losses = [s.loss for s in of(seen, ev.StepEvent)]
    assert code == EXIT_OK and losses[-1] < 0.5 * losses[0]
    hello = of(seen, ev.HelloEvent)[0]
    assert hello.tokens_per_step == hello.config["batch_size"] * hello.config["workload"]["seq_len"]


@pytest.mark.unit
def test_scaler_skips_the_step_with_an_inf_and_halves_the_scale() -> None:
    code, seen = run_preset("amp-fp16", "steps=8", "debug.inf_loss_at_step=4")
    steps = {s.step: s for s in of(seen, ev.StepEvent)}
    assert code == EXIT_OK
    assert steps[4].skipped and not steps[3].skipped and not steps[5].skipped
    assert steps[4].loss_scale == steps[3].loss_scale / 2
    assert steps[4].loss is None  # not finite
    assert of(seen, ev.DoneEvent)[0].skipped_steps == 1
    assert any(w.code == "skipped-step" and w.step == 4 for w in of(seen, ev.WarningEvent))


@pytest.mark.unit
def test_without_scaler_an_inf_loss_fails_the_run_with_a_nan_error() -> None:
    code, seen = run_preset("amp-bf16", "steps=8", "debug.inf_loss_at_step=3")
    error = of(seen, ev.ErrorEvent)[0]
    assert code == EXIT_FAILED and error.kind == "nan" and error.step == 3
    assert of(seen, ev.DoneEvent)[0].status == "failed"


# A GPT whose output gradients are small enough (2048 tokens per batch, 1024-token vocabulary)
# to fall below fp16's smallest subnormal once the model becomes confident.
UNDERFLOW = [
    "device='cpu'",
    "steps=24",
    "lr=1e-2",
    "grad_zero_every=23",
    "batch_size=32",
    "workload.width=32",
    "workload.layers=1",
    "workload.heads=2",
    "workload.vocab=1024",
]


@pytest.mark.slow
def test_fp16_without_scaling_loses_gradients_the_scaled_run_keeps() -> None:
    zeros = {}
    for name in ("amp-fp16", "amp-fp16-noscale"):
        seen: list[ev.Event] = []
        assert run(name, UNDERFLOW, record=False, on_event=seen.append) == EXIT_OK
        zeros[name] = of(seen, ev.StepEvent)[23].grad_zero_frac
    assert zeros["amp-fp16"] < 0.01
    assert zeros["amp-fp16-noscale"] > 0.05


@pytest.mark.slow
def test_grad_zero_frac_is_measured_only_every_n_steps() -> None:
    _, seen = run_preset("fp32", "steps=7", "grad_zero_every=3")
    measured = [s.step for s in of(seen, ev.StepEvent) if s.grad_zero_frac is not None]
    assert measured == [0, 3, 6]


@pytest.mark.slow
def test_exception_in_the_loop_is_an_error_event_and_the_record_is_kept(tmp_path: Path) -> None:
    code, seen = run_preset("fp32", "steps=10", "debug.raise_at_step=4", runs_dir=tmp_path)
    error = of(seen, ev.ErrorEvent)[0]
    assert code == EXIT_FAILED
    assert error.kind == "exception" and "debug.raise_at_step" in error.message
    assert "Traceback" in (error.traceback or "")
    record = records.load_run(next(tmp_path.iterdir()))
    assert [s.step for s in of(record.events, ev.StepEvent)] == [0, 1, 2, 3]
    assert record.status == "failed"


@pytest.mark.unit
def test_records_go_under_the_runs_dir_named_by_time_and_preset(tmp_path: Path) -> None:
    run_preset("mlp-demo", "steps=2", "warmup_steps=1", runs_dir=tmp_path)
    (path,) = tmp_path.iterdir()
    assert path.name.endswith("-mlp-demo") and path.name[:8].isdigit()
    (run_record,) = records.list_runs(tmp_path)
    assert run_record.status == "ok" and run_record.hello and run_record.hello.preset == "mlp-demo"


@pytest.mark.unit
def test_a_runs_dir_whose_name_is_not_utf8_records_a_readable_run(tmp_path: Path) -> None:
    # a folder named in another encoding (Latin-1's 0xff): Python holds the byte as a lone
    # surrogate, which JSON cannot carry; the run ended failed on the hello it could not write
    root = tmp_path / os.fsdecode(b"l\xe4ufe\xff")
    code, _ = run_preset("mlp-demo", "steps=2", "warmup_steps=1", runs_dir=root)
    assert code == EXIT_OK
    (run_record,) = records.list_runs(root)
    assert run_record.status == "ok" and run_record.problem is None
    assert run_record.hello is not None
    assert run_record.hello.run_dir == str(run_record.path).replace("\udce4", "\\xe4").replace(
        "\udcff", "\\xff"
    )
    loaded = records.load_run(run_record.path)
    assert loaded.unreadable_lines == 0 and len(of(loaded.events, ev.StepEvent)) == 2


@pytest.mark.unit
def test_an_event_with_a_string_that_is_no_text_is_written_with_its_bytes_escaped() -> None:
    warning = ev.WarningEvent(code="x", message="in /data/\udcff/a and \ud800")
    line = ev.encode(warning)
    read = ev.decode(line)
    assert line.endswith(b"\n") and isinstance(read, ev.WarningEvent)
    assert read.message == "in /data/\\xff/a and \\ud800"


@pytest.mark.subprocess
def test_sigterm_mid_run_ends_with_done_stopped_and_a_readable_record(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        engine_command("mlp-demo", ["steps=100000"], tmp_path),
        cwd=ROOT,
        env=engine_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    for line in proc.stdout:  # lines arrive while the run goes on: flushes are not held to the end
        if json.loads(line)["type"] == "step" or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGTERM)
    rest = proc.stdout.read().splitlines()
    assert proc.wait(timeout=30) == EXIT_STOPPED
    done = ev.decode(rest[-1])
    assert isinstance(done, ev.DoneEvent) and done.status == "stopped" and done.steps_done > 0
    record = records.load_run(next(tmp_path.iterdir()))
    assert record.status == "stopped"
    assert len(of(record.events, ev.StepEvent)) == done.steps_done


@pytest.mark.slow
@pytest.mark.subprocess
def test_compile_runs_on_the_smallest_model_with_a_fresh_cache(tmp_path: Path) -> None:
    """One cold compile (20-40 s on two cores): phases, counters and timing are reported."""
    proc = subprocess.run(
        engine_command(
            "compile-default",
            [
                "device='cpu'",
                "workload.kind='mlp'",
                "workload.layers=1",  # 11 C++ kernels to build: each about a second of CPU
                "workload.width=32",
                "precision='fp32'",
                "steps=6",
                "warmup_steps=2",
            ],
            extra=["--no-record"],
        ),
        cwd=ROOT,
        env=engine_env(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor")),
        capture_output=True,
        timeout=600,
    )
    assert proc.returncode == EXIT_OK, proc.stderr.decode()[-2000:]
    events = [ev.decode(line) for line in proc.stdout.splitlines()]
    phases = [(e.phase, e.state) for e in of(events, ev.PhaseEvent)]
    assert ("compile", "start") in phases and ("compile", "end") in phases
    assert phases.index(("compile", "end")) < phases.index(("train", "end"))
    compiled = of(events, ev.CompileEvent)[0]
    assert compiled.graphs >= 1 and compiled.compile_s and compiled.compile_s > 0
    done = of(events, ev.DoneEvent)[0]
    assert done.status == "ok" and done.compile_s == compiled.compile_s
    assert done.step_ms_median is not None and done.step_ms_median < 1000 * done.compile_s


@pytest.mark.unit
def test_out_of_memory_is_an_oom_error_with_a_hint(tmp_path: Path) -> None:
    import torch

    from ampscope.engine.lifecycle import loop

    real_step = loop.train_step

    def step_that_runs_out(s, step: int, *rest):
        if step == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real_step(s, step, *rest)

    code, seen = run_preset(
        "fp32", "steps=6", runs_dir=tmp_path, parts=Parts(train_step=step_that_runs_out)
    )
    error = of(seen, ev.ErrorEvent)[0]
    assert code == EXIT_FAILED and error.kind == "oom" and error.step == 2
    assert "Tried to allocate 20.00 GiB" in error.message
    assert error.hint and "batch_size" in error.hint
    assert records.load_run(next(tmp_path.iterdir())).status == "failed"


@pytest.mark.unit
def test_out_of_memory_in_a_cpu_run_on_a_gpu_machine_still_ends_with_done(monkeypatch) -> None:
    """CUDA's memory figures belong to CUDA runs: asked about a CPU device, torch raises."""
    import torch

    def cuda_only(device=None) -> int:
        raise ValueError(f"Expected a cuda device, but got: {device}")

    def step_that_runs_out(s, step: int, *rest):
        raise torch.OutOfMemoryError("CPU out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_allocated", cuda_only)
    monkeypatch.setattr(torch.cuda, "memory_reserved", cuda_only)
    code, seen = run_preset("fp32", "steps=3", parts=Parts(train_step=step_that_runs_out))
    error = of(seen, ev.ErrorEvent)[0]
    assert code == EXIT_FAILED and error.kind == "oom" and error.mem_allocated is None
    assert of(seen, ev.DoneEvent)[0].status == "failed"


@pytest.mark.unit
def test_a_gpu_without_bf16_is_refused_before_anything_is_built() -> None:
    import torch

    from ampscope.engine.device import DeviceInfo

    t4 = DeviceInfo(torch.device("cuda", 0), "Tesla T4", (7, 5), 16 * 2**30, 70.0, "t4-uuid")
    code, seen = run_preset("amp-bf16", parts=Parts(resolve_device=lambda spec, ranks=None: t4))
    error = of(seen, ev.ErrorEvent)[0]
    assert code == EXIT_USAGE and error.kind == "config"
    assert "Tesla T4 is 7.5" in error.message and "amp-fp16" in error.message
    assert of(seen, ev.HelloEvent) == [] and of(seen, ev.DoneEvent)[0].status == "failed"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("precision", "kind", "weights", "inputs", "computes_in"),
    [
        ("bf16", "mlp", "bfloat16", "bfloat16", "bfloat16"),
        ("fp16", "cnn", "float16", "float16", "float16"),
        ("bf16", "gpt", "bfloat16", "int64", "bfloat16"),  # token ids stay integers
        ("fp64", "mlp", "float64", "float64", "float64"),
        ("amp-bf16", "mlp", "float32", "float32", "bfloat16"),  # fp32 master weights, autocast
        ("fp32", "gpt", "float32", "int64", "float32"),
    ],
)
def test_the_precision_decides_every_dtype_and_the_loss_stays_fp32(
    precision: str, kind: str, weights: str, inputs: str, computes_in: str
) -> None:
    import torch

    from ampscope.core import presets
    from ampscope.engine.device import resolve_device
    from ampscope.engine.lifecycle.loop import train_step
    from ampscope.engine.step.setup import build

    preset = presets.load_preset("fp32", [f"precision='{precision}'", f"workload.kind='{kind}'"])
    s = build(preset, resolve_device("cpu"))
    x, y = s.workload.batch(0)
    with s.policy.autocast("cpu"):
        output = s.model(x)
        loss = s.workload.loss(output, y)
    assert {p.dtype for p in s.model.parameters()} == {getattr(torch, weights)}
    assert x.dtype == getattr(torch, inputs) and y.dtype == torch.int64
    assert output.dtype == getattr(torch, computes_in) and loss.dtype == torch.float32
    train_step(s, 0, measure_zeros=False)
    moments = {
        t.dtype for state in s.optimizer.state.values() for k, t in state.items() if k != "step"
    }
    assert moments == {getattr(torch, weights)}  # AdamW's state follows the weights


@pytest.mark.subprocess
def test_a_refused_preset_answers_before_torch_is_imported() -> None:
    script = (
        "import sys; from ampscope.engine.lifecycle.run import run; code = run('no-such-preset'); "
        "print('torch' in sys.modules); sys.exit(code)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=engine_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == EXIT_USAGE and out.stdout.strip() == "False"
    assert out.stderr.startswith("ampscope: Unknown preset 'no-such-preset'")
    assert "Traceback" not in out.stderr
