"""torch.compile's counters (graphs, graph breaks, recompiles, CUDA-graph skips) as events."""

from __future__ import annotations

from torch._dynamo.utils import counters

from ampscope import events as ev
from engine.emitter import EventWriter

_last: tuple[int, int, int, int] | None = None
_first_graphs = 0


def snapshot() -> tuple[int, int, int, int]:
    graphs = int(counters["stats"].get("unique_graphs", 0))
    frames = int(counters["frames"].get("total", 0))
    breaks = int(sum(counters["graph_break"].values()))
    skips = int(
        sum(counters["inductor"].get(k, 0) for k in counters["inductor"] if "cudagraph_skip" in k)
    )
    return graphs, frames, breaks, skips


def report_changes(writer: EventWriter, step: int, compile_s: float | None) -> None:
    """Emit a compile event when a counter moved; warn on recompiles after the first step."""
    global _last, _first_graphs
    now = snapshot()
    if now == _last:
        return
    if _last is None:
        _first_graphs = now[0]
    elif now[0] > _last[0]:
        writer.emit(
            ev.WarningEvent(
                code="recompile",
                step=step,
                message=(
                    f"torch.compile compiled {now[0] - _last[0]} new graph(s) at step {step}: a guard failed "
                    "(changing shapes or Python values). Each recompile costs seconds; after 8, that frame "
                    "runs eagerly."
                ),
            ),
            urgent=True,
        )
    _last = now
    graphs, frames, breaks, skips = now
    writer.emit(
        ev.CompileEvent(
            step=step,
            graphs=graphs,
            frames=frames,
            recompiles=max(0, graphs - _first_graphs),
            graph_breaks=breaks,
            break_reasons={str(k)[:200]: int(v) for k, v in counters["graph_break"].items()},
            cudagraph_skips=skips,
            compile_s=compile_s,
        ),
        urgent=True,
    )
