"""``ampscope profile``'s line on what would help: for this device, naming a setting that exists,
and a word when the profile was taken under load."""

from __future__ import annotations

import itertools
import re
import subprocess

import pytest

from ampscope.core import events as ev
from ampscope.core import presets, profiles
from ampscope.core.profiles import RunFacts
from ampscope.core.profiles.rules import OpTime

pytestmark = pytest.mark.unit


def profile_of(timing: str, **ms: float) -> ev.ProfileEvent:
    """One step of 10 ms: ``matmul__bf16=6`` is 6 ms of bf16 matmul, ``idle=2`` 2 ms with no
    kernel running; the rest of the step is other."""
    idle = ms.pop("idle", 0.0)
    ops = [OpTime("op-rest", "other", (10.0 - idle - sum(ms.values())) * 1000.0, 2)]
    for key, share in ms.items():
        cls, _, dtype = key.partition("__")
        ops.append(OpTime(f"op-{key}", cls, share * 1000.0, 2, dtype or None))
    return profiles.summarize(ops, 10_000.0, step=5, steps=1, timing=timing, idle_us=idle * 1000)


COSTS = {
    "data": {"data": 4.0},
    "idle": {"idle": 6.0, "matmul__bf16": 2.0},
    "communication": {"communication": 5.0},
    "fp32 matmul": {"matmul__fp32": 6.0},
    "fusion": {"elementwise": 3.0, "norm_act": 2.0},
    "optimizer": {"optimizer": 5.0},
    "loss scaling": {"loss_scaling": 3.0},
    "memcpy": {"memcpy": 4.0},
    "compute-bound": {"matmul__bf16": 9.0},
    "compute-bound fp32": {"matmul__fp32": 2.4, "attention": 5.0},
}
FACTS = [
    RunFacts(),  # the Run view's profile: nothing known
    RunFacts(precision="fp32", compile="off", optimizer="per-tensor", fast_bf16=False),  # a CPU
    RunFacts(precision="fp32", compile="off", optimizer="per-tensor", fast_bf16=True),
    RunFacts(precision="amp-bf16", compile="default", optimizer="fused", fast_bf16=True),  # A100
    RunFacts(
        precision="amp-bf16", compile="reduce-overhead", optimizer="fused", fast_bf16=True, fp8=True
    ),  # fmt: skip
    RunFacts(precision="amp-fp16", compile="off", optimizer="foreach", fast_bf16=False),  # V100
]


def _settings(text: str) -> list[str]:
    """Every ``--set KEY=VALUE`` an advice names, with N (a number of the user's) as 8."""
    return [s.replace("=N", "=8") for s in re.findall(r"--set ([\w.]+=(?:'[^']*'|[\w.]+))", text)]


@pytest.mark.parametrize(("cost", "timing"), list(itertools.product(COSTS, ["cpu", "device"])))
def test_every_advice_names_a_setting_that_exists(cost: str, timing: str) -> None:
    """'a fused or foreach optimizer (fused=True) would help most' named no field there was:
    each --set an advice names loads, and each preset it names exists."""
    for facts in FACTS:
        text = profiles.advice(profile_of(timing, **COSTS[cost]), facts)
        for setting in _settings(text):
            presets.load_preset("fp32", [setting])  # raises ConfigError for a field that is not
        for name in re.findall(r"the ([\w-]+) preset", text):
            presets.find_preset(name)
        assert "fused=True" not in text


def test_fp8_is_never_advised_where_the_device_cannot_run_it() -> None:
    """A compute-bound step on a CPU was told 'a lower-precision format or fp8 is what is
    left'; fp8 needs a GPU of compute capability 8.9 or newer."""
    bf16_cpu = profile_of("cpu", matmul__bf16=7.0)
    cpu = RunFacts(precision="amp-bf16", optimizer="per-tensor", fast_bf16=True)
    assert "fp8" not in profiles.advice(bf16_cpu, cpu)
    assert "fp8" not in profiles.advice(bf16_cpu)  # not known to run it: not offered
    bf16_gpu = profile_of("device", matmul__bf16=9.0)
    a100 = RunFacts(precision="amp-bf16", optimizer="fused", fast_bf16=True, fp8=False)
    assert "fp8" not in profiles.advice(bf16_gpu, a100)
    h100 = RunFacts(precision="amp-bf16", optimizer="fused", fast_bf16=True, fp8=True)
    assert profiles.advice(bf16_gpu, h100) == (
        "Matrix multiplies take 90%: the step is compute-bound; what is left is "
        "a larger batch (--set batch_size=N) or fp8 (the fp8-tensorwise preset)."
    )
    fp8_run = RunFacts(precision="fp8", optimizer="fused", fast_bf16=True, fp8=True)
    assert "fp8" not in profiles.advice(bf16_gpu, fp8_run)  # it is fp8 already


def test_the_dense_work_is_named_as_the_step_did_it() -> None:
    """A U-Net's step, 68 % convolutions, was told 'Matrix multiplies and attention take 68%'."""
    cpu = RunFacts(precision="amp-bf16", optimizer="per-tensor", fast_bf16=True)
    unet = profiles.advice(profile_of("cpu", conv__bf16=6.8), cpu)
    assert unet.startswith("Convolutions take 68%: the step is compute-bound")
    llama = profiles.advice(profile_of("cpu", matmul__bf16=5.0, attention__bf16=2.0), cpu)
    assert llama.startswith("Matrix multiplies and attention take 70%")


def test_a_narrower_format_is_not_advised_on_a_cpu_without_bf16_units() -> None:
    fp32 = profile_of("cpu", matmul__fp32=6.0)
    without = profiles.advice(fp32, RunFacts(precision="fp32", fast_bf16=False))
    assert "no bf16 units" in without and "--set precision" not in without
    with_units = profiles.advice(fp32, RunFacts(precision="fp32", fast_bf16=True))
    assert "bf16 autocast (--set precision='amp-bf16') would help most" in with_units


def test_the_optimizer_advice_follows_the_adamw_that_ran() -> None:
    heavy = profile_of("cpu", optimizer=5.0)
    per_tensor = profiles.advice(heavy, RunFacts(optimizer="per-tensor"))
    assert per_tensor == (
        "The optimizer takes 50% (AdamW per-tensor): fused AdamW (--set optimizer.fused=true) "
        "would help most."
    )
    fused = profiles.advice(heavy, RunFacts(optimizer="fused"))
    assert "fused AdamW already" in fused and "optimizer.fused" not in fused


def test_advice_does_not_offer_what_the_run_has() -> None:
    fusion = profile_of("device", elementwise=3.0, norm_act=2.0)
    compiled = profiles.advice(fusion, RunFacts(compile="default"))
    assert "compiled already (compile = 'default')" in compiled and "--set compile" not in compiled
    idle = profile_of("device", idle=6.0, matmul__bf16=2.0)
    graphs = profiles.advice(idle, RunFacts(compile="reduce-overhead"))
    assert "CUDA graphs already" in graphs and "--set compile" not in graphs


def test_a_profile_under_load_says_so_and_a_quiet_one_says_nothing() -> None:
    assert profiles.load_note(0.1, 2, 2) is None  # a quiet machine
    assert profiles.load_note(3.0, 64, 16) is None  # others' work on cores the run left free
    said = profiles.load_note(1.0, 2, 2)
    assert said is not None and said.startswith(
        "Taken under load: other processes used 1.0 of this machine's 2 cores while it ran "
        "(2 threads here)"
    )


def profile_cli(capsys, load, *argv: str) -> subprocess.CompletedProcess[str]:
    """``ampscope profile ARGV`` as its command line reads it, other processes' use of the
    CPUs measured by ``load``: what it prints and returns."""
    from ampscope.cli.main import command_args
    from ampscope.cli.profile import cmd_profile

    code = cmd_profile(command_args(["profile", *argv]), load)
    said = capsys.readouterr()
    return subprocess.CompletedProcess(["profile", *argv], code, said.out, said.err)


def test_ampscope_profile_says_when_other_processes_took_the_cores(capsys) -> None:
    """Two profiles seconds apart gave opposite advice with no word about the load: the
    machine's busy CPU time during the profile, less the run's own, is other processes'."""
    from ampscope.cli.profile import LoadWatch

    readings = iter([(100.0, 50.0, 10.0), (102.0, 56.0, 12.0)])  # others: 4 s of CPU in 2 s
    load = LoadWatch(lambda: next(readings), cores=lambda: 2, threads=lambda: 1)
    said = profile_cli(
        capsys,
        load, "mlp-demo", "--device", "cpu", "--steps", "1", "--no-record",
        "--set", "workload.width=32", "--set", "workload.layers=1", "--set", "batch_size=4",
    )  # fmt: skip
    assert said.returncode == 0, said.stderr
    assert (
        "Taken under load: other processes used 2.0 of this machine's 2 cores while it ran "
        "(1 thread here)" in " ".join(said.stdout.split())
    )
    assert all(len(line) <= 80 for line in said.stdout.splitlines()[-4:])  # wrapped at words
    assert next(readings, None) is None  # read at the profile's start and its end


def test_the_json_says_under_load_null_on_a_quiet_machine(capsys) -> None:
    import json

    from ampscope.cli.profile import LoadWatch

    readings = iter([(100.0, 50.0, 10.0), (102.0, 52.0, 12.0)])  # the run's own work only
    said = profile_cli(
        capsys,
        LoadWatch(lambda: next(readings)), "mlp-demo", "--device", "cpu", "--steps", "1", "--no-record", "--json",
        "--set", "workload.width=32", "--set", "workload.layers=1", "--set", "batch_size=4",
    )  # fmt: skip
    assert said.returncode == 0, said.stderr
    data = json.loads(said.stdout)
    assert data["under_load"] is None and "fp8" not in data["advice"]
