"""An all-reduce's bus bandwidth across this machine's GPUs, for ``doctor --bench``: one
process per GPU over NCCL, timed as nccl-tests' all_reduce_perf times it (the median of
repeats after a warm-up), and given as its bus bandwidth. Over gloo the same code runs on a
CPU, which is how it is tested without a GPU.
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time

import torch

from ampscope.core.machine.check import allreduce_busbw
from ampscope.core.processes.launch import child_env

ALLREDUCE_BYTES = 256 << 20
"""nccl-tests reaches a link's bandwidth from about 128 MiB on; a step's gradients are of
that order too."""
WARMUP, REPEATS = 3, 10
START_TIMEOUT_S = 90.0  # each rank imports torch and sets up NCCL before the first message


def allreduce_gbps(
    ranks: int,
    nbytes: int = ALLREDUCE_BYTES,
    backend: str = "nccl",
    timeout_s: float = START_TIMEOUT_S,
) -> float:
    """The bus bandwidth (GB/s) of an all-reduce of ``nbytes`` over ``ranks`` processes (GPU
    ``rank`` each over NCCL; the CPU over gloo). Raises RuntimeError when a rank fails or the
    ranks do not answer within ``timeout_s``; no process is left behind."""
    port = _free_port()
    command = [sys.executable, "-m", "ampscope.engine.machine.allreduce", str(ranks), str(port)]
    command += [backend, str(nbytes)]
    procs = [
        subprocess.Popen(
            [*command, str(rank)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=child_env(),
            text=True,
        )
        for rank in range(ranks)
    ]
    try:
        out, err = procs[0].communicate(timeout=timeout_s)
        for rank, proc in enumerate(procs[1:], start=1):
            proc.wait(timeout=30)
            if proc.returncode != 0:
                raise RuntimeError(f"rank {rank} ended with exit code {proc.returncode}")
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the ranks did not answer within {timeout_s:g} s") from None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if procs[0].returncode != 0:
        last = (err.strip().splitlines() or ["no message"])[-1]
        raise RuntimeError(f"rank 0 ended with exit code {procs[0].returncode}: {last[:300]}")
    return allreduce_busbw(nbytes / float(out.strip()) / 1e9, ranks)


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, ranks: int, port: int, backend: str, nbytes: int) -> None:
    """One rank: join the group, warm up, time the repeats; rank 0 prints the median."""
    import torch.distributed as dist

    os.environ.setdefault("NCCL_DEBUG", "WARN")
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks
    )
    on_gpu = backend == "nccl"
    device = torch.device("cuda", rank) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    data = torch.ones(nbytes // 4, dtype=torch.float32, device=device)

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize(device)

    for _ in range(WARMUP):
        dist.all_reduce(data)
    sync()
    times = []
    for _ in range(REPEATS):
        dist.barrier()
        sync()
        start = time.perf_counter()
        dist.all_reduce(data)
        sync()
        times.append(time.perf_counter() - start)
    if rank == 0:
        print(statistics.median(times), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    _ranks, _port, _backend, _nbytes, _rank_index = sys.argv[1:6]
    _rank(int(_rank_index), int(_ranks), int(_port), _backend, int(_nbytes))
