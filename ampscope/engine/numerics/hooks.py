"""Hooks on every leaf module, on sampled steps only: outputs forward, their gradients backward.

The hooks are registered just before a sampled step and removed right after it, so other
steps run exactly as without numerics. A hook only reads: it never changes a value, a grad
or the RNG, so training is bit-identical with and without (a test checks). Each measured
tensor leaves one row on the device; the rows of a step are stacked and copied to the host
once, without a wait on CUDA (read when the copy has landed, normally a step later).

Parameters get a hook too, which only checks their gradient for inf/NaN (one reduction): an
overflow born in a weight gradient (a large batch summed in fp16) is named by the module that
owns the weight, as that module's backward pass.

Which modules never ran is a claim about the whole run, not the sampled steps: routing is data
(an MoE's expert may get its first tokens at step 4). A pre-hook on each measured module that
has not run yet, removed as it first runs, sees every step at the cost of one call a module;
a module that first runs in a step not sampled has the next step sampled, so it is measured.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from ampscope.core import events as ev
from ampscope.core.numerics import MODULE_CAP, choose_modules
from ampscope.engine.numerics.measure import CONSTANTS, RAW, measure, row_of
from ampscope.engine.numerics.summary import module_numerics
from ampscope.engine.step.module_calls import why_not_called

FORWARD, BACKWARD, WEIGHT = "forward", "backward", "weight"
RECENT = 16  # sampled steps remembered, so that a skipped step that was measured is not rerun


def tensors_in(out: object) -> Iterator[torch.Tensor]:
    """The floating-point tensors inside a module's output (tuples, lists, dicts, dataclass-like
    ``ModelOutput``s are dicts); anything else is skipped."""
    if isinstance(out, torch.Tensor):
        if out.is_floating_point() and out.numel() > 0:
            yield out
    elif isinstance(out, (list, tuple)):
        for item in out:
            yield from tensors_in(item)
    elif isinstance(out, dict):
        for item in out.values():
            yield from tensors_in(item)


def leaf_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if n and not any(m.children())]


@dataclass
class Pending:
    """One sampled step's rows, on their way to the host."""

    step: int
    slots: list[tuple[int, str]]  # (owner index, pass) of each row, in the order measured
    dtypes: list[str]  # the format each row's tensor was computed in (torch's name)
    flat: torch.Tensor  # the rows, the weight checks, the scale: on the host or in flight
    ready: Callable[[], bool]
    replayed: bool = False
    called: frozenset[int] = frozenset()  # the measured modules whose forward ran


@dataclass
class NumericsProbe:
    model: torch.nn.Module
    device: torch.device
    emit: Callable[[ev.Event], None]
    every: int
    cap: int = MODULE_CAP
    names: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    total: int = 0
    failed: bool = False
    called: set[int] = field(default_factory=set)  # this sampled step's modules that ran
    ran: set[int] = field(default_factory=set)  # the measured modules that ran in any step

    def __post_init__(self) -> None:
        leaves = leaf_modules(self.model)
        self.total = len(leaves)
        by_name = dict(leaves)
        self.names = choose_modules([n for n, _ in leaves], self.cap)
        self.modules = [by_name[n] for n in self.names]
        self.kinds = [type(m).__name__ for m in self.modules]
        self.owners, self.params = weight_owners(self.model, self.names)
        self.constants = torch.tensor(CONSTANTS, dtype=torch.float32, device=self.device)
        self.handles: list[torch.utils.hooks.RemovableHandle] = []
        self.rows: list[torch.Tensor] = []
        self.checks: list[torch.Tensor] = []  # weight gradients' largest magnitude
        self.slots: list[tuple[int, str]] = []
        self.dtypes: list[str] = []  # each row's tensor's dtype: its inf is that format's overflow
        self.pending: collections.deque[Pending] = collections.deque()
        self.extra: set[int] = set()  # steps sampled out of turn (after a skipped step)
        self.measured: collections.deque[int] = collections.deque(maxlen=RECENT)
        # Each measured step's first inf/NaN, by step (a rerun step may land after later ones)
        self.found: dict[int, ev.FirstNonfinite] = {}
        self.woke = False  # a module ran for the first time in a step not sampled
        self.first_calls = {
            index: module.register_forward_pre_hook(self._first_call(index))
            for index, module in enumerate(self.modules)
        }

    def _first_call(self, index: int) -> Callable[..., None]:
        def hook(module: torch.nn.Module, inputs: object) -> None:
            self.ran.add(index)
            self.woke = self.woke or not self.handles  # outside a sampled step
            handle = self.first_calls.pop(index, None)
            if handle is not None:
                handle.remove()

        return hook

    def wants(self, step: int) -> bool:
        if self.failed or not self.names:
            return False
        woke, self.woke = self.woke, False  # a module's first run: measure it at once
        return woke or step in self.extra or (self.every > 0 and step % self.every == 0)

    def sample_next(self, step: int) -> None:
        """Measure ``step`` too: the step after a skip shows where the inf comes from."""
        self.extra.add(step)

    def begin(self, step: int, scale: torch.Tensor) -> None:
        self.scale = scale
        self.rows, self.checks, self.slots, self.dtypes = [], [], [], []
        self.called = set()
        self.measured.append(step)
        for index, module in enumerate(self.modules):
            self.handles.append(module.register_forward_hook(self._forward_hook(index)))
        for owner, param in self.params:
            self.handles.append(param.register_hook(self._weight_hook(owner)))

    def _forward_hook(self, index: int) -> Callable[..., None]:
        def hook(module: torch.nn.Module, inputs: object, out: object) -> None:
            if self.failed:
                return
            self.called.add(index)
            try:
                for t in tensors_in(out):
                    self._take(index, FORWARD, t)
                    if t.requires_grad:
                        t.register_hook(self._grad_hook(index))
            except Exception as exc:  # never the user's run: one warning, numerics off
                self._fail(exc)

        return hook

    def _grad_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            if self.failed:
                return
            try:
                if grad.is_floating_point() and grad.numel() > 0:
                    self._take(index, BACKWARD, grad)
            except Exception as exc:
                self._fail(exc)

        return hook

    def _weight_hook(self, owner: int) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            if self.failed or not grad.is_floating_point() or grad.numel() == 0:
                return
            try:
                with torch.no_grad():  # inf or NaN when any value is: one reduction
                    self.checks.append(torch.linalg.vector_norm(grad.detach(), math.inf))
                self.slots.append((owner, WEIGHT))
            except Exception as exc:
                self._fail(exc)

        return hook

    def _take(self, index: int, which: str, t: torch.Tensor) -> None:
        with torch.no_grad():
            self.rows.append(measure(t, self.constants))
        self.slots.append((index, which))
        self.dtypes.append(str(t.dtype).removeprefix("torch."))

    def _fail(self, exc: Exception) -> None:
        self.fail(exc, "measuring a layer failed")

    def fail(self, exc: Exception, what: str) -> None:
        """Numerics off for the rest of the run, said once; training goes on."""
        if self.failed:
            return
        self.failed = True
        self.close()
        message = (
            f"numerics stopped: {what} ({type(exc).__name__}: {exc}). "
            "Training goes on unchanged; set numerics.every = 0 to leave them off."
        )
        self.emit(ev.WarningEvent(code="numerics-failed", message=message[:2000]))

    def remove(self) -> None:
        """The sampled step's hooks off (the first-call watch stays: see ``close``)."""
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def close(self) -> None:
        """Every hook off: the run is over, or numerics are."""
        self.remove()
        for handle in self.first_calls.values():
            handle.remove()
        self.first_calls = {}

    def end(self, step: int, replayed: bool = False) -> None:
        """After the step: hooks off, the rows on their way to the host (one copy)."""
        self.remove()
        self.extra.discard(step)
        if self.failed or not self.slots:
            return
        try:
            parts = [r.reshape(-1) for r in self.rows]  # float64 already
            if self.checks:
                parts.append(torch.stack(self.checks).to(torch.float64))
            parts.append(self.scale.reshape(1).to(torch.float64))
            flat = torch.cat(parts)
            self.rows, self.checks = [], []
            ready: Callable[[], bool]
            if self.device.type == "cuda":
                host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
                host.copy_(flat, non_blocking=True)
                done = torch.cuda.Event()
                done.record()
                ready = done.query
            else:
                host, ready = flat, lambda: True
            called = frozenset(self.called)
            self.pending.append(
                Pending(step, self.slots, self.dtypes, host, ready, replayed, called)
            )
        except Exception as exc:
            self._fail(exc)
        self.poll()

    def poll(self, wait: bool = False) -> None:
        """Emit the steps whose rows have landed (all of them when ``wait``)."""
        while self.pending and (wait or self.pending[0].ready()):
            item = self.pending.popleft()
            if wait and self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            try:
                self.emit(self._event(item))
            except Exception as exc:
                self._fail(exc)

    def _event(self, item: Pending) -> ev.NumericsEvent:
        flat = item.flat.tolist()
        rows = sum(1 for _, which in item.slots if which != WEIGHT)
        table = [row_of(flat[i * RAW : (i + 1) * RAW]) for i in range(rows)]
        checks, scale = flat[rows * RAW : -1], flat[-1]
        modules, first = module_numerics(
            self.names, self.kinds, self.owners, item.slots, table, checks, item.dtypes
        )
        found = (
            ev.FirstNonfinite(step=item.step, module=first[0], pass_=first[1]) if first else None
        )
        if found is not None:
            self.found[item.step] = found
            while len(self.found) > RECENT:
                del self.found[min(self.found)]
        return ev.NumericsEvent(
            step=item.step,
            loss_scale=scale if scale == scale else None,  # NaN: no GradScaler
            modules=modules,
            modules_total=self.total,
            modules_idle={  # not run in this step, nor in any step before it
                name: why_not_called(self.model, name)
                for i, name in enumerate(self.names)
                if i not in item.called and i not in self.ran
            },
            first_nonfinite=found,
            replayed=item.replayed,
        )


def weight_owners(
    model: torch.nn.Module, names: list[str]
) -> tuple[list[str], list[tuple[int, torch.nn.Parameter]]]:
    """Who each trainable parameter belongs to: its module's name (the measured leaves first,
    by their index), or the parameter's own name when the model itself holds it."""
    owners = list(names)
    index = {n: i for i, n in enumerate(names)}
    params, seen = [], set()
    for name, module in model.named_modules():
        for pname, param in module.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            owner = name or pname
            if owner not in index:
                index[owner] = len(owners)
                owners.append(owner)
            params.append((index[owner], param))
    return owners, params
