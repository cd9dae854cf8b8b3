"""The GPU check's commands, as a lent H200 would run them, checked before it is lent.

``GPU_CHECK_DRY_RUN=1`` runs every stage of ``benchmarks/gpu_check.sh`` without running what it
calls: each command goes to OUTDIR/plan.txt. Each command must parse as the CLI parses it, and
each preset with its ``--set`` overrides must load and pass the checks a run makes before it
builds anything, on a made-up H200 (the smoke run, on the CPU). The smoke run trains fewer
presets than the GPU run; these checks cover all of the GPU run's.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from ampscope.cli.main import build_parser
from ampscope.core.presets import load_preset
from ampscope.core.presets.run_args import (
    ArgParser,
    add_run_arguments,
    model_overrides,
    run_overrides,
)
from ampscope.engine.device import DeviceInfo
from ampscope.engine.step.validation import Facts, check_run
from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check_rules  # noqa: E402

pytestmark = pytest.mark.subprocess  # bash, with every command written down instead of run

GIB = 1 << 30
H200 = DeviceInfo(torch.device("cuda", 0), "NVIDIA H200", (9, 0), 141 * GIB, 700.0, None)
CPU = DeviceInfo(torch.device("cpu"), "AMD EPYC", None, None, None, None)
STAGE_LINE = re.compile(r"^# stage (\S+): at most (\d+) s, started with (\d+) s or more left$")


@dataclass(frozen=True)
class Training:
    """One preset a command trains, with the overrides it gives it."""

    stage: str
    preset: str
    overrides: tuple[str, ...]
    grouped: bool  # one rank of a process group (torchrun)
    command: str


@dataclass
class Plan:
    stages: dict[str, tuple[int, int]]  # name -> (cap, need)
    commands: list[tuple[str, list[str]]]  # (stage, argv)
    budget: int


def dry_run(tmp: Path, **env: str) -> Plan:
    out = tmp / "out"
    run_env = dict(os.environ, GPU_CHECK_DRY_RUN="1", PY="python3", **env)
    for key in ("GPU_CHECK_SMOKE", "GPU_CHECK_STAGES", "GPU_CHECK_BUDGET_S"):
        if key not in env:
            run_env.pop(key, None)
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), str(out)],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    budget = re.search(r"^budget (\d+) s", proc.stdout, re.M)
    assert budget is not None, proc.stdout
    plan = Plan({}, [], int(budget.group(1)))
    for line in (out / "plan.txt").read_text().splitlines():
        if m := STAGE_LINE.match(line):
            plan.stages[m.group(1)] = (int(m.group(2)), int(m.group(3)))
        else:
            stage, *argv = shlex.split(line)
            plan.commands.append((stage, argv))
    return plan


def engine_parser() -> argparse.ArgumentParser:
    parser = ArgParser(prog="python -m ampscope.engine")
    add_run_arguments(parser)
    return parser


def trainings(plan: Plan) -> list[Training]:
    """Every preset a command of the plan trains, with its overrides, as the CLI reads them."""
    found: list[Training] = []
    for stage, argv in plan.commands:
        text = shlex.join(argv)
        assert "python3" in argv[0], text  # the device has python3 (or $PY), no python
        if argv[1:3] == ["-m", "ampscope"]:
            args = build_parser().parse_args(argv[3:])
            if args.command == "run":
                grouped = (args.nproc_per_node or 1) > 1
                found.append(Training(stage, args.preset, (*run_overrides(args),), grouped, text))
            elif args.command == "bench":
                presets = dict.fromkeys([args.baseline, *args.presets])
                found += [Training(stage, p, (*run_overrides(args),), False, text) for p in presets]
            elif args.command == "profile":
                overrides = (*model_overrides(args), *args.overrides)
                found.append(Training(stage, args.preset, overrides, False, text))
            elif args.command == "numerics":
                overrides = ("numerics.every=1", *run_overrides(args))
                found.append(Training(stage, args.preset, overrides, False, text))
            else:
                assert args.command == "doctor", text
        elif "torch.distributed.run" in argv:
            at = argv.index("ampscope.engine")
            args = engine_parser().parse_args(argv[at + 1 :])
            found.append(Training(stage, args.preset, (*run_overrides(args),), True, text))
        elif argv[1].endswith("gpu_check.py") and argv[2] == "dashboard":
            preset, *overrides = shlex.split(argv[argv.index("--autostart") + 1])
            assert argv[argv.index("--") + 1 :] == ["python3", "-m", "ampscope"], text
            found.append(Training(stage, preset, tuple(overrides), False, text))
        else:
            assert argv[1].endswith("gpu_check.py") and argv[2] == "imports", text
    return found


def facts(info: DeviceInfo, grouped: bool) -> Facts:
    """The lent machine: one H200 (141 GiB), 128 GiB of host memory, torchao carried."""
    gpu = (lambda: (140 * GIB, 141 * GIB)) if info.is_cuda else None
    return Facts(info, grouped, True, frozenset({"bf16"}), gpu, lambda: (120 * GIB, 128 * GIB))


def refusals(t: Training, info: DeviceInfo) -> list[str]:
    preset = load_preset(t.preset, list(t.overrides))
    verdict = check_run(preset, facts(info, t.grouped), every=True)
    return [str(r) for r in verdict.refusals]


def test_every_gpu_command_parses_and_each_preset_can_run_on_an_h200(tmp_path: Path) -> None:
    plan = dry_run(tmp_path, GPU_CHECK_DRY_RUN_GPUS="2")
    assert list(plan.stages) == list(gpu_check_rules.STAGES)  # every stage the checks judge
    found = trainings(plan)
    for t in found:
        assert refusals(t, H200) == [], (t.stage, t.preset, t.command)
        preset = load_preset(t.preset, list(t.overrides))
        assert preset.device == "cuda", t.command
    by_stage: dict[str, set[str]] = {}
    for t in found:
        by_stage.setdefault(t.stage, set()).add(t.preset)
    assert by_stage["eager"] == {
        "fp32", "tf32", "amp-bf16", "amp-fp16", "amp-fp16-noscale", "bf16", "fp16"
    }  # fmt: skip
    assert by_stage["probe"] == {"tf32", "fp32"}
    assert by_stage["compile"] == {"compile-default", "compile-reduce-overhead"}
    assert by_stage["fp8"] == {"compile-default", "fp8-tensorwise", "fp8-rowwise"}
    assert by_stage["max-autotune"] == {"amp-bf16", "compile-max-autotune"}
    across = [t for t in found if "--nproc-per-node 2" in t.command]
    strategies = [load_preset(t.preset, list(t.overrides)).parallel.strategy for t in across]
    assert list(zip([t.preset for t in across], strategies, strict=True)) == [
        ("amp-bf16", "ddp"),
        ("amp-fp16", "fsdp2"),  # FSDP2 with its sharded GradScaler, across the GPUs
    ]
    probe = [load_preset(t.preset, list(t.overrides)) for t in found if t.stage == "probe"]
    assert {(p.workload.kind, p.compile) for p in probe} == {("cnn", "max-autotune-no-cudagraphs")}


def test_the_smoke_run_trains_a_subset_of_the_gpu_runs_presets_and_each_can_run_on_a_cpu(
    tmp_path: Path,
) -> None:
    gpu = {(t.stage, t.preset) for t in trainings(dry_run(tmp_path / "gpu"))}
    smoke = trainings(dry_run(tmp_path / "smoke", GPU_CHECK_SMOKE="1"))
    assert {(t.stage, t.preset) for t in smoke} <= gpu
    for t in smoke:
        assert refusals(t, CPU) == [], (t.stage, t.preset, t.command)
        assert load_preset(t.preset, list(t.overrides)).device == "cpu", t.command


def test_the_gpu_run_fits_two_ten_minute_commands_with_margin(tmp_path: Path) -> None:
    """The stages start while the budget has the seconds each needs, and end by its deadline
    (a stage's timeout is what is left): the budget, 20 s for a stage to die after its
    timeout, 15 s of checks, well inside 600 s. On an H200 the stages took more than one
    command has, so the first call runs the stages up to fp8, and the second the two long
    compiles (GPU_CHECK_STAGES=fp8,max-autotune); both fit the 15 minutes a session is lent."""
    plan = dry_run(tmp_path)
    assert plan.budget <= 480
    assert plan.budget + 20 + 15 <= 540
    for name, (cap, need) in plan.stages.items():
        assert 0 < need <= cap, name
    second = ("fp8", "max-autotune")
    assert list(plan.stages)[-2:] == list(second)
    first = sum(need for name, (_, need) in plan.stages.items() if name not in second)
    assert first <= plan.budget - 15, "the first call cannot start every stage before fp8"
    second_budget = 360  # GPU_CHECK_BUDGET_S of the second call, as docs/gpu-check.md gives it
    assert sum(plan.stages[name][1] for name in second) <= second_budget - 15
    # the first call's stages and checks, the second call's worst case, a minute of starts
    assert first + 15 + second_budget + 20 + 15 + 60 <= 900
