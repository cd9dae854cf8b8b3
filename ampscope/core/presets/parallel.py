"""Runs on several processes: the preset's ``[parallel]`` table and how torchrun is asked to
start them.

Torch-free: the table is validated with the rest of the preset (``presets.check_combinations``),
and the launch (``--nproc-per-node``, ``--nnodes``, ``--node-rank``, ``--rdzv-endpoint``) is
checked before any process starts, so a typo is answered at once with exit 2.

Each rank trains the same model on its own batches (``batch_size`` is per rank); the
gradients are averaged by DDP (``strategy = 'ddp'``) or reduce-scattered by FSDP2
(``strategy = 'fsdp2'``, ``torch.distributed.fsdp.fully_shard``).
"""

from __future__ import annotations

import errno
import re
import socket
from dataclasses import dataclass
from typing import Literal

import msgspec

Strategy = Literal["ddp", "fsdp2"]
WireDtype = Literal["auto", "fp32", "bf16", "fp16"]
Compression = Literal["none", "bf16", "fp16"]

MAX_PROCESSES = 1024
DEFAULT_RDZV_TIMEOUT_S = 600  # torchrun's own default for the static rendezvous


class Parallel(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """How the ranks share a step; read only when the run has more than one process."""

    strategy: Strategy = "ddp"
    param_dtype: WireDtype = "auto"  # fsdp2: the dtype layers compute in (all-gathered weights)
    reduce_dtype: WireDtype = "auto"  # fsdp2: the dtype gradients are reduce-scattered in
    grad_compression: Compression = "none"  # ddp: all-reduce gradients cast to this dtype


# fsdp2's defaults follow the preset's precision: AMP keeps fp32 master weights, computes in
# its autocast dtype and reduces in fp32; a pure cast computes and reduces in its own dtype.
FSDP_DEFAULTS: dict[str, tuple[str, str]] = {
    "fp32": ("fp32", "fp32"),
    "tf32": ("fp32", "fp32"),
    "amp-bf16": ("bf16", "fp32"),
    "amp-fp16": ("fp16", "fp32"),
    "bf16": ("bf16", "bf16"),
    "fp16": ("fp16", "fp16"),
    "fp64": ("fp64", "fp64"),
    "fp8": ("bf16", "fp32"),  # fp32 master weights, bf16 autocast around the fp8 matmuls
}
PURE_CASTS = ("bf16", "fp16", "fp64")


def fsdp_dtypes(precision: str, parallel: Parallel) -> tuple[str, str]:
    """(param_dtype, reduce_dtype) for fsdp2, ``auto`` resolved from the precision."""
    param, reduce = FSDP_DEFAULTS[precision]
    if parallel.param_dtype != "auto":
        param = parallel.param_dtype
    if parallel.reduce_dtype != "auto":
        reduce = parallel.reduce_dtype
    return param, reduce


def check_parallel(precision: str, p: Parallel) -> list[tuple[str, str]]:
    """(key at fault, message) for ``[parallel]`` fields that do not fit together."""
    problems: list[tuple[str, str]] = []
    if p.strategy == "ddp":
        for name in ("param_dtype", "reduce_dtype"):
            if getattr(p, name) != "auto":
                problems.append(
                    (
                        f"parallel.{name}",
                        f"parallel.{name} applies to strategy = 'fsdp2' only. DDP all-reduces "
                        "gradients in the parameter dtype; to send them in bf16 or fp16, set "
                        "parallel.grad_compression.",
                    )
                )
    if p.strategy == "fsdp2" and p.grad_compression != "none":
        problems.append(
            (
                "parallel.grad_compression",
                "parallel.grad_compression applies to strategy = 'ddp' only. FSDP2 reduces "
                "gradients in parallel.reduce_dtype (fp32, bf16 or fp16).",
            )
        )
    if p.strategy == "fsdp2" and precision in PURE_CASTS and p.param_dtype != "auto":
        problems.append(
            (
                "parallel.param_dtype",
                f"precision = '{precision}' stores the weights in {precision} "
                "already, so there is no param_dtype to choose. Leave parallel.param_dtype = "
                "'auto', or use an amp-* precision (fp32 master weights).",
            )
        )
    return problems


class LaunchError(ValueError):
    """A launch flag at fault: the message names it and what would be accepted."""


@dataclass(frozen=True)
class Launch:
    """How many processes run one preset, and where; one process on this machine by default."""

    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    rdzv_timeout_s: int | None = None

    @property
    def distributed(self) -> bool:
        return self.nproc_per_node > 1 or self.nnodes > 1

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def torchrun_args(self) -> list[str]:
        """torchrun's own options: a standalone rendezvous on a free port for one machine, the
        static rendezvous at ``rdzv_endpoint`` (node 0 hosts it) for several."""
        args = ["--nproc-per-node", str(self.nproc_per_node)]
        if self.nnodes == 1:
            return [*args, "--standalone"]
        args += ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank)]
        args += ["--rdzv-endpoint", str(self.rdzv_endpoint)]
        if self.rdzv_timeout_s is not None:
            args += ["--rdzv-conf", f"timeout={self.rdzv_timeout_s}"]
        return args

    def flags(self) -> list[str]:
        """The ampscope flags that give this launch again (for a detached run's front-end)."""
        if not self.distributed:
            return []
        out = ["--nproc-per-node", str(self.nproc_per_node)]
        if self.nnodes > 1:
            out += ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank)]
            out += ["--rdzv-endpoint", str(self.rdzv_endpoint)]
        if self.rdzv_timeout_s is not None:
            out += ["--rdzv-timeout", str(self.rdzv_timeout_s)]
        return out

    def describe(self) -> str:
        """For people: '2 processes' or '2 nodes x 8 processes (this is node 1)'."""
        if self.nnodes == 1:
            return f"{self.nproc_per_node} processes"
        return (
            f"{self.nnodes} nodes x {self.nproc_per_node} processes (this is node {self.node_rank})"
        )


def make_launch(
    nproc_per_node: int | None = None,
    nnodes: int | None = None,
    node_rank: int | None = None,
    rdzv_endpoint: str | None = None,
    rdzv_timeout_s: int | None = None,
) -> Launch:
    """A checked Launch from the command-line flags; LaunchError names the flag at fault."""
    nproc = 1 if nproc_per_node is None else nproc_per_node
    nodes = 1 if nnodes is None else nnodes
    if not 1 <= nproc <= MAX_PROCESSES:
        raise LaunchError(
            f"--nproc-per-node {nproc} is out of range. Accepted: 1 to {MAX_PROCESSES} "
            "(one process a GPU; on a CPU, 2 to a few)."
        )
    if not 1 <= nodes <= MAX_PROCESSES:
        raise LaunchError(f"--nnodes {nodes} is out of range. Accepted: 1 to {MAX_PROCESSES}.")
    if rdzv_timeout_s is not None and not 1 <= rdzv_timeout_s <= 86400:
        raise LaunchError(
            f"--rdzv-timeout {rdzv_timeout_s} is out of range. Accepted: 1 to 86400 seconds "
            f"(torchrun waits {DEFAULT_RDZV_TIMEOUT_S} s by default)."
        )
    if nodes == 1:
        for flag, value in (("--node-rank", node_rank), ("--rdzv-endpoint", rdzv_endpoint)):
            if value is not None:
                raise LaunchError(
                    f"{flag} only applies to a job on several machines. Add --nnodes N (N > 1), "
                    "or leave it out: one machine needs only --nproc-per-node."
                )
        return Launch(nproc, 1, None, None, rdzv_timeout_s)
    if node_rank is None or rdzv_endpoint is None:
        raise LaunchError(
            f"--nnodes {nodes} needs --node-rank (this machine's place, 0 to {nodes - 1}) and "
            "--rdzv-endpoint HOST:PORT (node 0's address and a free port), the same endpoint on "
            "every machine."
        )
    if not 0 <= node_rank < nodes:
        raise LaunchError(
            f"--node-rank {node_rank} is out of range for --nnodes {nodes}. Accepted: 0 to "
            f"{nodes - 1}."
        )
    split_endpoint(rdzv_endpoint)
    return Launch(nproc, nodes, node_rank, rdzv_endpoint, rdzv_timeout_s)


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) as (host, port); LaunchError otherwise."""
    host, sep, port_text = endpoint.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    # torchrun reads a host of letters, digits, '.', ':', '-' and '_' and a port of 1 to 5
    # ASCII digits, and answers anything else with a traceback: refused here, in words
    if (
        not sep
        or not re.fullmatch(r"[\w.:-]+", host)
        or not re.fullmatch(r"[0-9]{1,5}", port_text)
        or not 1 <= int(port_text) <= 65535
    ):
        raise LaunchError(
            f"--rdzv-endpoint {endpoint[:80]!r} is not HOST:PORT. Accepted: node 0's host name "
            "or address and a port from 1 to 65535, for example node0:29500."
        )
    return host, int(port_text)


def port_in_use(launch: Launch) -> str | None:
    """On node 0, whose machine hosts the rendezvous: why its port cannot be used, if it cannot.

    Found here, before torchrun starts, rather than as a traceback from inside it.
    """
    if launch.nnodes == 1 or launch.node_rank != 0 or launch.rdzv_endpoint is None:
        return None  # one machine: torchrun picks a free port itself (--standalone)
    host, port = split_endpoint(launch.rdzv_endpoint)
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError as exc:
        return f"--rdzv-endpoint {launch.rdzv_endpoint}: {host} cannot be resolved ({exc})."
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store's server does
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                return (
                    f"--rdzv-endpoint {launch.rdzv_endpoint}: node 0 hosts the rendezvous, but "
                    f"{host} is not an address of this machine. Give node 0's own host name or "
                    "address, or run this command with --node-rank 0 on that machine."
                )
            return (
                f"--rdzv-endpoint {launch.rdzv_endpoint}: port {port} cannot be used on this "
                f"machine ({exc.strerror}); another torchrun job may hold it. Pick a free port "
                "and give the same endpoint to every node."
            )
    return None
