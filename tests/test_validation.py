"""Can this preset run here: every refusal and warning made before a run builds anything,
over made-up devices (no GPU here), in the order a user meets them, and the workload sized once.
"""

from __future__ import annotations

import sys

import pytest
import torch

from ampscope.cli.console import ConsoleReporter
from ampscope.core import events as ev
from ampscope.core import presets
from ampscope.engine.device import DeviceInfo
from ampscope.engine.lifecycle.parts import Parts
from ampscope.engine.lifecycle.run import EXIT_OK, EXIT_USAGE, run
from ampscope.engine.step.validation import Facts, check_run, require_runnable
from tests.helpers import FAST

GIB = 1 << 30
CPU = DeviceInfo(torch.device("cpu"), "AMD EPYC 7B13", None, None, None, None)


def gpu(name: str, capability: tuple[int, int]) -> DeviceInfo:
    return DeviceInfo(torch.device("cuda", 0), name, capability, 80 * GIB, 700.0, None)


T4, V100 = gpu("Tesla T4", (7, 5)), gpu("Tesla V100-SXM2-16GB", (7, 0))
A100, H100 = gpu("NVIDIA A100-SXM4-80GB", (8, 0)), gpu("NVIDIA H100 80GB HBM3", (9, 0))


def facts(info: DeviceInfo, **kw: object) -> Facts:
    """A machine with room to spare unless told otherwise: 64 GiB of host, 80 GiB of GPU."""
    defaults: dict[str, object] = {"host_memory": lambda: (64 * GIB, 64 * GIB)}
    if info.is_cuda:
        defaults["device_memory"] = lambda: (80 * GIB, 80 * GIB)
    return Facts(info, **{**defaults, **kw})  # type: ignore[arg-type]


# (preset, overrides, facts, key at fault, what the first refusal's paragraph says)
REFUSED = [
    pytest.param(
        "amp-bf16", [], facts(T4), None,
        "precision = 'amp-bf16' needs bf16 Tensor Cores (compute capability 8.0, Ampere, or "
        "newer), but Tesla T4 is 7.5", id="bf16-before-ampere",
    ),
    pytest.param(
        "bf16", [], facts(V100), None, "Use precision = 'amp-fp16'", id="pure-bf16-on-volta",
    ),
    pytest.param(
        "fp8-tensorwise", [], facts(A100), "precision",
        "NVIDIA A100-SXM4-80GB has compute capability 8.0", id="fp8-before-8.9",
    ),
    pytest.param(
        "fp8-eager", [], facts(CPU), "precision", "this run's device is the CPU", id="fp8-on-cpu",
    ),
    pytest.param(
        "fp8-rowwise", ["fp8.emulate=true"], facts(CPU, has_torchao=False), "precision",
        "pip install 'ampscope[fp8]'", id="fp8-without-torchao",
    ),
    pytest.param(
        "fp8-tensorwise", ["batch_size=3", "workload.seq_len=100"], facts(H100), "batch_size",
        "batch_size x workload.seq_len = 3 x 100 = 300) to be a multiple of 16",
        id="fp8-tokens-not-a-multiple-of-16",
    ),
    pytest.param(
        "fp32", ["device='cpu'", "parallel.grad_compression='bf16'"], facts(CPU, grouped=True),
        "parallel.grad_compression", "needs NCCL (CUDA GPUs)", id="bf16-all-reduce-on-gloo",
    ),
    pytest.param(
        "fp32", ["workload.heads=3"], facts(CPU), "workload.width",
        "workload.width = 64 is not divisible by workload.heads = 3", id="heads-do-not-divide",
    ),
    pytest.param(
        "mlp-demo", ["batch_size=400000"], facts(CPU, host_memory=lambda: (6 * GIB, 8 * GIB)),
        "batch_size", "the host's 8 GiB, 6 GiB available now", id="batch-beyond-the-host",
    ),
    pytest.param(
        "amp-bf16", ["batch_size=4096"], facts(H100, device_memory=lambda: (GIB, 2 * GIB)),
        "batch_size", "of NVIDIA H100 80GB HBM3 memory", id="batch-beyond-the-gpu",
    ),
]  # fmt: skip


@pytest.mark.unit
@pytest.mark.parametrize("name,overrides,machine,key,says", REFUSED)
def test_each_impossible_combination_is_refused_in_one_paragraph(
    name: str, overrides: list[str], machine: Facts, key: str | None, says: str
) -> None:
    verdict = check_run(presets.load_preset(name, overrides), machine)
    first = verdict.refusals[0]
    assert says in str(first) and first.key == key
    assert "\n" not in str(first)
    with pytest.raises(presets.ConfigError) as caught:
        require_runnable(presets.load_preset(name, overrides), machine)
    assert caught.value is not first and str(caught.value) == str(first)


@pytest.mark.unit
@pytest.mark.parametrize(
    "name,overrides,machine",
    [
        ("amp-bf16", [], facts(A100)),
        ("fp8-tensorwise", ["batch_size=3"], facts(H100)),  # 3 x 1024 tokens
        ("fp8-rowwise", ["fp8.emulate=true", "batch_size=3", "workload.seq_len=100"], facts(CPU)),
        ("fp32", ["device='cpu'", "parallel.grad_compression='bf16'"], facts(CPU)),  # one rank
        ("fp32", ["parallel.grad_compression='bf16'"], facts(H100, grouped=True)),  # NCCL
    ],
)
def test_what_the_device_can_run_passes_with_its_sizes(
    name: str, overrides: list[str], machine: Facts
) -> None:
    preset = presets.load_preset(name, overrides)
    verdict = require_runnable(preset, machine)
    assert verdict.refusals == []
    assert verdict.sizes == presets.resolve_workload(preset, on_cuda=machine.info.is_cuda)


@pytest.mark.unit
def test_the_first_refusal_is_the_earliest_check_and_every_gives_them_all() -> None:
    """On a T4 with a batch beyond its memory, the precision comes first; fp8 on an A100 with
    one, the memory does (as before the build, where memory was checked before fp8)."""
    tiny = facts(T4, device_memory=lambda: (GIB, 2 * GIB))
    preset = presets.load_preset("amp-bf16", ["batch_size=4096"])
    assert [e.key for e in check_run(preset, tiny).refusals] == [None]
    assert [e.key for e in check_run(preset, tiny, every=True).refusals] == [None, "batch_size"]
    fp8 = presets.load_preset("fp8-tensorwise", ["batch_size=4096"])
    refusals = check_run(fp8, facts(A100, device_memory=lambda: (GIB, 2 * GIB)), every=True)
    assert [e.key for e in refusals.refusals] == ["batch_size", "precision"]
    assert check_run(fp8, facts(A100, device_memory=lambda: (GIB, 2 * GIB))).sizes is not None


@pytest.mark.unit
@pytest.mark.parametrize(
    "name,overrides,machine,codes",
    [
        ("tf32", [], facts(V100), ["tf32-unsupported"]),
        ("tf32", [], facts(A100), []),
        ("tf32", ["device='cpu'"], facts(CPU), ["tf32-on-cpu"]),
        ("amp-bf16", ["device='cpu'"], facts(CPU), ["slow-bf16-cpu"]),
        ("amp-bf16", ["device='cpu'"], facts(CPU, fast_cpu_dtypes=frozenset({"bf16"})), []),
        ("amp-fp16", ["device='cpu'"], facts(CPU), ["slow-fp16-cpu"]),
        (
            "compile-reduce-overhead",
            ["device='cpu'"],
            facts(CPU),
            ["slow-bf16-cpu", "cudagraphs-cpu"],
        ),
        ("compile-reduce-overhead", [], facts(H100), []),
        (
            "mlp-demo",
            ["batch_size=40000"],
            facts(CPU, host_memory=lambda: (4 * GIB, 5 * GIB)),
            ["memory-estimate"],
        ),
    ],
)
def test_what_runs_slowly_or_otherwise_is_warned_about(
    name: str, overrides: list[str], machine: Facts, codes: list[str]
) -> None:
    verdict = require_runnable(presets.load_preset(name, overrides), machine)
    assert [code for code, _ in verdict.warnings] == codes


@pytest.mark.unit
def test_bf16_on_a_gpu_before_ampere_exits_2_with_the_paragraph(capsys) -> None:
    on_a_t4 = Parts(resolve_device=lambda spec, ranks=None: T4)
    # what `ampscope run amp-bf16 --no-record --steps 2` prints
    code = run("amp-bf16", ["steps=2"], record=False, on_event=ConsoleReporter(), parts=on_a_t4)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == EXIT_USAGE and len(lines) == 1, err
    assert lines[0].startswith("ampscope: precision = 'amp-bf16' needs bf16 Tensor Cores")
    assert "Tesla T4 is 7.5" in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,overrides",
    [
        ("mlp-demo", [*FAST, "steps=2", "compile='off'"]),
        ("fp8-rowwise", ["device='cpu'", "compile='off'", "fp8.emulate=true", "batch_size=8"]),
    ],
)
def test_a_run_sizes_its_workload_once(name: str, overrides: list[str], monkeypatch) -> None:
    if name.startswith("fp8"):
        pytest.importorskip("torchao")
        overrides = [*overrides, "steps=2"]
    real = presets.resolve_workload
    calls: list[str] = []

    def counted(preset: presets.Preset, on_cuda: bool) -> presets.WorkloadSizes:
        calls.append(preset.name)
        return real(preset, on_cuda)

    for module in list(sys.modules.values()):  # wherever it was imported by name
        named = getattr(module, "__name__", "")
        if named.startswith("ampscope") and getattr(module, "resolve_workload", None) is real:
            monkeypatch.setattr(module, "resolve_workload", counted)
    seen: list[ev.Event] = []
    assert run(name, overrides, record=False, on_event=seen.append) == EXIT_OK
    assert any(isinstance(e, ev.StepEvent) for e in seen)
    assert calls == [name]
