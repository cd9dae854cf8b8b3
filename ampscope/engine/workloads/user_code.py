"""Loading a user's model factory, calling it, and telling its failures as theirs.

Everything that can go wrong in the user's own code (a missing file or function, an import
that fails, a factory that raises, an answer without a model) becomes a :class:`UserCodeError`:
a ``ConfigError``, so the run ends with an ``error`` event of kind ``config`` and exit 2. Its
message names the spec, what was wrong and what is accepted; its traceback keeps the frames
of the user's code (and of the libraries it calls) and drops ampscope's and torch's call
plumbing, so the file and line shown are theirs.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any

from ampscope.core.presets import ConfigError
from ampscope.core.presets.suggest import did_you_mean
from ampscope.core.presets.workload_spec import (
    RETURN_FORMS,
    SPEC_FORMS,
    ModelSpec,
    SpecError,
    check_model_spec,
)
from ampscope.core.text import exception_text, value_text
from ampscope.core.workload import Workload

RESULT_KEYS = tuple(f.name for f in fields(Workload))
_PACKAGE = Path(__file__).parents[2]  # ampscope/, as this file is imported from it
# ampscope's own code, by the path it is imported under and by where the files really are
# (engine/ and tui/ are linked into the package from the top of a source checkout).
_ROOTS = (_PACKAGE, _PACKAGE / "engine", _PACKAGE / "tui")
OURS = tuple({str(p) + os.sep for root in _ROOTS for p in (root, root.resolve())})
# Frames of torch's plumbing that say nothing about the model: Module.__call__'s wrappers (two
# or three a layer), the dispatch of an op through a mode such as the FLOP counter, and the
# way from loss.backward() into autograd's engine.
PLUMBING = {
    "torch/_tensor.py": ("backward",),
    "torch/autograd/__init__.py": ("backward",),
    "torch/autograd/graph.py": ("_engine_run_backward",),
    "torch/nn/modules/module.py": ("_call_impl", "_wrapped_call_impl", "inner"),
    "torch/_compile.py": ("inner",),
    "torch/_dynamo/eval_frame.py": ("_fn",),
    "torch/_ops.py": None,
    "torch/utils/flop_counter.py": None,
    "torch/utils/_python_dispatch.py": None,
}


class UserCodeError(ConfigError):
    """A fault in (or of) the user's model code; ``traceback`` shows their frames only."""

    def __init__(self, message: str, traceback_text: str | None = None) -> None:
        super().__init__(message, key="workload.model")
        self.traceback = traceback_text


def _hidden(frame: traceback.FrameSummary) -> bool:
    """ampscope's frames, importlib's, and torch's plumbing."""
    name = frame.filename
    if name.startswith(OURS) or name.startswith("<frozen importlib"):
        return True
    path = name.replace(os.sep, "/")
    for suffix, functions in PLUMBING.items():
        if path.endswith(suffix) and (functions is None or frame.name in functions):
            return True
    return False


def user_traceback(exc: BaseException) -> str | None:
    """The traceback of ``exc`` without ampscope's frames nor torch's plumbing: what the
    user would see had they run the step themselves. None when none of its frames is theirs
    (a factory or loss called with the wrong arguments): the message says it all."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _hidden(f)]
    if not frames:
        return None
    lines = ["Traceback (most recent call last):\n"]
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines).rstrip("\n")


def raised_by_ampscope(exc: BaseException) -> bool:
    """Whether ampscope's own code raised ``exc`` after torch or the user's code called it
    back: a hook or counter ampscope put on the model (its frames come again below a frame of
    theirs). A fault of ampscope's instrumentation, never of the user's model or batches."""
    ours = [f.filename.startswith(OURS) for f in traceback.extract_tb(exc.__traceback__)]
    left = next((i for i, mine in enumerate(ours) if not mine), None)
    return left is not None and any(ours[left:])


def as_exception(exc: BaseException) -> Exception:
    """A BaseException the user's model raised (asyncio.CancelledError, GeneratorExit) as an
    Exception of the same name, message and frames: every check around their forward and
    loss catches Exception (KeyboardInterrupt and SystemExit keep ways of their own)."""
    kind = type(exc)
    named = {"__module__": kind.__module__, "__qualname__": kind.__qualname__}
    same = type(kind.__name__, (Exception,), named)(exception_text(exc))
    return same.with_traceback(exc.__traceback__)


def describe_exception(exc: BaseException) -> str:
    text = exception_text(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def exception_clause(exc: BaseException) -> str:
    """``describe_exception`` without the full stop its message may end with, for a sentence
    that goes on after it: torch's "... target batch_size (8)." would end on ".."."""
    return describe_exception(exc).rstrip(".")


def load_factory(spec_text: str) -> Callable[..., Any]:
    """The factory the spec names."""
    try:
        spec = check_model_spec(spec_text)
    except SpecError as exc:
        raise UserCodeError(str(exc)) from None
    module = _import_file(spec) if spec.source == "file" else _import_module(spec)
    target: Any = module
    for part in spec.function.split("."):
        if not hasattr(target, part):
            names = factory_names(module)
            hint = did_you_mean(spec.function, names)
            raise UserCodeError(
                f"workload.model = '{spec.text}': {spec.target} has no '{spec.function}'.{hint} "
                f"The functions it defines: {', '.join(names) or '(none)'}. "
                f"Accepted: {SPEC_FORMS}."
            )
        target = getattr(target, part)
    if not callable(target):
        raise UserCodeError(
            f"workload.model = '{spec.text}': '{spec.function}' in {spec.target} is a "
            f"{type(target).__name__}, not a function. Accepted: a function called as make(ctx)."
        )
    return target


def factory_names(module: ModuleType) -> list[str]:
    """The public functions ``module`` itself defines: what could be a factory. What it
    imports (``DataLoader``, ``Dataset``) and the classes it defines (an ``nn.Module`` is
    the model, not its factory) are not, and listing them hides the name meant."""
    own = getattr(module, "__name__", None)
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and isinstance(value, (FunctionType, functools.partial))
        and getattr(value, "__module__", own) == own
    )


def _import_file(spec: ModelSpec) -> ModuleType:
    """Import a .py file as a script would be run: its folder first on sys.path, so that its
    own imports (a sibling module, a package next to it) work, and under its own name when
    that is free, so that DataLoader workers can import what it defines."""
    path = spec.path.resolve()
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = path.stem
    existing = sys.modules.get(name)
    if existing is not None and getattr(existing, "__file__", None) != str(path):
        name = f"ampscope_user_{name}"
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise UserCodeError(f"workload.model = '{spec.text}': {path} cannot be loaded as Python.")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - any fault in their file is theirs to see
        del sys.modules[name]
        raise UserCodeError(
            f"workload.model = '{spec.text}': importing {spec.target} raised "
            f"{describe_exception(exc)}",
            user_traceback(exc),
        ) from None
    return module


def _import_module(spec: ModelSpec) -> ModuleType:
    """Import a module by name, from sys.path and then the working folder (last, so that
    nothing there can stand in for ampscope's own modules)."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.import_module(spec.target)
    except ModuleNotFoundError as exc:
        if exc.name and (spec.target == exc.name or spec.target.startswith(exc.name + ".")):
            raise UserCodeError(
                f"workload.model = '{spec.text}': there is no module named '{exc.name}' (looked "
                f"on sys.path and in the working folder {cwd}). Accepted: {SPEC_FORMS}; give a "
                "file path if the module is not installed."
            ) from None
        raise UserCodeError(
            f"workload.model = '{spec.text}': importing {spec.target} raised "
            f"{describe_exception(exc)}",
            user_traceback(exc),
        ) from None
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - an asyncio.CancelledError too: theirs
        raise UserCodeError(
            f"workload.model = '{spec.text}': importing {spec.target} raised "
            f"{describe_exception(exc)}",
            user_traceback(exc),
        ) from None


def call_factory(factory: Callable[..., Any], ctx: Any, spec_text: str) -> dict[str, Any]:
    """``factory(ctx)``, its answer as a dict of :class:`ampscope.Workload`'s fields."""
    try:
        result = factory(ctx)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - an asyncio.CancelledError too: theirs
        raise UserCodeError(
            f"workload.model = '{spec_text}': the factory raised {describe_exception(exc)}",
            user_traceback(exc),
        ) from None
    return workload_fields(result, spec_text)


def workload_fields(result: Any, spec_text: str) -> dict[str, Any]:
    """The factory's answer, a mapping or an object, as a dict; refuse what lacks a field."""
    if isinstance(result, Mapping):
        answer = dict(result)
        # a key that is no str is shown as value_text does: its str() may raise
        unknown = [
            k if isinstance(k, str) else value_text(k, 60) for k in answer if k not in RESULT_KEYS
        ]
        if unknown:
            missing = [k for k in ("model", "batches") if answer.get(k) is None]
            lacks = f", and it has no {' or '.join(repr(k) for k in missing)}" if missing else ""
            raise UserCodeError(
                f"workload.model = '{spec_text}': the factory's mapping has unknown key(s) "
                f"{', '.join(repr(k) for k in unknown)}{lacks}. Accepted keys: "
                f"{', '.join(RESULT_KEYS)} (model and batches required)."
            )
    elif is_dataclass(result) or hasattr(result, "model"):
        answer = {k: getattr(result, k) for k in RESULT_KEYS if hasattr(result, k)}
    else:
        raise UserCodeError(
            f"workload.model = '{spec_text}': the factory returned {_a(result)}. "
            f"Accepted: {RETURN_FORMS}."
        )
    for key in ("model", "batches"):
        if answer.get(key) is None:
            raise UserCodeError(
                f"workload.model = '{spec_text}': the factory's answer has no '{key}'. "
                f"Accepted: {RETURN_FORMS}."
            )
    return answer


def name_field(answer: dict[str, Any], default: str, spec_text: str) -> str:
    """The answer's ``name`` as text, or ``default`` when it gives none. A name whose
    ``__str__`` (or truth) raises is the user's error, said as theirs, not a traceback."""
    value = answer.get("name")
    try:
        return str(value) if value else default
    except Exception as exc:  # noqa: BLE001 - whatever their object raises
        raise UserCodeError(
            f"workload.model = '{spec_text}': 'name' cannot be made text: "
            f"{describe_exception(exc)}. Accepted: a str, or leave it out.",
            user_traceback(exc),
        ) from None


def positive_field(
    answer: dict[str, Any], key: str, spec_text: str, whole: bool, most: float
) -> Any:
    """The answer's ``key``, a number > 0 and at most ``most`` (a whole one if ``whole``), or
    None if not given."""
    value = answer.get(key)
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    try:  # an int past float's range (10**400) is no figure: TFLOP/s divides it as a float
        number = float(value) if ok else math.nan
    except OverflowError:
        number = math.inf
    past = isinstance(value, int) and math.isinf(number)
    if ok and whole:
        ok = number.is_integer()
    if not ok or not math.isfinite(number) or not 0 < number <= most:
        kind = "a whole number" if whole else "a number"
        shown = "a number past float's range" if past else value_text(value, 60)
        raise UserCodeError(
            f"workload.model = '{spec_text}': '{key}' is {shown}. Accepted: {kind} > 0 and "
            f"at most {most:.0e}, or leave it out."
        )
    return int(value) if whole else float(value)


def on_meta_device(model: Any) -> str | None:
    """What to say of a model whose parameters are on the meta device (built under
    ``torch.device("meta")``): shapes without values, nothing to train; None when none is."""
    params = list(model.parameters())
    meta = [p for p in params if getattr(p, "is_meta", False)]
    if not meta:
        return None
    return (
        f"the model's parameters are on the meta device ({len(meta):,} of {len(params):,}): "
        "they have shapes but no values, so there is nothing to train or move. Build the "
        "model on the CPU (or on ctx.device) in the factory, or call "
        "model.to_empty(device=ctx.device) and then initialise its weights (reset_parameters() "
        "or your own init) before returning it."
    )


def _a(value: Any) -> str:
    return "None" if value is None else f"a {type(value).__module__}.{type(value).__qualname__}"
