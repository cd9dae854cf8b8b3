"""``ampscope memory --model SPEC``: the planner fed with a user's model's true parameter count.

The count comes from the model itself: the real module its factory builds on the CPU, where
one step is measured; without that step (a transformer shape given, or a model the CPU cannot
run), the model built on the meta device (no memory, no time) when the factory allows it,
else on the CPU. Building it needs torch and the engine's loader, so this front-end reaches
into the engine only when asked.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

from ampscope.core.memory import plan
from ampscope.core.presets import ConfigError
from ampscope.core.text import exit_call, visible

SHAPE = ("layers", "hidden", "heads", "seq", "batch")


def from_model(args: argparse.Namespace) -> tuple[int, Any, str, plan.MeasuredStep | None]:
    """(parameter count, transformer shape if the flags give one, title, the activations
    measured on one step of the model); ConfigError (with the user's traceback, if their code
    failed) for a spec that builds no model."""
    from ampscope.engine.workloads.user import count_model_parameters

    try:
        with os_exit_said(args.model):
            params, device, name = count_model_parameters(args.model)
    except SystemExit as exc:  # their code's sys.exit() would end this command silently
        raise left_early(args.model, exc) from None
    shape = None
    if all(getattr(args, k) is not None for k in SHAPE):
        shape = plan.Shape(args.layers, args.hidden, args.heads, args.seq, args.batch, args.vocab)
    where = "the meta device" if device == "meta" else "the CPU"
    measured = None if shape is not None else measure(args.model)
    if measured is not None and measured.params is not None:  # the real module, ties and all
        params, where = measured.params, "the CPU"
    title = f"Training memory for model {visible(name)} from {args.model}: {params:,} parameters"
    return params, shape, f"{title}, as built on {where}", measured


def measure(spec: str, batch: int | None = None) -> plan.MeasuredStep | None:
    """What one step of the model saves for backward, in each regime (``engine.memory.saved``);
    None when the model cannot run a step on the CPU (the plan then says so)."""
    import torch

    from ampscope.core.workload import ModelContext
    from ampscope.engine.memory.saved import measure_step_memory
    from ampscope.engine.workloads.user import build_user_workload

    try:
        workload = build_user_workload(spec, ModelContext(torch.device("cpu"), batch, 0, "fp32"))
        workload.prepare()
        return measure_step_memory(workload)
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001 - whatever their step raises (sys.exit(), an
        # asyncio.CancelledError): the parameter plan stands without it
        return None


class Interrupted(Exception):
    """Ctrl+C while the model was being built: the command says so and exits 130."""


@contextlib.contextmanager
def os_exit_said(spec: str) -> Iterator[None]:
    """While the user's code builds the model: its ``os._exit(N)`` ends this command as it
    asked, but with a word on stderr and never with 0 (nothing was counted); a forked child
    (a DataLoader worker) leaves as it would. Ctrl+C is ``Interrupted``."""
    real_exit, me = os._exit, os.getpid()

    def said_exit(status: int) -> NoReturn:
        if os.getpid() == me:
            with contextlib.suppress(OSError, ValueError):
                print(
                    f"ampscope: workload.model = '{visible(spec)}': your code called "
                    f"os._exit({status}) while its model was being built, which ends this "
                    "command at once with nothing counted. Return the model from the factory.",
                    file=sys.stderr,
                    flush=True,
                )
            status = status or 2
        real_exit(status)

    os._exit = said_exit
    try:
        yield
    except KeyboardInterrupt:
        raise Interrupted(
            f"stopped (Ctrl+C) while the model of '{visible(spec)}' was being built: nothing "
            "counted."
        ) from None
    finally:
        os._exit = real_exit


def left_early(spec: str, exc: SystemExit) -> ConfigError:
    """The model's code called ``sys.exit()`` (importing it, or in its factory)."""
    from ampscope.engine.workloads.user_code import UserCodeError, user_traceback

    call = exit_call(exc.code)
    return UserCodeError(
        f"workload.model = '{spec}': your code called {call} while its model was being built "
        "(importing it, or in its factory), which would end this command with nothing "
        "counted. Raise an exception instead to say why, or return the model.",
        user_traceback(exc),
    )


def refuse(exc: ConfigError) -> int:
    """A spec that builds no model: one paragraph, the user's traceback under it, exit 2."""
    print(f"ampscope: {visible(exc, keep_newlines=True)}", file=sys.stderr)
    trace = getattr(exc, "traceback", None)
    if trace:
        print(visible(trace, keep_newlines=True), file=sys.stderr)
    return 2
