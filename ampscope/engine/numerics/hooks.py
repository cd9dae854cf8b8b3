"""Hooks on every leaf module, on sampled steps only: outputs forward, their gradients backward.

The hooks are registered just before a sampled step and removed right after it, so other
steps run exactly as without numerics. A hook only reads: it never changes a value, a grad
or the RNG, so training is bit-identical with and without (a test checks). Each measured
tensor leaves one row on its device (host floats on a CPU); a GPU's rows of a step are
stacked and copied to the host once, without a wait (read when the copy has landed,
normally a step later).

Parameters get a hook too: each trainable parameter's gradient is measured as a layer's
output is (at most ``MODULE_CAP`` of them; beyond, one of each repeated kind first, and the
rest only checked for inf/NaN, one reduction), so an overflow born in a weight's gradient (a
large batch summed in fp16) is named by that parameter: ``out.bias``'s gradient.

Every module that is not a leaf (the model itself included) gets a pre-hook that notes
whether its inputs hold an inf or NaN, and each leaf's forward hook notes its own inputs'
(one reduction a tensor, none for the output of a layer measured this step): when the first
inf/NaN of a step is in a leaf's output and its inputs already held one, the module whose
own forward code computed it (between its layers) is named instead: the innermost module
running around that leaf whose inputs were finite; the model's inputs when none was.

Which modules never ran is a claim about the whole run, not the sampled steps: routing is data
(an MoE's expert may get its first tokens at step 4). A pre-hook on each measured module that
has not run yet, removed as it first runs, sees every step at the cost of one call a module;
a module that first runs in a step not sampled has the next step sampled, so it is measured.
"""

from __future__ import annotations

import collections
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ampscope.core import events as ev
from ampscope.core.numerics import MODULE_CAP, choose_modules
from ampscope.core.text import exception_text
from ampscope.engine.numerics.measure import CONSTANTS, RAW, device_row, host_row, row_of
from ampscope.engine.numerics.summary import (
    CHECK,
    FORWARD,
    WEIGHT,
    Call,
    Inputs,
    Slot,
    module_numerics,
)
from ampscope.engine.step.module_calls import why_not_called

BACKWARD = "backward"
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


def landed() -> bool:
    """Whether a step's figures have reached the host: always, where nothing was in flight."""
    return True


def extremes(t: torch.Tensor) -> torch.Tensor:
    """``t``'s smallest and largest value, in fp32 on t's device: both finite exactly when
    every value of ``t`` is (NaN and inf carry through), in one reduction without a
    temporary the size of ``t`` (``vector_norm(t, inf)`` takes five times as long on a CPU)."""
    return torch.stack(torch.aminmax(t)).float()


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


@dataclass
class Pending:
    """One sampled step's rows, on their way to the host."""

    step: int
    slots: list[Slot]  # what each row and check is, in the order the step computed them
    calls: list[Call]  # the non-leaf modules' forward calls, in order
    flat: torch.Tensor | list[float]  # the rows, the checks, the scale: host or in flight
    ready: Callable[[], bool]
    replayed: bool = False
    called: frozenset[int] = frozenset()  # the measured modules whose forward ran


@dataclass
class Owner:
    """A module in the event: a measured leaf, or a module that owns trainable parameters."""

    name: str
    kind: str
    leaf: int = -1  # its index among the measured leaves; -1: not one
    parameters: list[tuple[str, torch.nn.Parameter, bool]] = field(default_factory=list)
    # (name in the module, the parameter, measured: a full row; else only checked for inf/NaN)


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
        self.owners = owners_of(self.model, self.names, self.cap)
        self.branches = [
            (name, module) for name, module in self.model.named_modules() if any(module.children())
        ]
        self.constants = torch.tensor(CONSTANTS, dtype=torch.float32, device=self.device)
        self.handles: list[torch.utils.hooks.RemovableHandle] = []
        self.rows: list[torch.Tensor | list[float]] = []  # a CPU tensor's row: host floats
        self.checks: list[torch.Tensor] = []  # smallest and largest values: gradients', inputs'
        # This step's tensors whose inf/NaN is known to show: id -> (the tensor, weakly: an id
        # is reused once it is freed, and holding it would keep it; FORWARD and its row, or
        # CHECK and its check)
        self.known: dict[int, tuple[weakref.ref[torch.Tensor], str, int]] = {}
        self.slots: list[Slot] = []
        self.calls: list[Call] = []
        self.open: list[int] = []  # the non-leaf calls running now, outermost first
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
        self.rows, self.checks, self.slots, self.calls, self.open = [], [], [], [], []
        self.known = {}
        self.called = set()
        self.measured.append(step)
        for index, owner in enumerate(self.owners):
            if owner.leaf >= 0:
                module = self.modules[owner.leaf]
                hook = self._forward_hook(index, owner.leaf)
                self.handles.append(module.register_forward_hook(hook, with_kwargs=True))
            for pname, param, full in owner.parameters:
                self.handles.append(param.register_hook(self._weight_hook(index, pname, full)))
        for name, module in self.branches:
            pre, post = self._entered(name), self._left()
            self.handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            self.handles.append(module.register_forward_hook(post, always_call=True))

    def _inputs(self, args: Any, kwargs: Any) -> Inputs:
        """Where this call's floating-point inputs' inf/NaN would show: the rows of those that
        are a layer's output measured this step (most are: the layer before's), the checks of
        the rest (one reduction each, once a tensor), and their widest format."""
        found = list(tensors_in([args, kwargs]))
        rows: list[int] = []
        checks: list[int] = []
        for t in found:
            kept = self.known.get(id(t))
            if kept is None or kept[0]() is not t:
                self.checks.append(extremes(t.detach()))
                kept = self.known[id(t)] = (weakref.ref(t), CHECK, len(self.checks) - 1)
            (rows if kept[1] == FORWARD else checks).append(kept[2])
        widest = max(found, key=lambda t: torch.finfo(t.dtype).max) if found else None
        return Inputs(tuple(rows), tuple(checks), dtype_name(widest) if widest is not None else "")

    def _entered(self, name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            if self.failed:
                return
            try:
                self.calls.append(Call(name, self._inputs(args, kwargs)))
                self.open.append(len(self.calls) - 1)
            except Exception as exc:  # never the user's run: one warning, numerics off
                self._fail(exc)

        return hook

    def _left(self) -> Callable[..., None]:
        def hook(module: torch.nn.Module, inputs: object, out: object) -> None:
            if self.open:
                self.open.pop()

        return hook

    def _forward_hook(self, index: int, leaf: int) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any, out: object) -> None:
            if self.failed:
                return
            self.called.add(leaf)
            try:
                slot = Slot(
                    index, FORWARD, inputs=self._inputs(args, kwargs), around=tuple(self.open)
                )
                for t in tensors_in(out):
                    self._take(slot, t)
                    self.known[id(t)] = (weakref.ref(t), FORWARD, len(self.rows) - 1)
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
                    self._take(Slot(index, BACKWARD), grad)
            except Exception as exc:
                self._fail(exc)

        return hook

    def _weight_hook(self, index: int, pname: str, full: bool) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            if self.failed or not grad.is_floating_point() or grad.numel() == 0:
                return
            try:
                if full:
                    self._take(Slot(index, WEIGHT, pname), grad)
                    return
                self.checks.append(extremes(grad.detach()))
                slot = Slot(index, CHECK, pname, check=len(self.checks) - 1)
                self.slots.append(slot._replace(dtype=dtype_name(grad)))
            except Exception as exc:
                self._fail(exc)

        return hook

    def _take(self, slot: Slot, t: torch.Tensor) -> None:
        t = t.detach()  # no graph is recorded
        self.rows.append(host_row(t) if t.device.type == "cpu" else device_row(t, self.constants))
        self.slots.append(slot._replace(row=len(self.rows) - 1, dtype=dtype_name(t)))

    def _fail(self, exc: Exception) -> None:
        self.fail(exc, "measuring a layer failed")

    def fail(self, exc: Exception, what: str) -> None:
        """Numerics off for the rest of the run, said once; training goes on."""
        if self.failed:
            return
        self.failed = True
        self.close()
        message = (
            f"numerics stopped: {what} ({type(exc).__name__}: {exception_text(exc)}). "
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
            host: torch.Tensor | list[float]
            if self.device.type == "cpu":  # nothing to wait for: host floats
                host, ready = self._floats(), landed
            else:
                host, ready = self._copied()
            self.rows, self.checks, self.known = [], [], {}
            called = frozenset(self.called)
            self.pending.append(
                Pending(step, self.slots, self.calls, host, ready, replayed, called)
            )
        except Exception as exc:
            self._fail(exc)
        self.poll()

    def _floats(self) -> list[float]:
        """The step's rows, checks and scale as host floats (a CPU run's)."""
        flat = [v for r in self.rows for v in (r if isinstance(r, list) else r.tolist())]
        if self.checks:
            flat += torch.cat(self.checks).tolist()
        flat.append(float(self.scale))
        return flat

    def _copied(self) -> tuple[torch.Tensor, Callable[[], bool]]:
        """The step's rows, checks and scale in one tensor, on its way to the host without a
        wait (on CUDA into pinned memory), and whether it has landed."""
        parts = [
            r.reshape(-1)
            if isinstance(r, torch.Tensor)
            else torch.tensor(r, dtype=torch.float64, device=self.device)
            for r in self.rows
        ]
        if self.checks:
            parts.append(torch.cat(self.checks).to(torch.float64))
        parts.append(self.scale.reshape(1).to(torch.float64))
        flat = torch.cat(parts)
        if self.device.type != "cuda":
            return flat, landed
        host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
        host.copy_(flat, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return host, done.query

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
        flat = item.flat if isinstance(item.flat, list) else item.flat.tolist()
        rows = sum(1 for slot in item.slots if slot.row >= 0)
        table = [row_of(flat[i * RAW : (i + 1) * RAW]) for i in range(rows)]
        values, scale = flat[rows * RAW : -1], flat[-1]
        checks = list(zip(values[0::2], values[1::2], strict=True))  # (smallest, largest)
        owners = [(o.name, o.kind, [p for p, _, _ in o.parameters]) for o in self.owners]
        modules, found = module_numerics(item.step, owners, item.slots, table, checks, item.calls)
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


def owners_of(model: torch.nn.Module, names: list[str], cap: int = MODULE_CAP) -> list[Owner]:
    """The modules an event names, in the model's order: the measured leaves ``names``, and
    every module that owns a trainable parameter (a parameter shared by several modules is
    its first owner's). At most ``cap`` parameters are measured whole."""
    leaf = {n: i for i, n in enumerate(names)}
    found: list[Owner] = []
    seen: set[int] = set()
    for name, module in model.named_modules():
        owner = Owner(name, type(module).__name__, leaf.get(name, -1))
        for pname, param in module.named_parameters(recurse=False):
            if param.requires_grad and id(param) not in seen:
                seen.add(id(param))
                owner.parameters.append((pname, param, False))
        if owner.leaf >= 0 or owner.parameters:
            found.append(owner)
    full = [f"{o.name}.{p}" if o.name else p for o in found for p, _, _ in o.parameters]
    measured = set(choose_modules(full, cap))
    for o in found:
        o.parameters = [
            (p, param, (f"{o.name}.{p}" if o.name else p) in measured)
            for p, param, _ in o.parameters
        ]
    return found
