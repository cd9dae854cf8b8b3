"""ampscope for Lightning: ``Trainer(callbacks=[LightningCallback()])``.

The callback reads what the trainer already knows: the optimizer, the precision plugin (its
name gives the number format, its GradScaler the loss scale and skipped steps), the planned
number of steps. A step is recorded each time Lightning's optimizer step count moves, so
gradient accumulation makes one step of several batches. Time spent validating is not
counted in the step that follows it. On a multi-process run only global rank 0 records.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
import torch

from ampscope.integrations import batch_size
from ampscope.watching import Monitor, RecordOptions, watch
from ampscope.watching.gradients import total_norm

if TYPE_CHECKING:
    from typing_extensions import Unpack

PRECISIONS = {
    "16-mixed": "amp-fp16",
    "bf16-mixed": "amp-bf16",
    "32-true": "fp32",
    "32": "fp32",
    "16-true": "fp16",
    "bf16-true": "bf16",
    "64-true": "fp64",
    "64": "fp64",
}
"""Lightning's precision names as ampscope's; others (fp8, transformer-engine) are inferred."""


class LightningCallback(pl.Callback):
    """Records the fit like an engine run; see ``ampscope.watch`` for the options.

    ``tokens``: a function from a batch to its number of tokens, for tokens/s.
    """

    def __init__(
        self,
        *,
        tokens: Callable[[Any], int] | None = None,
        grad_norm: bool = True,
        **options: Unpack[RecordOptions],
    ) -> None:
        self.options = options  # checked by watch(), with what the trainer tells
        self.tokens = tokens
        self.monitor: Monitor | None = None
        self._steps_seen = 0
        self._samples = self._tokens = 0  # over the batches of the step in progress
        self.grad_norm = grad_norm  # taken by this callback, before Lightning clips
        self._norm: Any = None
        self._loss: Any = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        options = self.options.copy()
        options["name"] = options.get("name") or type(pl_module).__name__
        self.monitor = watch(
            pl_module,
            optimizer,
            scaler=getattr(trainer.precision_plugin, "scaler", None),
            precision=PRECISIONS.get(str(trainer.precision)),
            steps=planned_steps(trainer),
            **options,
        )
        self._steps_seen = trainer.global_step

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self.monitor is None:
            return  # not global rank 0
        # Lightning divides each batch's loss by the batches accumulated: their sum is the step's
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor):
            self._loss = loss.detach() if self._loss is None else self._loss + loss.detach()
        self._samples += batch_size(batch) or 0
        if self.tokens is not None:
            self._tokens += self.tokens(batch)
        if trainer.global_step == self._steps_seen:
            return  # still accumulating gradients
        self._steps_seen = trainer.global_step
        tokens = self._tokens if self.tokens is not None else None
        samples = self._samples or None
        self.monitor.step(self._loss, samples=samples, tokens=tokens, grad_norm=self._norm)
        self._samples = self._tokens = 0
        self._loss = self._norm = None

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        """Gradients here are unscaled (AMP) and not clipped yet: the norm engine runs record."""
        if self.monitor is not None and self.grad_norm:
            try:
                self._norm = total_norm(pl_module.parameters())
            except Exception:  # noqa: BLE001 - a figure, never a reason to stop the fit
                self._norm = None

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.monitor is not None:
            self.monitor.restart_timer()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close(None)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._close(exception)

    def _close(self, error: BaseException | None) -> None:
        if self.monitor is not None:
            self.monitor.close(error)
            self.monitor = None


def planned_steps(trainer: pl.Trainer) -> int | None:
    if trainer.max_steps and trainer.max_steps > 0:
        return int(trainer.max_steps)
    try:
        estimate = trainer.estimated_stepping_batches
    except Exception:  # noqa: BLE001 - no estimate (an iterable without a length)
        return None
    return int(estimate) if math.isfinite(estimate) and estimate >= 1 else None
