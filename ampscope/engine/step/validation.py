"""Can this preset run here? Every check made before anything is built, in one order.

The preset has already passed the checks that need no device (``presets.check_combinations``).
What is left needs the machine: its device and compute capability, whether it is one rank of
several, its memory, whether torchao is installed. Those are read once into ``Facts``, and
``check_run`` goes through the checks in this order, the first refusal being the one a user
sees (a ConfigError: exit 2, one paragraph naming the key at fault and what would work):

1. precision: bf16 Tensor Cores before Ampere; TF32 and CPU fp16/bf16 warnings
2. parallel: grad_compression = 'bf16' without NCCL
3. compile: reduce-overhead on the CPU (a warning)
4. the workload's sizes, resolved once (``auto`` sizes; head widths that do not divide)
5. memory: the estimate against the host and the GPU (``preflight``)
6. fp8: compute capability 8.9, torchao, token counts in multiples of 16 (``fp8``)

The sizes resolved at step 4 travel on in the verdict to ``setup.build``. After the build,
``training_state_warning`` compares the planner's figure for the built model with the device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ampscope.core.memory import plan
from ampscope.core.presets import ConfigError, Preset, WorkloadSizes, resolve_workload
from ampscope.core.units import fmt_bytes
from ampscope.engine.device import DeviceInfo, cpu_has_fast_bf16, cpu_has_fast_fp16
from ampscope.engine.step import fp8, preflight
from ampscope.engine.step.precision import precision_policy

RunWarning = tuple[str, str]  # (code, message) for a run that goes ahead slowly or differently
MemoryReading = Callable[[], tuple[int, int]]  # (free or available, total) bytes, when called


@dataclass(frozen=True)
class Facts:
    """What the checks know of this machine; tests pass made-up ones."""

    info: DeviceInfo
    grouped: bool = False  # one rank of several, in a process group
    has_torchao: bool = True
    fast_cpu_dtypes: frozenset[str] = frozenset()  # "fp16", "bf16": the CPU has units for them
    device_memory: MemoryReading | None = None  # a GPU's (free, total); None for a CPU run
    host_memory: MemoryReading | None = None  # None: the host's own (preflight.host_memory)


def read_facts(info: DeviceInfo, grouped: bool) -> Facts:
    """This machine's facts; the CPU's arithmetic units are read for CPU runs only."""
    fast: set[str] = set()
    if not info.is_cuda:
        fast |= {"fp16"} if cpu_has_fast_fp16() else set()
        fast |= {"bf16"} if cpu_has_fast_bf16() else set()
    return Facts(
        info,
        grouped,
        fp8.torchao_installed(),
        frozenset(fast),
        preflight.gpu_memory(info),
    )


@dataclass
class Verdict:
    """The refusals in check order (the first is the user's message), the warnings, and the
    workload's sizes once resolved (None if a refusal came first)."""

    sizes: WorkloadSizes | None = None
    warnings: list[RunWarning] = field(default_factory=list)
    refusals: list[ConfigError] = field(default_factory=list)

    def attempt(self, check: Callable[..., list[RunWarning]], *args: object) -> bool:
        """Run one check: its warnings kept, its refusal kept; False when it refused."""
        try:
            self.warnings += check(*args)
        except ConfigError as exc:
            self.refusals.append(exc)
            return False
        return True


def check_run(preset: Preset, facts: Facts, every: bool = False) -> Verdict:
    """The verdict on ``preset`` here: up to the first refusal, or with ``every`` all of them
    (the memory and fp8 checks need the sizes, so a workload that cannot be sized ends it)."""
    verdict = Verdict()
    for check in (precision_support, parallel_support, compile_support):
        if not verdict.attempt(check, preset, facts) and not every:
            return verdict
    try:
        verdict.sizes = resolve_workload(preset, on_cuda=facts.info.is_cuda)
    except ConfigError as exc:
        verdict.refusals.append(exc)
        return verdict
    for sized in (memory_fits, fp8_support):
        if not verdict.attempt(sized, preset, facts, verdict.sizes) and not every:
            return verdict
    return verdict


def require_runnable(preset: Preset, facts: Facts) -> Verdict:
    """The verdict of a preset that can run here; raises the first refusal otherwise."""
    verdict = check_run(preset, facts)
    if verdict.refusals:
        raise verdict.refusals[0]
    return verdict


def precision_support(preset: Preset, facts: Facts) -> list[RunWarning]:
    """Refuse what the device cannot compute in; warn where it computes slowly or otherwise."""
    info, name = facts.info, preset.precision
    uses = precision_policy(preset).compute_dtype
    if info.is_cuda:
        major, minor = info.capability or (0, 0)
        if uses == "bf16" and major < 8:
            raise ConfigError(
                f"precision = '{name}' needs bf16 Tensor Cores (compute capability 8.0, "
                f"Ampere, or newer), but {info.name} is {major}.{minor}; torch would emulate it "
                "slowly. Use precision = 'amp-fp16' (with its GradScaler) on this GPU."
            )
        if uses == "tf32" and major < 8:
            message = (
                f"{info.name} ({major}.{minor}) has no TF32 Tensor Cores: this run is plain fp32."
            )
            return [("tf32-unsupported", message)]
        return []
    if uses == "tf32":
        return [
            ("tf32-on-cpu", "TF32 is a GPU Tensor Core mode: on the CPU this run is plain fp32.")
        ]
    if uses == "fp16" and "fp16" not in facts.fast_cpu_dtypes:
        message = (
            f"{info.name} has no fp16 arithmetic units (AVX512-FP16 or AMX-FP16): fp16 runs "
            "are emulated and much slower than fp32 here."
        )
        return [("slow-fp16-cpu", message)]
    if uses == "bf16" and "bf16" not in facts.fast_cpu_dtypes:
        message = (
            f"{info.name} has no bf16 arithmetic units (AVX512-BF16 or AMX): bf16 runs are "
            "converted and likely slower than fp32 here."
        )
        return [("slow-bf16-cpu", message)]
    return []


def parallel_support(preset: Preset, facts: Facts) -> list[RunWarning]:
    """Refuse what the process group's backend cannot do."""
    if facts.grouped and preset.parallel.grad_compression == "bf16" and not facts.info.is_cuda:
        raise ConfigError(
            "parallel.grad_compression = 'bf16' needs NCCL (CUDA GPUs); torch's gloo backend "
            "has no bf16 all-reduce hook. On the CPU use 'fp16' or 'none'.",
            key="parallel.grad_compression",
        )
    return []


def compile_support(preset: Preset, facts: Facts) -> list[RunWarning]:
    if preset.compile == "reduce-overhead" and not facts.info.is_cuda:
        message = (
            "compile = 'reduce-overhead' relies on CUDA graphs; on the CPU it compiles like "
            "'default'."
        )
        return [("cudagraphs-cpu", message)]
    return []


def memory_fits(preset: Preset, facts: Facts, sizes: WorkloadSizes) -> list[RunWarning]:
    info = facts.info
    return preflight.check_memory(
        preset, info.name, info.is_cuda, facts.device_memory, facts.host_memory, sizes=sizes
    )


def fp8_support(preset: Preset, facts: Facts, sizes: WorkloadSizes) -> list[RunWarning]:
    fp8.require_fp8_support(preset, facts.info, sizes, facts.has_torchao)
    return []


def training_state_warning(
    preset: Preset, info: DeviceInfo, params: int, total: int | None
) -> RunWarning | None:
    """A warning when the planner puts the built model's training state (weights, gradients,
    master weights, AdamW state, casts) above the ``total`` bytes of the device's memory."""
    regime = plan.regime_for_precision(preset.precision)
    needed = plan.plan_regime(params, regime).train_total
    if not total or needed <= total:
        return None
    message = (
        f"This model will likely run out of memory: the planner puts its training state at "
        f"{fmt_bytes(needed)} ({params:,} parameters in '{regime}': weights, gradients, master "
        f"weights and AdamW state; activations come on top), and {info.device} "
        f"({info.name}) has {fmt_bytes(total)}. A pure bf16 preset needs half the bytes a "
        "parameter; otherwise use a smaller model."
    )
    return "memory-estimate", message
