"""The speed model: a linear layer's fp8 training step against bf16's, from a roofline.

A linear layer's step is three GEMMs (forward ``(M, K, N)``, grad-input ``(M, N, K)``,
grad-weight ``(K, M, N)``); in fp8 its tensors are also cast, each by kernels that read and
write memory. Each GEMM takes the longer of its arithmetic at the format's throughput and its
bytes at the memory bandwidth; each cast kernel its bytes at the bandwidth; every kernel at
least ``KERNEL_FLOOR``. The casts' bytes are torchao's kernels as a compiled model runs them
(``CAST_KERNELS``): the first read of the input and of the gradient fuses into the op before
(a norm, an activation's backward), the rest does not. The speed-up is bf16's time over fp8's.

The model has few constants, each with its source (``CONSTANTS``); a GPU's throughputs are its
datasheet's (``core.machine.hardware``) times an achievable fraction, or what the machine
check measured on this GPU (``ampscope doctor --bench``), or the GEMMs' times measured on this
GPU for the model's own shapes (``GemmTimes``), each figure saying which. docs/plan.md tells
how it scores against torchao's published rowwise table and where it errs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ampscope.core.machine.hardware import GPUS, Gpu, datasheet_gbps, identify

Shape = tuple[int, int, int]  # (M, K, N) of the forward GEMM
GemmFormat = str  # "bf16" | "tensorwise" | "rowwise": the kernel a GEMM runs on
GemmTimes = Mapping[tuple[Shape, GemmFormat], tuple[float, float, float]]
"""Measured seconds of a layer's three GEMMs (forward, grad-input, grad-weight) per shape and
kernel, where this GPU timed them."""


@dataclass(frozen=True)
class Constant:
    """One number of the model, with where it comes from."""

    name: str
    value: float
    unit: str
    source: str


GEMM_FRACTION = Constant(
    "gemm_fraction",
    0.78,
    "of the datasheet's dense bf16 and fp8 peak",
    "torchao's roofline (torchao/testing/training/roofline_utils.py, "
    "pct_achievable_gemm_tops: 'based on experimental observation with sample large inputs', "
    "an H100); the tensorwise fp8 GEMMs are cuBLAS's, as bf16's",
)
ROWWISE_GEMM_FRACTION = Constant(
    "rowwise_gemm_fraction",
    0.55,
    "of the datasheet's dense fp8 peak",
    "a rowwise-scaled fp8 GEMM alone measured 1,083-1,141 TFLOP/s, 0.55-0.58 of the "
    "datasheet, on a 500 W H100 (pytorch/FBGEMM#2546); PyTorch's rowwise kernel runs at "
    "50-100 % of the tensorwise one (pytorch/pytorch#147971), and torchao runs a rowwise "
    "layer's two backward GEMMs on cuBLAS's tensorwise kernel with fp32-promoted accumulation "
    "(torchao/float8/float8_ops.py). 0.55 is the measured range's low end; docs/plan.md gives "
    "the score against torchao's table from 0.45 to 0.60",
)
MEMORY_FRACTION = Constant(
    "memory_fraction",
    0.70,
    "of the datasheet's memory bandwidth",
    "ampscope's machine check calls a copy at 70 % of the datasheet or more typical "
    "(core/machine/verdicts.py, TYPICAL_MEMORY); torchao's roofline assumes 92 % of its "
    "H100's 2.4 TB/s, 66 % of the SXM datasheet's 3.35",
)
KERNEL_FLOOR = Constant(
    "kernel_floor",
    2e-6,
    "seconds a kernel, at least",
    "torchao's roofline (KERNEL_LAUNCH_OVERHEAD_SEC: a one-element Triton kernel timed on an H100)",
)
CONSTANTS = (GEMM_FRACTION, ROWWISE_GEMM_FRACTION, MEMORY_FRACTION, KERNEL_FLOOR)

BF16_BYTES, FP8_BYTES = 2, 1

# The cast kernels of each recipe in a compiled model: (tensor, bytes per element, what).
# "input" is M x K, "weight" K x N, "grad" M x N. Bytes read and written per element of that
# tensor, from torchao's own accounting (roofline_utils.get_tensor_memory_traffic_ovhd_s)
# with its fusion assumptions, plus the rescale kernels a rowwise layer's backward GEMMs
# need (pytorch/ao#2184). A kernel of 0 bytes is a reduction too small to count but launched.
CAST_KERNELS: dict[str, tuple[tuple[str, int, str], ...]] = {
    "tensorwise": (
        ("input", 0, "amax, fused with the op before; its second stage"),
        ("input", BF16_BYTES + 2 * FP8_BYTES, "cast to fp8 in both layouts"),
        ("weight", BF16_BYTES, "amax"),
        ("weight", BF16_BYTES + FP8_BYTES, "cast for the forward GEMM"),
        ("weight", BF16_BYTES + FP8_BYTES, "cast, transposed, for the grad-input GEMM"),
        ("grad", 0, "amax, fused with the op before; its second stage"),
        ("grad", BF16_BYTES + 2 * FP8_BYTES, "cast to fp8 in both layouts"),
    ),
    "rowwise": (
        ("input", BF16_BYTES, "per-feature amax across tokens, for the grad-weight GEMM"),
        ("input", BF16_BYTES + FP8_BYTES, "cast per feature, transposed"),
        ("input", 2 * BF16_BYTES, "rescale of the grad-input GEMM's output"),
        ("weight", BF16_BYTES + FP8_BYTES, "amax and cast per output feature"),
        ("weight", BF16_BYTES, "amax per input feature"),
        ("weight", BF16_BYTES + FP8_BYTES, "cast per input feature, transposed"),
        ("weight", 2 * BF16_BYTES, "rescale of the grad-weight GEMM's output"),
        ("grad", BF16_BYTES, "per-feature amax across tokens, for the grad-weight GEMM"),
        ("grad", BF16_BYTES + FP8_BYTES, "cast per feature, transposed"),
    ),
    "rowwise_with_gw_hp": (
        ("weight", BF16_BYTES + FP8_BYTES, "amax and cast per output feature"),
        ("weight", BF16_BYTES + FP8_BYTES, "cast with one scale, for the grad-input GEMM"),
    ),
}
# Written once per element beside those: the per-token fp8 copy of the input and of the
# gradient (rowwise recipes), fused into the op before but still a write.
FUSED_WRITES: dict[str, tuple[str, ...]] = {
    "tensorwise": (),
    "rowwise": ("input", "grad"),
    "rowwise_with_gw_hp": ("input", "grad"),
}
GEMM_KERNEL = {"tensorwise": "tensorwise", "rowwise": "rowwise", "rowwise_with_gw_hp": "rowwise"}
RECIPES = tuple(CAST_KERNELS)


@dataclass(frozen=True)
class Machine:
    """What the model knows of a GPU: throughputs it can reach, each with where it came from."""

    name: str
    tflops: dict[GemmFormat, float]  # achievable TFLOP/s per GEMM kernel
    memory_gbps: float  # achievable GB/s
    sources: dict[str, str] = field(default_factory=dict)  # figure -> where it came from

    def gemm_seconds(self, m: int, k: int, n: int, kernel: GemmFormat) -> float:
        """One GEMM ``(m x k) @ (k x n)``: arithmetic or bytes, whichever is longer."""
        arithmetic = 2.0 * m * k * n / (self.tflops[kernel] * 1e12)
        operand = BF16_BYTES if kernel == "bf16" else FP8_BYTES
        moved = ((m * k + k * n) * operand + m * n * BF16_BYTES) / (self.memory_gbps * 1e9)
        return max(arithmetic, moved, KERNEL_FLOOR.value)

    def kernel_seconds(self, nbytes: float) -> float:
        return max(nbytes / (self.memory_gbps * 1e9), KERNEL_FLOOR.value)


class UnknownGpu(ValueError):
    """A GPU name the peak table does not know, or one without fp8 Tensor Cores."""


def fp8_gpus() -> list[str]:
    return [gpu.model for gpu in GPUS if gpu.fp8 is not None]


def find_gpu(name: str) -> Gpu:
    """The peak table's row for ``name`` ('h100' is the SXM part); UnknownGpu if none."""
    gpu = identify(name)
    if gpu is None:
        raise UnknownGpu(
            f"--gpu {name}: not a GPU the peak table knows. Accepted (case and spaces as you "
            f"like): {', '.join(g.model for g in GPUS)}."
        )
    return gpu


def datasheet_machine(gpu: Gpu, measured: Mapping[str, tuple[float, str]] | None = None) -> Machine:
    """The GPU's datasheet times the achievable fractions; ``measured``: format ("bf16",
    "fp8") -> (TFLOP/s, where from), the machine check's figures for this GPU, which replace
    the datasheet's for that format (a rowwise GEMM keeps its fraction of the tensorwise
    one). Raises UnknownGpu for a GPU without fp8 Tensor Cores."""
    if gpu.fp8 is None or gpu.bf16 is None:
        raise UnknownGpu(
            f"{gpu.model} has no fp8 Tensor Cores (they need compute capability 8.9: Ada, "
            f"Hopper, Blackwell), so nothing on it trains faster in fp8. GPUs with them: "
            f"{', '.join(fp8_gpus())}."
        )
    measured = measured or {}
    sheet = f"{gpu.model} datasheet ({gpu.source})"
    frac, row_frac = GEMM_FRACTION.value, ROWWISE_GEMM_FRACTION.value
    tflops = {
        "bf16": gpu.bf16 * frac,
        "tensorwise": gpu.fp8 * frac,
        "rowwise": gpu.fp8 * row_frac,
    }
    sources = {
        "bf16": f"{gpu.bf16:g} TFLOP/s x {frac:g}, {sheet}",
        "tensorwise": f"{gpu.fp8:g} TFLOP/s x {frac:g}, {sheet}",
        "rowwise": f"{gpu.fp8:g} TFLOP/s x {row_frac:g}, {sheet}",
    }
    if "bf16" in measured:
        tflops["bf16"], where = measured["bf16"]
        sources["bf16"] = f"{tflops['bf16']:.4g} TFLOP/s, {where}"
    if "fp8" in measured:
        value, where = measured["fp8"]
        tflops["tensorwise"], tflops["rowwise"] = value, value * row_frac / frac
        sources["tensorwise"] = f"{value:.4g} TFLOP/s, {where}"
        sources["rowwise"] = f"{value:.4g} TFLOP/s x {row_frac:g}/{frac:g}, {where}"
    gbps = datasheet_gbps(gpu) or 0.0
    sources["memory"] = f"{gbps:g} GB/s x {MEMORY_FRACTION.value:g}, {sheet}"
    return Machine(gpu.model, tflops, gbps * MEMORY_FRACTION.value, sources)


def gemm_seconds(
    machine: Machine, shape: Shape, kernels: tuple[GemmFormat, GemmFormat, GemmFormat]
) -> tuple[float, float, float]:
    """The three GEMMs of a layer at ``shape``, each on its kernel."""
    m, k, n = shape
    return (
        machine.gemm_seconds(m, k, n, kernels[0]),
        machine.gemm_seconds(m, n, k, kernels[1]),
        machine.gemm_seconds(k, m, n, kernels[2]),
    )


def recipe_kernels(recipe: str) -> tuple[GemmFormat, GemmFormat, GemmFormat]:
    """The kernel each GEMM of ``recipe`` runs on: rowwise_with_gw_hp keeps grad-weight bf16."""
    fp8 = GEMM_KERNEL[recipe]
    return (fp8, fp8, "bf16" if recipe == "rowwise_with_gw_hp" else fp8)


def cast_seconds(machine: Machine, shape: Shape, recipe: str) -> float:
    """The cast kernels of one call of a layer at ``shape`` in ``recipe``."""
    m, k, n = shape
    numel = {"input": m * k, "weight": k * n, "grad": m * n}
    seconds = sum(machine.kernel_seconds(numel[t] * b) for t, b, _ in CAST_KERNELS[recipe])
    writes = sum(numel[t] * FP8_BYTES for t in FUSED_WRITES[recipe])
    return seconds + writes / (machine.memory_gbps * 1e9)


@dataclass(frozen=True)
class Prediction:
    """A layer's predicted speed-up in one recipe, and whether its GEMMs were measured."""

    speedup: float
    measured: bool
    bf16_s: float
    fp8_s: float


def predict(
    machine: Machine,
    calls: Sequence[Shape],
    recipe: str,
    times: GemmTimes | None = None,
    around_bytes: float = 0.0,
) -> Prediction:
    """fp8 (``recipe``) over bf16 for a layer called at each of ``calls``. ``times``: this
    GPU's measured GEMM seconds, used where every shape was timed; ``around_bytes``: the
    traffic of elementwise neighbours counted on both sides (a LayerNorm before and an
    activation after, as torchao's published table measures): it changes the ratio's size,
    never which side of 1 it falls."""
    kernels = recipe_kernels(recipe)
    timed = times is not None and all(
        (shape, kernel) in times for shape in calls for kernel in {"bf16", *kernels}
    )
    bf16 = fp8 = 0.0
    for shape in calls:
        if timed:
            assert times is not None
            bf16 += sum(times[(shape, "bf16")])
            fp8 += sum(times[(shape, kernel)][i] for i, kernel in enumerate(kernels))
        else:
            bf16 += sum(gemm_seconds(machine, shape, ("bf16", "bf16", "bf16")))
            fp8 += sum(gemm_seconds(machine, shape, kernels))
        fp8 += cast_seconds(machine, shape, recipe)
    around = around_bytes / (machine.memory_gbps * 1e9)
    return Prediction((bf16 + around) / (fp8 + around), timed, bf16, fp8)


def layer_norm_sigmoid_bytes(shape: Shape) -> float:
    """The elementwise traffic around the layer in torchao's published benchmark (a
    LayerNorm before, a Sigmoid after, forward and backward, bf16): each reads and writes its
    tensor forward and reads two and writes one backward, five bf16 values an element."""
    m, k, n = shape
    return 5 * BF16_BYTES * (m * k + m * n)
