"""``ampscope profile`` and the engine's profiles: the split, its rules, and torch.profiler's own
figures for the same steps."""

from __future__ import annotations

import contextlib
import gzip
import json
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from ampscope.core import events as ev
from ampscope.core import profiles
from ampscope.core.profiles import compare
from ampscope.core.profiles.rules import OpTime, op_class, short_dtype


@pytest.mark.unit
@pytest.mark.parametrize(
    ("name", "phase", "cls"),
    [
        ("aten::addmm", "forward", "matmul"),
        ("aten::mm", "backward", "matmul"),
        ("aten::add_", "optimizer", "optimizer"),  # the phase decides first
        ("aten::mul", "scaler", "loss_scaling"),
        ("aten::gelu", "forward", "norm_act"),
        ("aten::native_layer_norm_backward", "backward", "norm_act"),
        ("aten::_to_copy", "forward", "elementwise"),
        ("aten::_scaled_dot_product_flash_attention", "forward", "attention"),
        ("aten::convolution", "forward", "conv"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "forward", "matmul"),
        ("void at::native::vectorized_elementwise_kernel<4, ...>", None, "elementwise"),
        ("triton_poi_fused_add_gelu_0", "forward", "elementwise"),
        ("flash_fwd_kernel", "forward", "attention"),
        ("Memcpy HtoD (Pageable -> Device)", None, "memcpy"),
        ("ncclDevKernel_AllReduce_Sum_f32", "optimizer", "communication"),
        ("void at::native::_amp_foreach_non_finite_check_and_unscale_cuda", None, "loss_scaling"),
        ("ampscope.data", None, "data"),
        ("ampscope.forward", None, "other"),
        ("aten::t", "forward", "other"),
        ("aten::ones_like", "backward", "elementwise"),  # the gradient backward starts from
    ],
)
def test_each_op_lands_in_its_class(name: str, phase: str | None, cls: str) -> None:
    assert op_class(name, phase) == cls


@pytest.mark.unit
def test_the_format_of_a_matmul_comes_from_its_inputs_or_its_kernel() -> None:
    assert short_dtype(["c10::BFloat16", "c10::BFloat16"]) == "bf16"
    assert short_dtype(["float"]) == "fp32"
    assert short_dtype((), "ampere_sgemm_128x64_tn") == "fp32"
    assert short_dtype((), "sm80_xmma_gemm_f16f16_f16f32") == "fp16"
    assert short_dtype((), "some_kernel") is None


def _profile(timing: str, idle_us: float = 0.0, **us: float) -> ev.ProfileEvent:
    ops = [
        OpTime(f"op-{cls}", cls, t, 2, "fp32" if cls == "matmul" else None) for cls, t in us.items()
    ]
    return profiles.summarize(ops, 1000.0 * 2, step=3, steps=2, timing=timing, idle_us=idle_us)


@pytest.mark.unit
def test_the_shares_sum_to_one_with_python_time_as_other_on_a_cpu() -> None:
    p = _profile("cpu", matmul=1000, elementwise=600)
    assert sum(p.classes.values()) == pytest.approx(1.0, abs=1e-4)
    assert p.classes["matmul"] == pytest.approx(0.5) and p.classes["other"] == pytest.approx(0.2)
    assert p.step_ms == pytest.approx(1.0) and p.classes["idle"] == 0.0
    assert [o.name for o in p.top_ops] == ["op-matmul", "op-elementwise"]


@pytest.mark.unit
def test_on_a_gpu_time_with_no_kernel_is_idle_and_overlapping_kernels_are_scaled_to_fit() -> None:
    p = _profile("device", idle_us=500, matmul=1000, elementwise=500)
    assert p.classes["idle"] == pytest.approx(0.25) and p.classes["other"] == 0.0
    # two streams: 2400 us of kernels in 1500 us of busy time
    q = _profile("device", idle_us=500, matmul=1600, elementwise=800)
    assert sum(q.classes.values()) == pytest.approx(1.0, abs=1e-4)
    assert q.classes["matmul"] == pytest.approx(0.5) and q.classes["idle"] == pytest.approx(0.25)


@pytest.mark.unit
def test_kernels_are_classed_with_the_op_and_the_phase_that_launched_them() -> None:
    from ampscope.engine.profiling.collect import covered_us, device_op_times

    cpu = SimpleNamespace(name="x", device_type="CPU", cpu_parent=None)
    opt = SimpleNamespace(name="ampscope.optimizer", device_type="CPU", cpu_parent=None, id=1)
    fwd = SimpleNamespace(name="ampscope.forward", device_type="CPU", cpu_parent=None, id=2)
    mm = SimpleNamespace(
        name="aten::mm", device_type="CPU", cpu_parent=fwd, id=3, input_dtypes=["c10::BFloat16"]
    )
    add = SimpleNamespace(name="aten::_foreach_add_", device_type="CPU", cpu_parent=opt, id=4)
    del cpu

    def kernel(name: str, start: float, end: float, launcher: int) -> SimpleNamespace:
        return SimpleNamespace(
            name=name,
            device_type="CUDA",
            time_range=SimpleNamespace(start=start, end=end),
            linked_correlation_id=launcher,
            cpu_parent=None,
        )

    events = [
        opt, fwd, mm, add,
        kernel("sm90_xmma_gemm_bf16bf16", 0, 60, 3),
        kernel("multi_tensor_apply_kernel", 70, 90, 4),
        kernel("vectorized_elementwise_kernel", 80, 100, 4),  # overlaps the one before
    ]  # fmt: skip
    rows, busy = device_op_times(events)
    assert [(r.cls, r.dtype) for r in rows] == [
        ("matmul", "bf16"),
        ("optimizer", None),
        ("optimizer", None),
    ]
    assert busy == 90.0 == covered_us([(0, 60), (70, 90), (80, 100)])


@pytest.mark.unit
def test_kernels_on_an_h200_take_their_ops_class_and_format_and_the_ranges_are_not_work() -> None:
    """The shapes of torch.profiler's events as an H200 gave them: the engine's ranges come
    back as GPU user annotations spanning their kernels (they had taken 31 % of the split, as
    'other'), and the CUDA runtime's calls are CPU events whose CUPTI ids take the same
    numbers as the ops' ids (the kernels had found the runtime call, not the op, and lost
    its format: 'no bf16 matmul' on an amp-bf16 run)."""
    from ampscope.core import profiles
    from ampscope.engine.profiling.collect import device_op_times

    def cpu(name: str, id: int, parent: object = None, linked: int = 0, **kw: object) -> object:
        return SimpleNamespace(
            name=name, device_type="CPU", cpu_parent=parent, id=id,
            linked_correlation_id=linked, is_async=False, **kw,
        )  # fmt: skip

    def gpu(name: str, start: float, end: float, linked: int, **kw: object) -> object:
        return SimpleNamespace(
            name=name, device_type="CUDA", cpu_parent=None, id=900 + int(start),
            time_range=SimpleNamespace(start=start, end=end), linked_correlation_id=linked, **kw,
        )  # fmt: skip

    bf16 = ["c10::BFloat16", "c10::BFloat16"]
    fwd, bwd = cpu("ampscope.forward", 1), cpu("ampscope.backward", 2)
    mm = cpu("aten::mm", 3, fwd, input_dtypes=bf16)
    sdpa = cpu("aten::_scaled_dot_product_cudnn_attention_backward", 4, bwd, input_dtypes=bf16)
    ln = cpu("aten::native_layer_norm_backward", 5, bwd, input_dtypes=["float"])
    copy = cpu("aten::copy_", 6, fwd, input_dtypes=["float", "float"])
    events = [
        fwd, bwd, mm, sdpa, ln, copy,
        # runtime calls: their own (CUPTI) ids are 3..6 too, and they link to their op
        cpu("cudaLaunchKernel", 3, mm, linked=4), cpu("cudaLaunchKernel", 4, sdpa, linked=5),
        cpu("cudaLaunchKernel", 5, ln, linked=3), cpu("cudaMemcpyAsync", 6, copy, linked=6),
        gpu("ampscope.forward", 0, 100, 1, is_user_annotation=True),
        gpu("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 0, 40, 3),
        gpu("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", 40, 60, 4),
        gpu("void at::native::GammaBetaBackwardCUDAKernelTemplate<float, float>", 60, 70, 5),
        gpu("Memcpy DtoD (Device -> Device)", 70, 75, 6),
    ]  # fmt: skip
    rows, busy = device_op_times(events)
    assert [(r.cls, r.dtype) for r in rows] == [
        ("matmul", "bf16"),
        ("attention", "bf16"),  # the kernel's name says f16; its inputs were bf16
        ("norm_act", None),
        ("memcpy", None),
    ]
    assert busy == 75.0  # the range's 100 us span is not busy time
    p = profiles.summarize(rows, 100.0, step=5, steps=1, timing="device", idle_us=25.0)
    assert p.classes["matmul"] == pytest.approx(0.40) and p.classes["other"] == 0.0
    assert p.dtypes["matmul"] == {"bf16": pytest.approx(0.40)}


@pytest.mark.unit
def test_the_advice_names_the_largest_cost_and_the_diff_says_what_moved() -> None:
    fp32 = _profile("device", idle_us=100, matmul=1500, elementwise=300)
    assert "fp32" in profiles.advice(fp32) and "bf16 autocast" in profiles.advice(fp32)
    bf16 = profiles.summarize(
        [
            OpTime("gemm", "matmul", 480, 2, "bf16"),
            OpTime("aten::add", "elementwise", 236, 2),
            OpTime("aten::_to_copy", "elementwise", 100, 2, cast=True),
        ],
        1000.0,
        step=3,
        steps=2,
        timing="device",
        idle_us=184,
    )
    line = ", ".join(compare.change_parts(fp32, bf16))
    assert "matmul \u221268 %" in line and "elementwise +12 % (casts)" in line
    idle = _profile("device", idle_us=1400, matmul=300)
    assert "idle" in profiles.advice(idle) and "torch.compile" in profiles.advice(idle)


class _Writer:
    def __init__(self) -> None:
        self.events: list[ev.Event] = []

    def emit(self, event: ev.Event, urgent: bool = False) -> None:
        self.events.append(event)


TOP_LEVEL = {
    "aten::linear": "matmul",
    "AddmmBackward0": "matmul",
    "aten::gelu": "norm_act",
    "GeluBackward0": "norm_act",
    "aten::relu": "norm_act",
    "ReluBackward0": "norm_act",
    "aten::cross_entropy_loss": "norm_act",
    "LogSoftmaxBackward0": "norm_act",
    "NllLossBackward0": "norm_act",
    "ToCopyBackward0": "elementwise",
    "torch::autograd::AccumulateGrad": "elementwise",
    "aten::ones_like": "elementwise",  # the gradient backward starts from: a fill
}
"""What each op the forward and backward ranges call directly does, by hand (autograd's
nodes by their ``evaluate_function: NAME``)."""


def reference_split(prof, total_us: float) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """The step split from torch.profiler's own tree, as a user reads it: each op the model
    calls, with everything it calls (its inclusive ``cpu_time_total``), in the class of what it
    does; the format conversions autocast runs inside an op (``aten::to``) are elementwise; the
    optimizer's, the scaler's and the data's ranges whole; the rest (Python between ops, view
    ops) other."""
    events = prof.events()
    split: dict[str, float] = defaultdict(float)
    for phase, cls in (("optimizer", "optimizer"), ("scaler", "loss_scaling"), ("data", "data")):
        split[cls] += sum(e.cpu_time_total for e in events if e.name == f"ampscope.{phase}")

    def conversions(e):  # type: ignore[no-untyped-def]
        if e.name == "aten::to":
            return e.cpu_time_total
        return sum(conversions(c) for c in e.cpu_children)

    for e in events:
        if e.cpu_parent is None and e.name in ("aten::stack", "aten::to"):  # the batch, unmarked
            split["elementwise"] += e.cpu_time_total
        if e.cpu_parent is None or e.cpu_parent.name not in (
            "ampscope.forward",
            "ampscope.backward",
        ):
            continue
        name = e.name.removeprefix("autograd::engine::evaluate_function: ")
        cls = TOP_LEVEL.get(name, "elementwise" if name == "aten::to" else "other")
        casts = 0.0 if name == "aten::to" else conversions(e)
        split[cls] += e.cpu_time_total - casts
        split["elementwise"] += casts
    split.pop("other", None)
    shares = {cls: us / total_us for cls, us in split.items()}
    shares["other"] = 1.0 - sum(shares.values())
    return shares


@pytest.mark.unit
def test_the_split_matches_torch_profilers_own_key_averages_over_the_same_steps(
    tmp_path: Path,
) -> None:
    from ampscope.core import presets
    from ampscope.engine.device import resolve_device
    from ampscope.engine.lifecycle.loop import train_step
    from ampscope.engine.profiling import ProfileControl
    from ampscope.engine.step.setup import build

    preset = presets.load_preset(
        "amp-bf16",
        ["workload.kind='mlp'", "workload.width=64", "workload.layers=3", "batch_size=16"],
    )
    s = build(preset, resolve_device("cpu"))
    writer = _Writer()
    seen: dict[str, object] = {}

    class Keeping(ProfileControl):  # torch.profiler's own object, kept to compare with
        def _summarize(self, prof, measured_us, steps):  # type: ignore[no-untyped-def]
            seen.update(prof=prof, measured_us=measured_us)
            return super()._summarize(prof, measured_us, steps)

    control = Keeping(writer, s.info.device, tmp_path, first=(2, 3))  # type: ignore[arg-type]
    for step in range(6):
        control.before_step(step)
        train_step(s, step, False, control.phase)
        control.after_step(step)
    (profile,) = [e for e in writer.events if isinstance(e, ev.ProfileEvent)]
    assert (profile.step, profile.steps, profile.timing) == (2, 3, "cpu")
    assert sum(profile.classes.values()) == pytest.approx(1.0, abs=0.05)

    rows = {r.key: r for r in seen["prof"].key_averages()}  # type: ignore[attr-defined]
    total = float(seen["measured_us"])  # type: ignore[arg-type]

    reference = reference_split(seen["prof"], total)
    assert reference["matmul"] > 0 and reference["optimizer"] > 0  # shares move with load
    assert reference["elementwise"] > 0
    # Over the same trace every op is classed alike, so the shares agree whatever the load did
    # to the op times (a preempted op once moved a share by 0.02: it was classed differently).
    for cls, share in reference.items():
        assert profile.classes[cls] == pytest.approx(share, abs=1e-3), cls
    # elementwise is small here (autocast's casts): close in proportion too, not only within 2 %
    assert profile.classes["elementwise"] == pytest.approx(reference["elementwise"], rel=0.1)
    assert profile.dtypes["matmul"].keys() == {"bf16"}  # autocast ran the matmuls in bf16
    # A listed op is counted and timed as torch counts it, where all its calls are one row (one
    # class, one format). A cast such as aten::_to_copy is split among rows (the optimizer's
    # casts are the optimizer's), some of them below the list: once, under load, it topped the
    # list with 45 of torch's 123 calls.
    # Which ops make the list moves with the load (a preempted op tops it): every listed op
    # whose calls all fall in one row is checked, the forward's matmul among them when listed.
    from ampscope.engine.profiling.collect import cpu_op_times

    kinds = defaultdict(set)
    for op in cpu_op_times(seen["prof"].events()):  # type: ignore[attr-defined]
        kinds[op.name].add((op.cls, op.dtype))
    assert kinds["aten::addmm"] == {("matmul", "bf16")}
    whole = [o for o in profile.top_ops if len(kinds[o.name]) == 1]
    assert whole
    for op in whole:
        assert op.calls == rows[op.name].count, op.name
        assert op.share == pytest.approx(rows[op.name].self_cpu_time_total / total, abs=1e-4)
    with gzip.open(profile.trace) as fh:  # type: ignore[arg-type]
        assert json.load(fh)["traceEvents"]
    assert not control.active


@pytest.mark.unit
def test_unasked_the_loop_gets_a_do_nothing_phase_until_a_request_file_appears(
    tmp_path: Path,
) -> None:
    import torch

    from ampscope.engine.profiling import ProfileControl, control, no_phase

    writer = _Writer()
    watch = ProfileControl(writer, torch.device("cpu"), tmp_path)  # type: ignore[arg-type]
    watch.before_step(0)
    assert watch.phase is no_phase and not watch.active
    profiles.ask_to_profile(tmp_path, 2)
    watch.before_step(1)  # checked at most twice a second: not yet
    assert not watch.active
    watch._next_check = 0.0
    watch.before_step(2)
    assert watch.active and not (tmp_path / profiles.REQUEST_FILE).exists()
    with watch.phase("forward"):
        torch.ones(4) @ torch.ones(4)
    watch.after_step(2)
    watch.end_run()  # stopped after one of the two steps asked: profiled what it got
    (profile,) = writer.events
    assert isinstance(profile, ev.ProfileEvent) and profile.steps == 1
    assert control.CHECK_EVERY_S == 0.5


@pytest.mark.unit
def test_profile_refuses_a_step_count_out_of_range(capsys: pytest.CaptureFixture[str]) -> None:
    from ampscope.cli.main import main

    assert main(["profile", "fp32", "--steps", "0"]) == 2
    err = capsys.readouterr().err
    assert "--steps 0" in err and f"1 to {profiles.MAX_STEPS}" in err
    assert main(["profile", "no-such-preset"]) == 2


@pytest.mark.unit
def test_ampscope_profile_json_prints_the_split_and_keeps_the_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.helpers import cli

    done = cli(
        capsys,
        "profile", "mlp-demo", "--device", "cpu", "--steps", "2", "--json",
        "--runs-dir", str(tmp_path),
        "--set", "workload.width=64", "--set", "workload.layers=2", "--set", "batch_size=8",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["preset"] == "mlp-demo" and data["steps"] == 2 and data["step_ms"] > 0
    assert abs(sum(data["classes"].values()) - 1.0) < 0.05
    assert {"name", "share", "calls", "class"} <= data["top_ops"][0].keys()
    assert Path(data["trace"]).is_file() and Path(data["trace"]).parent.parent == tmp_path
    assert data["advice"]


class _FakeProfile:
    """What save_trace asks of a profiler: a trace of ``size`` bytes of random text, or a
    failure of the export."""

    def __init__(self, size: int = 1000, fail: Exception | None = None) -> None:
        self.size, self.fail = size, fail
        self.written: list[str] = []

    def export_chrome_trace(self, path: str) -> None:
        import os

        if self.fail is not None:
            raise self.fail
        self.written.append(path)
        Path(path).write_bytes(os.urandom(self.size))  # random: gzip cannot shrink it


@pytest.mark.unit
def test_the_trace_is_written_outside_the_run_folder_bounded_and_only_the_last_few_kept(
    tmp_path: Path,
) -> None:
    from ampscope.engine.profiling import trace

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    big = _FakeProfile(size=8192)
    path, size, note = trace.save_trace(big, run_dir, 5, limit=4096)
    assert (path, size) == (None, None) and note is not None
    assert note.startswith("no Chrome trace: ") and note.endswith("kept; profile fewer steps")
    assert not list(run_dir.iterdir())  # neither the raw trace nor the oversized one stays
    assert run_dir not in [Path(p).parent for p in big.written]
    assert not any(Path(p).exists() for p in big.written)

    for step in (10, 20, 30, 40, 50):
        path, size, note = trace.save_trace(_FakeProfile(size=1000), run_dir, step)
        assert note is None and path is not None and size is not None and Path(path).exists()
    kept = sorted(p.name for p in run_dir.iterdir())
    assert kept == [f"profile-step{s}.trace.json.gz" for s in (30, 40, 50)]
    assert trace.KEEP_TRACES == 3


@pytest.mark.unit
def test_a_trace_that_cannot_be_exported_costs_the_trace_not_the_profile(tmp_path: Path) -> None:
    import torch

    from ampscope.engine.profiling import ProfileControl, trace

    failing = _FakeProfile(fail=RuntimeError("the trace's JSON could not be made"))
    path, size, note = trace.save_trace(failing, tmp_path, 3)
    assert (path, size) == (None, None)
    assert note == "no Chrome trace: it could not be written (the trace's JSON could not be made)"
    assert not list(tmp_path.iterdir())

    writer = _Writer()
    control = ProfileControl(writer, torch.device("cpu"), tmp_path, first=(0, 1))  # type: ignore[arg-type]
    export = torch.profiler.profile.export_chrome_trace

    def broken(self, path):  # type: ignore[no-untyped-def]
        raise ValueError("no trace today")

    torch.profiler.profile.export_chrome_trace = broken  # type: ignore[method-assign]
    try:
        control.before_step(0)
        with control.phase("forward"):
            torch.ones(4) @ torch.ones(4)
        control.after_step(0)
    finally:
        torch.profiler.profile.export_chrome_trace = export  # type: ignore[method-assign]
    (profile,) = writer.events
    assert isinstance(profile, ev.ProfileEvent) and profile.trace is None
    assert profile.note == "no Chrome trace: it could not be written (no trace today)"


@pytest.mark.unit
def test_copies_are_called_casts_only_where_a_narrow_format_ran_and_cpu_advice_says_cpu():
    """An fp32 run's copies are copies, not casts between formats; and on a CPU the advice
    for fp32 matmuls does not promise Tensor Cores."""
    from ampscope.core import profiles
    from tests.helpers import split_profile

    fp32_cpu = split_profile(10.0, "cpu", matmul_fp32=6.0, casts=0.5, optimizer=1.0)
    assert profiles.label("elementwise", fp32_cpu) == "elementwise"
    assert "Tensor Cores are where it pays" in profiles.advice(fp32_cpu)
    assert "(AMX, AVX512-BF16" in profiles.advice(fp32_cpu)
    amp = split_profile(10.0, "device", matmul_bf16=4.0, matmul_fp32=1.0, casts=0.5)
    # the casts are a row of their own under elementwise, each figure a share of the step
    assert profiles.label("elementwise", amp) == "elementwise"
    assert profiles.casts_share("elementwise", amp) == pytest.approx(0.05)
    assert profiles.casts_share("elementwise", fp32_cpu) is None
    lines = profiles.render(amp, "amp").splitlines()
    row = next(i for i, ln in enumerate(lines) if ln.strip().startswith("elementwise"))
    assert lines[row + 1].split() == ["of", "which", "casts", "5%", "\u2588\u2588"]
    assert "elementwise 5% (casts 5% of the step)" in profiles.headline(amp, most=6)
    fp32_gpu = split_profile(10.0, "device", matmul_fp32=9.0, optimizer=1.0)
    assert profiles.advice(fp32_gpu).endswith(
        "bf16 autocast (Tensor Cores: --set precision='amp-bf16') or tf32 (--set "
        "precision='tf32') would help most."
    )


@pytest.mark.unit
def test_a_run_without_a_grad_scaler_spends_nothing_on_loss_scaling(tmp_path):
    """The disabled GradScaler's calls (unscale_, update: nothing to do) are the optimizer's
    time in a profile: an fp32 run listed 'loss scaling 1 %'."""
    from ampscope.core import presets
    from ampscope.engine.device import resolve_device
    from ampscope.engine.lifecycle.loop import train_step
    from ampscope.engine.step.setup import build

    preset = presets.load_preset(
        "fp32", ["workload.kind='mlp'", "workload.width=32", "batch_size=8"]
    )
    s = build(preset, resolve_device("cpu"))
    marked: list[str] = []

    def phase(name: str):
        marked.append(name)
        return contextlib.nullcontext()

    train_step(s, 0, False, phase)
    assert "scaler" not in marked and marked.count("optimizer") >= 3


@pytest.mark.unit
def test_a_relu_mlp_splits_as_torch_profilers_tree_says_and_fp32_copies_are_not_casts(
    tmp_path: Path,
) -> None:
    """ReLU's kernels (aten::clamp_min, and aten::threshold_backward under autograd's
    ReluBackward0) are the activation's, not elementwise and not "other"; addmm's bias copies
    in an fp32 run are copies, not casts. Once: threshold_backward, 40 % of the step, in other."""
    import torch

    from ampscope.core import presets
    from ampscope.engine.device import resolve_device
    from ampscope.engine.lifecycle.loop import train_step
    from ampscope.engine.profiling import ProfileControl
    from ampscope.engine.step.setup import build

    model = str(Path(__file__).parent / "data" / "real_models.py") + ":relu_mlp"
    preset = presets.load_preset("fp32", [f"workload.model='{model}'", "batch_size=256"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        s = build(preset, resolve_device("cpu"))
        writer = _Writer()
        seen: dict[str, object] = {}

        class Keeping(ProfileControl):  # torch.profiler's own object, kept to compare with
            def _summarize(self, prof, measured_us, steps):  # type: ignore[no-untyped-def]
                seen.update(prof=prof, measured_us=measured_us)
                return super()._summarize(prof, measured_us, steps)

        control = Keeping(writer, s.info.device, tmp_path, first=(2, 3))  # type: ignore[arg-type]
        for step in range(5):
            control.before_step(step)
            train_step(s, step, False, control.phase)
            control.after_step(step)
    finally:
        torch.set_num_threads(threads)
    (profile,) = [e for e in writer.events if isinstance(e, ev.ProfileEvent)]
    reference = reference_split(seen["prof"], float(seen["measured_us"]))  # type: ignore[arg-type]
    rows = {r.key: r for r in seen["prof"].key_averages()}  # type: ignore[attr-defined]
    assert rows["aten::threshold_backward"].self_cpu_time_total > 0
    # ReLU's kernels are the activation's: at least their own share (4-30 % here, with load)
    relu_kernels = sum(
        rows[n].self_cpu_time_total for n in ("aten::threshold_backward", "aten::clamp_min")
    ) / float(seen["measured_us"])  # type: ignore[arg-type]
    assert profile.classes["norm_act"] >= relu_kernels - 0.01
    for cls in ("matmul", "norm_act", "elementwise", "optimizer", "other"):
        assert profile.classes[cls] == pytest.approx(reference[cls], abs=0.03), cls
    kinds = {o.name: o.kind for o in profile.top_ops}
    assert kinds.get("aten::threshold_backward", "norm_act") == "norm_act"
    assert kinds.get("aten::clamp_min", "norm_act") == "norm_act"
    assert rows["aten::copy_"].count > 0 and profile.casts == 0.0  # fp32: no format changed
    # the bias copies, the bias sums of addmm's backward and autograd's nodes ran for an fp32
    # addmm: the matmul row's fp32 is all of it, as the advice counts it (once 10 % apart)
    assert profile.dtypes["matmul"] == {"fp32": pytest.approx(profile.classes["matmul"], abs=1e-4)}


KINETO_PROBE = """
import torch
from ampscope.core import events as ev
from ampscope.engine.profiling.control import ProfileControl

class Writer:
    def emit(self, event, urgent=False):
        print(type(event).__name__)

control = ProfileControl(Writer(), torch.device("cpu"), first=(0, 1))
control.before_step(0)
torch.ones(64, 64) @ torch.ones(64, 64)
control.after_step(0)
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("users_level", [None, "0"])
def test_a_profile_writes_no_kineto_lines_to_the_terminal(users_level: str | None) -> None:
    """torch's profiler library prints 'USDT: ... profiler_start' to stderr; ampscope's
    profiles leave the terminal to ampscope, unless the user set KINETO_LOG_LEVEL."""
    import subprocess
    import sys

    from tests.helpers import engine_env

    env = engine_env()
    env.pop("KINETO_LOG_LEVEL", None)
    if users_level is not None:
        env["KINETO_LOG_LEVEL"] = users_level
    done = subprocess.run(
        [sys.executable, "-c", KINETO_PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "ProfileEvent" in done.stdout  # the profile was taken
    if users_level is None:
        assert "profiler_start" not in done.stderr and "USDT" not in done.stderr, done.stderr
    else:  # theirs is kept: the check above is not blind
        assert "profiler_start" in done.stderr


@pytest.mark.unit
@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("utf8", "not JSON text"),
        (
            "huge",
            '"steps": inf',
        ),  # 1e400: json reads it as inf, which int() refused with OverflowError
        ("fifo", "not a regular file"),  # opened blocking, it froze the training loop
        ("zero", "a link, not a file"),  # read to the end, it filled memory
        ("list", "not {"),
    ],
)
def test_a_bad_profile_request_is_refused_with_a_warning_and_training_goes_on(
    tmp_path: Path, kind: str, said: str
) -> None:
    import os

    import torch

    from ampscope.engine.profiling import ProfileControl

    request = tmp_path / profiles.REQUEST_FILE
    if kind == "utf8":
        request.write_bytes(b'{"steps": "\xff\xfe"}')
    elif kind == "huge":
        request.write_text('{"steps": 1e400}')
    elif kind == "fifo":
        os.mkfifo(request)
    elif kind == "zero":
        request.symlink_to("/dev/zero")
    else:
        request.write_text("[5]")
    writer = _Writer()
    control = ProfileControl(writer, torch.device("cpu"), tmp_path)  # type: ignore[arg-type]
    assert control.before_step(3) is False and not control.active
    (warning,) = writer.events
    assert isinstance(warning, ev.WarningEvent) and warning.code == "profile-failed"
    assert "request was refused" in warning.message and said in warning.message
    assert not os.path.lexists(request)  # removed: refused once, not every half second
    profiles.ask_to_profile(tmp_path, 2)  # a good request afterwards is taken
    control._next_check = 0.0
    assert control.before_step(4) is True
    control.close()


@pytest.mark.unit
@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("aten::mkldnn_rnn_layer", "matmul"),  # an LSTM's or GRU's own kernel on a CPU
        ("MkldnnRnnLayerBackward0", "matmul"),
        ("aten::_cudnn_rnn", "matmul"),
        ("aten::lstm", "matmul"),
        ("aten::linalg_vector_norm", "elementwise"),  # gradient clipping's norm: a reduction
        ("aten::_foreach_norm", "elementwise"),
        ("aten::native_layer_norm", "norm_act"),  # a norm layer stays one
        ("aten::native_batch_norm", "norm_act"),
    ],
)
def test_recurrent_kernels_are_matmul_and_vector_norms_are_no_norm_layers(name, cls) -> None:
    """An LSTM's kernel, most of its step, was filed under 'other' (Python between ops), and
    clip_grad_norm_'s norms under 'norm, activation'."""
    assert op_class(name) == cls
