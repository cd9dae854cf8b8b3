"""The built-in workloads' dimensions for each ``workload.size``, and the rules a ``[workload]``
table follows: which fields each kind takes, and none for a user's own model.

``auto`` means small on a CPU and large on CUDA. Small keeps a step well under a second on two
CPU cores (except ``gpt2-124m``, whose point is its size: on a CPU it keeps the 124M-parameter
model and shortens the context instead); large keeps a modern GPU busy.
"""

from __future__ import annotations

from typing import Protocol

from ampscope.core.presets.workload_spec import SpecError, check_model_spec

WORKLOAD_SIZES: dict[str, dict[str, dict[str, int]]] = {
    "gpt": {  # ~110M parameters when large
        "small": {
            "layers": 2,
            "width": 64,
            "heads": 4,
            "seq_len": 64,
            "vocab": 1024,
            "batch_size": 32,
        },
        "large": {
            "layers": 12,
            "width": 768,
            "heads": 12,
            "seq_len": 1024,
            "vocab": 32768,
            "batch_size": 16,
        },
    },
    "mlp": {
        "small": {"layers": 4, "width": 256, "classes": 16, "batch_size": 256},
        "large": {"layers": 8, "width": 4096, "classes": 64, "batch_size": 8192},
    },
    "cnn": {
        "small": {"layers": 3, "width": 16, "image_size": 32, "classes": 10, "batch_size": 32},
        "large": {"layers": 5, "width": 128, "image_size": 64, "classes": 100, "batch_size": 256},
    },
    # nanoGPT's GPT-2 small (12 layers, width 768, 12 heads, context 1024, vocab 50304,
    # micro-batch 12): tokens/s and MFU comparable with nanoGPT's own figures.
    "gpt2-124m": {
        "small": {
            "layers": 12,
            "width": 768,
            "heads": 12,
            "seq_len": 64,
            "vocab": 50304,
            "batch_size": 1,
        },
        "large": {
            "layers": 12,
            "width": 768,
            "heads": 12,
            "seq_len": 1024,
            "vocab": 50304,
            "batch_size": 12,
        },
    },
    # A Llama-style decoder: RMSNorm, rotary embeddings, SwiGLU (hidden 4 x width) and
    # grouped-query attention. Large is about 1.1B parameters (Llama 3.2 1B's body).
    "llama": {
        "small": {
            "layers": 2,
            "width": 64,
            "heads": 4,
            "kv_heads": 2,
            "seq_len": 64,
            "vocab": 1024,
            "batch_size": 32,
        },
        "large": {
            "layers": 16,
            "width": 2048,
            "heads": 32,
            "kv_heads": 8,
            "seq_len": 2048,
            "vocab": 32768,
            "batch_size": 4,
        },
    },
}

WORKLOAD_FIELDS: dict[str, tuple[str, ...]] = {
    kind: tuple(k for k in sizes["small"] if k != "batch_size")
    for kind, sizes in WORKLOAD_SIZES.items()
}

DIM_FIELDS = ("layers", "width", "heads", "kv_heads", "seq_len", "vocab", "image_size", "classes")
"""Every dimension a preset's ``[workload]`` table may set, for any kind."""

TRANSFORMERS = ("gpt", "gpt2-124m", "llama")
"""Kinds whose width is split across attention heads."""


class WorkloadFields(Protocol):
    """A preset's ``[workload]`` table (``presets.WorkloadTable``), as far as these rules read it."""

    @property
    def kind(self) -> str: ...
    @property
    def model(self) -> str | None: ...
    @property
    def size(self) -> str: ...
    @property
    def width(self) -> int | None: ...
    @property
    def heads(self) -> int | None: ...
    @property
    def kv_heads(self) -> int | None: ...


def check_workload(w: WorkloadFields) -> list[tuple[str, str]]:
    """A user's model takes no built-in dimensions; a built-in kind takes only its own."""
    if w.model is not None:
        try:
            check_model_spec(w.model)
        except SpecError as exc:
            return [("workload.model", str(exc))]
        given = [f for f in DIM_FIELDS if getattr(w, f) is not None]
        if w.size != "auto":
            given.insert(0, "size")
        return [
            (
                f"workload.{name}",
                f"workload.{name} does not apply to your own model (workload.model = "
                f"'{w.model}'): the factory decides its sizes. Remove workload.{name}, or "
                "unset workload.model to use a built-in workload.",
            )
            for name in given
        ]
    problems: list[tuple[str, str]] = []
    allowed = WORKLOAD_FIELDS[w.kind]
    for name in DIM_FIELDS:
        if getattr(w, name) is not None and name not in allowed:
            message = (
                f"workload.{name} does not apply to workload.kind = '{w.kind}'. "
                f"Its fields: {', '.join(allowed)}."
            )
            problems.append((f"workload.{name}", message))
    if w.kind in TRANSFORMERS:
        problems += head_problems(w.width, w.heads, w.kv_heads)
    return problems


def head_problems(
    width: int | None, heads: int | None, kv_heads: int | None
) -> list[tuple[str, str]]:
    """Heads split the width evenly; grouped-query attention shares each key/value head
    among an equal number of query heads. (key at fault, message) pairs."""
    problems = []
    if width is not None and heads is not None and width % heads:
        message = f"workload.width = {width} is not divisible by workload.heads = {heads}."
        problems.append(("workload.width", message))
    if heads is not None and kv_heads is not None and heads % kv_heads:
        message = (
            f"workload.heads = {heads} is not divisible by workload.kv_heads = {kv_heads}: "
            "each key/value head serves the same number of query heads."
        )
        problems.append(("workload.kv_heads", message))
    return problems
