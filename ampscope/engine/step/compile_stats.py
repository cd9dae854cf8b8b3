"""torch.compile's counters (graphs, graph breaks, recompiles, CUDA-graph skips) as events."""

from __future__ import annotations

from ampscope.core import events as ev
from ampscope.engine.emitter import EventWriter
from ampscope.engine.private_apis import dynamo_counters

Snapshot = tuple[int, int, int, int]  # graphs, frames, graph breaks, CUDA-graph skips


def snapshot() -> Snapshot:
    counters = dynamo_counters()
    graphs = int(counters["stats"].get("unique_graphs", 0))
    frames = int(counters["frames"].get("total", 0))
    breaks = int(sum(counters["graph_break"].values()))
    skips = int(
        sum(counters["inductor"].get(k, 0) for k in counters["inductor"] if "cudagraph_skip" in k)
    )
    return graphs, frames, breaks, skips


class CompileWatch:
    """Reads dynamo's counters after each step (dict lookups: cheap) and reports changes.

    Graphs compiled after the first step are recompiles: a guard failed.
    """

    def __init__(self, writer: EventWriter) -> None:
        self.writer = writer
        self.last: Snapshot | None = None
        self.first_graphs = 0

    def after_step(self, step: int, compile_s: float | None) -> None:
        now = snapshot()
        if now == self.last:
            return
        if self.last is None:
            self.first_graphs = now[0]
        elif now[0] > self.last[0]:
            self.writer.emit(
                ev.WarningEvent(
                    code="recompile",
                    step=step,
                    message=(
                        f"torch.compile compiled {now[0] - self.last[0]} new graph(s) at step "
                        f"{step}: a guard failed (changing shapes or Python values). Each "
                        "recompile costs seconds; after 8, that frame runs eagerly."
                    ),
                ),
                urgent=True,
            )
        self.last = now
        graphs, frames, breaks, skips = now
        self.writer.emit(
            ev.CompileEvent(
                step=step,
                graphs=graphs,
                frames=frames,
                recompiles=max(0, graphs - self.first_graphs),
                graph_breaks=breaks,
                break_reasons={
                    str(k)[:200]: int(v) for k, v in dynamo_counters()["graph_break"].items()
                },
                cudagraph_skips=skips,
                compile_s=compile_s,
            ),
            urgent=True,
        )
