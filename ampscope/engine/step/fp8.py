"""FP8 training through torchao: refuse what cannot run, pick the layers, convert them.

``precision = "fp8"`` is amp-bf16 with the model's linear layers swapped for torchao's
Float8Linear, which casts each matmul's operands to fp8 with dynamic scales (the recipe, in
ampscope.core.presets.fp8_recipes, says which formats and how many scales). Everything else (attention,
norms, the loss, the layers left out) runs under bf16 autocast as in amp-bf16, and the fp32
weights stay the master copy.

torchao is optional (``ampscope[fp8]``): it is imported here only, when an fp8 run starts.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType

import torch
from torch import nn

from ampscope.core import events as ev
from ampscope.core.presets import ConfigError, Preset, WorkloadSizes, resolve_workload
from ampscope.core.presets.fp8_recipes import INSTALL_HINT, MIN_CAPABILITY, Fp8Options
from ampscope.core.presets.suggest import did_you_mean
from ampscope.engine.device import DeviceInfo
from ampscope.engine.step.module_calls import (
    attention_projections,
    foreign_linear_layers,
    never_runs_as_module,
)

FP8_MULTIPLE = 16  # fp8 matmul kernels need both dimensions of a weight to be multiples of 16

# Loggers that torchao's import wakes on a CPU-only torch: missing CUDA kernels, a pytree
# deprecation. True but not the user's concern: their lines would land in the dashboard.
_NOISY_LOGGERS = ("torchao", "torch.utils._pytree")


def convert_for_fp8(
    model: nn.Module, preset: Preset, info: DeviceInfo, called: Sequence[str] | None = None
) -> ev.Fp8Layers | None:
    """Swap the chosen linear layers for fp8 ones in place; None for presets that are not fp8.
    ``called``: the modules the first batch's forward calls, in order (``module_calls``): its
    last linear layer is the output head.

    Raises ConfigError (exit 2) where no layer can be converted or torchao does not import;
    the device and the token counts were checked before the build (``engine.step.validation``).
    """
    if preset.precision != "fp8":
        return None
    options = preset.fp8
    float8 = import_torchao_float8()
    converted, skipped = choose_layers(model, options.skip_head, called, options.layers)
    if not converted:
        raise ConfigError(nothing_to_convert(model, skipped, preset), key="precision")
    by_recipe: dict[str, set[str]] = {}
    for name in converted:
        by_recipe.setdefault(options.recipe_of(name), set()).add(name)
    for recipe, chosen in by_recipe.items():
        config = float8.Float8LinearConfig.from_recipe_name(recipe)
        if options.emulate:
            config = dataclasses.replace(config, emulate=True)
        float8.convert_to_float8_training(
            model,
            config=config,
            module_filter_fn=lambda _module, name, chosen=chosen: name in chosen,
        )
        if recipe == "rowwise_with_gw_hp" and not info.is_cuda:
            _autocast_inputs_on_cpu(model, chosen)
    own = {n: options.recipe_of(n) for n in converted if options.recipe_of(n) != options.recipe}
    return ev.Fp8Layers(
        recipe=options.recipe,
        emulate=options.emulate,
        converted=converted,
        skipped=skipped,
        recipes=own,
    )


HEAD_REASON = "the output head (fp8.skip_head = true)"


def nothing_to_convert(model: nn.Module, skipped: dict[str, str], preset: Preset) -> str:
    """Why an fp8 run has no layer to train in fp8, with only the advice that would work: a
    model without a linear layer (a U-Net, a CNN) is told so, not to resize layers it lacks."""
    if not skipped:
        convs = sum(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
        theirs = f" (its {convs} convolutions are not)" if convs else ""
        return (
            "precision = 'fp8', but this model has no linear layer (nn.Linear) to run in fp8: "
            f"fp8 training converts linear layers only{theirs}, so it would train as amp-bf16 "
            "does. Use precision = 'amp-bf16'."
        )
    ways = []
    if any(f"not multiples of {FP8_MULTIPLE}" in why for why in skipped.values()):
        ways.append(
            "give your model's linear layers dimensions that are multiples of 16"
            if preset.workload.model
            else "use a wider workload (workload.width)"
        )
    heads = [name for name, why in skipped.items() if why == HEAD_REASON]
    head = model.get_submodule(heads[0]) if heads else None
    if isinstance(head, nn.Linear) and fits_fp8(head):
        ways.append("set fp8.skip_head = false (the output head in fp8 too)")
    to_train = f"To train in fp8, {'; or '.join(ways)}. Otherwise use" if ways else "Use"
    return (
        "precision = 'fp8', but none of this workload's linear layers can run in fp8 ("
        + "; ".join(grouped_reasons(skipped))
        + f"). {to_train} precision = 'amp-bf16'."
    )


def fits_fp8(layer: nn.Linear) -> bool:
    """Both dimensions of the layer's weight are multiples of 16, as fp8 matmuls need."""
    return all(d % FP8_MULTIPLE == 0 for d in layer.weight.shape)


def _autocast_inputs_on_cpu(model: nn.Module, names: set[str]) -> None:
    """torchao's Float8Linear casts its input to autocast's dtype only under CUDA autocast
    (``torch.is_autocast_enabled()``); under CPU autocast an fp32 input stays fp32, and
    rowwise_with_gw_hp's high-precision grad-weight GEMM then multiplies a bf16 gradient by
    an fp32 input and fails. Cast it as torchao does on a GPU, for these layers."""

    def cast(_module: nn.Module, args: tuple[object, ...]) -> tuple[object, ...] | None:
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or not torch.is_autocast_enabled("cpu"):
            return None
        return (x.to(torch.get_autocast_dtype("cpu")), *args[1:])

    for name, module in model.named_modules():
        if name in names:
            module.register_forward_pre_hook(cast)


def grouped_reasons(skipped: dict[str, str], shown: int = 3) -> list[str]:
    """``name: why`` for each reason, its first few layers named and the rest counted: a
    GPT-2's 48 Conv1D layers are one reason, not 48 lines."""
    by_reason: dict[str, list[str]] = {}
    for name, why in skipped.items():
        by_reason.setdefault(why, []).append(name)
    out = []
    for why, names in by_reason.items():
        more = f" and {len(names) - shown} more" if len(names) > shown else ""
        out.append(f"{', '.join(names[:shown])}{more}: {why}")
    return out


def choose_layers(
    model: nn.Module,
    skip_head: bool,
    called: Sequence[str] | None = None,
    listed: list[str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The linear layers to train in fp8, and the others with the reason they stay in bf16.

    The output head is the last linear layer the forward pass calls (``called``, the first
    batch's calls in order; the last one the model defines when unknown): its logits go
    straight into the loss, where fp8's 2-3 mantissa bits would cost the most, and fp8 recipes
    leave it out. Every other layer whose dimensions fit is converted, whether the first batch
    calls it or not: an MoE's expert that gets its first tokens at step 4 then runs in fp8 as
    the others do. Left out whatever the data: ``nn.MultiheadAttention``'s out_proj (its
    weight is multiplied by the attention's own code) and the q/k/v projections it keeps as
    bare parameters. ``listed`` (``fp8.layers``): exactly those layers, the head included when
    named; a name the model lacks or a layer that cannot run in fp8 raises ConfigError naming it.
    """
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    head = output_head([name for name, _ in linears], called) if listed is None else None
    converted: list[str] = []
    skipped: dict[str, str] = {}
    for name, module in linears:
        out_features, in_features = module.weight.shape
        structural = never_runs_as_module(model, name)
        if structural is not None:
            skipped[name] = structural
        elif skip_head and name == head:
            skipped[name] = HEAD_REASON
        elif not fits_fp8(module):
            skipped[name] = (
                f"{in_features} -> {out_features} features, not multiples of {FP8_MULTIPLE}"
            )
        else:
            converted.append(name)
    skipped.update(attention_projections(model))
    skipped.update(foreign_linear_layers(model))
    if listed is None:
        return converted, skipped
    return _only_listed(listed, [n for n, _ in linears], converted, skipped)


def _only_listed(
    listed: list[str], linears: list[str], converted: list[str], skipped: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """``fp8.layers``: the listed layers, each of which must be a linear layer that can run
    in fp8; every other linear layer stays in bf16, said so."""
    for name in listed:
        if name in converted:
            continue
        if name in skipped:
            raise ConfigError(
                f"fp8.layers lists '{name}', which cannot run in fp8: {skipped[name]}. Drop it "
                "from fp8.layers ('ampscope plan fp8' lists the layers that can).",
                key="fp8.layers",
            )
        hint = did_you_mean(name, linears)
        shown = ", ".join(linears[:8]) + (
            f" and {len(linears) - 8} more" if len(linears) > 8 else ""
        )
        raise ConfigError(
            f"fp8.layers lists '{name}', which is not a linear layer of this model.{hint} "
            f"Its linear layers, by name: {shown or '(none)'}.",
            key="fp8.layers",
        )
    wanted = set(listed)
    out = {n: skipped[n] for n in skipped}
    for name in converted:
        if name not in wanted:
            out[name] = "not listed in fp8.layers"
    return [n for n in converted if n in wanted], out


def output_head(linears: list[str], called: Sequence[str] | None) -> str | None:
    """The last of ``linears`` the forward pass called (the last defined, when unknown)."""
    if called is not None:
        known = set(linears)
        ran = [name for name in called if name in known]
        if ran:
            return ran[-1]
    return linears[-1] if linears else None


def require_fp8_support(
    preset: Preset,
    info: DeviceInfo,
    sizes: WorkloadSizes | None = None,
    has_torchao: bool | None = None,
) -> None:
    """Raise ConfigError where an fp8 preset cannot run here; nothing for other presets.

    ``sizes``: the workload's, already resolved; ``has_torchao``: None looks it up."""
    if preset.precision == "fp8":
        installed = torchao_installed() if has_torchao is None else has_torchao
        require_support(preset.fp8, info, installed)
        if not preset.fp8.emulate:
            require_token_multiple(preset, info, sizes)


def require_token_multiple(
    preset: Preset, info: DeviceInfo, sizes: WorkloadSizes | None = None
) -> None:
    """torch._scaled_mm needs every matmul's rows (the tokens of a batch: batch x sequence) to
    be a multiple of 16 too, not only the weights: refused before anything is built, with the
    nearest sizes that fit. A user's model is sized by its batches, known only once read."""
    if preset.workload.model is not None:
        return
    dims, batch = sizes or resolve_workload(preset, on_cuda=info.is_cuda)
    seq = dims.get("seq_len", 1)
    tokens = batch * seq
    if tokens % FP8_MULTIPLE == 0:
        return
    fits = [f"batch_size = {_next_fit(batch, seq)}"]
    counted = f"batch_size {batch}"
    if "seq_len" in dims:
        counted = f"batch_size x workload.seq_len = {batch} x {seq}"
        fits.append(f"workload.seq_len = {_next_fit(seq, batch)}")
    raise ConfigError(
        f"precision = 'fp8' needs the token count of a batch ({counted} = {tokens}) to be a "
        f"multiple of {FP8_MULTIPLE}: torch's fp8 matmul (torch._scaled_mm) refuses other row "
        f"counts. Set {' or '.join(fits)}, or emulate fp8 (--set fp8.emulate=true).",
        key="batch_size",
    )


def _next_fit(value: int, other: int) -> int:
    """The smallest value >= ``value`` whose product with ``other`` is a multiple of 16."""
    fit = value
    while fit * other % FP8_MULTIPLE:
        fit += 1
    return fit


def require_support(options: Fp8Options, info: DeviceInfo, has_torchao: bool) -> None:
    """Refuse an fp8 run this device or this Python cannot do, in one paragraph."""
    capability = None if options.emulate else capability_problem(info)
    if capability is None and has_torchao:
        return
    missing = (
        f"torchao, which fp8 training runs through, is not installed in this Python "
        f"({sys.executable}): install it with {INSTALL_HINT}."
    )
    if capability is None:
        message = f"precision = 'fp8': {missing} Or use the amp-bf16 preset."
    else:
        message = (
            f"{capability}{'' if has_torchao else ' ' + missing} To try fp8 without fp8 "
            "hardware, emulate it (fp8 rounding, fp32 matmuls; slow): --set fp8.emulate=true"
            f"{'' if has_torchao else ' once torchao is installed'}. For speed on this device, "
            "use the amp-bf16 preset."
        )
    raise ConfigError(message, key="precision")


def capability_problem(info: DeviceInfo) -> str | None:
    """Why this device has no fp8 Tensor Cores, or None when it has them."""
    need = ".".join(map(str, MIN_CAPABILITY))
    lead = (
        f"precision = 'fp8' runs its matmuls on fp8 Tensor Cores, which need a CUDA GPU of "
        f"compute capability {need} or newer (L4, L40S, RTX 4090, H100, H200, B200)"
    )
    if not info.is_cuda:
        return f"{lead}, but this run's device is the CPU ({info.name})."
    if info.capability is None or info.capability < MIN_CAPABILITY:
        have = ".".join(map(str, info.capability)) if info.capability else "unknown"
        return f"{lead}, but {info.name} has compute capability {have}."
    return None


def torchao_installed() -> bool:
    return importlib.util.find_spec("torchao") is not None


def import_torchao_float8() -> ModuleType:
    """torchao.float8, quietly; an install that does not import is a user error, not a crash."""
    try:
        with _quiet(_NOISY_LOGGERS):
            import torchao.float8 as float8
    except Exception as exc:  # noqa: BLE001 - any import failure means the install is broken
        raise ConfigError(
            f"torchao is installed but does not import with torch {torch.__version__} "
            f"({type(exc).__name__}: {exc}). Install a torchao release made for this torch: "
            f"{INSTALL_HINT}, or use the amp-bf16 preset.",
            key="precision",
        ) from None
    return float8


@contextmanager
def _quiet(names: tuple[str, ...]) -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
