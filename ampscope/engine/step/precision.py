"""What a preset's `precision` means in torch terms; whether a device can run it is validation's.

Every precision decision of a run is made here, by ``precision_policy``: where the weights
live (pure casts), what autocast computes in, whether TF32 is on, which GradScaler scales the
loss (none, plain or sharded), whether AdamW is fused, and which dtype's peak MFU is measured
against. The workload carries the decision out (``TrainingWorkload.cast``) and keeps
its loss in fp32 (``workloads.base.LOSS_DTYPE``).
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Literal

import torch

from ampscope.core.presets import ConfigError, Preset, ScalerOptions
from ampscope.engine.workloads import TrainingWorkload

DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp64": torch.float64,
}
PURE_CASTS = ("bf16", "fp16", "fp64")  # the weights themselves in the format: never scaled
ScalerKind = Literal["none", "plain", "sharded"]


@dataclass(frozen=True)
class PrecisionPolicy:
    """Where the weights live, what autocast computes in, which peak MFU is measured against,
    which GradScaler scales the loss and whether AdamW is the fused kernel: decided together,
    by ``precision_policy``, and read by the step."""

    name: str
    param_dtype: torch.dtype
    autocast_dtype: torch.dtype | None
    tf32: bool
    compute_dtype: str
    scaler: ScalerKind
    fused_adamw: bool

    @property
    def use_scaler(self) -> bool:
        return self.scaler != "none"

    def autocast(self, device_type: str) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device_type, dtype=self.autocast_dtype)

    def cast(self, workload: TrainingWorkload) -> None:
        """Pure casts keep weights, gradients and AdamW state in one dtype; AMP keeps fp32."""
        if self.param_dtype != torch.float32:
            workload.cast(self.param_dtype)

    def grad_scaler(self, device: torch.device, options: ScalerOptions) -> torch.amp.GradScaler:
        """The policy's scaler: disabled (it passes through) where nothing is scaled, and under
        FSDP2 the sharded one (every rank sees only its shard of the gradients)."""
        if self.scaler == "sharded":
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            # Its found-inf scalar becomes a DTensor with a warning on every step; the value is right.
            warnings.filterwarnings("ignore", message="Found a non-scalar tensor with numel=1")
            scaler_type: type[torch.amp.GradScaler] = ShardedGradScaler
        else:
            scaler_type = torch.amp.GradScaler
        return scaler_type(
            device.type,
            enabled=self.use_scaler,
            init_scale=options.init_scale,
            growth_factor=options.growth_factor,
            backoff_factor=options.backoff_factor,
            growth_interval=options.growth_interval,
        )


def precision_policy(
    preset: Preset, on_cuda: bool = False, grouped: bool = False
) -> PrecisionPolicy:
    """Every precision decision of a run, in one place.

    ``amp-X``: fp32 weights, autocast to X. ``bf16``/``fp16``/``fp64``: pure casts, never
    scaled. ``fp32``/``tf32``: no autocast; TF32 Tensor Cores only for ``tf32``. ``fp8``: fp8
    linears (engine/step/fp8.py) inside bf16 autocast; emulated fp8 runs fp32 matmuls.

    The scaler follows the preset's ``grad_scaler`` (``auto``: on for amp-fp16 only); on
    several ranks under FSDP2 it is the sharded one. AdamW is the fused kernel on CUDA, except
    beside a ShardedGradScaler: once unscaled (the loop does, to clip), its found-inf flag has
    shape [1], and fused AdamW subtracts it in place from its 0-dim step counters ("output with
    shape [] doesn't match the broadcast shape [1]" at the first step, torch 2.13 over gloo;
    the CUDA path is the same code). The foreach AdamW takes it, on DTensors too
    (tests/test_fsdp_fp16.py). A CPU keeps torch's default.
    """
    p = preset.precision
    scaled = preset.uses_scaler and p not in PURE_CASTS
    sharded = grouped and preset.parallel.strategy == "fsdp2"
    scaler: ScalerKind = "none" if not scaled else "sharded" if sharded else "plain"
    fused = on_cuda and scaler != "sharded"
    if p == "fp8":
        compute = "fp32" if preset.fp8.emulate else "fp8"
        return PrecisionPolicy(p, torch.float32, torch.bfloat16, False, compute, scaler, fused)
    if p.startswith("amp-"):
        short = p.removeprefix("amp-")
        return PrecisionPolicy(p, torch.float32, DTYPES[short], False, short, scaler, fused)
    if p in PURE_CASTS:
        return PrecisionPolicy(p, DTYPES[p], None, False, p, scaler, fused)
    return PrecisionPolicy(p, torch.float32, None, p == "tf32", p, scaler, fused)


TF32_API_SINCE = "2.9"  # torch.backends.cuda.matmul.fp32_precision first shipped in torch 2.9


def set_matmul_precision(tf32: bool) -> None:
    """TF32 for fp32 matmuls and convolutions, set so that every getter, old and new, agrees.

    torch's own compiler reads the legacy getters (inductor's mm autotuning reads
    ``get_float32_matmul_precision()`` and ``cuda.matmul.allow_tf32``, its convolutions
    ``cudnn.allow_tf32``), and those raise once only the new ``fp32_precision`` API has set
    the flags (torch reads that as a mix of the two). So the legacy setters go first, which
    keep both views in step, then the new flags of cuDNN are set explicitly: the legacy one
    leaves them at 'none', and inductor's Triton convolution templates read cuDNN's own
    ``fp32_precision`` (on an H200 with torch 2.11 the tf32 preset's compiled convolutions
    autotuned with ``ALLOW_TF32=False`` until it was set). A torch without the new API (older than 2.9, the floor
    in pyproject.toml) is refused with a message, not a traceback.
    """
    backends = torch.backends
    cudnn = backends.cudnn
    if not hasattr(backends.cuda.matmul, "fp32_precision") or not hasattr(cudnn, "conv"):
        raise ConfigError(
            f"ampscope needs torch {TF32_API_SINCE} or newer (it sets TF32 through "
            f"torch.backends.cuda.matmul.fp32_precision, new in {TF32_API_SINCE}), but this is "
            f"torch {torch.__version__}. Upgrade it: pip install -U 'torch>={TF32_API_SINCE}'."
        )
    mode = "tf32" if tf32 else "ieee"
    backends.cuda.matmul.allow_tf32 = tf32
    cudnn.allow_tf32 = tf32
    cudnn.fp32_precision = mode
    cudnn.conv.fp32_precision = mode
    cudnn.rnn.fp32_precision = mode  # type: ignore[attr-defined]  # torch's stubs lack rnn's


def tf32_getters() -> dict[str, object]:
    """What every TF32 getter answers (an exception's name where one raises): for doctor and
    the GPU check, which must see the same answers inductor will."""
    backends, cudnn = torch.backends, torch.backends.cudnn
    # The ignores below: torch's stubs do not show cudnn.conv and cudnn.rnn (new in 2.9).
    reads = {
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision,
        "torch.backends.cuda.matmul.allow_tf32": lambda: backends.cuda.matmul.allow_tf32,
        "torch.backends.cudnn.allow_tf32": lambda: backends.cudnn.allow_tf32,
        "torch.backends.cudnn.fp32_precision": lambda: cudnn.fp32_precision,
        "torch.backends.cuda.matmul.fp32_precision": lambda: backends.cuda.matmul.fp32_precision,
        "torch.backends.cudnn.conv.fp32_precision": lambda: cudnn.conv.fp32_precision,  # type: ignore[attr-defined]
        "torch.backends.cudnn.rnn.fp32_precision": lambda: cudnn.rnn.fp32_precision,  # type: ignore[attr-defined]
    }
    answers: dict[str, object] = {}
    for name, read in reads.items():
        try:
            answers[name] = read()
        except Exception as exc:  # noqa: BLE001 - a getter that raises is the finding
            answers[name] = f"raises {type(exc).__name__}"
    return answers


def tf32_disagreements(tf32: bool) -> list[str]:
    """The getters that raise or disagree with ``tf32`` (empty when all agree)."""
    want = {
        "torch.get_float32_matmul_precision()": "high" if tf32 else "highest",
        "torch.backends.cuda.matmul.allow_tf32": tf32,
        "torch.backends.cudnn.allow_tf32": tf32,
        "torch.backends.cudnn.fp32_precision": "tf32" if tf32 else "ieee",
        "torch.backends.cuda.matmul.fp32_precision": "tf32" if tf32 else "ieee",
        "torch.backends.cudnn.conv.fp32_precision": "tf32" if tf32 else "ieee",
        "torch.backends.cudnn.rnn.fp32_precision": "tf32" if tf32 else "ieee",
    }
    got = tf32_getters()
    return [
        f"{name} = {got[name]!r} (want {value!r})"
        for name, value in want.items()
        if got[name] != value
    ]
