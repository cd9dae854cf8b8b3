"""The line under a profile that says what would help most: for this run on this device.

Every advice names a setting that exists (a ``--set`` field, a preset, a DataLoader argument
in the user's factory) and never a format or kernel the device cannot run or the run already
uses; what the run was and what its device runs come in ``RunFacts`` (``ampscope profile``
knows them; the Run view's profile, knowing less, gets advice that holds either way). And a
profile taken while other processes used the cores the run needed says so (``load_note``).
Torch-free, beside ``profiles``, which splits the step.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ampscope.core import events as ev
from ampscope.core.profiles.rules import label


@dataclass(frozen=True)
class RunFacts:
    """What the profiled run was and what its device can run, so that the advice names only
    settings that exist and apply here. A field left unknown (None) gets advice that holds
    whatever it was (the Run view's profile knows less than ``ampscope profile``)."""

    precision: str | None = None
    compile: str | None = None
    optimizer: str | None = None  # the AdamW step that ran: fused, foreach or per-tensor
    fp8: bool = False  # the device runs fp8 matmuls (a GPU of compute capability 8.9+)
    fast_bf16: bool | None = None  # bf16 arithmetic units (a GPU 8.0+, a CPU's AMX/AVX512-BF16)


LARGER_BATCH = "a larger batch (--set batch_size=N)"


def advice(profile: ev.ProfileEvent, facts: RunFacts | None = None) -> str:
    """The one thing that would help this step most, in a sentence, from its largest cost:
    always a setting that exists (a preset field, a DataLoader argument in the user's
    factory), never a format the device cannot run."""
    facts = facts or RunFacts()
    c = defaultdict(float, profile.classes)
    fp32 = sum(
        c2
        for cls in ("matmul", "conv")
        for d, c2 in profile.dtypes.get(cls, {}).items()
        if d in ("fp32", "fp64")
    )
    dense = c["matmul"] + c["conv"] + c["attention"]
    fused = c["elementwise"] + c["norm_act"]
    candidates = [
        (
            c["data"],
            0.15,
            "Waiting for data takes {}: more DataLoader workers (num_workers), pin_memory=True "
            "or a larger prefetch_factor where your factory builds the loader would help most.",
        ),
        (c["idle"], 0.15, _idle_words(facts)),
        (
            c["communication"],
            0.2,
            f"Communication takes {{}}: {LARGER_BATCH} spreads it over more work per rank, and "
            "gradients sent in bf16 halve it (parallel.grad_compression = 'bf16' with ddp, "
            "parallel.reduce_dtype = 'bf16' with fsdp2).",
        ),
        (fp32, 0.25, _fp32_words(profile, facts)),
        (fused, 0.2, _fusion_words(facts)),
        (c["optimizer"], 0.2, _optimizer_words(facts)),
        (c["loss_scaling"], 0.1, _scaling_words(facts)),
        (
            c["memcpy"],
            0.15,
            "Memory copies take {}: build the batches on the device, or set pin_memory=True "
            "in your DataLoader so that they copy without a wait.",
        ),
    ]
    over = [(share / bar, share, text) for share, bar, text in candidates if share >= bar]
    if over:
        _, share, text = max(over)
        return text.format(f"{share:.0%}")
    if dense >= 0.5:
        return (
            f"{_dense_words(c)} take {dense:.0%}: the step is compute-bound; "
            f"what is left is {_compute_bound_options(profile, facts)}."
        )
    top = max(profile.classes, key=lambda k: profile.classes[k], default="other")
    return f"No one cost dominates; the largest is {label(top, profile)} at {c[top]:.0%}."


DENSE_WORDS = {"matmul": "matrix multiplies", "conv": "convolutions", "attention": "attention"}


def _dense_words(shares: dict[str, float]) -> str:
    """The dense work the step does, named: "Convolutions" for a U-Net, "Matrix multiplies
    and attention" for a transformer (a class under 1 % of the step left out)."""
    named = [w for k, w in DENSE_WORDS.items() if shares.get(k, 0.0) >= 0.01]
    named = named or ["matrix multiplies"]
    words = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
    return words[0].upper() + words[1:]


def _idle_words(facts: RunFacts) -> str:
    if facts.compile == "reduce-overhead":
        return (
            "The GPU sits idle for {} of the step between launches, with CUDA graphs already "
            f"(compile = 'reduce-overhead'): {LARGER_BATCH} would help most."
        )
    return (
        "The GPU sits idle for {} of the step between launches: CUDA graphs (--set "
        f"compile='reduce-overhead', torch.compile) or {LARGER_BATCH} would help most."
    )


def _fp32_words(profile: ev.ProfileEvent, facts: RunFacts) -> str:
    amp = "--set precision='amp-bf16'"
    if profile.timing == "device":
        if facts.fast_bf16 is False:
            return (
                "Matrix multiplies in fp32 take {}: this GPU has no bf16 Tensor Cores; fp16 "
                "autocast with loss scaling (--set precision='amp-fp16') would help most."
            )
        return (
            f"Matrix multiplies in fp32 take {{}}: bf16 autocast (Tensor Cores: {amp}) or tf32 "
            "(--set precision='tf32') would help most."
        )
    if facts.fast_bf16:
        return (
            "Matrix multiplies in fp32 take {}: this CPU has bf16 units (AMX, AVX512-BF16), so "
            f"bf16 autocast ({amp}) would help most."
        )
    if facts.fast_bf16 is False:
        return (
            "Matrix multiplies in fp32 take {}: this CPU has no bf16 units (AMX, AVX512-BF16), "
            "so a narrower format would be slower here; a GPU's Tensor Cores are where it pays."
        )
    return (
        f"Matrix multiplies in fp32 take {{}}: on a CPU, bf16 autocast ({amp}) helps only "
        "where it has bf16 units (AMX, AVX512-BF16; ampscope doctor says); a GPU's Tensor "
        "Cores are where it pays."
    )


def _fusion_words(facts: RunFacts) -> str:
    if facts.compile not in (None, "off"):
        return (
            "Elementwise, norm and activation work takes {}, compiled already (compile = "
            f"'{facts.compile}'): {LARGER_BATCH} spreads each kernel's fixed cost over more "
            "samples."
        )
    return (
        "Elementwise, norm and activation work takes {}: torch.compile (--set "
        "compile='default') would fuse most of it into fewer kernels."
    )


def _optimizer_words(facts: RunFacts) -> str:
    if facts.optimizer == "fused":
        return (
            "The optimizer takes {} with fused AdamW already: it reads and writes every weight "
            f"and its state once a step, and {LARGER_BATCH} spreads that over more samples."
        )
    if facts.optimizer in ("per-tensor", "foreach"):
        return (
            f"The optimizer takes {{}} (AdamW {facts.optimizer}): fused AdamW (--set "
            "optimizer.fused=true) would help most."
        )
    return (
        "The optimizer takes {}: fused AdamW (--set optimizer.fused=true; ampscope's choice "
        "on CUDA) would help most, unless the run has it already."
    )


def _scaling_words(facts: RunFacts) -> str:
    if facts.fast_bf16 is False:
        return (
            "Loss scaling takes {}: it is what fp16 costs here, and this device has no fast "
            "bf16 (which would need none)."
        )
    where = "" if facts.fast_bf16 else ", where the device has fast bf16"
    return f"Loss scaling takes {{}}: bf16 needs none (--set precision='amp-bf16'){where}."


def _compute_bound_options(profile: ev.ProfileEvent, facts: RunFacts) -> str:
    """What is left for a compute-bound step: a larger batch, a narrower format where the
    dense work is in fp32 and the device computes bf16 fast, fp8 where it runs fp8."""
    options = [LARGER_BATCH]
    if facts.precision is not None:
        in_fp32 = facts.precision in ("fp32", "tf32", "fp64")
    else:
        dense = {d for cls in ("matmul", "conv") for d in profile.dtypes.get(cls, {})}
        in_fp32 = bool(dense) and dense <= {"fp32", "tf32", "fp64"}
    on_gpu = profile.timing == "device"
    if in_fp32 and facts.fast_bf16 is not False and (on_gpu or facts.fast_bf16):
        options.append("bf16 autocast (--set precision='amp-bf16')")
    if facts.fp8 and on_gpu and facts.precision != "fp8":
        options.append("fp8 (the fp8-tensorwise preset)")
    return options[0] if len(options) == 1 else ", ".join(options[:-1]) + " or " + options[-1]


BUSY_CORES = 0.5
"""Other processes using this many cores or more on average, where the run needed them
too, make a profile one taken under load."""


def load_note(others_cores: float, cores: int, threads: int) -> str | None:
    """A line for a profile taken while other processes used cores the run needed: on a
    shared CPU its split (and so its advice) moves with their load; two profiles seconds
    apart gave opposite advice."""
    if others_cores < BUSY_CORES or others_cores + threads <= cores:
        return None
    return (
        f"Taken under load: other processes used {others_cores:.1f} of this machine's {cores} "
        f"cores while it ran ({threads} thread{'s' if threads != 1 else ''} here), so the split "
        "and the advice move with their work. Profile again when the machine is quieter, or "
        "compare profiles taken alike."
    )
