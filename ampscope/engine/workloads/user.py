"""A user's own model as a workload: their model, batches and loss behind the engine's interface.

The factory named by ``workload.model`` answers with a model and its batches (see
``ampscope.Workload``); this module adapts them to what the loop expects of every workload: a
batch per step on the device, a forward call, a scalar loss, the model FLOPs per step. The
precision, compile mode, optimizer, clipping, telemetry and events are the engine's, exactly
as for the built-in workloads.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import psutil
import torch
from torch import nn

from ampscope.core import events as ev
from ampscope.core.presets import ConfigError
from ampscope.core.workload import MAX_FLOPS_PER_STEP, MAX_ITEMS_PER_STEP, ModelContext
from ampscope.engine.workloads.base import TrainingWorkload
from ampscope.engine.workloads.user_code import (
    UserCodeError,
    as_exception,
    call_factory,
    describe_exception,
    exception_clause,
    load_factory,
    name_field,
    on_meta_device,
    positive_field,
    raised_by_ampscope,
    user_traceback,
)

BATCH_FORMS = (
    "(inputs, targets), or a dict of keyword arguments for the model (with no targets); inputs "
    "may be a tensor (model(x)), a tuple (model(*x)) or a dict (model(**x))"
)
COMPILER_MODULES = ("torch._dynamo", "torch._inductor")
LOSS_FORMS = (
    "give 'loss' as (output, targets) -> scalar tensor, or let the model return its loss: a "
    "scalar, or an object with .loss (as Hugging Face models do when given labels)"
)


def describe_value(value: Any) -> str:
    """A value as an error message names it: type, and shape and dtype for a tensor."""
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"a tensor of shape {list(value.shape)} ({dtype})"
    if isinstance(value, Mapping):
        return f"a {type(value).__name__} with keys {', '.join(map(str, value)) or '(none)'}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    return "None" if value is None else f"a {type(value).__name__}"


def first_tensor(value: Any) -> torch.Tensor | None:
    """The first tensor in inputs (a tensor, a tuple or list, or a dict), depth first."""
    if isinstance(value, torch.Tensor):
        return value
    items = value.values() if isinstance(value, Mapping) else value
    if isinstance(items, (tuple, list)) or isinstance(value, Mapping):
        for item in items:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


def move(value: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    """Tensors to the device (without waiting, from the host) and real-valued ones to ``dtype``."""
    if isinstance(value, torch.Tensor):
        value = value.to(device, non_blocking=device.type == "cuda")
        return value.to(dtype) if dtype is not None and value.is_floating_point() else value
    if isinstance(value, Mapping):
        return {k: move(v, device, dtype) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(move(v, device, dtype) for v in value)
    if isinstance(value, list):
        return [move(v, device, dtype) for v in value]
    return value


def _child_pids() -> set[int]:
    with contextlib.suppress(psutil.Error):
        return {child.pid for child in psutil.Process().children()}
    return set()


class UserBatches:
    """The factory's batches, one a step, on the device.

    An iterable (a DataLoader, a list) is read in order and read again from the start when it
    runs out; a callable is asked for ``batches(step)``. The first batch is fetched before
    timing starts (for the batch size and the FLOP count) and served again at step 0.

    The processes ``iter()`` starts (a DataLoader's workers) serve the iterator ampscope holds:
    ``release_iterators`` lets go of it at the end of the run and names them, so that they are
    not taken for processes the user's code left running.
    """

    def __init__(
        self,
        source: Any,
        device: torch.device,
        spec_text: str,
        warnings: list[ev.WarningEvent | ev.NoteEvent],
    ) -> None:
        self.spec_text, self.device, self.warnings = spec_text, device, warnings
        self.dtype: torch.dtype | None = None  # the weights' dtype under a pure cast
        self.source = source
        self.fn: Callable[[int], Any] | None = None
        self.it: Any = None
        self.workers: set[int] = set()  # pids of the processes iter() started
        if callable(source) and not hasattr(source, "__iter__"):
            self.fn = source
        else:
            try:
                self.it = self._iterate()
            except TypeError:
                raise UserCodeError(
                    f"workload.model = '{spec_text}': 'batches' is {describe_value(source)}, neither "
                    "iterable nor callable. Accepted: an iterable of batches (a DataLoader, a "
                    "list) or a callable step -> batch."
                ) from None
        self.served = 0  # batches read in the current pass over an iterable
        self.epoch = 1  # passes begun over an iterable
        self.first: tuple[Any, Any] | None = None
        self.first_ms = 0.0  # how long the first batch took, read ahead of step 0
        self.first_seen = ""  # what the first batch held, for a message about it
        self.batch_size = 0  # known once the first batch is in
        self.rank, self.world_size = 0, 1
        self.sharded = False

    def _iterate(self) -> Any:
        """``iter()`` over the batches, noting the processes it starts where it can start
        some: a DataLoader's workers (``num_workers`` > 0) start there, persistent ones once.
        A list is read again every few steps: nothing is looked up for it."""
        if not getattr(self.source, "num_workers", 0):
            return iter(self.source)
        before = _child_pids()
        it = iter(self.source)
        _SERVING.add(self)
        self.workers |= _child_pids() - before
        return it

    def release(self) -> set[int]:
        """Let go of the iterator (a DataLoader's workers end with it) and return the pids of
        the processes it started that still run: persistent workers, kept by the loader."""
        self.it = None
        _SERVING.discard(self)
        alive = set()
        for pid in self.workers:
            with contextlib.suppress(psutil.Error):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.add(pid)
        return alive

    def shard(self, rank: int, world_size: int) -> None:
        """Data parallelism: rank r trains on batch r of every ``world_size`` (a callable is
        asked for ``step * world_size + rank``). The first batch, read before, is every rank's."""
        if not self.sharded:  # a DistributedSampler's batches are this rank's already
            self.rank, self.world_size = rank, world_size

    def cast_inputs(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        if self.first is not None:  # read before the cast (to count FLOPs): cast it too
            inputs, targets = self.first
            self.first = move(inputs, self.device, dtype), targets

    def peek(self) -> tuple[Any, Any]:
        if self.first is None:
            t0 = time.perf_counter()
            self.first = self._fetch(0)
            self.first_ms = (time.perf_counter() - t0) * 1000.0
            inputs, targets = self.first
            self.first_seen = f"inputs {describe_value(inputs)}, targets {describe_value(targets)}"
        return self.first

    def get(self, step: int) -> tuple[Any, Any]:
        if self.first is not None:
            batch, self.first = self.first, None
            return batch
        return self._fetch(step)

    def _fetch(self, step: int) -> tuple[Any, Any]:
        if self.fn is not None:
            raw = self.fn(step * self.world_size + self.rank)
        else:
            for _ in range(self.rank):
                self._next(step)
            raw = self._next(step)
            for _ in range(self.world_size - self.rank - 1):
                self._next(step)
        if isinstance(raw, Mapping):
            inputs, targets = raw, None
        elif isinstance(raw, (tuple, list)) and len(raw) == 2:
            inputs, targets = raw
        else:
            raise UserCodeError(
                f"workload.model = '{self.spec_text}': batch {step} is {describe_value(raw)}. "
                f"Accepted: {BATCH_FORMS}."
            )
        return move(inputs, self.device, self.dtype), move(targets, self.device, None)

    def _next(self, step: int) -> Any:
        try:
            raw = next(self.it)
        except StopIteration:
            raw = self._restart(step)
        self.served += 1
        return raw

    def _restart(self, step: int) -> Any:
        """Start the iterable over: a new epoch, noted in the record (not a warning)."""
        epoch, self.served = self.served, 0
        self.it = None  # the finished pass's workers end before the next pass's start
        self.it = self._iterate()
        try:
            raw = next(self.it)
        except StopIteration:
            what = (
                "the batches are empty"
                if epoch == 0 and step == 0
                else f"the batches ran out after {epoch} batches and cannot be read again (a "
                "generator or an iterator is used up once read)"
            )
            raise UserCodeError(
                f"workload.model = '{self.spec_text}': {what}. Accepted: a list, a DataLoader "
                "or another iterable that can be read again, or a callable step -> batch."
            ) from None
        self.epoch += 1
        message = f"epoch {self.epoch} from step {step}"
        if self.epoch == 2:  # said once; later passes move the count (a list of 8: every 8 steps)
            message += (
                f": the batches ran out after {epoch} steps and started again from the first "
                "(later passes are counted, not said)"
            )
        self.warnings.append(
            ev.NoteEvent(code=ev.EPOCH_NOTE, message=message, step=step, count=self.epoch)
        )
        return raw


_SERVING: weakref.WeakSet[UserBatches] = weakref.WeakSet()
"""The batches whose iterator ampscope holds (one a run; weak: a finished run's go with it)."""


def release_iterators() -> set[int]:
    """At the end of a run: let go of every iterator ampscope holds over a user's batches, and
    return the pids of the processes they started that still run (workers a DataLoader with
    ``persistent_workers`` keeps until the loader goes): the loader's, not leftovers of the
    user's code (engine/lifecycle/children.py)."""
    alive: set[int] = set()
    for batches in list(_SERVING):
        alive |= batches.release()
    return alive


class UserWorkload(TrainingWorkload):
    """A factory's answer (its fields checked) as a workload."""

    def __init__(self, answer: dict[str, Any], spec_text: str, device: torch.device) -> None:
        model = answer["model"]
        if not isinstance(model, nn.Module):
            raise UserCodeError(
                f"workload.model = '{spec_text}': 'model' is {describe_value(model)}, not a "
                "torch.nn.Module. Accepted: an nn.Module."
            )
        if not any(p.requires_grad for p in model.parameters()):
            raise UserCodeError(
                f"workload.model = '{spec_text}': the model has no trainable parameters. "
                "Accepted: an nn.Module with parameters that require gradients."
            )
        loss = answer.get("loss")
        if loss is not None and not callable(loss):
            raise UserCodeError(
                f"workload.model = '{spec_text}': 'loss' is {describe_value(loss)}, not callable. "
                f"Accepted: {LOSS_FORMS}."
            )
        meta = on_meta_device(model)
        if meta:  # .to() would fail inside torch, with none of their frames to show
            raise UserCodeError(f"workload.model = '{spec_text}': {meta}")
        try:
            model = model.to(device)
        except Exception as exc:  # noqa: BLE001
            raise UserCodeError(
                f"workload.model = '{spec_text}': the model cannot be moved to {device}: "
                f"{describe_exception(exc)}",
                user_traceback(exc),
            ) from None
        flops = positive_field(answer, "flops_per_step", spec_text, False, MAX_FLOPS_PER_STEP)
        warnings: list[ev.WarningEvent | ev.NoteEvent] = []
        batches = UserBatches(answer["batches"], device, spec_text, warnings)
        batches.sharded = bool(answer.get("sharded"))
        name = name_field(answer, type(model).__name__, spec_text)
        super().__init__(
            model,
            batches,
            tokens_per_step=positive_field(
                answer, "tokens_per_step", spec_text, True, MAX_ITEMS_PER_STEP
            ),
            flops_per_step=flops,  # None: counted with FlopCounterMode (engine.step.flops)
            name=name,
        )
        self.warnings = warnings
        self.batches = batches
        self.spec_text, self.loss_fn = spec_text, loss
        self.samples_per_step = (
            positive_field(answer, "samples_per_step", spec_text, True, MAX_ITEMS_PER_STEP) or 0
        )
        # What the factory gave holds for every batch; what is read from the first batch is
        # read again from each (a DataLoader's short last batch, lengths bucketed by batch).
        self.sizes_given = (bool(self.samples_per_step), self.tokens_per_step is not None)
        self.first_elements = 0  # the first batch's first input tensor's elements
        self.sizes: dict[int, tuple[int, int | None, float]] = {}  # by step, until reported

    def prepare(self) -> None:
        """The first batch, read before timing starts: the batch size and token count."""
        try:
            inputs, _ = self.batches.peek()
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - their data pipeline's fault
            raise UserCodeError(
                f"workload.model = '{self.spec_text}': reading the first batch raised "
                f"{describe_exception(exc)}",
                user_traceback(exc),
            ) from None
        first = first_tensor(inputs)
        if not self.samples_per_step:
            if first is None or first.dim() == 0:
                raise UserCodeError(
                    f"workload.model = '{self.spec_text}': the batch size cannot be read from "
                    f"inputs that are {describe_value(inputs)}. Accepted: inputs whose first tensor "
                    "is batch-first, or give 'samples_per_step'."
                )
            self.samples_per_step = int(first.shape[0])
        self.pool.batch_size = self.samples_per_step
        if first is None:
            return
        self.first_elements = first.numel()
        if self.tokens_per_step is None and _token_ids(first):
            self.tokens_per_step = int(first.numel())  # (batch, sequence) token ids

    def batch(self, step: int) -> tuple[Any, Any]:
        inputs, targets = self.pool.get(step)
        self.sizes[step] = self._sizes_of(inputs)
        return inputs, targets

    def step_sizes(self, step: int) -> tuple[int, int | None, float]:
        return self.sizes.pop(step, None) or (self.samples_per_step, self.tokens_per_step, 1.0)

    def _sizes_of(self, inputs: Any) -> tuple[int, int | None, float]:
        """Samples and tokens read as from the first batch, and FLOPs in proportion to the
        first input's elements (exact for a batch size that changes; for a sequence length,
        exact where attention's T x T products are a small part of the step)."""
        samples, tokens = self.samples_per_step, self.tokens_per_step
        first = first_tensor(inputs)
        if first is None or first.dim() == 0 or not self.first_elements:
            return samples, tokens, 1.0
        samples_given, tokens_given = self.sizes_given
        if not samples_given:
            samples = int(first.shape[0])
        if not tokens_given and tokens is not None and _token_ids(first):
            tokens = int(first.numel())
        counted = self.flops_per_step is None  # the factory's figure is theirs to keep
        return samples, tokens, first.numel() / self.first_elements if counted else 1.0

    def first_batch(self) -> tuple[Any, Any]:
        return self.batches.peek()

    def read_ahead_ms(self, step: int) -> float:
        return self.batches.first_ms if step == 0 else 0.0

    def forward(self, model: nn.Module, inputs: Any) -> Any:
        try:
            if isinstance(inputs, Mapping):
                return model(**inputs)
            if isinstance(inputs, (tuple, list)):
                return model(*inputs)
            return model(inputs)
        except (Exception, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - theirs, for checks that catch Exception
            raise as_exception(exc) from None

    def loss(self, output: Any, target: Any) -> torch.Tensor:
        try:
            value = self.loss_fn(output, target) if self.loss_fn is not None else self._own(output)
        except (Exception, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - theirs, for checks that catch Exception
            raise as_exception(exc) from None
        if not isinstance(value, torch.Tensor):  # .item() or float(): nothing to backward
            raise UserCodeError(
                f"workload.model = '{self.spec_text}': the loss is {describe_value(value)}, not a "
                f"tensor: backward() needs the tensor itself, not a number read from it (drop "
                f".item() or float()). Accepted: {LOSS_FORMS}."
            )
        if value.numel() != 1:
            raise UserCodeError(
                f"workload.model = '{self.spec_text}': the loss is {describe_value(value)}, not a "
                f"scalar. Accepted: {LOSS_FORMS}; reduce a per-example loss with .mean()."
            )
        return value.reshape(()).float()  # the scaler and the step's metrics work in fp32

    def _own(self, output: Any) -> Any:
        """The loss the model returned itself, when it did."""
        if isinstance(output, torch.Tensor) and output.numel() == 1:
            return output
        loss = getattr(output, "loss", None)
        if loss is None and isinstance(output, Mapping):
            loss = output.get("loss")
        if isinstance(loss, torch.Tensor):
            return loss
        raise UserCodeError(
            f"workload.model = '{self.spec_text}': the model returned {describe_value(output)} and "
            f"the factory gave no loss. Accepted: {LOSS_FORMS}."
        )

    def graded_output(self, output: Any) -> torch.Tensor | None:
        """The output tensor (or ``.logits``) for ``grad_zero_frac``; None for a bare loss."""
        found = output
        if not isinstance(found, torch.Tensor):
            found = getattr(output, "logits", None)
            if found is None and isinstance(output, Mapping):
                found = output.get("logits")
            if found is None and isinstance(output, (tuple, list)):
                found = first_tensor(output)
        ok = isinstance(found, torch.Tensor) and found.requires_grad and found.numel() > 1
        return found if ok else None

    def first_step_failure(self, exc: Exception) -> Exception:
        """A fault in the first step (their model refusing its first batch, most often) is
        a user error. Running out of memory, torch.compile's own failures and a fault of
        ampscope's own hooks stay what they are: faults of the run, not of the input."""
        if isinstance(exc, (ConfigError, torch.OutOfMemoryError)) or _from_compiler(exc):
            return exc
        if raised_by_ampscope(exc):
            return exc
        seen = f" ({self.batches.first_seen})" if self.batches.first_seen else ""
        return UserCodeError(
            f"workload.model = '{self.spec_text}': the first training step failed on the first "
            f"batch{seen}: {exception_clause(exc)}. Accepted batches: {BATCH_FORMS}. "
            f"For the loss, {LOSS_FORMS}.",
            user_traceback(exc),
        )


def _token_ids(first: torch.Tensor) -> bool:
    """(batch, sequence) token ids: integers in two dimensions."""
    return first.dim() == 2 and not first.is_floating_point() and first.dtype != torch.bool


def _from_compiler(exc: Exception) -> bool:
    """Raised by torch.compile (Dynamo or Inductor), without importing them to ask."""
    return any(c.__module__.startswith(COMPILER_MODULES) for c in type(exc).__mro__)


def build_user_workload(spec_text: str, ctx: ModelContext) -> UserWorkload:
    """Load the factory, call it with ``ctx`` (seeded), and adapt its answer."""
    factory = load_factory(spec_text)
    torch.manual_seed(ctx.seed)
    answer = call_factory(factory, ctx, spec_text)
    return UserWorkload(answer, spec_text, ctx.device)


def count_model_parameters(spec_text: str, precision: str = "fp32") -> tuple[int, str, str]:
    """The model's true parameter count (tied weights once), where it was built ('meta' when
    the factory allows, else 'cpu'), and its name. Raises UserCodeError.

    A factory that builds its model and then moves it (``.to(ctx.device)``, as docs/model.md
    writes one) would untie its tied weights on the way to the meta device: each module's
    parameter becomes a new one. Built with torch's swap of module parameters on conversion,
    a moved Parameter stays the one object every module holds, so a tie is counted once."""
    factory = load_factory(spec_text)
    for device in ("meta", "cpu"):
        ctx = ModelContext(torch.device(device), None, 0, precision)
        try:
            with ties_kept() if device == "meta" else contextlib.nullcontext():
                answer = call_factory(factory, ctx, spec_text)
        except UserCodeError:
            if device == "meta":
                continue  # their factory needs real tensors: build it on the CPU instead
            raise
        model = answer["model"]
        if not isinstance(model, nn.Module):
            raise UserCodeError(
                f"workload.model = '{spec_text}': 'model' is {describe_value(model)}, not a "
                "torch.nn.Module. Accepted: an nn.Module."
            )
        name = name_field(answer, type(model).__name__, spec_text)
        return sum(p.numel() for p in model.parameters()), device, name
    raise AssertionError("unreachable: the CPU attempt returns or raises")


@contextlib.contextmanager
def ties_kept() -> Iterator[None]:
    """``Module.to()`` swaps each parameter's contents in place instead of making a new
    Parameter, while the block runs."""
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        yield
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)
