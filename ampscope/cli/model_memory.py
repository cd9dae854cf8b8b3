"""``ampscope memory --model SPEC``: the planner fed with a user's model's true parameter count.

The count comes from the model itself, built by its factory on the meta device (no memory, no
time) when the factory allows it, else on the CPU. Building it needs torch and the engine's
loader, so this front-end reaches into the engine only when asked.
"""

from __future__ import annotations

import sys

from ampscope.core.config import ConfigError
from ampscope.core.text import visible


def model_params(spec: str) -> tuple[int, str]:
    """(parameter count, a title naming the model and where it was counted); ConfigError
    (with the user's traceback, if their code failed) for a spec that builds no model."""
    from ampscope.engine.workloads.user import count_model_parameters

    params, device, name = count_model_parameters(spec)
    where = "the meta device" if device == "meta" else "the CPU"
    return params, f"model {name} from {spec}, {params:,} parameters as built on {where}"


def refuse(exc: ConfigError) -> int:
    """A spec that builds no model: one paragraph, the user's traceback under it, exit 2."""
    print(f"ampscope: {visible(exc, keep_newlines=True)}", file=sys.stderr)
    trace = getattr(exc, "traceback", None)
    if trace:
        print(visible(trace, keep_newlines=True), file=sys.stderr)
    return 2
