"""The memory planner beside a finished run: what it predicted and what the run measured.

Only like is compared with like. On CUDA the record's peak is torch.cuda's
max_memory_allocated: tensors only, as the planner counts them. On the CPU the record holds
process RSS, which also holds the Python interpreter, torch's libraries and their caches
(about 300 MB before a single tensor exists): it is compared only as growth from an RSS
read before the model was built, when the record has one, and otherwise not at all.

Imports neither torch nor textual.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ampscope.core import events as ev
from ampscope.core import records
from ampscope.core.memory.plan import (
    ATTENTION,
    REGIMES,
    MeasuredStep,
    PlanError,
    RegimePlan,
    Shape,
    plan_regime,
    regime_for_precision,
    workload_from,
)
from ampscope.core.text import visible


@dataclass
class RunComparison:
    run: str
    device: str
    on_cuda: bool
    regime: str
    params: int
    measured_peak: int | None  # the record's peak, whatever it measured
    measured_what: str  # what measured_peak is, in words
    plan: RegimePlan
    compared: int | None  # the measured tensor memory set beside the prediction, or None
    compared_what: str
    predicted: int  # what the measurement is compared with
    predicted_what: str
    ratio: float | None  # compared / predicted; None when nothing comparable was measured
    percent: float | None  # (compared - predicted) / predicted * 100
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["plan"] = self.plan.to_dict()
        return d


RSS_SPREAD = (1.07, 1.42)
"""RSS growth over the tensor peak (torch.profiler's allocator bytes) between identical CPU
runs of one model: the allocator's caching and the runtime's own growth differ run to run."""


def compare_run(run_dir: Any, step: MeasuredStep | None = None) -> RunComparison:
    """The planner's prediction for a recorded run beside its measured peak memory.
    ``step``: a user's model's activations for the run's batch (``engine.memory.saved``),
    when the model could be built again."""
    path = Path(run_dir)
    if not (path / records.EVENTS_FILE).is_file() and not (path / records.SUMMARY_FILE).is_file():
        raise PlanError(f"{path} is not a run record (no {records.EVENTS_FILE} in it).")
    rec = records.load_run(path)
    if rec.hello is None:
        raise PlanError(f"{path}: the record has no hello event, so its configuration is unknown.")
    hello = rec.hello
    try:  # any JSON may be in a record's config: one of another shape is a message
        conf = hello.config or {}
        wl = conf.get("workload", {}) or {}
        kind = str(wl.get("kind", "gpt"))
        batch = int(conf.get("batch_size") or 1)
        precision = str(conf.get("precision", "fp32"))
        recipe = str((conf.get("fp8") or {}).get("recipe", ""))
        # a size below 1 is no size (a damaged record): left out, never planned as negative bytes
        dims = {
            k: int(v)
            for k, v in wl.items()
            if isinstance(v, int) and not isinstance(v, bool) and v > 0
        }
    except (AttributeError, TypeError, ValueError, OverflowError):
        raise PlanError(f"{path}: the record's configuration cannot be read.") from None
    if batch < 1:
        raise PlanError(
            f"{path}: the record's batch_size {batch} is not a batch (at least 1), so its "
            "memory cannot be planned."
        )
    regime = regime_for_precision(precision, recipe)
    shape = None
    if kind == "gpt" and all(k in dims for k in ("layers", "width", "heads", "seq_len")):
        shape = Shape(
            dims["layers"], dims["width"], dims["heads"], dims["seq_len"], batch, dims.get("vocab")
        )
    params = int(hello.param_count or 0)
    if params <= 0:
        try:
            params = workload_from(kind, dims, batch, precision).params
        except (KeyError, PlanError) as exc:
            raise PlanError(f"{path}: no parameter count in the record ({exc}).") from None
    p = plan_regime(params, regime, "adamw", shape, step)
    on_cuda = str(hello.device or "").startswith("cuda")
    measured = _measured_peak(rec)
    notes: list[str] = []
    if precision not in REGIMES and precision != "fp8":
        notes.append(
            f"the record's precision '{visible(precision, 40)}' is not one the planner knows: "
            "planned as fp32"
        )
    if on_cuda:
        measured_what = "torch.cuda.max_memory_allocated (tensors only, not the CUDA context)"
        compared, compared_what = measured, "peak tensor memory (max_memory_allocated)"
    else:
        measured_what = "process RSS: the Python and torch runtime as well as tensors"
        compared, compared_what = _cpu_growth(hello, measured)
        before = hello.rss_before_model
        if compared is None and measured and before and before > 0 and measured <= before:
            notes.append(
                f"the record's RSS peak ({measured:,} bytes) is not above its RSS before the "
                f"model was built ({before:,} bytes): the sampled RSS missed the step's peak, "
                "so nothing is compared"
            )
        elif compared is None:
            notes.append(
                "on the CPU this record holds process RSS only, which includes about 300 MB "
                "of Python and torch runtime: it is not compared with tensor memory (a record "
                "with an RSS read from before the model was built is)"
            )
        else:
            low, high = RSS_SPREAD
            notes.append(
                f"RSS growth is not tensor bytes: between identical CPU runs it measured "
                f"{low:.2f}-{high:.2f}x the tensor peak (the allocator's caching, the runtime's "
                "own growth), so read the ratio against that band, not against 1.00"
            )
    if p.activations is None:
        what = f"a user's model ({kind})" if wl.get("model") else f"a {kind} workload"
        notes.append(f"no transformer shape for {what}: activations are not predicted")
    elif step is not None and shape is None:
        notes.append(f"activations: what autograd saves in one step of the model, {step.how}")
    else:
        notes.append(ATTENTION)
    notes.append(
        "prediction: weights + grads + AdamW state + transient casts"
        + (" + activations + logits" if p.activations is not None else "")
        + (", or the optimizer step's temporaries where larger" if p.optimizer_temp else "")
    )
    ratio = compared / p.train_total if compared and p.train_total else None
    return RunComparison(
        run=path.name,
        device=str(hello.device or ""),
        on_cuda=on_cuda,
        regime=regime,
        params=params,
        measured_peak=measured,
        measured_what=measured_what,
        plan=p,
        compared=compared,
        compared_what=compared_what,
        predicted=p.train_total,
        predicted_what="training total",
        ratio=ratio,
        percent=(ratio - 1) * 100 if ratio is not None else None,
        notes=notes,
    )


def _measured_peak(rec: records.RunRecord) -> int | None:
    """The record's peak memory: a number of bytes above zero, or None (a damaged or
    hand-made record's 0 or negative is no measurement)."""
    if rec.done is not None and rec.done.mem_peak is not None and rec.done.mem_peak > 0:
        return rec.done.mem_peak
    steps = [e for e in rec.events if isinstance(e, ev.StepEvent)]
    figures = [f for e in steps if (f := e.mem_peak or e.mem_allocated) and f > 0]
    return max(figures) if figures else None


def _cpu_growth(hello: ev.HelloEvent, peak_rss: int | None) -> tuple[int | None, str]:
    before = hello.rss_before_model
    if before is None or before <= 0 or peak_rss is None or peak_rss <= before:
        return None, "nothing: no tensor-only figure on the CPU"
    return (
        peak_rss - before,
        "RSS growth since before the model was built (tensors, plus allocator slack)",
    )
