"""How much memory training takes, per precision regime: a planner for a lecture, not a profiler.

Per parameter, a training step keeps weights, gradients, optimizer state and (in mixed
precision) fp32 master weights; activations and the loss's logit buffers come on top and
scale with batch and sequence. The facts, with AdamW:

- fp32 / tf32 with AdamW: 4 w + 4 g + 8 (m, v) = 16 bytes/param; inference 4.
- torch AMP (fp32 weights are the master copy, autocast to bf16/fp16): also 16, plus a
  transient 16-bit copy of the weights that autocast makes and autograd keeps until backward.
- classic mixed precision (fp16 weights and grads, fp32 master + m + v): 2+2+4+8 = 16.
- pure bf16 (torch AdamW keeps m, v in the parameters' dtype): 2+2+4 = 8.

Activations are those of the engine's GPT block as autograd saves them, with the attention
the engine really runs (torch SDPA: flash or memory-efficient kernels, which keep q, k, v,
the output and a logsumexp but never the s x s scores). Per layer and token, in units of
the hidden size h: two residual-stream inputs of the LayerNorms (in the residual dtype,
fp32 under autocast) and, in the compute dtype, the qkv input (1), q, k, v (3), the
attention output (1, also the projection's input), the MLP input (1), the GELU input (4)
and output (4): s*b*h*(2*R + 14*C) bytes. Korthikanti et al. (2022) count 34*s*b*h in
16-bit for a block with dropout; this block has none. Measured against torch.profiler's
allocator bytes in tests/test_memory_measured.py.

Imports neither torch nor textual.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ampscope.core.machine import hardware
from ampscope.core.presets.fp8_recipes import RECIPES, Fp8Recipe

GIB = 1 << 30
FIT_FRACTION = 0.9  # leave 10% for the CUDA context, the allocator's fragmentation, workspaces

# (label, nominal GiB) per GPU memory size, from the one hardware table.
GPUS: tuple[tuple[str, float], ...] = hardware.fit_chart()

ATTENTION = (
    "attention: torch SDPA flash / memory-efficient kernels, as the engine runs them "
    "(no s x s scores stored)"
)

OPTIMIZER_STATES = {"adamw": 2, "sgd-momentum": 1, "sgd": 0}


@dataclass(frozen=True)
class Regime:
    """Bytes per parameter for each kind of state, and the dtypes activations are kept in."""

    key: str
    label: str
    weight_bytes: int  # the weights the forward pass reads
    grad_bytes: int
    master_bytes: int  # a separate fp32 copy (0 when the weights are the master copy)
    state_bytes: int  # per optimizer state tensor (m, v, momentum)
    cast_bytes: int  # transient low-precision copies of the weights made each step
    activation_bytes: int  # bytes per activation value in the compute dtype (16-bit: 2)
    residual_bytes: int  # bytes per value of the residual stream (fp32 under autocast)
    inference_bytes: int  # bytes/param to serve the model in the regime's compute dtype
    note: str = ""


def fp8_regime_key(recipe: str) -> str:
    """'fp8' is torchao's default recipe, tensorwise; other recipes get their own row."""
    return "fp8" if recipe == "tensorwise" else f"fp8-{recipe}"


def _fp8_regime(recipe: Fp8Recipe) -> Regime:
    """torchao's Float8Linear keeps fp32 master weights, grads and AdamW state as amp does."""
    return Regime(
        fp8_regime_key(recipe.name),
        f"fp8 {recipe.name}",
        4, 4, 0, 4, 1, 2, 4, 1,
        f"{recipe.describe()}; torchao Float8Linear with fp32 master weights, grads and AdamW "
        "state, bf16 autocast elsewhere; each weight cast to fp8 as its layer runs (1 transient "
        "byte/param); saved activations bf16, the residual stream fp32; inference assumes fp8 "
        "weights",
    )  # fmt: skip


_AMP = (
    "torch.autocast: fp32 weights are the master copy; {d} weight copies live from forward "
    "to backward; the residual stream stays fp32; inference assumes the model cast to {d}"
)
REGIMES: dict[str, Regime] = {
    r.key: r
    for r in (
        #      key           label                     w  g  mst st cast act res inf
        Regime("fp32",       "fp32",                   4, 4, 0, 4, 0,   4,  4,  4, "everything fp32 (TF32 off); activations fp32"),
        Regime("tf32",       "tf32",                   4, 4, 0, 4, 0,   4,  4,  4, "as fp32: TF32 only changes how matmuls round their inputs, not storage"),
        Regime("amp-bf16",   "AMP bf16 (fp32 master)", 4, 4, 0, 4, 2,   2,  4,  2, _AMP.format(d="bf16")),
        Regime("amp-fp16",   "AMP fp16 (fp32 master)", 4, 4, 0, 4, 2,   2,  4,  2, _AMP.format(d="fp16") + "; its GradScaler adds a few bytes"),
        Regime("mixed-fp16", "classic mixed fp16",     2, 2, 4, 4, 0,   2,  2,  2, "fp16 weights and grads, fp32 master weights and optimizer state (Micikevicius et al.)"),
        Regime("bf16",       "pure bf16",              2, 2, 0, 2, 0,   2,  2,  2, "model.to(bfloat16): torch AdamW keeps its state in bf16 too"),
        Regime("fp16",       "pure fp16",              2, 2, 0, 2, 0,   2,  2,  2, "as pure bf16, in fp16 (no loss scaling)"),
        *(_fp8_regime(recipe) for recipe in RECIPES.values()),
        Regime("fp64",       "fp64",                   8, 8, 0, 8, 0,   8,  8,  8, "everything fp64"),
    )
}  # fmt: skip
DEFAULT_REGIMES = ("fp32", "tf32", "amp-bf16", "amp-fp16", "mixed-fp16", "bf16", "fp8")


@dataclass(frozen=True)
class Shape:
    """A decoder transformer's shape, for activation memory."""

    layers: int
    hidden: int
    heads: int
    seq: int
    batch: int
    vocab: int | None = None


MEASURED_AS = {
    "fp32": "fp32",
    "tf32": "fp32",
    "amp-bf16": "amp-bf16",
    "amp-fp16": "amp-fp16",
    "mixed-fp16": "fp16",
    "bf16": "bf16",
    "fp16": "fp16",
    "fp64": "fp32",
}
"""The run a regime's activations were measured in: fp8 runs bf16 autocast around its fp8
matmuls (counted as amp-bf16, an upper bound: torchao saves fp8 inputs); fp64 is fp32's
bytes twice."""


@dataclass(frozen=True)
class MeasuredStep:
    """What one training step of a user's model holds, measured on the real module
    (``engine.memory.saved``), per measured regime: autograd's saved tensors
    (``saved_tensors_hooks``; storages once, parameters and the weights' casts left out), the
    weights' casts, and everything else the forward and backward hold at their peak beyond
    them (torch.profiler's allocator records, in the order they happened): the loss's and
    backward's buffers and the gradients made by then.

    Beside them: the batch's bytes (inputs and targets, on the device all step; real-valued
    inputs in the weights' dtype), and once: the optimizer step's temporaries (fp32 bytes:
    the engine's gradient clipping and per-tensor AdamW, run where they weigh most), the real
    module's parameter count (a tied weight once), those that take gradients, the trainable
    parameters the measured step gave no gradient (a later batch may: an MoE's expert), its
    buffers' bytes, and how many linear layers fp8 training would convert."""

    batch: int
    activations: dict[str, int]
    loss: dict[str, int]
    largest_param: int  # elements of the largest parameter: per-tensor AdamW's temporaries
    how: str
    casts: dict[str, int] = field(default_factory=dict)
    batch_bytes: dict[str, int] = field(default_factory=dict)  # the batch, in each regime
    update_temp: int | None = None
    params: int | None = None
    trainable: int | None = None
    unreached: dict[str, int] = field(default_factory=dict)  # parameter name -> elements
    buffers: int = 0
    fp8_layers: int | None = None  # None: not known

    def for_regime(self, regime: str) -> tuple[int | None, int | None]:
        key = measured_key(regime)
        factor = 2 if regime == "fp64" else 1
        acts, loss = self.activations.get(key), self.loss.get(key)
        return (
            None if acts is None else acts * factor,
            None if loss is None else loss * factor,
        )

    def casts_for(self, regime: str) -> int | None:
        """The weights' casts the regime's step makes, as measured (fp8: amp-bf16's, an
        upper bound: its converted layers cast to one byte, not two)."""
        return self.casts.get(measured_key(regime)) if regime != "fp64" else 0


def measured_key(regime: str) -> str:
    return MEASURED_AS.get(regime, "amp-bf16" if regime.startswith("fp8") else regime)


def fp8_not_applicable(measured: MeasuredStep | None) -> str | None:
    """Why the fp8 rows do not apply to a measured model (it has no linear layer fp8 training
    converts, so ``ampscope run fp8-*`` refuses it); None when they do or it is not known."""
    if measured is None or measured.fp8_layers != 0:
        return None
    return (
        "fp8: does not apply: the model has no linear layer fp8 training converts (nn.Linear "
        "with dimensions that are multiples of 16, the output head aside), so "
        "'ampscope run fp8-*' refuses it"
    )


ADAMW_TEMPORARIES = 2
"""Per-tensor AdamW (torch's default off CUDA) makes two parameter-sized temporaries for the
parameter it updates: sqrt(v), then its quotient, before the in-place add of eps."""


def optimizer_temporaries(optimizer: str, largest_param: int | None, state_bytes: int) -> int:
    """The optimizer step's transient bytes beyond its state: AdamW's two temporaries of the
    largest parameter, in its state's dtype (fused AdamW on CUDA makes none: an upper bound)."""
    if optimizer != "adamw" or not largest_param:
        return 0
    return ADAMW_TEMPORARIES * largest_param * state_bytes


@dataclass
class RegimePlan:
    """One regime's bytes: per parameter, and in total for the model (and shape, if given)."""

    regime: str
    label: str
    optimizer: str
    params: int
    weight_bpp: int
    grad_bpp: int
    master_bpp: int
    optimizer_bpp: int
    cast_bpp: int
    train_bpp: int  # persistent state per parameter: weights + grads + master + optimizer
    inference_bpp: int
    weights: int
    grads: int
    master: int
    optimizer_state: int
    cast_copies: int
    activations: int | None  # None: no transformer shape known, nor measured
    logits: int | None  # the loss's logit-sized buffers at the backward peak
    static: int  # weights + grads + master + optimizer state
    train_total: int  # static + the larger of the backward's and the optimizer step's peaks
    inference_total: int  # weights only
    optimizer_temp: int = 0  # the optimizer step's temporaries (activations are freed by then)
    trainable: int | None = None  # the parameters that take gradients (None: all of them)
    held: int = 0  # held all step beside the state, where measured: buffers and the batch
    grads_in_peak: bool = False  # TRAIN takes the step's measured peaks, gradients in them
    fits_train: list[str] = field(default_factory=list)
    fits_inference: list[str] = field(default_factory=list)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class PlanError(ValueError):
    """A user error in the planner's inputs: the message is meant to be shown as is."""


_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_COUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*$", re.IGNORECASE)


MAX_PARAMS = 10**15
"""The largest count planned: 1e15 parameters, 16 PB of fp32 AdamW state, still fits a column."""


def parse_count(text: str) -> int:
    """A parameter count: 7e9, 7B, 125M, 1.3b, 350k, 1_000_000 or a plain integer."""
    match = _COUNT.match(str(text).replace("_", "").replace(",", ""))
    if not match:
        raise PlanError(
            f"'{text}' is not a parameter count. Accepted: a plain integer (125000000), "
            "scientific notation (7e9), or a number with a suffix k, M, B or T "
            "(350k, 125M, 1.3B, 7B), in either case."
        )
    value = float(match.group(1)) * _SUFFIX[match.group(2).lower()]
    if not math.isfinite(value):
        raise PlanError(
            f"'{text}' is not a parameter count: it is too large to read (past 1.8e308, the "
            "largest number a float holds)."
        )
    if value < 1:
        raise PlanError(f"'{text}' is not a parameter count: it must be at least 1.")
    if value > MAX_PARAMS:
        raise PlanError(
            f"'{text}' is more parameters than the planner takes: at most 1e15 (a thousand "
            "times the largest models trained), where every figure still fits its column."
        )
    return round(value)


MAX_BYTES = 16 * MAX_PARAMS
"""The largest figure planned: the fp32 AdamW state of ``MAX_PARAMS`` parameters (14,552 TiB)."""


def check_shape(params: int, shape: Shape | None) -> None:
    """Refuse a shape whose figures no column holds: past ``MAX_PARAMS`` parameters, or
    activations and logits past ``MAX_BYTES`` in fp32 (a typo such as --hidden 1e11)."""
    if shape is None:
        return
    given = (
        f"the shape (layers {shape.layers}, hidden {shape.hidden}, heads {shape.heads}, "
        f"seq {shape.seq}, batch {shape.batch}"
        + (f", vocab {shape.vocab})" if shape.vocab else ")")
    )
    if params > MAX_PARAMS:
        raise PlanError(
            f"{given}: about {params:.3g} parameters, more than the planner takes: at most 1e15 "
            "(a thousand times the largest models trained). Check the sizes given."
        )
    held = saved_activation_bytes(shape, 4) + (logits_bytes(shape, 4) or 0)
    if held > MAX_BYTES:
        raise PlanError(
            f"{given}: about {held:.3g} bytes of activations in fp32, more than the planner "
            f"takes: at most {MAX_BYTES:.3g} (the fp32 AdamW state of 1e15 parameters). Check "
            "--seq, --batch and --vocab."
        )
    if shape.hidden % shape.heads:
        fits = [str(n) for n in range(1, 65) if shape.hidden % n == 0][-6:]
        choices = " or ".join([", ".join(fits[:-1]), fits[-1]] if len(fits) > 1 else fits)
        raise PlanError(
            f"{given}: hidden {shape.hidden} is not divisible by heads {shape.heads}, and "
            f"attention splits the width evenly among its heads: a hidden of {shape.hidden} "
            f"takes {choices} heads."
        )


def gpt_params(vocab: int, seq_len: int, width: int, layers: int) -> int:
    """Parameters of the engine's gpt: token + position embeddings, pre-LN blocks, untied head.

    Each block: 2 LayerNorms (2*h each), qkv (3h^2) and proj (h^2), fc (4h^2) and out (4h^2),
    all without bias: 12h^2 + 4h. Then a final LayerNorm (2h) and the head (h*vocab).
    """
    h = width
    return vocab * h + seq_len * h + layers * (12 * h * h + 4 * h) + 2 * h + h * vocab


def gpt2_params(vocab: int, seq_len: int, width: int, layers: int) -> int:
    """GPT-2 as nanoGPT builds it: biases everywhere, the head tied to the token embedding.

    Each block: 2 LayerNorms (2h each), qkv (3h^2 + 3h), proj (h^2 + h), fc (4h^2 + 4h) and
    out (4h^2 + h): 12h^2 + 13h. Embeddings (vocab + seq_len) x h, a final LayerNorm (2h).
    """
    h = width
    return (vocab + seq_len) * h + layers * (12 * h * h + 13 * h) + 2 * h


def llama_params(vocab: int, width: int, layers: int, heads: int, kv_heads: int) -> int:
    """The engine's llama: per layer q and o (h^2 each), k and v (h x kv_heads x head width
    each), SwiGLU (3 x h x 4h) and two RMSNorms (h each); embedding, final norm, untied head."""
    h, kv = width, kv_heads * (width // heads)
    return 2 * vocab * h + layers * (2 * h * h + 2 * h * kv + 12 * h * h + 2 * h) + h


def mlp_params(width: int, layers: int, classes: int) -> int:
    """(layers-1) x Linear(width, width) with bias, then Linear(width, classes) with bias."""
    return (layers - 1) * (width * width + width) + width * classes + classes


def cnn_params(width: int, layers: int, classes: int) -> int:
    """3x3 convolutions with bias, channels width*2^min(i,3), then a Linear head."""
    total, channels = 0, 3
    for i in range(layers):
        out = width * 2 ** min(i, 3)
        total += channels * out * 9 + out
        channels = out
    return total + channels * classes + classes


def transformer_params(layers: int, hidden: int, vocab: int | None = None) -> int:
    """An estimate for a decoder from its shape alone: 12*L*h^2 (+ 2*V*h for embeddings/head)."""
    return 12 * layers * hidden * hidden + (2 * vocab * hidden if vocab else 0)


def saved_activation_bytes(
    shape: Shape, bytes_per_value: int = 2, residual_bytes: int | None = None
) -> int:
    """What autograd keeps for backward in the engine's GPT, logits excluded (module docstring).

    Per layer s*b*h*(2*R + 14*C) bytes, C = ``bytes_per_value`` (the compute dtype) and R =
    ``residual_bytes`` (the residual stream; C when not given); then the final LayerNorm's
    input (R) and the head's input (C). Terms of size s*b (LayerNorm statistics, the
    attention's logsumexp) are left out: under 1 % of the layer at h = 64.
    """
    r = bytes_per_value if residual_bytes is None else residual_bytes
    tokens_x_h = shape.seq * shape.batch * shape.hidden
    return tokens_x_h * (shape.layers * (2 * r + 14 * bytes_per_value) + r + bytes_per_value)


LOGIT_BUFFERS_FP32 = 3  # the log-softmax output, the loss's gradient, the log-softmax gradient


def logits_bytes(shape: Shape, bytes_per_value: int) -> int | None:
    """The logit-sized buffers alive at the start of backward, where the step peaks.

    The engine's loss is cross_entropy(logits.float()): the logits (compute dtype) are held,
    log_softmax keeps its fp32 output, and its backward holds the incoming fp32 gradient and
    the fp32 gradient it makes: 4 + 12 = 16 bytes a logit in fp32, 2 + 12 = 14 in bf16.
    """
    if not shape.vocab:
        return None
    return shape.seq * shape.batch * shape.vocab * (bytes_per_value + 4 * LOGIT_BUFFERS_FP32)


def fits(total: int, fraction: float = FIT_FRACTION, regime: str = "fp32") -> list[str]:
    """The chart's GPUs whose memory holds ``total`` and that can run the regime's format."""
    return [n for n, g in GPUS if total <= fraction * g * GIB and n not in unable_gpus(regime)]


def unable_gpus(regime: str) -> frozenset[str]:
    """The chart's GPUs that cannot run ``regime`` at all (no bf16 or fp8 Tensor Cores)."""
    if regime.startswith("fp8"):
        return hardware.cannot_run("fp8")
    if "bf16" in regime:
        return hardware.cannot_run("bf16")
    return frozenset()


def plan_regime(
    params: int,
    regime: str,
    optimizer: str = "adamw",
    shape: Shape | None = None,
    measured: MeasuredStep | None = None,
    largest_param: int | None = None,
) -> RegimePlan:
    """One regime's bytes. TRAIN adds every column, gradients included; the optimizer step's
    temporaries count where they exceed the backward's transients (activations, casts and the
    loss's buffers are freed before the step). ``largest_param``: the largest parameter's
    elements.

    The engine frees its gradients before each forward (zero_grad(set_to_none=True)), so at
    the backward peak they do not exist yet: its measured peak is lower by up to the grads
    column. Counting them keeps TRAIN an upper bound that also holds with gradient
    accumulation, and it is never less than the optimizer step's weights + grads + state.

    ``measured`` (a user's model, no shape formula): its step as it ran, where nothing is
    assumed (``measured_plan``).
    """
    if regime not in REGIMES:
        raise PlanError(f"unknown regime '{regime}'. Regimes: {', '.join(REGIMES)}.")
    if optimizer not in OPTIMIZER_STATES:
        raise PlanError(
            f"unknown optimizer '{optimizer}'. Optimizers: {', '.join(OPTIMIZER_STATES)}."
        )
    if measured is not None and shape is None:
        return measured_plan(params, regime, optimizer, measured)
    r = REGIMES[regime]
    opt_bpp = OPTIMIZER_STATES[optimizer] * r.state_bytes
    acts = saved_activation_bytes(shape, r.activation_bytes, r.residual_bytes) if shape else None
    logits = logits_bytes(shape, r.activation_bytes) if shape else None
    temp = optimizer_temporaries(optimizer, largest_param, r.state_bytes)
    backward = params * r.cast_bytes + (acts or 0) + (logits or 0)
    return _regime_plan(r, optimizer, params, params, opt_bpp, acts, logits, backward, temp)


def measured_plan(params: int, regime: str, optimizer: str, measured: MeasuredStep) -> RegimePlan:
    """A user's model's regime, from its step as it ran on the real module.

    Gradients, master weights and optimizer state are for the parameters that take gradients
    (frozen ones get none). The step's two peaks are taken as measured, each with what it
    really holds: the forward and backward's (the weights' casts, what autograd saves, the
    loss's and backward's buffers and the gradients made by then, in the order they were
    allocated and freed) and the optimizer step's (every gradient, and the temporaries of
    gradient clipping and AdamW, measured where they weigh most). A trainable parameter the
    measured batch gave no gradient may get one from a later batch (an MoE's expert): its
    gradient is added to the first peak, and its state is counted."""
    r = REGIMES[regime]
    trainable = params if measured.trainable is None else measured.trainable
    opt_bpp = OPTIMIZER_STATES[optimizer] * r.state_bytes
    acts, rest = measured.for_regime(r.key)
    casts = measured.casts_for(r.key)
    casts = params * r.cast_bytes if casts is None else casts
    temp = optimizer_temporaries(optimizer, measured.largest_param, r.state_bytes)
    if optimizer == "adamw" and measured.update_temp is not None:
        temp = measured.update_temp * r.state_bytes // 4  # measured in fp32
    later = sum(measured.unreached.values()) * r.grad_bytes
    backward = casts + (acts or 0) + (rest or 0) + later
    held = measured.buffers + measured.batch_bytes.get(measured_key(r.key), 0)
    figures = (acts, rest, backward, temp, casts)
    return _regime_plan(r, optimizer, params, trainable, opt_bpp, *figures, True, held)


def _regime_plan(
    r: Regime,
    optimizer: str,
    params: int,
    trainable: int,
    opt_bpp: int,
    acts: int | None,
    logits: int | None,
    backward: int,
    temp: int,
    casts: int | None = None,
    grads_in_peak: bool = False,
    held: int = 0,
) -> RegimePlan:
    """The regime's row. TRAIN: the state held all step (weights, master, optimizer state,
    ``held``: buffers and the batch, where measured) plus the larger of the backward's
    transients and the optimizer step's; the gradients in the latter only where the
    backward's peak holds those made by then (``grads_in_peak``), else in both."""
    weights = params * r.weight_bytes
    grads = trainable * r.grad_bytes
    master = trainable * r.master_bytes
    state = trainable * opt_bpp
    static = weights + grads + master + state
    if grads_in_peak:
        total = weights + master + state + held + max(backward, grads + temp)
    else:
        total = static + held + max(backward, temp)
    inference = params * r.inference_bytes
    return RegimePlan(
        regime=r.key,
        label=r.label,
        optimizer=optimizer,
        params=params,
        weight_bpp=r.weight_bytes,
        grad_bpp=r.grad_bytes,
        master_bpp=r.master_bytes,
        optimizer_bpp=opt_bpp,
        cast_bpp=r.cast_bytes,
        train_bpp=r.weight_bytes + r.grad_bytes + r.master_bytes + opt_bpp,
        inference_bpp=r.inference_bytes,
        weights=weights,
        grads=grads,
        master=master,
        optimizer_state=state,
        cast_copies=params * r.cast_bytes if casts is None else casts,
        activations=acts,
        logits=logits,
        static=static,
        train_total=total,
        inference_total=inference,
        optimizer_temp=temp,
        fits_train=fits(total, regime=r.key),
        fits_inference=fits(inference, regime=r.key),
        note=r.note,
        trainable=trainable,
        held=held,
        grads_in_peak=grads_in_peak,
    )


def plan(
    params: int,
    regimes: Iterable[str] = DEFAULT_REGIMES,
    optimizer: str = "adamw",
    shape: Shape | None = None,
    measured: MeasuredStep | None = None,
    largest_param: int | None = None,
) -> list[RegimePlan]:
    """One :class:`RegimePlan` a regime: the planner's table. A measured model no fp8 run
    takes (no linear layer fp8 converts) has no fp8 rows (``fp8_not_applicable`` says why)."""
    if fp8_not_applicable(measured if shape is None else None):
        regimes = [r for r in regimes if not r.startswith("fp8")]
    return [plan_regime(params, r, optimizer, shape, measured, largest_param) for r in regimes]


# ---------------------------------------------------------------------------------------------
# Presets and run records


@dataclass
class PlannedModel:
    """A preset's (or a run's) model, as the planner sees it."""

    kind: str
    params: int
    regime: str
    shape: Shape | None
    dims: dict[str, int]
    batch: int


def regime_for_precision(precision: str, fp8_recipe: str = "tensorwise") -> str:
    """A preset's ``precision`` as a planner regime (they share names; fp8 has one a recipe)."""
    if precision == "fp8":
        return fp8_regime_key(fp8_recipe or "tensorwise")
    return precision if precision in REGIMES else "fp32"


def workload_from(
    kind: str, dims: dict[str, int], batch: int, precision: str, fp8_recipe: str = "tensorwise"
) -> PlannedModel:
    if kind == "gpt":
        params = gpt_params(dims["vocab"], dims["seq_len"], dims["width"], dims["layers"])
        shape = Shape(
            dims["layers"], dims["width"], dims["heads"], dims["seq_len"], batch, dims["vocab"]
        )
    elif kind == "gpt2-124m":
        params = gpt2_params(dims["vocab"], dims["seq_len"], dims["width"], dims["layers"])
        shape = Shape(
            dims["layers"], dims["width"], dims["heads"], dims["seq_len"], batch, dims["vocab"]
        )
    elif kind == "llama":  # activations: SwiGLU and RoPE are not in the GPT formula
        params = llama_params(
            dims["vocab"], dims["width"], dims["layers"], dims["heads"], dims["kv_heads"]
        )
        shape = None
    elif kind == "mlp":
        params, shape = mlp_params(dims["width"], dims["layers"], dims["classes"]), None
    elif kind == "cnn":
        params, shape = cnn_params(dims["width"], dims["layers"], dims["classes"]), None
    else:
        raise PlanError(f"unknown workload kind '{kind}'.")
    regime = regime_for_precision(precision, fp8_recipe)
    return PlannedModel(kind, params, regime, shape, dict(dims), batch)


def workload_from_preset(name: str, on_cuda: bool = True) -> PlannedModel:
    """A preset's workload at its GPU size (``on_cuda``) or CPU size; raises ConfigError."""
    from ampscope.core import presets

    preset = presets.load_preset(name)
    if preset.workload.model is not None:
        raise presets.ConfigError(
            f"preset '{name}' trains your own model (workload.model = '{preset.workload.model}'): "
            f"plan it with ampscope memory --model {preset.workload.model}"
        )
    dims, batch = presets.resolve_workload(preset, on_cuda=on_cuda)
    return workload_from(preset.workload.kind, dims, batch, preset.precision, preset.fp8.recipe)


def gpu_names() -> Sequence[str]:
    return [name for name, _ in GPUS]
