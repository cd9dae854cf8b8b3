"""Which rank this engine process is, as torchrun tells it (environment variables; no torch).

torchrun starts one engine per rank with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE`` and ``GROUP_RANK`` (the node) set; such an engine joins the process group,
also when it is the only rank (``torchrun --nproc-per-node 1``: the same code path as on eight
GPUs, on one). An engine started any other way is the only rank of its run and joins nothing.

Rank 0 is the run's voice: it alone writes the event stream (stdout) and the run record, with
every rank's figures gathered to it each step. The other ranks train, check and report to it.

Beside this module (which rank this process is):

    link.py         every step's figures gathered, one decision to stop, the failed rank named
    stall_watch.py  which rank holds the others up

DDP and FSDP2 around the model are built with the step (``step/parallelize.py``); what the
ranks compare besides their steps (devices, telemetry, weights) is ``lifecycle/replicas.py``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ampscope.core.presets import ConfigError


@dataclass(frozen=True)
class RankEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    launched: bool = False  # by torchrun

    @property
    def distributed(self) -> bool:
        """Joins a process group (DDP or FSDP2 around the model)."""
        return self.launched

    @property
    def lead(self) -> bool:
        """The rank that writes the stream and the record."""
        return self.rank == 0

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> RankEnv:
        env = os.environ if env is None else env
        if "WORLD_SIZE" not in env or "RANK" not in env:
            return cls()
        try:
            return cls(
                rank=int(env["RANK"]),
                world_size=int(env["WORLD_SIZE"]),
                local_rank=int(env.get("LOCAL_RANK", "0")),
                local_world_size=int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
                node_rank=int(env.get("GROUP_RANK", "0")),
                launched=True,
            )
        except ValueError:
            raise ConfigError(
                "RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE must be whole numbers (torchrun "
                "sets them); start several processes with 'ampscope run PRESET --nproc-per-node N'."
            ) from None

    @staticmethod
    def lead_by_environ(env: Mapping[str, str] | None = None) -> bool:
        """Rank 0, or no torchrun: read leniently, for a refusal before anything else."""
        return (os.environ if env is None else env).get("RANK", "0").strip() in ("0", "")

    def device_spec(self, spec: str) -> str:
        """The preset's ``device`` for this rank: every rank of a GPU run takes the GPU of its
        local rank. Raises ConfigError for a device that cannot be shared out."""
        if not self.distributed or spec == "cpu":
            return spec
        if spec.startswith("cuda:"):
            raise ConfigError(
                f"device = '{spec}' pins every rank to one GPU. With several processes use "
                "device = 'cuda' or 'auto' (rank r takes the GPU of its local rank), or 'cpu'.",
                key="device",
            )
        return spec  # "auto" or "cuda": resolved against LOCAL_RANK in engine/device.py
