"""What a preset's `precision` means in torch terms; whether a device can run it is validation's.

Every dtype decision of a run is made here: where the weights live (pure casts), what autocast
computes in, whether TF32 is on, whether a GradScaler scales the loss, and which dtype's peak
MFU is measured against. The workload carries the decision out (``Workload.cast``) and keeps
its loss in fp32 (``workloads.base.LOSS_DTYPE``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ampscope.core.config import ConfigError, Preset, ScalerOptions
from ampscope.engine.workloads import Workload

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}


@dataclass(frozen=True)
class PrecisionPolicy:
    """Where the weights live, what autocast computes in, and which peak MFU is measured against."""

    name: str
    param_dtype: torch.dtype
    autocast_dtype: torch.dtype | None
    tf32: bool
    compute_dtype: str
    use_scaler: bool

    def autocast(self, device_type: str) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device_type, dtype=self.autocast_dtype)

    def cast(self, workload: Workload) -> None:
        """Pure casts keep weights, gradients and AdamW state in one dtype; AMP keeps fp32."""
        if self.param_dtype != torch.float32:
            workload.cast(self.param_dtype)

    def grad_scaler(self, device: torch.device, options: ScalerOptions) -> torch.amp.GradScaler:
        """A GradScaler that scales only where the policy says so (disabled, it passes through)."""
        return torch.amp.GradScaler(
            device.type,
            enabled=self.use_scaler,
            init_scale=options.init_scale,
            growth_factor=options.growth_factor,
            backoff_factor=options.backoff_factor,
            growth_interval=options.growth_interval,
        )


def precision_policy(preset: Preset) -> PrecisionPolicy:
    """``amp-X``: fp32 weights, autocast to X. ``bf16``/``fp16``/``fp64``: pure casts, never
    scaled. ``fp32``/``tf32``: no autocast; TF32 Tensor Cores only for ``tf32``. The scaler
    follows the preset's ``grad_scaler`` (``auto``: on for amp-fp16 only)."""
    p = preset.precision
    if p == "fp8":  # fp8 linears (engine/fp8.py) inside bf16 autocast; emulated fp8 runs fp32 mms
        compute = "fp32" if preset.fp8.emulate else "fp8"
        return PrecisionPolicy(p, torch.float32, torch.bfloat16, False, compute, preset.uses_scaler)
    if p.startswith("amp-"):
        short = p.removeprefix("amp-")
        return PrecisionPolicy(p, torch.float32, DTYPES[short], False, short, preset.uses_scaler)
    if p in DTYPES:
        return PrecisionPolicy(p, DTYPES[p], None, False, p, False)
    return PrecisionPolicy(p, torch.float32, None, p == "tf32", p, preset.uses_scaler)


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
