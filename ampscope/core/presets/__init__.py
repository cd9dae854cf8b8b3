"""Presets: TOML files that each describe one training configuration.

A preset is looked up by name (shipped presets, then ``~/.config/ampscope/presets/``) or
by path, fields are overridden with ``--set key=value``, and the result is validated into
a :class:`Preset`. Every problem becomes a :class:`ConfigError` whose message names the
file, the key and what would be accepted.

Its modules:

    preset.py          the preset's model (``Preset``), finding, ``--set`` overrides, validation
    errors.py          the one error type of presets and overrides
    messages.py        msgspec's validation messages reworded for people
    toml_text.py       reading a preset file or a ``--set`` value, writing values back
    run_args.py        the run arguments shared by ``ampscope run`` and the engine
    parallel.py        the ``[parallel]`` table and how torchrun is asked
    workload_rules.py  the built-in workloads' dimensions and ``[workload]`` rules
    fp8_recipes.py     which fp8 format each tensor of a linear layer takes
    optimizer.py       the ``[optimizer]`` table: fused, foreach or per-tensor AdamW
    workload_spec.py   a user's own model (``--model``): the factory's spec (``ampscope.Workload``
                       is in core/workload.py)
    suggest.py         "did you mean": the close name for a mistyped preset, field or value
"""

from __future__ import annotations

from ampscope.core.presets.errors import ConfigError
from ampscope.core.presets.preset import (
    DEVICE_PATTERN,
    MAX_STEPS,
    PRESET_ORDER,
    CompileMode,
    Debug,
    Dim,
    Precision,
    Preset,
    PresetInfo,
    ScalerMode,
    ScalerOptions,
    StepIndex,
    Steps,
    WorkloadKind,
    WorkloadSize,
    WorkloadSizes,
    WorkloadTable,
    apply_override,
    check_combinations,
    describe_validation_error,
    find_preset,
    get_dotted,
    list_presets,
    load_preset,
    parse_override,
    resolve_workload,
    set_dotted,
    sharded_scaler,
    shipped_presets_dir,
    to_dict,
    to_toml,
    user_config_dir,
    user_presets_dir,
    validate,
)
from ampscope.core.presets.toml_text import MAX_PRESET_BYTES, MAX_VALUE_CHARS, parse_value
from ampscope.core.presets.workload_rules import WORKLOAD_SIZES

__all__ = [
    "CompileMode",
    "ConfigError",
    "DEVICE_PATTERN",
    "Debug",
    "Dim",
    "MAX_PRESET_BYTES",
    "MAX_STEPS",
    "MAX_VALUE_CHARS",
    "PRESET_ORDER",
    "Precision",
    "Preset",
    "PresetInfo",
    "ScalerMode",
    "ScalerOptions",
    "StepIndex",
    "Steps",
    "WORKLOAD_SIZES",
    "WorkloadKind",
    "WorkloadSize",
    "WorkloadSizes",
    "WorkloadTable",
    "apply_override",
    "check_combinations",
    "describe_validation_error",
    "find_preset",
    "get_dotted",
    "list_presets",
    "load_preset",
    "parse_override",
    "parse_value",
    "resolve_workload",
    "set_dotted",
    "sharded_scaler",
    "shipped_presets_dir",
    "to_dict",
    "to_toml",
    "user_config_dir",
    "user_presets_dir",
    "validate",
]
