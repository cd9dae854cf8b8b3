"""ampscope.watch for trainers that own the loop: Lightning and Hugging Face's Trainer.

``ampscope.integrations.lightning.LightningCallback`` and ``ampscope.integrations.hf.HFTrainerCallback``
each import their library; this package imports neither (extras ``lightning`` and ``hf``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def batch_size(batch: Any) -> int | None:
    """The leading dimension of the first tensor in a batch (a tensor, mapping or sequence)."""
    if hasattr(batch, "shape") and hasattr(batch, "dim"):
        return int(batch.shape[0]) if batch.dim() else None
    items = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__"):
        return None
    for item in items:
        if hasattr(item, "shape") and hasattr(item, "dim") and item.dim():
            return int(item.shape[0])
    return None
