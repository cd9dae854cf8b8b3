"""FP8 training recipes: which fp8 format each tensor of a linear layer is cast to, and how.

ampscope trains in fp8 through torchao's float8 linear layers, which cast the three operands
of every matmul (the layer's input, its weight and the gradient flowing back) to fp8 with a
scale computed from the tensor's largest magnitude. The recipes differ in the formats and in
how many scales they keep. The facts live here, free of torch, so that the preset's ``[fp8]``
table, the memory planner's fp8 rows and the formats explorer all say the same thing; a test
checks them against torchao's own recipe configs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec

from ampscope.core.events import Fp8Layers

Fp8RecipeName = Literal["tensorwise", "rowwise"]

# fp8 Tensor Cores arrived with Ada (8.9: L4, L40S, RTX 4090) and Hopper (9.0: H100, H200).
MIN_CAPABILITY = (8, 9)
INSTALL_HINT = "pip install 'ampscope[fp8]' (or pip install torchao)"


class Fp8Options(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The ``[fp8]`` table, read when ``precision = "fp8"``.

    ``skip_head`` leaves the last linear layer (the output head, whose logits feed the loss)
    in bf16, as fp8 recipes usually do; layers whose dimensions are not multiples of 16 stay
    in bf16 regardless, since fp8 matmul kernels cannot take them. ``emulate`` runs torchao's
    emulation (fp8 rounding, fp32 matmuls): any device, slowly, for tests and lectures.
    """

    recipe: Fp8RecipeName = "tensorwise"
    emulate: bool = False
    skip_head: bool = True


@dataclass(frozen=True)
class Fp8Recipe:
    """One recipe in the words of the formats explorer (its format keys) and the planner."""

    name: str
    input: str  # the format the layer's input (an activation) is cast to
    weight: str
    grad_output: str  # the gradient arriving from the layer above
    scale_per: Literal["tensor", "row"]
    power_of_two_scales: bool

    @property
    def formats(self) -> dict[str, str]:
        return {"input": self.input, "weight": self.weight, "grad_output": self.grad_output}

    def describe(self) -> str:
        """One line for the memory planner, the dashboard and the docs."""
        if self.grad_output == self.input:
            operands = f"{_short(self.input)} activations, weights and gradients"
        else:
            operands = f"{_short(self.input)} activations and weights, {_short(self.grad_output)} gradients"
        scale = "power-of-two scale" if self.power_of_two_scales else "scale"
        return f"{operands}; one {scale} per {self.scale_per}"


def _short(key: str) -> str:
    """The explorer's 'fp8-e4m3fn' as the name recipes go by, 'e4m3'."""
    return key.removeprefix("fp8-").removesuffix("fn")


RECIPES: dict[str, Fp8Recipe] = {
    "tensorwise": Fp8Recipe(
        name="tensorwise",
        input="fp8-e4m3fn",
        weight="fp8-e4m3fn",
        grad_output="fp8-e5m2",  # e5m2's range for gradients, which span many decades
        scale_per="tensor",
        power_of_two_scales=False,
    ),
    "rowwise": Fp8Recipe(
        name="rowwise",
        input="fp8-e4m3fn",
        weight="fp8-e4m3fn",
        grad_output="fp8-e4m3fn",  # a scale per row buys the range back, so e4m3's precision
        scale_per="row",
        power_of_two_scales=True,
    ),
}


def layers_line(layers: Fp8Layers) -> str:
    """How an fp8 run trains, for a terminal: 'fp8 tensorwise: 8 of 9 linear layers in fp8 (...)'."""
    known = RECIPES.get(layers.recipe)
    how = f" ({known.describe()})" if known else ""
    total = len(layers.converted) + len(layers.skipped)
    line = f"{_mode(layers)}: {len(layers.converted)} of {total} linear layers in fp8{how}"
    return line + "".join(f"\n  in bf16: {group}" for group in skipped_groups(layers))


def skipped_groups(layers: Fp8Layers, shown: int = 2) -> list[str]:
    """The layers left in bf16, one line a reason: 'blocks.0.attn.out_proj, blocks.1.attn.out_proj
    and 1 more: nn.MultiheadAttention's out_proj: ...'."""
    by_reason: dict[str, list[str]] = {}
    for name, why in layers.skipped.items():
        by_reason.setdefault(why, []).append(name)
    lines = []
    for why, names in by_reason.items():
        listed = ", ".join(names[:shown])
        more = len(names) - shown
        lines.append(f"{listed}{f' and {more} more' if more > 0 else ''}: {why}")
    return lines


def layers_short(layers: Fp8Layers) -> str:
    """The same for a header: 'fp8 tensorwise 8/9 linear'."""
    total = len(layers.converted) + len(layers.skipped)
    return f"{_mode(layers)} {len(layers.converted)}/{total} linear"


def _mode(layers: Fp8Layers) -> str:
    return f"fp8 {layers.recipe}" + (" emulated" if layers.emulate else "")
