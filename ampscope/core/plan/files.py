"""A plan in the forms people apply: a preset, torchao's filter, torchtitan's list, the JSON.

- ``plan.toml``: a preset ``ampscope run`` trains. fp8: ``[fp8] layers`` names the planned
  layers (``layer_recipes`` those in another recipe), ``emulate = true`` where this machine has
  no fp8 Tensor Cores, compiled on a GPU as the fp8 presets are. fp16: amp-fp16 with
  ``fp32_modules``. A plan that trains nothing in the low format is amp-bf16, and says why.
- ``torchao_fp8_filter.py``: ``module_filter_fn(module, fqn) -> bool`` for torchao's
  ``convert_to_float8_training``, one per recipe where the plan mixes recipes, and
  ``convert(model)`` applying them.
- ``torchtitan_fp8.py``: torchtitan's ``filter_fqns``, an exclusion list matched by substring,
  for a single-recipe plan, after checking that no name it excludes also excludes a planned
  layer (``substring_clash``).
- ``plan.json``: the plan (docs/plan.md).

Every writer returns text; ``write`` puts the files in a folder. Each preset is validated as
``ampscope run`` would load it before it is written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ampscope.core import presets
from ampscope.core.plan.report import Files, Plan, to_builtins
from ampscope.core.presets.toml_text import toml_value
from ampscope.core.records import safe_file_name, write_json, write_text
from ampscope.core.text import visible

PRESET_FILE = "plan.toml"
TORCHAO_FILE = "torchao_fp8_filter.py"
TORCHTITAN_FILE = "torchtitan_fp8.py"
JSON_FILE = "plan.json"
STEPS = 200


@dataclass(frozen=True)
class Where:
    """Where the preset will train: on a GPU (compiled) or not, with fp8 Tensor Cores or not."""

    cuda: bool
    fp8_hardware: bool


def plan_dir(runs_dir: Path, target: str, model_name: str) -> Path:
    """``runs/plans/<time>-<target>-<model>``: beside the run records, a new folder a plan."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = runs_dir / "plans" / f"{stamp}-{target}-{safe_file_name(model_name)}"
    path, n = base, 1
    while path.exists():
        path, n = base.with_name(f"{base.name}-{n}"), n + 1
    return path


def preset_text(plan: Plan, name: str, where: Where, bf16_instead: bool = False) -> str:
    """The plan as a preset file. ``bf16_instead``: an fp16 plan whose overflow no module
    holds, which amp-bf16 trains."""
    spec = plan.model or ""
    header = [
        f"# The {plan.target} plan of {visible(spec, 0)}, written by 'ampscope plan {plan.target}'"
        + (f" for {plan.gpu}" if plan.gpu else "")
        + ".",
        "# Train it: ampscope run THIS_FILE (its reasons, layer by layer: plan.json beside it)",
    ]
    lines = [f"name = {toml_value(name)}"]
    compile_mode = "default" if where.cuda else "off"
    if plan.target == "fp8":
        lines += _fp8_lines(plan, compile_mode, where)
    else:
        lines += _fp16_lines(plan, bf16_instead)
    lines += ["", "[workload]", f"model = {toml_value(spec)}"]
    return "\n".join(header + lines) + "\n"


def _fp8_lines(plan: Plan, compile_mode: str, where: Where) -> list[str]:
    by_recipe = plan.recipes()
    if not by_recipe:
        return [
            'description = "The fp8 plan keeps every layer in bf16: amp-bf16."',
            'precision = "amp-bf16"',
            f"compile = {toml_value(compile_mode)}",
            f"steps = {STEPS}",
        ]
    main = next(iter(by_recipe))
    layers = [layer.name for layer in plan.fp8_layers]
    count = f"{len(layers)} of {len(plan.layers)} layers in fp8"
    lines = [
        f"description = {toml_value(f'{count}, the rest in bf16 (ampscope plan fp8)')}",
        'precision = "fp8"',
        f"compile = {toml_value(compile_mode)}"
        + ("" if where.cuda else '  # "default" on a GPU, as the fp8 presets'),
        f"steps = {STEPS}",
        "warmup_steps = 10",
        "",
        "[fp8]",
        f"recipe = {toml_value(main)}",
    ]
    if not where.fp8_hardware:
        lines.append(
            "emulate = true  # no fp8 Tensor Cores here: fp8 rounding, fp32 matmuls; false on an "
            "fp8 GPU"
        )
    lines.append("layers = [")
    lines += [f"    {toml_value(n)}," for n in layers]
    lines.append("]")
    others = {n: r for r, names in by_recipe.items() if r != main for n in names}
    if others:
        lines += ["", "[fp8.layer_recipes]"]
        lines += [f"{toml_value(n)} = {toml_value(r)}" for n, r in others.items()]
    return lines


def _fp16_lines(plan: Plan, bf16_instead: bool) -> list[str]:
    kept = [layer.name for layer in plan.fp32_layers]
    if bf16_instead:
        return [
            'description = "Overflows fp16 where no module holds it: amp-bf16 (ampscope plan fp16)."',
            'precision = "amp-bf16"',
            f"steps = {STEPS}",
        ]
    about = f"amp-fp16 with {len(kept)} module(s) in fp32 (ampscope plan fp16)"
    lines = [
        f"description = {toml_value(about)}",
        'precision = "amp-fp16"',
        f"steps = {STEPS}",
        "fp32_modules = [",
    ]
    return lines + [f"    {toml_value(n)}," for n in kept] + ["]"]


def in_docstring(text: object) -> str:
    """``text`` (a model's path) as a written file's docstring may hold it: a path with three
    double quotes in it ended the docstring early, and the rest of the path ran as code."""
    return visible(text, 0).replace("\\", "\\\\").replace('"', '\\"')


def torchao_text(plan: Plan) -> str:
    """A Python file of ``module_filter_fn``s, exact names, one per recipe."""
    by_recipe = plan.recipes()
    single = len(by_recipe) <= 1
    recipe = next(iter(by_recipe), "tensorwise")
    out = [
        f'"""The fp8 plan of {in_docstring(plan.model)}: which linear layers torchao converts, by name.',
        "",
        "Written by 'ampscope plan fp8'"
        + (f" for {plan.gpu}" if plan.gpu else "")
        + ". Apply before torch.compile and before",
        "activation-checkpoint wrapping, to the model the factory returns (the names are its",
        "named_modules() names):",
        "",
    ]
    if single:
        out += [
            "    from torchao.float8 import Float8LinearConfig, convert_to_float8_training",
            "",
            "    config = Float8LinearConfig.from_recipe_name(RECIPE)",
            "    convert_to_float8_training(model, config=config, module_filter_fn=module_filter_fn)",
        ]
    else:
        out += [
            "    convert(model)  # each recipe's layers with their own config",
            "",
            "or per recipe: convert_to_float8_training(model, config=Float8LinearConfig",
            "    .from_recipe_name(recipe), module_filter_fn=FILTERS[recipe]).",
        ]
    out += ['"""', "", "from __future__ import annotations", ""]
    out += ["LAYERS = {"]
    for r, names in by_recipe.items():
        out.append(f"    {r!r}: frozenset({{")
        out += [f"        {n!r}," for n in names]
        out.append("    }),")
    out += ["}", ""]
    if single:
        out += [
            f"RECIPE = {recipe!r}",
            "",
            "",
            "def module_filter_fn(module, fqn):",
            '    """True for the layers the plan trains in fp8."""',
            "    return fqn in LAYERS.get(RECIPE, ())",
            "",
            "",
            "FILTERS = {RECIPE: module_filter_fn}",
        ]
    else:
        for r in by_recipe:
            out += [
                "",
                "",
                f"def module_filter_fn_{r}(module, fqn):",
                f'    """True for the layers the plan trains in fp8 {r}."""',
                f"    return fqn in LAYERS[{r!r}]",
            ]
        out += ["", "", "FILTERS = {"]
        out += [f"    {r!r}: module_filter_fn_{r}," for r in by_recipe]
        out += ["}"]
    out += [
        "",
        "",
        "def convert(model, emulate=False):",
        '    """Convert the planned layers of ``model`` in place, each recipe with its config."""',
        "    import dataclasses",
        "",
        "    from torchao.float8 import Float8LinearConfig, convert_to_float8_training",
        "",
        "    for recipe, keep in FILTERS.items():",
        "        config = Float8LinearConfig.from_recipe_name(recipe)",
        "        if emulate:",
        "            config = dataclasses.replace(config, emulate=True)",
        "        convert_to_float8_training(model, config=config, module_filter_fn=keep)",
        "    return model",
    ]
    return "\n".join(out) + "\n"


def substring_clash(excluded: list[str], planned: list[str]) -> tuple[str, str] | None:
    """An excluded name that is part of a planned layer's name (torchtitan matches
    ``filter_fqn in fqn``), which would keep that layer out too: (excluded, planned)."""
    for ex in excluded:
        for name in planned:
            if ex in name:
                return ex, name
    return None


def torchtitan_text(plan: Plan, linears: list[str]) -> tuple[str | None, str | None]:
    """torchtitan's ``filter_fqns`` for this plan, or None and why not. ``linears``: every
    ``nn.Linear`` of the model by name (torchao converts every one the filter lets through)."""
    by_recipe = plan.recipes()
    if len(by_recipe) != 1:
        why = (
            "the plan converts no layer"
            if not by_recipe
            else "the plan mixes recipes, and torchtitan converts with one"
        )
        return None, f"torchtitan's filter_fqns: not written ({why})"
    planned = [layer.name for layer in plan.fp8_layers]
    excluded = [n for n in linears if n not in set(planned)]
    clash = substring_clash(excluded, planned)
    if clash is not None:
        return None, (
            f"torchtitan's filter_fqns: not written: it matches names by substring, and "
            f"excluding '{clash[0]}' would exclude the planned '{clash[1]}' too"
        )
    recipe = next(iter(by_recipe))
    out = [
        f'"""The fp8 plan of {in_docstring(plan.model)} for torchtitan: one recipe, the rest excluded.',
        "",
        "torchtitan keeps a linear layer out of fp8 when one of FILTER_FQNS is part of its",
        "name; no name below is part of a planned layer's name (checked). Use them as",
        "",
        "    Float8LinearConverter.Config(recipe_name=RECIPE_NAME, filter_fqns=FILTER_FQNS,",
        "                                 model_compile_enabled=True)",
        "",
        "or, in a TOML job config: [quantize.linear.float8] recipe_name and filter_fqns.",
        '"""',
        "",
        f"RECIPE_NAME = {recipe!r}",
        "FILTER_FQNS = [",
        *[f"    {n!r}," for n in excluded],
        "]",
    ]
    return "\n".join(out) + "\n", None


def write(
    plan: Plan,
    folder: Path,
    name: str,
    where: Where,
    linears: list[str],
    bf16_instead: bool = False,
) -> list[str]:
    """Write the plan's files into ``folder`` (created), fill ``plan.files``; the notes to
    add (a file not written, and why). Raises OSError when the folder cannot be written."""
    folder.mkdir(parents=True, exist_ok=True)
    notes = []
    preset = folder / PRESET_FILE
    write_text(preset, preset_text(plan, name, where, bf16_instead))
    loaded = presets.load_preset(str(preset))  # as 'ampscope run' loads it: an error is a bug
    plan.preset_precision = loaded.precision
    files = Files(preset=str(preset), json=str(folder / JSON_FILE))
    if plan.target == "fp8":
        torchao = folder / TORCHAO_FILE
        write_text(torchao, torchao_text(plan))
        files.torchao = str(torchao)
        text, why = torchtitan_text(plan, linears)
        if text is not None:
            titan = folder / TORCHTITAN_FILE
            write_text(titan, text)
            files.torchtitan = str(titan)
        elif why:
            notes.append(why)
    plan.files = files
    plan.notes += notes
    write_json(folder / JSON_FILE, to_builtins(plan))
    return notes
