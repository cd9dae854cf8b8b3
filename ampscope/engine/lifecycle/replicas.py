"""What the ranks tell each other besides their steps: where each runs (for ``hello``), their
telemetry samples (for ``sys``), and a checksum of their weights at the end (for ``done``).

Each function is a collective on several processes, so every rank calls it at the same point
of the run; on one process each is a plain local call.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

from ampscope.core import events as ev
from ampscope.engine.device import DeviceInfo
from ampscope.engine.emitter import EventWriter
from ampscope.engine.ranks.link import Link
from ampscope.engine.step.metrics import ReplicasDiverged
from ampscope.engine.step.parallelize import param_checksum
from ampscope.engine.step.setup import Setup
from ampscope.engine.telemetry import TelemetrySampler, start_for_run


def rank_devices(s: Setup) -> list[ev.RankDevice] | None:
    """Every rank's host and device, gathered to all (None on one process)."""
    if not s.link.grouped:
        return None
    mine = ev.RankDevice(
        rank=s.link.rank,
        host=socket.gethostname(),
        device=str(s.info.device),
        device_name=s.info.name,
        pid=os.getpid(),
    )
    return s.link.gather(mine)


def start_sampler(
    writer: EventWriter, info: DeviceInfo, hz: float, link: Link
) -> tuple[TelemetrySampler, Callable[[], ev.RankSys | None]]:
    """The run's telemetry sampler, and a call that hands this rank's newest sample (once) to
    the step exchange. Rank 0's ``sys`` events carry every rank's latest sample."""
    if not link.grouped:
        return start_for_run(writer, info, hz=hz), lambda: None
    newest: list[ev.RankSys | None] = [None]

    def emit(event: ev.Event) -> None:
        if isinstance(event, ev.SysEvent):
            mine = rank_sample(link.rank, event)
            link.put_sample(mine)
            newest[0] = mine
            event.ranks = link.latest_samples()
        writer.emit(event, urgent=isinstance(event, ev.WarningEvent))  # rank 0's alone go out

    def take() -> ev.RankSys | None:
        sample, newest[0] = newest[0], None
        return sample

    sampler = TelemetrySampler(emit, uuid=info.uuid, cuda=info.is_cuda, hz=hz).start()
    return sampler, take


def rank_sample(rank: int, e: ev.SysEvent) -> ev.RankSys:
    return ev.RankSys(
        rank=rank,
        gpu_util=e.gpu_util,
        gpu_mem_used=e.gpu_mem_used,
        gpu_mem_total=e.gpu_mem_total,
        power_w=e.power_w,
        proc_cpu=e.proc_cpu,
        proc_rss=e.proc_rss,
    )


def compare_weights(s: Setup, last_step: int | None) -> list[str | None] | None:
    """Every rank's weight checksum; ReplicasDiverged when they differ (None on one process).

    DDP keeps a full replica on every rank, identical after every step; FSDP2 gathers the
    shards, so every rank sees the same whole weights too.
    """
    if not s.link.grouped:
        return None
    sums: list[str | None] = s.link.gather(param_checksum(s.model))
    if len(set(sums)) > 1:
        listed = ", ".join(f"rank {r}: {c}" for r, c in enumerate(sums))
        raise ReplicasDiverged(
            last_step or 0,
            f"Replicas ended with different weights ({listed}): the ranks trained different "
            "models. Gradients were not averaged alike on every rank.",
        )
    return sums
