"""FSDP2 under amp-fp16: a ShardedGradScaler beside AdamW on DTensors. The one combination torch
cannot take (fused AdamW beside the sharded scaler), which the engine therefore never picks. Two
gloo ranks train it in tests/test_torchrun.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from ampscope.core import presets
from ampscope.engine.device import DeviceInfo
from ampscope.engine.step.precision import precision_policy
from tests.helpers import ROOT, engine_env

H200 = DeviceInfo(torch.device("cuda", 0), "NVIDIA H200", (9, 0), 141 << 30, 700.0, None)
CPU = DeviceInfo(torch.device("cpu"), "AMD EPYC", None, None, None, None)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("preset", "strategy", "grouped", "info", "fused"),
    [
        ("amp-fp16", "fsdp2", True, H200, False),  # ShardedGradScaler: foreach AdamW
        ("amp-fp16", "ddp", True, H200, True),  # the plain GradScaler takes fused AdamW
        ("amp-fp16", "fsdp2", False, H200, True),  # one process: no sharding, plain scaler
        ("amp-bf16", "fsdp2", True, H200, True),  # no scaler at all
        ("amp-fp16-noscale", "fsdp2", True, H200, True),
        ("amp-bf16", "ddp", False, CPU, False),  # the CPU keeps torch's default
    ],
)
def test_fused_adamw_only_where_the_scaler_lets_it(
    preset: str, strategy: str, grouped: bool, info: DeviceInfo, fused: bool
) -> None:
    p = presets.load_preset(preset, [f"parallel.strategy='{strategy}'"])
    assert precision_policy(p, info.is_cuda, grouped).fused_adamw is fused


PROBE = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    for kind in ("fused", "foreach"):
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        for block in model:
            if list(block.parameters()):
                fully_shard(block)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=kind == "fused" or None)
        scaler = ShardedGradScaler("cpu")
        try:
            for _ in range(2):
                with torch.autocast("cpu", dtype=torch.float16):
                    out = model(torch.randn(8, 16))
                    loss = nn.functional.cross_entropy(out, torch.arange(8) % 4)
                scaler.scale(loss).backward()
                scaler.unscale_(opt)  # to clip, as the engine does: the flag then has shape [1]
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
            print(f"{kind}: trained")
        except RuntimeError as exc:
            print(f"{kind}: refused:", exc)
    dist.destroy_process_group()
    """
)


@pytest.mark.subprocess
def test_torch_fused_adamw_cannot_take_the_sharded_scalers_flag() -> None:
    """Why ``fused_adamw`` says no under FSDP2 with a scaler. When a torch release fixes it,
    this fails: fused AdamW may then come back there."""
    proc = subprocess.run(  # both in one process: each start costs seconds of imports
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=engine_env(),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    said = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert said["foreach"] == "trained"
    assert said["fused"].startswith("refused:") and "broadcast shape [1]" in said["fused"]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("preset", "overrides", "grouped", "scaler"),
    [
        ("amp-fp16", ["parallel.strategy='fsdp2'"], True, "sharded"),
        ("amp-fp16", ["parallel.strategy='ddp'"], True, "plain"),
        ("amp-fp16", ["parallel.strategy='fsdp2'"], False, "plain"),  # one process
        ("amp-bf16", [], False, "none"),
        ("amp-bf16", ["grad_scaler='on'"], False, "plain"),
        ("fp16", [], False, "none"),  # a pure cast is never scaled
        ("fp32", ["grad_scaler='on'"], False, "plain"),
    ],
)
def test_one_decision_names_the_scaler_and_the_scaler_built_is_that_one(
    preset: str, overrides: list[str], grouped: bool, scaler: str
) -> None:
    p = presets.load_preset(preset, overrides)
    policy = precision_policy(p, False, grouped)
    assert policy.scaler == scaler
    if scaler != "sharded":  # a sharded one needs a process group to step, not to be named
        built = policy.grad_scaler(torch.device("cpu"), p.scaler)
        assert built.is_enabled() is (scaler != "none")
