"""FSDP2 under amp-fp16: a ShardedGradScaler beside AdamW on DTensors. What gloo runs (all of
it, with the foreach AdamW), and the one combination torch cannot take (fused AdamW beside the
sharded scaler), which the engine therefore never picks."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from ampscope.core import config as cfg
from ampscope.core import events as ev
from ampscope.engine.device import DeviceInfo
from ampscope.engine.parallelize import fused_adamw
from ampscope.engine.precision import precision_policy
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
    p = cfg.load_preset(preset, [f"parallel.strategy='{strategy}'"])
    assert fused_adamw(p, precision_policy(p), info, grouped) is fused


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


@pytest.mark.subprocess
def test_two_gloo_ranks_train_fsdp2_under_amp_fp16_with_a_sharded_scaler(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ampscope", "run", "amp-fp16", "--nproc-per-node", "2"]
        + ["--steps", "12", "--json", "--runs-dir", str(tmp_path)]
        + ["--set", "workload.kind='mlp'", "--set", "device='cpu'", "--set", "warmup_steps=2"]
        + ["--set", "parallel.strategy='fsdp2'"],
        capture_output=True,
        timeout=240,
        cwd=ROOT,
        env=engine_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [ev.decode(line) for line in proc.stdout.splitlines() if line.strip()]
    hello = next(e for e in events if isinstance(e, ev.HelloEvent))
    done = next(e for e in events if isinstance(e, ev.DoneEvent))
    steps = [e for e in events if isinstance(e, ev.StepEvent)]
    assert (hello.world_size, hello.backend, hello.strategy) == (2, "gloo", "fsdp2")
    assert done.status == "ok" and done.steps_done == 12
    assert all(s.loss_scale is not None for s in steps)  # the scaler ran on every step
    assert steps[-1].loss < steps[0].loss
    sums = [r.param_checksum for r in done.ranks or []]
    assert len(sums) == 2 and sums[0] is not None and sums[0] == sums[1]
