"""What a recorded run is called on every screen: its preset and its model.

A run that failed before its ``hello`` (a factory with a typo) has only the configuration
the engine wrote first (``config.json``); it is named from that the same way, not by its
folder's name.
"""

from __future__ import annotations

from typing import Any

from ampscope.core import records
from ampscope.core.presets.workload_spec import config_model, model_label
from ampscope.core.records import files


def recorded_config(run: records.RunRecord) -> dict[str, Any]:
    """The configuration the run was started with: its hello's, else its ``config.json``."""
    if run.hello is not None:
        return run.hello.config or {}
    try:
        conf = files.read_json(run.path / records.CONFIG_FILE)
    except (OSError, ValueError, RecursionError):
        return {}
    return conf if isinstance(conf, dict) else {}


def run_preset(run: records.RunRecord) -> str:
    if run.hello is not None:
        return run.hello.preset
    name = recorded_config(run).get("name")
    return str(name) if name else run.preset


def run_model(run: records.RunRecord) -> str:
    """The user's model by name (``model_label``), else the built-in workload's kind."""
    conf = recorded_config(run)
    label = model_label(config_model(conf), run.hello.workload if run.hello else None)
    if label:
        return label
    workload = conf.get("workload")
    kind = workload.get("kind") if isinstance(workload, dict) else None
    return str(kind) if kind else "-"


def named_in(precision: str, preset: str) -> bool:
    """Whether the preset's name says the precision as one of its dash-separated words
    (``amp-fp16`` in ``amp-fp16-noscale``, ``amp-bf16`` in ``cnn-amp-bf16``); ``amp-fp16``
    is one word, so a preset named ``amp-fp16-x`` that trains in pure ``fp16`` says so."""

    def words(name: str) -> list[str]:
        return name.replace("amp-", "amp+").split("-")

    return precision.replace("amp-", "amp+") in words(preset)
