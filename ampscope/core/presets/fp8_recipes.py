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
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from ampscope.core.events import Fp8Layers

Fp8RecipeName = Literal["tensorwise", "rowwise", "rowwise_with_gw_hp"]
RECIPE_NAMES: tuple[str, ...] = ("tensorwise", "rowwise", "rowwise_with_gw_hp")

# fp8 Tensor Cores arrived with Ada (8.9: L4, L40S, RTX 4090) and Hopper (9.0: H100, H200).
MIN_CAPABILITY = (8, 9)
INSTALL_HINT = "pip install 'ampscope[fp8]' (or pip install torchao)"


class Fp8Options(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The ``[fp8]`` table, read when ``precision = "fp8"``.

    ``skip_head`` leaves the last linear layer (the output head, whose logits feed the loss)
    in bf16, as fp8 recipes usually do; layers whose dimensions are not multiples of 16 stay
    in bf16 regardless, since fp8 matmul kernels cannot take them. ``emulate`` runs torchao's
    emulation (fp8 rounding, fp32 matmuls): any device, slowly, for tests and lectures.

    ``layers`` names the linear layers to train in fp8, as ``named_modules()`` names them
    (``ampscope plan fp8`` writes it): those and no others, whatever ``skip_head`` says; a name
    the model lacks, or a layer that cannot run in fp8, is refused with the reason.
    ``layer_recipes`` gives a listed layer another recipe than ``recipe`` (a plan that mixes
    recipes).
    """

    recipe: Fp8RecipeName = "tensorwise"
    emulate: bool = False
    skip_head: bool = True
    layers: list[Annotated[str, Meta(min_length=1, max_length=1000)]] | None = None
    layer_recipes: dict[str, Fp8RecipeName] = msgspec.field(default_factory=dict)

    def recipe_of(self, layer: str) -> str:
        """The recipe ``layer`` trains in: its own in ``layer_recipes``, else ``recipe``."""
        return self.layer_recipes.get(layer, self.recipe)

    @property
    def recipes(self) -> list[str]:
        """Every recipe this table trains in, ``recipe`` first."""
        listed = set(self.layers or ())
        others = {r for name, r in self.layer_recipes.items() if name in listed}
        return [self.recipe, *sorted(others - {self.recipe})]


def check_fp8_layers(options: Fp8Options) -> list[tuple[str, str]]:
    """``layer_recipes`` naming a layer that ``layers`` does not list: (key, message) pairs."""
    if not options.layer_recipes:
        return []
    listed = set(options.layers or ())
    stray = [name for name in options.layer_recipes if name not in listed]
    if not stray:
        return []
    where = "fp8.layers is not set" if options.layers is None else "fp8.layers does not list it"
    return [
        (
            "fp8.layer_recipes",
            f"fp8.layer_recipes gives a recipe to '{stray[0]}', but {where}: a layer's own "
            "recipe is for a layer that trains in fp8. Add it to fp8.layers, or drop it from "
            "fp8.layer_recipes.",
        )
    ]


@dataclass(frozen=True)
class Fp8Recipe:
    """One recipe in the words of the formats explorer (its format keys) and the planner."""

    name: str
    input: str  # the format the layer's input (an activation) is cast to
    weight: str
    grad_output: str  # the gradient arriving from the layer above
    scale_per: Literal["tensor", "row"]
    power_of_two_scales: bool
    grad_weight_high_precision: bool = False  # the weight-gradient matmul stays in bf16

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
        kept = "; the weight-gradient matmul in bf16" if self.grad_weight_high_precision else ""
        return f"{operands}; one {scale} per {self.scale_per}{kept}"


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
    # rowwise, but the weight-gradient matmul takes the input and the gradient in bf16: across
    # tokens one outlier token sets a feature's scale there, and rowwise flushes the rest.
    "rowwise_with_gw_hp": Fp8Recipe(
        name="rowwise_with_gw_hp",
        input="fp8-e4m3fn",
        weight="fp8-e4m3fn",
        grad_output="fp8-e4m3fn",
        scale_per="row",
        power_of_two_scales=True,
        grad_weight_high_precision=True,
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
    others = sorted(set(layers.recipes.values()) - {layers.recipe})
    mixed = "".join(f" + {r} ({sum(v == r for v in layers.recipes.values())})" for r in others)
    return f"fp8 {layers.recipe}{mixed}" + (" emulated" if layers.emulate else "")
