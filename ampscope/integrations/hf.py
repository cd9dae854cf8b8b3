"""ampscope for Hugging Face's Trainer: ``Trainer(..., callbacks=[HFTrainerCallback()])``.

The Trainer hands its callbacks the model and its optimizer: accelerate's wrapper, which holds
the accelerator's GradScaler (fp16) beside the torch optimizer. The loss of each step is not
handed over, so the callback takes it from the model's own output (``outputs.loss``), combined
over the micro-batches of a step as the Trainer combines it for its logs; tokens and samples are read from ``input_ids`` (padding
included). Unless ``flops_per_step`` or ``count_flops`` says otherwise, FLOPs per step are the
Trainer's own estimate: 6 x parameters (without embeddings) x tokens. Time spent
evaluating or saving is not counted in the step that follows. Only the main process records.

Gradient norm: taken just before the optimizer step. The Trainer clips before that
(``max_grad_norm``, 1.0 by default), so a step it clipped records no norm (it was at least
``max_grad_norm``); the others record the norm before clipping, as engine runs do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import TrainerCallback

from ampscope.integrations import batch_size
from ampscope.watching import Monitor, RecordOptions, watch
from ampscope.watching.gradients import GradNormHook

if TYPE_CHECKING:
    from typing_extensions import Unpack


class HFTrainerCallback(TrainerCallback):
    """Records ``trainer.train()`` like an engine run; see ``ampscope.watch`` for the options."""

    def __init__(
        self,
        *,
        grad_norm: bool = True,
        **options: Unpack[RecordOptions],
    ) -> None:
        self.options = options  # checked by watch(), with what the trainer tells
        self.grad_norm = grad_norm
        self.monitor: Monitor | None = None
        self._norm_hook: GradNormHook | None = None
        self._clip_at = 0.0
        self._model: Any = None
        self._handles: list[Any] = []
        self._loss_is_share = False
        self._params: int | None = None  # parameters without embeddings, for the estimate
        self._reset_step()
        # HF's FLOPs estimate, summed over the first step; -1: not wanted, or done
        given = options.get("flops_per_step") is not None or options.get("count_flops")
        self._estimate = -1.0 if given else 0.0

    def _reset_step(self) -> None:
        self._loss: torch.Tensor | None = None
        self._micro_batches = 0
        self._tokens: int | None = None
        self._samples: int | None = None

    # -------------------------------------------------------------- the Trainer's events

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model, optimizer = kwargs.get("model"), kwargs.get("optimizer")
        if not state.is_world_process_zero or model is None:
            return
        options = self.options.copy()
        options["name"] = options.get("name") or _run_name(args, model)
        inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper holds it
        self.monitor = watch(
            model,
            inner,
            scaler=getattr(optimizer, "scaler", None),
            precision="amp-fp16" if args.fp16 else "amp-bf16" if args.bf16 else None,
            steps=state.max_steps if state.max_steps and state.max_steps > 0 else None,
            **options,
        )
        if self.grad_norm and inner is not None:
            self._norm_hook = GradNormHook(inner, self.monitor.troubles)
            self._clip_at = float(getattr(args, "max_grad_norm", 0.0) or 0.0)
        self._handles = [
            model.register_forward_pre_hook(self._before_forward, with_kwargs=True),
            model.register_forward_hook(self._after_forward),
        ]

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is None:
            return
        loss = self._loss
        if loss is not None and not self._loss_is_share:
            loss = loss / self._micro_batches
        if self._estimate > 0:
            self.monitor.flops_per_step = self._estimate
        self._estimate = -1.0  # one step's estimate is enough
        norm = self._norm_hook.take() if self._norm_hook is not None else None
        if norm is not None and self._clip_at > 0:
            norm = unclipped_or_nan(norm, self._clip_at)
        self.monitor.step(loss, tokens=self._tokens, samples=self._samples, grad_norm=norm)
        self._reset_step()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.restart_timer()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.restart_timer()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._norm_hook is not None:
            self._norm_hook.remove()
            self._norm_hook = None
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None

    # -------------------------------------------------------------- the model's forward

    def _before_forward(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if not module.training:
            return
        try:
            ids = kwargs.get("input_ids")
            if isinstance(ids, torch.Tensor):
                self._tokens = (self._tokens or 0) + ids.numel()
            size = batch_size(kwargs) or batch_size(args)
            if size is not None:
                self._samples = (self._samples or 0) + size
            # normalised by the items of the whole step: the micro-batch losses add up to it
            self._loss_is_share = kwargs.get("num_items_in_batch") is not None
            if self._estimate >= 0 and isinstance(ids, torch.Tensor):
                if self._params is None:
                    self._params = int(module.num_parameters(exclude_embeddings=True))
                self._estimate += 6.0 * ids.numel() * self._params
        except Exception:  # noqa: BLE001 - figures are optional; the forward is the user's
            self._estimate = -1.0

    def _after_forward(self, module: Any, args: Any, output: Any) -> None:
        if not module.training:
            return
        loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
        if loss is None and isinstance(output, (tuple, list)) and output:
            loss = output[0]
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            loss = loss.detach()
            self._loss = loss if self._loss is None else self._loss + loss
            self._micro_batches += 1


def unclipped_or_nan(norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """The norm before clipping where the Trainer did not clip; NaN (null) where it did.

    The Trainer clips to ``max_grad_norm`` before the optimizer step, where the norm is taken,
    and keeps the norm it clipped from to itself until it logs. A clipped step's norm lands
    just under ``max_norm``; an unclipped one is the norm before clipping.
    """
    return torch.where(norm < max_norm * (1 - 1e-3), norm, torch.full_like(norm, math.nan))


def _run_name(args: Any, model: Any) -> str:
    named = getattr(args, "run_name", None) or getattr(args, "output_dir", None)
    return Path(str(named)).name if named else type(model).__name__
