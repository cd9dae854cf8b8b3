"""Which class of work an op or a kernel is: the rules a profile's split is made with.

Torch-free, so that the engine (which has the profiler's events), the tests and anyone reading a
trace class the same names the same way. The phase an op ran in (the engine marks data,
forward, backward, scaler and optimizer with ``record_function`` ranges while it profiles)
decides first: everything under the optimizer is the optimizer's, whatever its ops are; then
the op's own name does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ampscope.core import events as ev

CLASSES: dict[str, str] = {
    "matmul": "matmul",
    "conv": "conv",
    "attention": "attention (SDPA)",
    "elementwise": "elementwise",
    "norm_act": "norm, activation",
    "optimizer": "optimizer",
    "loss_scaling": "loss scaling",
    "data": "data wait",
    "communication": "communication",
    "memcpy": "memory copies",
    "idle": "idle (no kernel)",
    "other": "other",
}
"""Every class of the split, in the order it is shown, with the words shown for it."""

PHASE_PREFIX = "ampscope."
PHASES = ("data", "forward", "backward", "scaler", "optimizer")
"""The ranges the engine marks while it profiles, named ``ampscope.<phase>``."""
PHASE_CLASS = {"data": "data", "scaler": "loss_scaling", "optimizer": "optimizer"}
"""Phases whose whole time is one class."""

_RULES: list[tuple[str, re.Pattern[str]]] = [
    (cls, re.compile(pattern))
    for cls, pattern in [
        ("communication", r"nccl|c10d::|gloo|all_?reduce|all_?gather|reduce_?scatter|broadcast_"),
        ("loss_scaling", r"_amp_foreach_non_finite|_amp_update_scale|non_finite_check"),
        ("optimizer", r"multi_tensor_apply|fused_adam|_fused_sgd|foreach_adam|adamw?_kernel"),
        ("memcpy", r"^memcpy|^memset|cudamemcpy|memcpy (htod|dtoh|dtod)"),
        ("attention", r"scaled_dot_product|flash|fmha|efficient_attention|cudnn_attention|sdpa"),
        ("conv", r"conv|winograd|implicit_gemm|im2col|cudnn_convolution"),
        (
            "matmul",
            r"aten::(linear|mm|addmm|bmm|baddbmm|matmul|_scaled_mm|addmv|mv)$|gemm|cublas|"
            r"cutlass|xmma|nvjet|s1688|s16816|h1688|h16816|triton_tem_|_scaled_mm",
        ),
        # a recurrent layer's own kernel (oneDNN's on a CPU, cuDNN's on a GPU) is its matmuls
        (
            "matmul",
            r"aten::(lstm|gru|rnn_tanh|rnn_relu|_thnn_fused_(lstm|gru)_cell|mkldnn_rnn_layer|"
            r"_cudnn_rnn|miopen_rnn)|cudnn::rnn|rnn_layer_(fwd|bwd)",
        ),
        ("elementwise", r"triton_(poi|red|per)_"),  # torch.compile's fused kernels
        # a vector norm (gradient clipping's, F.normalize's) is a reduction, not a norm layer
        ("elementwise", r"aten::(linalg_vector_norm|_foreach_norm|norm)$"),
        (
            "norm_act",
            r"norm|gelu|relu|silu|sigmoid|tanh|softmax|dropout|nll_loss|threshold|"
            r"cross_entropy|hardswish|mish|\belu",
        ),
        (
            "elementwise",
            r"elementwise|aten::(add|sub|mul|div|neg|pow|sqrt|rsqrt|exp|log|"
            r"copy_|_to_copy|to|fill_|zero_|ones_like|zeros_like|full_like|where|clamp|abs|sum|"
            r"mean|cat|stack|index|scatter|"
            r"gather|masked|lerp|addcmul|addcdiv|maximum|minimum|_foreach_\w+)|triton_|"
            r"pool|embedding|"
            r"reduce_kernel|copy_kernel|fill_kernel|cat_|index_",
        ),
    ]
]

_CASTS = re.compile(r"aten::(to|_to_copy|copy_)$")
"""The ops a format conversion goes through (autocast's casts among them); one is a cast when
its dtypes differ (``OpTime.cast``), counted in elementwise too."""

_DTYPES = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "c10::bfloat16": "bf16",
    "half": "fp16",
    "c10::half": "fp16",
    "float16": "fp16",
    "fp16": "fp16",
    "f16": "fp16",
    "float": "fp32",
    "float32": "fp32",
    "fp32": "fp32",
    "tf32": "tf32",
    "double": "fp64",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "fp8": "fp8",
    "e4m3": "fp8",
}
_KERNEL_DTYPE = re.compile(r"(bf16|f16|fp16|tf32|e4m3|fp8|sgemm|hgemm|fp32|s1688|h1688|f32)")
_KERNEL_ALIASES = {
    "sgemm": "fp32",
    "hgemm": "fp16",
    "s1688": "tf32",
    "h1688": "fp16",
    "f32": "fp32",
}


_AUTOGRAD_NODE = re.compile(r"^(?:autograd::engine::evaluate_function: )?(\w+?)Backward\d*$")
_ACCUMULATE = re.compile(r"accumulategrad")
_CONVERSIONS = re.compile(r"aten::(to|_to_copy)$")
GENERIC = ("elementwise", "other")
"""Classes that say little about what an op is for: such an op takes its caller's class
(``aten::clamp_min`` under ``aten::relu`` is the activation's, ``aten::copy_`` under
``aten::addmm`` is the matmul's)."""


def op_name(name: str) -> str:
    """The aten op an autograd node stands for (``AddmmBackward0`` and autograd's
    ``evaluate_function: AddmmBackward0`` are addmm's backward), else the name as it is."""
    node = _AUTOGRAD_NODE.match(name)
    if node is None:
        return name
    return "aten::" + re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", node.group(1)).lower()


def decides_itself(name: str, cls: str) -> bool:
    """Whether an op's own class stands, whatever called it: a specific class, or a format
    conversion (autocast's casts, under the matmul that asked for them, are casts)."""
    return cls not in GENERIC or _CONVERSIONS.search(name.lower()) is not None


def op_class(name: str, phase: str | None = None) -> str:
    """The class an op's (or a kernel's) self time counts in, from its own name. ``phase`` is
    the engine's range it ran under (``forward``, ``optimizer``...), when it ran under one.
    An op of a generic class takes its caller's (the engine's ``collect`` walks the tree)."""
    lowered = op_name(name).lower()
    if _ACCUMULATE.search(lowered):  # autograd adding into .grad
        lowered = "aten::add_"
    if phase in PHASE_CLASS and not _RULES[0][1].search(lowered):
        return PHASE_CLASS[phase]
    if lowered.startswith(PHASE_PREFIX):  # a range's own time: Python between the ops
        return PHASE_CLASS.get(lowered[len(PHASE_PREFIX) :], "other")
    for cls, pattern in _RULES:
        if pattern.search(lowered):
            return cls
    return "other"


def is_cast(name: str) -> bool:
    return _CASTS.search(name.lower()) is not None


def phase_of(range_name: str) -> str | None:
    """``forward`` for the range ``ampscope.forward``; None for any other name."""
    if range_name.startswith(PHASE_PREFIX) and range_name[len(PHASE_PREFIX) :] in PHASES:
        return range_name[len(PHASE_PREFIX) :]
    return None


def short_dtype(input_dtypes: Iterable[str] = (), kernel_name: str = "") -> str | None:
    """The number format a matmul or conv ran in: its first floating input's, or what its
    kernel's name says on a GPU."""
    for dtype in input_dtypes:
        short = _DTYPES.get(str(dtype).lower())
        if short:
            return short
    found = _KERNEL_DTYPE.search(kernel_name.lower())
    if found:
        word = found.group(1)
        return _KERNEL_ALIASES.get(word, _DTYPES.get(word, word))
    return None


@dataclass
class OpTime:
    """One op's self time over the profiled steps, summed over its calls."""

    name: str
    cls: str
    self_us: float
    calls: int = 1
    dtype: str | None = None
    cast: bool = False  # a copy between number formats (its input dtypes differ)


def label(cls: str, profile: ev.ProfileEvent | None = None) -> str:
    """A class as shown: 'matmul (bf16)' when one format did most of it."""
    text = CLASSES.get(cls, cls)
    kinds = profile.dtypes.get(cls) if profile else None
    if kinds:
        text += " (" + "/".join(sorted(kinds, key=lambda d: -kinds[d])[:2]) + ")"
    return text
