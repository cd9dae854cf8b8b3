"""A preset: its model (``Preset`` and its tables), finding one by name or path, ``--set``
overrides, validation into a :class:`Preset`, and writing it back as TOML.

Every problem becomes a :class:`ConfigError` whose message names the file, the key and what
would be accepted.
"""

from __future__ import annotations

import contextlib
import os
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from ampscope.core.numerics.options import NumericsOptions
from ampscope.core.presets.errors import ConfigError, FlagOverride
from ampscope.core.presets.fp8_recipes import Fp8Options, check_fp8_layers
from ampscope.core.presets.messages import describe_validation_error as _describe
from ampscope.core.presets.optimizer import OptimizerOptions, check_optimizer
from ampscope.core.presets.parallel import Parallel, check_parallel
from ampscope.core.presets.suggest import did_you_mean
from ampscope.core.presets.toml_text import (
    parse_value,
    read_toml,
    reason,
    toml_value,
)
from ampscope.core.presets.workload_rules import (
    TRANSFORMERS,
    WORKLOAD_SIZES,
    check_workload,
    head_problems,
)
from ampscope.core.presets.workload_spec import model_override

Precision = Literal["fp32", "tf32", "amp-bf16", "amp-fp16", "bf16", "fp16", "fp64", "fp8"]
ScalerMode = Literal["auto", "on", "off"]
CompileMode = Literal[
    "off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
]
WorkloadKind = Literal["gpt", "mlp", "cnn", "gpt2-124m", "llama"]
WorkloadSize = Literal["auto", "small", "large"]

# Upper bounds far beyond any real run, so that a typo (or 10**23) is refused at once
# instead of running for ever or asking the allocator for terabytes.
MAX_STEPS = 10_000_000
Steps = Annotated[int, Meta(ge=1, le=MAX_STEPS)]
StepIndex = Annotated[int, Meta(ge=0, le=MAX_STEPS)]
Dim = Annotated[int, Meta(ge=1, le=1 << 20)]


class ScalerOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """torch.amp.GradScaler's knobs."""

    init_scale: Annotated[float, Meta(gt=0, le=2.0**100)] = 65536.0
    growth_factor: Annotated[float, Meta(gt=1, le=1e6)] = 2.0
    backoff_factor: Annotated[float, Meta(gt=0, lt=1)] = 0.5
    growth_interval: Steps = 2000


class WorkloadTable(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The model and its data: a built-in kind (unset dimensions come from ``size``), or the
    user's own factory, ``model = "path/to/file.py:make"`` or ``"pkg.module:make"``."""

    kind: WorkloadKind = "gpt"
    model: Annotated[str, Meta(max_length=1000)] | None = None  # replaces kind when set
    size: WorkloadSize = "auto"
    layers: Annotated[int, Meta(ge=1, le=1024)] | None = None
    width: Dim | None = None
    heads: Annotated[int, Meta(ge=1, le=1024)] | None = None  # transformers
    kv_heads: Annotated[int, Meta(ge=1, le=1024)] | None = None  # llama only
    seq_len: Dim | None = None  # transformers
    vocab: Annotated[int, Meta(ge=2, le=1 << 22)] | None = None  # transformers
    image_size: Annotated[int, Meta(ge=8, le=8192)] | None = None  # cnn only
    classes: Annotated[int, Meta(ge=2, le=1 << 20)] | None = None  # mlp and cnn


class Debug(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Fault injection, for demonstrations and tests. 0 means never."""

    inf_loss_at_step: StepIndex = 0
    raise_at_step: StepIndex = 0
    rank: Annotated[int, Meta(ge=0, le=1 << 20)] | None = None  # the one rank struck; unset: all

    @property
    def configured(self) -> bool:
        """Any fault set: the step calls the fault hook only then."""
        return self.inf_loss_at_step > 0 or self.raise_at_step > 0


class Preset(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: Annotated[str, Meta(min_length=1, max_length=200)]
    description: Annotated[str, Meta(max_length=2000)] = ""
    precision: Precision = "fp32"
    grad_scaler: ScalerMode = "auto"
    compile: CompileMode = "off"
    fullgraph: bool = False
    dynamic: bool = False
    steps: Steps = 200
    warmup_steps: StepIndex = 5
    batch_size: Dim | Literal["auto"] = "auto"
    lr: Annotated[float, Meta(gt=0, le=10)] = 3e-3
    grad_clip: Annotated[float, Meta(ge=0, le=1e9)] = 1.0
    # Backward runs on loss / loss_divisor, as when a trainer averages over that many times the
    # examples (gradient accumulation, a loss over millions of tokens): every gradient that much
    # smaller, where fp16 flushes them to zero. AdamW's update does not depend on the scale.
    loss_divisor: Annotated[float, Meta(ge=1, le=2.0**40)] = 1.0
    seed: Annotated[int, Meta(ge=0, le=2**63 - 1)] = 0
    device: Annotated[str, Meta(max_length=64)] = "auto"
    grad_zero_every: StepIndex = 10
    peak_tflops: Annotated[float, Meta(gt=0, le=1e6)] | None = None
    telemetry_hz: Annotated[float, Meta(ge=0.25, le=10)] = 2.0  # sys samples a second
    scaler: ScalerOptions = msgspec.field(default_factory=ScalerOptions)
    workload: WorkloadTable = msgspec.field(default_factory=WorkloadTable)
    parallel: Parallel = msgspec.field(default_factory=Parallel)
    debug: Debug = msgspec.field(default_factory=Debug)
    fp8: Fp8Options = msgspec.field(default_factory=Fp8Options)  # read with precision = "fp8"
    # AMP: these modules (by name) compute in fp32, autocast off inside them (ampscope plan fp16)
    fp32_modules: list[Annotated[str, Meta(min_length=1, max_length=1000)]] = msgspec.field(
        default_factory=list
    )
    numerics: NumericsOptions = msgspec.field(default_factory=NumericsOptions)  # per-layer ranges
    optimizer: OptimizerOptions = msgspec.field(default_factory=OptimizerOptions)  # AdamW's step

    @property
    def uses_scaler(self) -> bool:
        if self.grad_scaler == "auto":
            return self.precision == "amp-fp16"
        return self.grad_scaler == "on"


DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


@dataclass(frozen=True)
class PresetInfo:
    name: str
    description: str
    path: Path
    source: Literal["shipped", "user", "path"]
    problem: str | None = None
    """Why the file cannot be used (not TOML, unreadable, absurd), for a preset listed as broken."""


def shipped_presets_dir() -> Path:
    """The presets ship inside the package (the checkout's top-level presets/ links here)."""
    return Path(__file__).resolve().parents[2] / "presets"  # ampscope/core/presets/__init__.py


def user_config_dir() -> Path:
    """``$XDG_CONFIG_HOME/ampscope`` (``~/.config/ampscope``): user presets and key bindings."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "ampscope"


def user_presets_dir() -> Path:
    return user_config_dir() / "presets"


# The order presets are listed in: the lecture's story, from the baseline to compile modes.
PRESET_ORDER = (
    "fp32",
    "tf32",
    "amp-bf16",
    "amp-fp16",
    "amp-fp16-noscale",
    "bf16",
    "fp16",
    "compile-default",
    "compile-reduce-overhead",
    "compile-max-autotune",
    "fp8-tensorwise",
    "fp8-rowwise",
    "fp8-eager",
    "underflow-demo-scaled",
    "underflow-demo",
)


def list_presets() -> list[PresetInfo]:
    """Shipped presets in the lecture's order, then the rest by name; a user preset of the
    same name as a shipped one replaces it."""
    found: dict[str, PresetInfo] = {}
    for source, folder in (("shipped", shipped_presets_dir()), ("user", user_presets_dir())):
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.toml")):
            try:
                raw = read_toml(path)
            except ConfigError as exc:  # listed as broken, so the user can find and fix it
                found.setdefault(path.stem, PresetInfo(path.stem, "", path, source, exc.detail))  # type: ignore[arg-type]
                continue
            name = str(raw.get("name", path.stem))
            problem = None if source == "shipped" else _problem_of(raw, path)
            found[name] = PresetInfo(name, str(raw.get("description", "")), path, source, problem)  # type: ignore[arg-type]
    rank = {name: i for i, name in enumerate(PRESET_ORDER)}
    return sorted(found.values(), key=lambda p: (rank.get(p.name, len(rank)), p.name))


def _problem_of(raw: dict[str, Any], path: Path) -> str | None:
    """Why a user's preset would be refused by ``run`` (an unknown field, a bad value), so that
    the list marks it broken before a run is tried; None for one that validates."""
    try:
        validate({"name": path.stem, **raw}, source=str(path))
    except ConfigError as exc:
        return exc.detail
    return None


def find_preset(name_or_path: str) -> PresetInfo:
    """A preset by file path or by name (a name may hold a '/': a path is tried first)."""
    path = Path(name_or_path).expanduser()
    looks_like_path = name_or_path.endswith(".toml") or os.sep in name_or_path
    if looks_like_path and path.exists():  # a FIFO or a folder: read_toml says what it is
        raw = read_toml(path)
        return PresetInfo(
            str(raw.get("name", path.stem)), str(raw.get("description", "")), path, "path"
        )
    presets = list_presets()
    for info in presets:
        if info.name == name_or_path:
            if info.problem:
                raise ConfigError(
                    f"preset '{info.name}' is broken: {info.problem}", source=str(info.path)
                )
            return info
    if looks_like_path:
        raise ConfigError(f"Preset file {name_or_path} does not exist.")
    names = ", ".join(p.name for p in presets) or "(none found)"
    hint = did_you_mean(name_or_path, [p.name for p in presets])
    raise ConfigError(
        f"Unknown preset '{name_or_path}'.{hint} Available presets: {names}. A preset can also be given "
        f"as a path to a .toml file, or saved in {user_presets_dir()}."
    )


def load_preset(name_or_path: str, overrides: typing.Sequence[str] = ()) -> Preset:
    """Find, override and validate a preset. Raises ConfigError with a user-facing message."""
    info = find_preset(name_or_path)
    raw = read_toml(info.path)
    raw.setdefault("name", info.path.stem)
    for item in overrides:
        apply_override(raw, item)
    try:
        return validate(raw, source=str(info.path))
    except ConfigError as exc:
        blamed = _blame_override(exc, overrides)
        if blamed is None:
            raise
        raise ConfigError(exc.detail, key=exc.key, source=_flag_for(blamed)) from None


def _flag_for(override: str) -> str:
    """How the user most likely wrote it: ``--model SPEC`` stands for a workload.model --set."""
    if isinstance(override, FlagOverride):
        return override.flag
    key, _, value = override.partition("=")
    if key.strip() == "workload.model":
        with contextlib.suppress(ConfigError):
            spec = parse_value(value.strip())
            if isinstance(spec, str) and model_override(spec) == override:
                return (
                    f"--model {spec if spec.strip() else repr(spec)}"  # --model '' said "--model :"
                )
    return f"--set {override}"


def _blame_override(exc: ConfigError, overrides: typing.Sequence[str]) -> str | None:
    """The last --set that gave the field at fault (or a table above it, or a field inside
    it: ``--set optimiser.fused=true`` made the unknown table ``optimiser``), if one did."""
    if exc.key is None:
        return None
    for item in reversed(overrides):
        key = item.partition("=")[0].strip()
        inside = exc.key.startswith((key + ".", key + "["))  # a table's entry: [...]
        if exc.key == key or inside or key.startswith(exc.key + "."):
            return item
    return None


def parse_override(item: str) -> tuple[list[str], Any]:
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(
            f"Override '{item[:80]}' is not of the form key=value (for example steps=50 or workload.layers=4)."
        )
    try:
        return key.split("."), parse_value(text.strip())
    except ConfigError as exc:
        raise ConfigError(exc.detail, key=key, source=f"--set {key}") from None


def get_dotted(data: dict[str, Any], key: str) -> Any:
    """``data["workload"]["layers"]`` for ``"workload.layers"``; None where any part is missing."""
    node: Any = data
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set a dotted key, creating the tables on the way. Raises ConfigError where a part is not
    a table."""
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"'{part}' is not a table, so it has no fields.", key=key)
        node = child
    node[parts[-1]] = value


def apply_override(raw: dict[str, Any], item: str) -> None:
    path, value = parse_override(item)
    try:
        set_dotted(raw, ".".join(path), value)
    except ConfigError as exc:
        raise ConfigError(exc.detail, key=exc.key, source=f"Override '{item}'") from None


def validate(raw: dict[str, Any], source: str = "preset") -> Preset:
    try:
        preset = msgspec.convert(raw, Preset, str_keys=True)
    except msgspec.ValidationError as exc:
        key, message = describe_validation_error(str(exc))
        raise ConfigError(message, key=key, source=source) from None
    except (RecursionError, ValueError, OverflowError) as exc:
        raise ConfigError(f"not a usable preset ({reason(exc)}).", source=source) from None
    problems = check_combinations(preset)
    if problems:
        key, message = problems[0]
        raise ConfigError(message, key=key, source=source)
    return preset


def check_combinations(preset: Preset) -> list[tuple[str, str]]:
    """Rules that span fields and need no device to check: (key at fault, message) pairs."""
    problems: list[tuple[str, str]] = []
    if preset.precision in ("fp16", "bf16", "fp64") and preset.grad_scaler == "on":
        message = (
            f"grad_scaler = 'on' cannot be used with precision = '{preset.precision}': GradScaler "
            "unscales fp32 master gradients, and a pure-cast model has none. Use precision = "
            "'amp-fp16' for loss scaling, or set grad_scaler = 'off'."
        )
        problems.append(("grad_scaler", message))
    if not DEVICE_PATTERN.match(preset.device):
        message = (
            f"device = '{preset.device}' is not a device. Accepted: auto, cpu, cuda, or cuda:N."
        )
        problems.append(("device", message))
    if preset.fp32_modules and not preset.precision.startswith("amp-"):
        message = (
            f"fp32_modules keeps modules out of autocast, but precision = "
            f"'{preset.precision}' runs no autocast. Use it with precision = 'amp-fp16' or "
            "'amp-bf16', or drop fp32_modules."
        )
        problems.append(("fp32_modules", message))
    problems += check_fp8_layers(preset.fp8)
    problems += check_workload(preset.workload)
    problems += check_optimizer(preset.optimizer, sharded_scaler(preset))
    return problems + check_parallel(preset.precision, preset.parallel)


def sharded_scaler(preset: Preset) -> bool:
    """FSDP2 with a GradScaler: on several ranks the scaler is the sharded one."""
    return (
        preset.parallel.strategy == "fsdp2"
        and preset.uses_scaler
        and preset.precision not in ("bf16", "fp16", "fp64")
    )


WorkloadSizes = tuple[dict[str, int], int]
"""A built-in workload's dimensions and its batch size, ``auto`` decided."""


def resolve_workload(preset: Preset, on_cuda: bool) -> WorkloadSizes:
    """The workload's dimensions and the batch size once ``auto`` sizes are decided: once a
    run (``engine.step.validation``), then passed along."""
    size = preset.workload.size
    if size == "auto":
        size = "large" if on_cuda else "small"
    base = dict(WORKLOAD_SIZES[preset.workload.kind][size])
    batch = base.pop("batch_size")
    for name in base:
        value = getattr(preset.workload, name)
        if value is not None:
            base[name] = value
    if preset.batch_size != "auto":
        batch = preset.batch_size
    if preset.workload.kind in TRANSFORMERS:
        problems = head_problems(base["width"], base["heads"], base.get("kv_heads"))
        if preset.workload.kind == "llama" and base["width"] // base["heads"] % 2:
            message = (
                f"workload.width / workload.heads = {base['width'] // base['heads']} is odd: "
                "rotary embeddings turn pairs of values, so a head needs an even width."
            )
            problems.append(("workload.width", message))
        if problems:
            key, message = problems[0]
            raise ConfigError(message, key=key)
    return base, batch


def to_dict(preset: Preset) -> dict[str, Any]:
    return msgspec.to_builtins(preset)


def to_toml(preset: Preset) -> str:
    """A preset as a TOML file, for saving an edited preset."""
    data = to_dict(preset)
    lines = []
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    for key, value in data.items():
        if key not in tables and value is not None and value != []:
            lines.append(f"{key} = {toml_value(value)}")
    for table, fields in tables.items():
        defaults = to_dict(getattr(Preset(name="_"), table))
        changed = {k: v for k, v in fields.items() if v is not None and v != defaults.get(k)}
        if table == "workload" or changed:
            lines.append(f"\n[{table}]")
            for key, value in (fields if table == "workload" else changed).items():
                if value is not None:
                    lines.append(f"{key} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


def describe_validation_error(message: str) -> tuple[str | None, str]:
    """msgspec's message about a preset as (dotted key at fault, a message for people)."""
    return _describe(message, Preset)
