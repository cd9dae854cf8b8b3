"""The zoo (tests/data/zoo.py): models of the kinds users bring, through every command, each
figure checked against a reference the test computes on its own.

References: FLOPs from torch's ``FlopCounterMode`` on the real model (attention on the math
kernel, as model FLOPs are defined) or, for convolutions, a hand count; per-layer numerics
from torch's own casts of the layer's outputs and gradients on the same first step; the
parameters from ``model.parameters()``; memory from autograd's saved tensors
(``saved_tensors_hooks``) and the engine's own steady step under torch.profiler's allocator
records; the profile from torch.profiler's own table of the same steps;
fp8 layers from forward hooks that see which linear layers really run.

Every command runs in this process (``main()``; ``bench``'s runs too, in place of an engine
process each: the process boundary is tested in test_model_cli), a few steps each, and the
references are computed once a model (module-scoped caches): the zoo costs tens of
CPU-seconds, not minutes.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import math
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import ampscope
from ampscope.cli.main import main
from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.numerics.report import NOTABLE
from tests.data import zoo

pytestmark = pytest.mark.slow  # the whole zoo trained, profiled and measured: the full suite's
pytest.importorskip("transformers")

SPEC = Path(__file__).parent / "data" / "zoo.py"
MODELS = list(zoo.FACTORIES)
STEPS = 3
QUICK = ["--device", "cpu", "--set", "warmup_steps=1"]
CONV_MODELS = ("cnn_bn", "dw_separable", "unet")
TOKEN_MODELS = (
    "encoder",
    "hf_gpt2",
    "hf_bert",
    "lstm",
    "gru",
    "tied",
    "hf_llama",
    "moe",
    "tied_to_device",
)
WIDE_BATCH = ("unused", "root_computes", "root_exp")  # 2 x BATCH samples a step


def models(*names: str, xfail: str | None = None) -> list[Any]:
    """Parameters for these zoo models. Each model's tests share one xdist group: its cached
    runs and references are made once, on one worker. ``xfail``: their strict xfail reason."""
    marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
    return [pytest.param(n, id=n, marks=[pytest.mark.xdist_group(f"zoo-{n}"), *marks]) for n in names]  # fmt: skip


def spec(name: str) -> str:
    return f"{SPEC}:make_{name}"


def quiet_main(*argv: str, command: Callable[[], int] | None = None) -> tuple[int, str, str]:
    """``ampscope ARGV`` through ``main()`` (or ``command``), its stdout and stderr captured
    (usable where pytest's capsys is not: in a module-scoped cache)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = command() if command is not None else main(list(argv))
    return code, out.getvalue(), err.getvalue()


def stream(stdout: str) -> list[ev.Event]:
    return [e for e in (ev.decode(line) for line in stdout.splitlines() if line) if e]


def of(events: list[Any], kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


# ---------------------------------------------------------------------------------------------
# The references, computed once a model


def build(name: str) -> dict:
    """The factory's answer, as the engine gets it (seed 0, the preset's default)."""
    torch.manual_seed(0)
    ctx = ampscope.ModelContext(torch.device("cpu"), None, 0, "fp32")
    return zoo.FACTORIES[name](ctx)


def loss_of(answer: dict, model: nn.Module, batch: Any) -> torch.Tensor:
    """One forward and the loss, calling the model as docs/model.md says ampscope does."""
    if isinstance(batch, dict):
        return model(**batch).loss
    inputs, targets = batch
    out = model(*inputs) if isinstance(inputs, (tuple, list)) else model(inputs)
    return answer["loss"](out, targets)


FORMATS = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "e4m3": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
}


def cast_counts(t: torch.Tensor) -> dict:
    """What torch's own casts do to ``t``: per format, the finite values that become inf or
    NaN (overflow) and the non-zero values that become zero (underflow), with its amax."""
    x = t.detach().float().reshape(-1)
    counts: dict[str, Any] = {"amax": float(x.abs().max()), "numel": x.numel()}
    for key, dtype in FORMATS.items():
        y = x.to(dtype).float()
        counts[key] = {
            "overflow": int((~torch.isfinite(y) & torch.isfinite(x)).sum()),
            "underflow": int(((y == 0) & (x != 0)).sum()),
        }
    return counts


@dataclass
class Reference:
    params: int
    flops: float
    leaves: list[str]  # every leaf module, in named_modules() order
    ran: list[str]  # the leaves whose forward ran
    linears_ran: list[str]  # nn.Linear modules called as modules in the forward
    last_linear: str | None
    outputs: dict[str, dict] = field(default_factory=dict)  # leaf -> cast_counts of step 0
    grads: dict[str, dict] = field(default_factory=dict)
    weights: dict[str, dict] = field(default_factory=dict)  # parameter -> its gradient's
    saved_bytes: int = 0  # what autograd keeps for backward, parameters left out
    first_loss: float = math.nan


def hand_flops(model: nn.Module, answer: dict, batch: Any) -> float:
    """A conv net's training FLOPs by hand: each conv and linear layer's forward counts
    2 x outputs x (inputs a group x kernel) multiply-adds; the weight gradient costs as much,
    and so does the input gradient, except the first layer's (data needs none)."""
    forward: list[float] = []

    def hook(module: nn.Module, inputs: Any, out: torch.Tensor) -> None:
        if isinstance(module, nn.ConvTranspose2d):  # each input value meets a kernel a group
            kh, kw = module.kernel_size
            per_input = module.out_channels // module.groups * kh * kw
            forward.append(2 * inputs[0].numel() * per_input)
        elif isinstance(module, nn.Conv2d):
            kh, kw = module.kernel_size
            forward.append(2 * out.numel() * module.in_channels // module.groups * kh * kw)
        else:
            forward.append(2 * out.numel() * module.in_features)

    kinds = (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)
    layers = [m for m in model.modules() if isinstance(m, kinds)]
    handles = [m.register_forward_hook(hook) for m in layers]
    loss_of(answer, model, batch)
    for h in handles:
        h.remove()
    return 3 * sum(forward) - forward[0]


RNN_GATES = {"lstm": 4, "gru": 3}


def rnn_flops(gates: int) -> float:
    """A one-layer recurrent LM by hand: each of SEQ steps multiplies the input and the
    hidden state by ``gates`` x WIDTH weights (forward); backward doubles it, less the input
    gradient of the zero initial state; the head is a Linear of WIDTH -> VOCAB a token."""
    b, t, h = zoo.BATCH, zoo.SEQ, zoo.WIDTH
    forward = 2 * b * t * (h * gates * h + h * gates * h)
    head = 6 * b * t * h * zoo.VOCAB
    return 3 * forward - 2 * b * h * gates * h + head


def flat_tensors(out: Any) -> list[torch.Tensor]:
    """The tensors in a module's output, inside tuples (an LSTM's ``(out, (h, c))``) too."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in flat_tensors(item)]
    return []


def reference(name: str) -> Reference:
    answer = build(name)
    model, batch = answer["model"], answer["batches"](0)
    named = dict(model.named_modules())
    leaves = [n for n, m in named.items() if n and not any(m.children())]
    linears = [n for n, m in named.items() if isinstance(m, nn.Linear)]
    ref = Reference(
        params=sum(p.numel() for p in model.parameters()),  # a tied weight once
        flops=0.0,
        leaves=leaves,
        ran=[],
        linears_ran=[],
        last_linear=linears[-1] if linears else None,
    )

    def watch_leaf(leaf: str):
        def hook(module: nn.Module, inputs: Any, out: Any) -> None:
            ref.ran.append(leaf)
            if isinstance(module, nn.Linear):
                ref.linears_ran.append(leaf)
            for t in flat_tensors(out):
                if t.is_floating_point():
                    ref.outputs.setdefault(leaf, []).append(t.detach().clone())
                    if t.requires_grad:
                        t.register_hook(lambda g: ref.grads.setdefault(leaf, []).append(g))

        return hook

    handles = [named[n].register_forward_hook(watch_leaf(n)) for n in leaves]
    kept = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in kept:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_of(answer, model, batch)
    loss.backward()
    for h in handles:
        h.remove()
    ref.first_loss = loss.item()
    ref.saved_bytes = sum(saved.values())
    ref.outputs = {k: cast_counts(torch.cat([t.reshape(-1) for t in v])) for k, v in ref.outputs.items()}  # fmt: skip
    ref.grads = {k: cast_counts(torch.cat([t.reshape(-1) for t in v])) for k, v in ref.grads.items()}  # fmt: skip
    ref.weights = {
        n: cast_counts(p.grad.reshape(-1))
        for n, p in model.named_parameters()
        if p.grad is not None
    }
    model.zero_grad(set_to_none=True)
    if name in CONV_MODELS:  # torch's formula charges a grouped conv's weight gradient x groups
        ref.flops = hand_flops(model, answer, batch)
    elif name in RNN_GATES:  # torch has no formula for the CPU's recurrent kernels
        ref.flops = rnn_flops(RNN_GATES[name])
    else:
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            loss_of(answer, model, batch).backward()
        ref.flops = counter.get_total_flops()
    return ref


@pytest.fixture(scope="module")
def refs() -> dict[str, Reference]:
    return {}


def ref_of(refs: dict[str, Reference], name: str) -> Reference:
    if name not in refs:
        refs[name] = reference(name)
    return refs[name]


# ---------------------------------------------------------------------------------------------
# bench, and the runs it makes with ``ampscope run``


@dataclass
class Bench:
    table: dict  # bench --json
    runs: dict[str, tuple[list[ev.Event], str]]  # preset -> its record's events, run's output


def run_command(preset, overrides, runs_dir, on_line=None, launch=None) -> records.RunRecord:
    """bench's ``run_one`` in this process: ``ampscope run PRESET --set ...`` through
    ``main()``, its console output kept beside the record it leaves."""
    before = set(runs_dir.iterdir()) if runs_dir.exists() else set()
    sets = [arg for o in overrides for arg in ("--set", o)]
    code, out, err = quiet_main("run", preset, *sets, "--runs-dir", str(runs_dir))
    assert code == 0, err
    (run_dir,) = set(runs_dir.iterdir()) - before
    (run_dir / "console.txt").write_text(out)
    return records.load_run(run_dir)


@pytest.fixture(scope="module")
def benches(tmp_path_factory) -> dict[str, Any]:
    return {"_dir": tmp_path_factory.mktemp("zoo-bench")}


def bench(cache: dict[str, Any], name: str) -> Bench:
    """``ampscope bench fp32 amp-bf16`` on the model, one run each, once a module."""
    from ampscope.cli import bench as bench_cli
    from ampscope.cli.main import command_args

    if name not in cache:
        runs_dir = cache["_dir"] / name
        args = command_args([
            "bench", "fp32", "amp-bf16", "--model", spec(name), "--steps", str(STEPS),
            "--repeats", "1", *QUICK, "--runs-dir", str(runs_dir), "--json",
        ])  # fmt: skip
        code, out, err = quiet_main(command=lambda: bench_cli.cmd_bench(args, run_command))
        assert code == 0, err
        table = json.loads(out)
        runs = {}
        for row in table["rows"]:
            (run_dir,) = row["run_dirs"]
            events, _ = records.read_events(Path(run_dir) / records.EVENTS_FILE)
            runs[row["preset"]] = (events, (Path(run_dir) / "console.txt").read_text())
        cache[name] = Bench(table, runs)
    return cache[name]


def fp32_run(cache: dict[str, Any], name: str) -> list[ev.Event]:
    return bench(cache, name).runs["fp32"][0]


@pytest.mark.parametrize("name", models(*MODELS))
def test_bench_of_two_presets_reads_each_runs_own_steps(name, benches) -> None:
    done = bench(benches, name)
    rows = {r["preset"]: r for r in done.table["rows"]}
    assert list(rows) == ["fp32", "amp-bf16"]
    medians = {}
    for preset, row in rows.items():
        events, console = done.runs[preset]
        assert_trains(events)
        assert re.search(r"^  status +ok$", console, re.M), console  # what `run` printed
        (hello,) = of(events, ev.HelloEvent)
        assert hello.config["precision"] == preset
        steps = of(events, ev.StepEvent)
        medians[preset] = statistics.median(s.step_ms for s in steps if s.step >= 1)  # warm-up 1
        assert row["status"] == "ok"
        assert row["step_ms"] == pytest.approx(medians[preset], abs=5e-5)  # to 4 decimals
        assert row["loss_final"] == pytest.approx(steps[-1].loss, rel=1e-6)
    # one run each: the speed-up is the ratio of the two step times
    speedup = medians["fp32"] / medians["amp-bf16"]
    assert rows["amp-bf16"]["speedup"] == pytest.approx(speedup, rel=1e-3)  # of rounded times
    assert rows["amp-bf16"]["significant"] is None  # untested with one repeat


# ---------------------------------------------------------------------------------------------
# run


def assert_trains(events: list[ev.Event]) -> list[float]:
    losses = [s.loss for s in of(events, ev.StepEvent)]
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0], losses
    (done,) = of(events, ev.DoneEvent)
    assert done.status == "ok" and done.skipped_steps == 0
    return losses


@pytest.mark.parametrize("name", models(*MODELS))
def test_run_trains_and_counts_the_models_parameters_and_flops(name, refs, benches) -> None:
    """bench's fp32 run, an ``ampscope run fp32`` (run_command)."""
    events, ref = fp32_run(benches, name), ref_of(refs, name)
    losses = assert_trains(events)
    (hello,) = of(events, ev.HelloEvent)
    assert hello.workload == "zoo-" + name.replace("_", "-")
    assert hello.param_count == ref.params
    assert hello.flops_source == "counted" and not hello.flops_counted_partial
    assert hello.flops_per_step == pytest.approx(ref.flops, rel=1e-9)
    assert losses[0] == pytest.approx(ref.first_loss, rel=1e-5)  # the same weights, the same batch
    assert hello.samples_per_step == (2 * zoo.BATCH if name in WIDE_BATCH else zoo.BATCH)
    if name in TOKEN_MODELS:
        assert hello.tokens_per_step == zoo.BATCH * zoo.SEQ


# ---------------------------------------------------------------------------------------------
# compile


@pytest.mark.xdist_group("zoo-tied")
def test_a_fault_of_ampscopes_own_hooks_is_never_blamed_on_the_users_model(monkeypatch) -> None:
    """The gradient-zeros hook failing in the first step once read "the first training step
    failed on the first batch", exit 2, with torch's frames only: the user's fault. It is
    ampscope's: said so, with its frames, exit 1."""
    from ampscope.engine.lifecycle.run import EXIT_FAILED, run
    from ampscope.engine.step import metrics

    def broken(grad: torch.Tensor) -> torch.Tensor:
        raise AttributeError("'NoneType' object has no attribute 'detach'")

    monkeypatch.setattr(metrics, "zero_fraction", broken)
    seen: list[ev.Event] = []
    sets = [f"workload.model='{spec('tied')}'", "device='cpu'", "steps=2"]
    assert run("fp32", sets, record=False, on_event=seen.append) == EXIT_FAILED
    (error,) = of(seen, ev.ErrorEvent)
    assert error.kind == "exception" and "first batch" not in error.message
    assert error.message.startswith("ampscope's own instrumentation failed"), error.message
    assert "ampscope/engine/step/metrics.py" in (error.traceback or "")


# ---------------------------------------------------------------------------------------------
# numerics


@pytest.fixture(scope="module")
def numerics_out() -> dict[tuple[str, bool], Any]:
    return {}


def numerics(cache: dict, name: str, json_out: bool = True) -> Any:
    """``ampscope numerics fp32`` on step 0 only: its JSON (or, ``json_out=False``, its table
    as printed), once a module."""
    key = (name, json_out)
    if key not in cache:
        argv = ["numerics", "fp32", "--model", spec(name), "--steps", "1", *QUICK, "--no-record"]
        code, out, err = quiet_main(*argv, *(["--json"] if json_out else []))
        assert code == 0, err
        cache[key] = json.loads(out) if json_out else out
    return cache[key]


def assert_matches_casts(figures: dict, counts: dict, what: str) -> None:
    assert figures["nonfinite"] == 0, what
    assert figures["amax"] == pytest.approx(counts["amax"], rel=1e-5), what
    for key in FORMATS:
        for loss in ("overflow", "underflow"):
            share = figures["formats"][key][loss] * counts["numel"]
            # one value at most may land the other side of a boundary (the same kernels on
            # another thread count can round the last bit differently)
            assert abs(share - counts[key][loss]) <= 1, (what, key, loss, share, counts[key])


@pytest.mark.parametrize("name", models(*MODELS))
def test_numerics_agree_with_torchs_own_casts_layer_by_layer(name, refs, numerics_out) -> None:
    ref, out = ref_of(refs, name), numerics(numerics_out, name)
    assert out["steps_sampled"] == 1 and out["first_nonfinite"] is None
    assert out["modules_total"] == len(ref.leaves)
    assert out["modules_measured"] == len(set(ref.ran))
    measured = {m["name"]: m for m in out["modules"] if m["activation"]}
    assert measured.keys() == set(ref.ran)
    for leaf, module in measured.items():
        assert_matches_casts(module["activation"], ref.outputs[leaf], f"{leaf} outputs")
        if leaf in ref.grads:
            assert_matches_casts(module["gradient"], ref.grads[leaf], f"{leaf} gradients")
        else:
            assert module["gradient"] is None, leaf
    weights = {  # each parameter's gradient, named as named_parameters() names it
        f"{m['name']}.{p}" if m["name"] else p: figures
        for m in out["modules"]
        for p, figures in m["parameters"].items()
    }
    assert weights.keys() == ref.weights.keys()
    for parameter, figures in weights.items():
        assert_matches_casts(figures, ref.weights[parameter], f"{parameter}'s gradient")
    # the fp16 verdict: the largest share rounding to zero, by torch's casts, else it fits
    every = (("outputs", ref.outputs), ("gradients", ref.grads), ("gradient", ref.weights))
    shares = [
        (c["fp16"]["underflow"] / c["numel"], leaf, kind)
        for kind, figures in every
        for leaf, c in figures.items()
    ]
    worst = max(share for share, _, _ in shares)
    fp16 = next(v for v in out["verdicts"] if v.startswith("fp16:"))
    if worst < NOTABLE:  # a share below 1 % is not worth a sentence
        largest = max(c["amax"] for _, figures in every for c in figures.values())
        assert fp16.startswith("fp16: every layer fits") and f"{largest:.3g}" in fp16, fp16
    else:  # the worst, or one as bad (the model's first)
        tied = [(leaf, kind) for share, leaf, kind in shares if share == worst]
        assert any(f"of {leaf}'s {kind} round to zero" in fp16 for leaf, kind in tied), fp16


@pytest.mark.parametrize("name", models("vit", "encoder", "unused"))
def test_numerics_names_the_leaf_modules_that_never_ran(name, refs, numerics_out) -> None:
    """nn.MultiheadAttention calls out_proj's weight itself; an unused head never runs."""
    ref, text = ref_of(refs, name), numerics(numerics_out, name, json_out=False)
    never = [n for n in ref.leaves if n not in ref.ran]
    assert never and len(never) < len(ref.leaves)
    for leaf in never:
        assert leaf in text, (leaf, text)


@pytest.mark.xdist_group("zoo-root_computes")
def test_numerics_under_amp_fp16_does_not_call_a_run_with_an_overflow_fitting() -> None:
    """The root's own matmul overflows fp16 (the first inf/NaN is found in ``out``, the first
    module it reaches): the fp16 verdict must not say every layer fits."""
    argv = ["numerics", "amp-fp16", "--model", f"{SPEC}:make_root_overflow", "--steps", "1"]
    code, out, err = quiet_main(*argv, *QUICK, "--no-record", "--json")
    assert code == 1 and "Every step skipped (1 of 1)" in err, err  # the run failed: said so
    result = json.loads(out)  # and the diagnosis is still the JSON on stdout
    assert result["first_nonfinite"] is not None  # the inf was seen
    fp16 = next(v for v in result["verdicts"] if v.startswith("fp16:"))
    assert "every layer fits" not in fp16, fp16


@pytest.mark.xdist_group("zoo-moe")
def test_a_run_names_a_layer_unused_only_if_it_never_ran_in_the_whole_run() -> None:
    """The MoE's experts 6 and 7 get their first tokens at step 4, between the steps numerics
    sample (every 3rd): the Numerics view once named them "never ran" all run long. A layer's
    first run has the next step sampled, so they are measured; a 2-step run, where they
    never run, names them."""
    from ampscope.core.numerics.report import NumericsSummary
    from ampscope.engine.lifecycle.run import run

    late = [f"experts.{e}.{part}" for e in zoo.LATE_EXPERTS for part in ("fc1", "act", "fc2")]
    answer = build("moe")
    early, later = answer["batches"](0)[0], answer["batches"](zoo.LATE_FROM)[0]
    assert (early < zoo.LATE_TOKENS).all() and (later >= zoo.LATE_TOKENS).any()  # by design
    for steps, ran in ((zoo.LATE_FROM + 2, True), (2, False)):
        seen: list[ev.Event] = []
        sets = [f"workload.model='{spec('moe')}'", "device='cpu'", f"steps={steps}"]
        sets += ["numerics.every=3", "warmup_steps=1"]
        assert run("fp32", sets, record=False, on_event=seen.append) == 0
        summary = NumericsSummary()
        for event in of(seen, ev.NumericsEvent):
            summary.add(event)
        never = summary.never_ran()
        if ran:  # sampled at 0 and 3, and at 5: the step after the experts first ran
            assert summary.steps == [0, 3, zoo.LATE_FROM + 1], summary.steps
            assert not set(late) & set(never), never
            assert all(summary.modules[name].activation.steps for name in late)
        else:
            assert summary.steps == [0] and set(late) <= set(never), never


# ---------------------------------------------------------------------------------------------
# profile


@pytest.fixture(scope="module")
def profiles_out() -> dict[str, tuple[dict, Any, float]]:
    return {}


def profile(cache: dict, name: str) -> tuple[dict, Any, float]:
    """``ampscope profile fp32 --steps 1 --json``, with torch.profiler's own object kept."""
    from ampscope.cli.main import command_args
    from ampscope.cli.profile import cmd_profile
    from ampscope.engine.lifecycle.parts import Parts
    from ampscope.engine.profiling import ProfileControl

    if name not in cache:
        kept: dict[str, Any] = {}

        class Keeping(ProfileControl):  # torch.profiler's own object, kept to compare with
            def _summarize(self, prof, measured_us, steps):  # type: ignore[no-untyped-def]
                kept.update(prof=prof, measured_us=measured_us)
                return super()._summarize(prof, measured_us, steps)

        args = command_args([
            "profile", "fp32", "--model", spec(name), "--steps", "1", *QUICK, "--json",
            "--no-record",
        ])  # fmt: skip
        parts = Parts(profiler=Keeping)
        code, out, err = quiet_main(command=lambda: cmd_profile(args, parts=parts))
        assert code == 0, err
        cache[name] = (json.loads(out), kept["prof"], float(kept["measured_us"]))
    return cache[name]


def debug_chain(prof: Any, total: float) -> list:
    """What an assertion message needs to tell a discrepancy's cause: ampscope's op time as
    its collector reads it now, torch's table's, the measured time, the largest events."""
    from ampscope.engine.profiling.collect import cpu_op_times

    ops = cpu_op_times(prof.events())
    busy = sum(o.self_us for o in ops)
    rows = sum(r.self_cpu_time_total for r in prof.key_averages())
    threads = {e.thread for e in prof.events()}
    big = sorted(prof.events(), key=lambda e: -e.self_cpu_time_total)[:4]
    out: list = [("busy", busy, "rows", rows, "total", total, "threads", threads)]
    for e in big:
        chain, n = [], e
        while n is not None:
            chain.append(n.name)
            n = n.cpu_parent
        out.append((e.name, e.self_cpu_time_total / total, e.thread, chain[-3:]))
    return out


def in_passes(prof: Any, wanted: Any) -> float:
    """Self time (us) of the ops ``wanted(name)`` picks, walked down from the engine's forward
    and backward ranges and from the ops under no range (the loss's, autograd's)."""

    def tree(e: Any) -> Any:
        yield e
        for child in e.cpu_children:
            yield from tree(child)

    events = prof.events()
    tops = [e for e in events if e.name in ("ampscope.forward", "ampscope.backward")]
    tops += [e for e in events if e.cpu_parent is None and not e.name.startswith("ampscope.")]
    return sum(e.self_cpu_time_total for top in tops for e in tree(top) if wanted(e.name))


GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
CONVS = re.compile(r"conv", re.I)  # aten's conv ops, and autograd's ConvolutionBackward0 node
NORM_ACT = re.compile(
    r"^aten::.*(batch_norm|layer_norm|group_norm|gelu|softmax|tanh|sigmoid|nll_loss|cross_ent)"
)
EITHER = re.compile(r"relu|threshold|clamp_min|vector_norm|foreach_norm|dropout|silu|^autograd::")
"""Filed today elsewhere than by what they do (#36 item 4): ReLU's kernels as elementwise and
other, gradient clipping's norms as norm_act, autograd's nodes by a word in their name; the
norm_act check allows either."""


@pytest.mark.parametrize("name", models(*MODELS))
def test_profile_counts_each_op_as_torch_profiler_does(name, profiles_out) -> None:
    data, prof, total = profile(profiles_out, name)
    assert data["steps"] == 1 and data["timing"] == "cpu"
    assert sum(data["classes"].values()) == pytest.approx(1.0, abs=0.05)
    assert (data["classes"]["conv"] > 0) == (name in CONV_MODELS)
    assert set(data["dtypes"].get("matmul", {"fp32": 0})) == {"fp32"}
    rows = {r.key: r for r in prof.key_averages()}
    dense = [op for op in data["top_ops"] if op["name"] in GEMMS or CONVS.search(op["name"])]
    # the heavy op torch's own table ranks first among as many ops is among the largest here
    # too (the same trace decides it: on a tiny model under load the largest may be a copy)
    ranked = sorted(rows.values(), key=lambda r: -r.self_cpu_time_total)[: len(data["top_ops"])]
    heavy = [r.key for r in ranked if r.key in GEMMS or CONVS.search(r.key)]
    assert not heavy or heavy[0] in {op["name"] for op in dense}, (heavy, data["top_ops"])
    for op in dense:  # each op's every call is in its one row
        assert op["class"] == ("matmul" if op["name"] in GEMMS else "conv"), op
        assert op["calls"] == rows[op["name"]].count, op


def subtrees_in_passes(prof: Any, wanted: Any) -> float:
    """Inclusive time (us) of the outermost ops ``wanted(name)`` picks in the passes: each with
    everything it called. An upper bound for a class that takes its ops' generic callees (the
    bias copy under ``aten::addmm`` is the matmul's)."""
    from ampscope.core.profiles.rules import op_name

    def outermost(e: Any) -> Any:
        if wanted(op_name(e.name.removeprefix("autograd::engine::evaluate_function: "))):
            yield e
            return
        for child in e.cpu_children:
            yield from outermost(child)

    events = prof.events()
    tops = [e for e in events if e.name in ("ampscope.forward", "ampscope.backward")]
    tops += [e for e in events if e.cpu_parent is None and not e.name.startswith("ampscope.")]
    return sum(e.cpu_time_total for top in tops for e in outermost(top))


MATMUL_FAMILY = re.compile(
    r"^aten::(linear|matmul|mm|addmm|bmm|baddbmm|einsum|lstm|gru|mkldnn_rnn_layer\w*)$"
)
"""The ops whose subtrees are matmul work: dense layers, and a recurrent layer's own kernel."""


@pytest.mark.parametrize("name", models(*MODELS))
def test_profile_class_shares_lie_within_torch_profilers_own_tree(name, profiles_out) -> None:
    """Each dense class holds at least its kernels' own time and at most the whole subtrees of
    the ops that are that class (what they call, the copies and views among it, is theirs), as
    torch.profiler's event tree of the same profile has them; norm_act likewise."""
    data, prof, total = profile(profiles_out, name)
    rows = {r.key: r for r in prof.key_averages()}
    classes, seen = data["classes"], debug_chain(prof, total)

    def within(cls: str, own: Any, family: Any) -> None:
        low = in_passes(prof, own) / total
        high = subtrees_in_passes(prof, family) / total
        assert low - 0.02 <= classes[cls] <= high + 0.02, (cls, low, classes[cls], high, seen)

    within("matmul", lambda n: n in GEMMS, lambda n: bool(MATMUL_FAMILY.search(n)))
    within("conv", lambda n: bool(CONVS.search(n)), lambda n: bool(CONVS.search(n)))
    norm_act = {k for k in rows if NORM_ACT.search(k)}
    either = {k for k in rows if NORM_ACT.search(k) or EITHER.search(k)}
    anywhere = sum(rows[k].self_cpu_time_total for k in either) / total
    assert in_passes(prof, lambda n: n in norm_act) / total - 0.02 <= classes["norm_act"], seen
    assert classes["norm_act"] <= anywhere + 0.02 or classes["norm_act"] <= (
        subtrees_in_passes(prof, lambda n: bool(NORM_ACT.search(n) or EITHER.search(n))) / total
        + 0.02
    ), (classes, seen)
    for op in data["top_ops"]:
        if op["name"] in GEMMS:
            share = rows[op["name"]].self_cpu_time_total / total
            assert op["share"] == pytest.approx(share, abs=0.02), (op, seen)


@pytest.mark.xdist_group("zoo-lstm")
def test_an_lstms_recurrent_kernel_is_not_other(profiles_out) -> None:
    """On a CPU, nn.LSTM runs as aten::mkldnn_rnn_layer and its backward: matrix products,
    most of the step as a rule; 'other' is Python between ops (README)."""
    data, _, _ = profile(profiles_out, "lstm")
    rnn = [op for op in data["top_ops"] if "rnn" in op["name"]]
    assert rnn  # among the step's largest
    assert all(op["class"] != "other" for op in rnn), rnn


# ---------------------------------------------------------------------------------------------
# memory --model


MEMORY_REGIMES = ("fp32", "amp-bf16", "bf16")
TIGHT = 1.10  # the plan bounds the measured step from above, by at most this much


@functools.cache
def memory_plan(name: str) -> dict:
    """``ampscope memory --model`` with its default regimes, as JSON."""
    code, out, err = quiet_main("memory", "--model", spec(name), "--json")
    assert code == 0, err
    return json.loads(out)


def row(plan: dict, regime: str) -> dict:
    return next(r for r in plan["regimes"] if r["regime"] == regime)


@pytest.mark.parametrize("name", models(*MODELS))
def test_memory_counts_each_parameter_once_and_fp32_adamw_at_16_bytes(name, refs) -> None:
    """``tied_to_device``'s factory ends with ``.to(ctx.device)``: built on the meta device,
    its tied weight became two (8,288 parameters planned, 6,240 real)."""
    plan, ref = memory_plan(name), ref_of(refs, name)
    assert plan["params"] == ref.params  # a tied weight once
    fp32 = row(plan, "fp32")
    # by hand: fp32 weights 4 bytes, gradients 4, AdamW's two moments 8
    assert (fp32["weights"], fp32["grads"], fp32["optimizer_state"]) == (
        4 * ref.params,
        4 * ref.params,
        8 * ref.params,
    )
    assert fp32["train_total"] >= 16 * ref.params


@pytest.mark.parametrize("name", models("vit", "lstm", "cnn_bn", "hf_bert"))
def test_memory_plans_what_autograd_saves_for_backward(name, refs) -> None:
    fp32 = row(memory_plan(name), "fp32")
    saved = ref_of(refs, name).saved_bytes
    assert fp32["activations"] is not None
    assert 0.67 * saved <= fp32["activations"] <= 1.5 * saved, (fp32["activations"], saved)


@pytest.mark.xdist_group("zoo-unet")
def test_the_memory_plan_has_no_fp8_row_for_a_model_fp8_refuses() -> None:
    """The U-Net has no linear layer: its plan once had an fp8 row with fp8 casts for every
    parameter, while ``run fp8-*`` refuses the model (``fp8_run``)."""
    plan = memory_plan("unet")
    assert not [r for r in plan["regimes"] if r["regime"].startswith("fp8")]
    assert "fp8: does not apply" in plan["fp8_not_applicable"]
    assert "'ampscope run fp8-*' refuses it" in plan["fp8_not_applicable"]
    assert plan["measured"]["fp8_layers"] == 0


def engine_step_peak(name: str, regime: str) -> int:
    """The reference: torch.profiler's allocator records over one steady step of the
    engine's own loop (``train_step``), added up in time order, plus the tensors alive before
    it (weights, buffers, AdamW's state). Steady: after the step that makes AdamW's state;
    the MoE's after its late experts first ran, on a later batch than the plan measured."""
    from torch.profiler import ProfilerActivity, profile

    from ampscope.core import presets
    from ampscope.engine.device import resolve_device
    from ampscope.engine.lifecycle.loop import train_step
    from ampscope.engine.step import setup as engine_setup

    sets = [f"workload.model='{spec(name)}'", "device='cpu'", "compile='off'"]
    s = engine_setup.build(presets.load_preset(regime, sets), resolve_device("cpu"))
    steady = zoo.LATE_FROM + 1 if name == "moe" else 1
    for step in range(steady):
        train_step(s, step, False)
    state = [t for st in s.optimizer.state.values() for t in st.values() if torch.is_tensor(t)]
    alive = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in (*s.model.parameters(), *s.model.buffers(), *state)
    }
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        train_step(s, steady, False)
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    running = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        running += event.nbytes()
        peak = max(peak, running)
    return sum(alive.values()) + peak


EVERY_REGIME = ("unet", "moe")  # measured in fp32, AMP bf16 and pure bf16; the others in fp32


@pytest.mark.parametrize(
    ("name", "regime"),
    [
        pytest.param(n, r, id=f"{n}-{r}", marks=pytest.mark.xdist_group(f"zoo-{n}"))
        for n in MODELS
        for r in (MEMORY_REGIMES if n in EVERY_REGIME else ("fp32",))
    ],
)
def test_the_memory_plan_is_a_tight_upper_bound_on_the_engines_steady_step(name, regime) -> None:
    """Plans once 4-32 % above the measured peak on these models (the gradients counted
    twice, an MoE's and a tied model's the most) and 2 % under it on another (AdamW's
    temporaries of the parameter before the largest still held)."""
    planned = row(memory_plan(name), regime)["train_total"]
    measured = engine_step_peak(name, regime)
    assert measured <= planned <= TIGHT * measured, (planned / measured, planned, measured)


# ---------------------------------------------------------------------------------------------
# emulated fp8 (torchao)

FP8_TRAINS = [
    "vit",
    "encoder",
    "hf_bert",
    "tied",
    "unused",
    "root_computes",
    "hf_llama",
    "root_exp",
]
"""The models with linear layers fp8 can take (the MoE's: its own test, over the whole run)."""


@functools.cache
def fp8_run(name: str) -> list[ev.Event]:
    """``ampscope run fp8-tensorwise`` emulated (the engine's ``run``, as ``ampscope run``
    calls it, its events kept)."""
    pytest.importorskip("torchao")
    from ampscope.engine.lifecycle.run import run

    seen: list[ev.Event] = []
    sets = [f"workload.model='{spec(name)}'", "device='cpu'", f"steps={STEPS}", "warmup_steps=1"]
    sets += ["fp8.emulate=true", "compile='off'"]
    run("fp8-tensorwise", sets, record=False, on_event=seen.append)
    return seen


@pytest.mark.parametrize("name", models(*FP8_TRAINS))
def test_emulated_fp8_trains_and_counts_the_linear_layers_that_run_in_fp8(
    name, refs, benches
) -> None:
    ref = ref_of(refs, name)
    events = fp8_run(name)
    assert not of(events, ev.ErrorEvent), of(events, ev.ErrorEvent)
    losses = assert_trains(events)
    # fp8 rounding, but the same model: the first loss within a percent of fp32's
    fp32_first = of(fp32_run(benches, name), ev.StepEvent)[0].loss
    assert losses[0] == pytest.approx(fp32_first, rel=0.01) and losses[0] != fp32_first
    (hello,) = of(events, ev.HelloEvent)
    assert hello.fp8 is not None and hello.fp8.emulate and hello.fp8.recipe == "tensorwise"
    # every linear layer whose dimensions fit, whether the first batch calls it or not (the
    # MoE's experts 6 and 7, the unused head), but the output head, the last one that ran,
    # and MultiheadAttention's out_proj, which never runs as a layer
    named = dict(build(name)["model"].named_modules())
    mha_out = {f"{n}.out_proj" for n, m in named.items() if isinstance(m, nn.MultiheadAttention)}
    head = ref.linears_ran[-1]
    expected = [
        n
        for n, m in named.items()
        if isinstance(m, nn.Linear)
        and n not in (head, *mha_out)
        and all(d % 16 == 0 for d in m.weight.shape)
    ]
    assert ref.last_linear == head and head in hello.fp8.skipped
    assert hello.fp8.converted == expected


@pytest.mark.xdist_group("zoo-moe")
def test_fp8_converts_the_experts_the_first_batch_does_not_reach() -> None:
    """The MoE's experts 6 and 7 get tokens from step 4 on: the fp8 line once said "never
    called in the forward pass" of them, and they ran in bf16 all run long. The reference:
    forward hooks on the fp8 layers, over the whole run."""
    pytest.importorskip("torchao")
    from ampscope.core import presets
    from ampscope.core.presets.fp8_recipes import layers_line
    from ampscope.engine.device import resolve_device
    from ampscope.engine.lifecycle.loop import train_step
    from ampscope.engine.step import setup as engine_setup

    sets = [f"workload.model='{spec('moe')}'", "device='cpu'", "fp8.emulate=true", "compile='off'"]
    preset = presets.load_preset("fp8-tensorwise", sets)
    s = engine_setup.build(preset, resolve_device("cpu"))
    assert s.fp8 is not None
    first_ran: dict[str, int] = {}
    now = [0]

    def note_first_run(layer: str) -> Any:
        def hook(*_: Any) -> None:
            first_ran.setdefault(layer, now[0])

        return hook

    for layer, module in s.workload.model.named_modules():
        if type(module).__name__ == "Float8Linear":
            module.register_forward_hook(note_first_run(layer))
    losses = []
    for step in range(zoo.LATE_FROM + 2):
        now[0] = step
        losses.append(float(train_step(s, step, False)[0][0]))
    assert losses[zoo.LATE_FROM - 1] < losses[0]  # trains in fp8 (the batch changes at step 4)
    late = [f"experts.{e}.fc{i}" for e in zoo.LATE_EXPERTS for i in (1, 2)]
    assert [first_ran.get(layer) for layer in late] == [zoo.LATE_FROM] * len(late)
    assert set(first_ran) == set(s.fp8.converted)  # every converted layer ran in fp8
    assert len(s.fp8.converted) == 2 * zoo.EXPERTS and set(s.fp8.skipped) == {"router", "head"}
    assert "never called" not in layers_line(s.fp8)


@pytest.mark.parametrize("name", models("hf_gpt2", "lstm", "gru", "cnn_bn", "dw_separable"))
def test_fp8_on_a_model_with_no_linear_layer_it_can_take_says_so_and_why(name, refs) -> None:
    """Their one nn.Linear is the output head (GPT-2's other matmuls are transformers'
    Conv1D): nothing to train in fp8, and the refusal names the head and the way out."""
    events = fp8_run(name)
    assert not of(events, ev.StepEvent)
    (error,) = of(events, ev.ErrorEvent)
    head = ref_of(refs, name).last_linear
    assert error.kind == "config"
    assert "none of this workload's linear layers can run in fp8" in error.message
    assert f"({head}: the output head (fp8.skip_head = true)" in error.message
    assert "precision = 'amp-bf16'" in error.message and not error.traceback


@pytest.mark.xdist_group("zoo-unet")
def test_fp8_on_a_model_without_a_linear_layer_says_so_and_nothing_about_dimensions() -> None:
    """A U-Net has no linear layer: the refusal once read "none of this workload's linear
    layers can run in fp8 ()" and advised giving them dimensions of multiples of 16."""
    (error,) = of(fp8_run("unet"), ev.ErrorEvent)
    convs = [m for m in build("unet")["model"].modules() if isinstance(m, nn.modules.conv._ConvNd)]
    assert error.kind == "config" and "()" not in error.message
    assert "no linear layer (nn.Linear) to run in fp8" in error.message
    assert f"its {len(convs)} convolutions are not" in error.message
    assert "multiples of 16" not in error.message and "precision = 'amp-bf16'" in error.message


@pytest.mark.xdist_group("zoo-hf_gpt2")
def test_fp8_on_gpt2_says_its_conv1d_layers_are_no_linear_layers() -> None:
    """A GPT-2 user reads 'none of this workload's linear layers' of a model with eight
    matmul layers a block: transformers' Conv1D, which fp8 conversion does not take."""
    (error,) = of(fp8_run("hf_gpt2"), ev.ErrorEvent)
    assert "Conv1D" in error.message and "transformer.h.0.attn.c_attn" in error.message


# ---------------------------------------------------------------------------------------------
# ampscope.watch: the user's own loop


# Models whose first step, on the CPU itself, runs a kernel torch has no FLOP formula for:
# the CPU's flash attention (torch's SDPA), an LSTM's oneDNN kernel.
NO_FORMULA_ON_CPU = {
    "vit": "aten._scaled_dot_product_flash_attention_for_cpu",
    "encoder": "aten._scaled_dot_product_flash_attention_for_cpu",
    "hf_gpt2": "aten._scaled_dot_product_flash_attention_for_cpu",
    "hf_bert": "aten._scaled_dot_product_flash_attention_for_cpu",
    "hf_llama": "aten._scaled_dot_product_flash_attention_for_cpu",
    "lstm": "aten.mkldnn_rnn_layer",
}


@pytest.mark.parametrize("name", models(*MODELS))
def test_watch_records_the_loops_losses_and_counts_its_flops(name, refs, tmp_path) -> None:
    ref = ref_of(refs, name)
    answer = build(name)
    model, batch = answer["model"], answer["batches"](0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    with ampscope.watch(model, opt, runs_dir=tmp_path, count_flops=True, numerics_every=2) as mon:
        for _ in range(STEPS):
            loss = loss_of(answer, model, batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.step(loss)
            losses.append(loss.item())
    assert losses[-1] < losses[0] and losses[0] == pytest.approx(ref.first_loss, rel=1e-6)
    run = records.load_run(mon.run_dir)
    assert run.state == "ok" and run.hello is not None
    assert run.hello.param_count == ref.params
    assert [s.loss for s in of(run.events, ev.StepEvent)] == pytest.approx(losses, rel=1e-6)
    sampled = of(run.events, ev.NumericsEvent)
    assert [e.step for e in sampled] == [0, 2]
    assert sampled[0].modules_total == len(ref.leaves)
    partial = [w for w in of(run.events, ev.WarningEvent) if w.code == "flops-partial"]
    if name in NO_FORMULA_ON_CPU:  # counted on the CPU itself: a lower bound, and it says so
        assert mon.flops_per_step is not None and 0 < mon.flops_per_step < ref.flops
        (warning,) = partial
        assert NO_FORMULA_ON_CPU[name] in warning.message and "lower bound" in warning.message
        assert f"{mon.flops_per_step:.4g} a step" in warning.message
    else:
        assert mon.flops_per_step == pytest.approx(ref.flops, rel=1e-9) and not partial


@pytest.mark.parametrize("name", models("lstm", "gru"))
def test_count_flops_warns_when_torch_cannot_count_a_kernel(name, refs) -> None:
    answer = build(name)
    model, batch = answer["model"], answer["batches"](0)
    with pytest.warns(UserWarning, match="lower bound") if name == "lstm" else contextlib.nullcontext():  # fmt: skip
        counted = ampscope.count_flops(lambda: loss_of(answer, model, batch).backward())
    if name == "gru":  # decomposed into matrix products on the CPU: counted whole
        assert counted == ref_of(refs, name).flops
