"""The model's own GEMM shapes, timed on this GPU: bf16 against each fp8 kernel.

For every distinct forward shape ``(M, K, N)`` a plan holds, each of the layer's three GEMMs
(forward ``M x K @ K x N``, grad-input ``M x N @ N x K``, grad-weight ``K x M @ M x N``) is
timed in bf16 (``torch.mm``) and as torchao runs it in fp8 (``torch._scaled_mm``: the
tensorwise kernel; the rowwise kernel with fast accumulation for the forward GEMM, and for the
two backward ones cuBLAS's tensorwise kernel with a separate rescale of the output, as
``torchao/float8/float8_ops.py`` does). CUDA events around a few repetitions after warm-up,
one synchronisation a figure: a few seconds for a model's shapes. The casts are not timed: the
speed model adds them (``core.plan.speed``). CUDA only; ``GemmTimer`` is the seam the tests fake.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from ampscope.core.plan.speed import GemmFormat, GemmTimes, Shape
from ampscope.engine.private_apis import scaled_mm

WARMUP, REPEATS = 3, 10
GemmTimer = Callable[[Iterable[Shape]], GemmTimes]


def time_gemms(shapes: Iterable[Shape], device: torch.device | None = None) -> GemmTimes:
    """Seconds of each shape's three GEMMs in bf16, tensorwise and rowwise fp8, on ``device``
    (a CUDA device; the current one by default)."""
    device = device or torch.device("cuda", torch.cuda.current_device())
    times: dict[tuple[Shape, GemmFormat], tuple[float, float, float]] = {}
    for shape in sorted(set(shapes)):
        m, k, n = shape
        gemms = ((m, k, n), (m, n, k), (k, m, n))
        for kernel in ("bf16", "tensorwise", "rowwise"):
            seconds = [
                _time_one(a, b, c, kernel, i == 0, device) for i, (a, b, c) in enumerate(gemms)
            ]
            times[(shape, kernel)] = (seconds[0], seconds[1], seconds[2])
        torch.cuda.empty_cache()
    return times


def _time_one(
    m: int, k: int, n: int, kernel: GemmFormat, forward: bool, device: torch.device
) -> float:
    """One ``(m x k) @ (k x n)`` GEMM on ``kernel``, in seconds."""
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, k, device=device, dtype=torch.bfloat16).t()  # column-major, as a weight
    if kernel == "bf16":

        def run() -> torch.Tensor:
            return torch.mm(a, b)

    else:
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        one = torch.ones((), device=device)
        rows, cols = torch.ones(m, 1, device=device), torch.ones(1, n, device=device)
        if kernel == "tensorwise":

            def run() -> torch.Tensor:
                return scaled_mm(a8, b8, one, one, use_fast_accum=forward)

        elif forward:

            def run() -> torch.Tensor:
                return scaled_mm(a8, b8, rows, cols, use_fast_accum=True)

        else:

            def run() -> torch.Tensor:
                return scaled_mm(a8, b8, one, one, use_fast_accum=False) * (rows * cols)

    for _ in range(WARMUP):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPEATS):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0 / REPEATS
